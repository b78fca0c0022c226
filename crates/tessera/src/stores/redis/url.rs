//! The `redis://` and `rediss://` URL and tessera's options in it (`prefix`, `eviction`; see
//! the [store's docs](super)).

use crate::error::{redact_url, Error, InvalidInput, Result};

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tessera";
/// Longest key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// What to do when the server may evict tessera's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EvictionPolicy {
    Warn,
    Refuse,
}

/// A parsed `redis://` or `rediss://` URL.
pub(crate) struct Config {
    /// The URL handed to redis-rs (tessera's options removed).
    pub(crate) server_url: String,
    /// The URL for messages, password replaced.
    pub(crate) redacted: String,
    pub(crate) prefix: String,
    pub(crate) eviction: EvictionPolicy,
    pub(crate) tls: bool,
}

pub(super) fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| -> Error {
        InvalidInput::StoreUrl {
            url: redacted.clone(),
            reason,
        }
        .into()
    };
    let mut url = url::Url::parse(raw).map_err(|e| bad(format!("not a URL ({e})")))?;
    let tls = match url.scheme() {
        "redis" => false,
        "rediss" => true,
        _ => return Err(bad("expected redis:// or rediss://".into())),
    };
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("missing host, e.g. redis://127.0.0.1:6379".into()));
    }
    let path = url.path().trim_start_matches('/');
    if !path.is_empty() && path.parse::<u16>().is_err() {
        return Err(bad(format!(
            "the path must be a database number, e.g. /0, not /{path}"
        )));
    }
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut eviction = EvictionPolicy::Warn;
    // Options redis-rs itself reads from the URL, handed through.
    let mut passed: Vec<(String, String)> = Vec::new();
    for (k, v) in url.query_pairs() {
        match &*k {
            "prefix" => {
                if v.is_empty()
                    || v.len() > MAX_PREFIX_LEN
                    || !v
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                {
                    return Err(bad(format!(
                        "prefix {v:?} must be 1-{MAX_PREFIX_LEN} bytes of A-Z a-z 0-9 . _ -"
                    )));
                }
                prefix = v.into_owned();
            }
            "eviction" => {
                eviction = match &*v {
                    "warn" => EvictionPolicy::Warn,
                    "refuse" => EvictionPolicy::Refuse,
                    _ => return Err(bad(format!("eviction={v} must be warn or refuse"))),
                }
            }
            "protocol" => passed.push((k.into_owned(), v.into_owned())),
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: prefix, eviction, protocol"
                )))
            }
        }
    }
    url.set_query(None);
    if !passed.is_empty() {
        url.query_pairs_mut().extend_pairs(passed);
    }
    Ok(Config {
        server_url: url.to_string(),
        redacted,
        prefix,
        eviction,
        tls,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let c =
            parse_url("redis://u:hunter2@127.0.0.1:6380/2?prefix=team-a&eviction=refuse").unwrap();
        assert_eq!(c.prefix, "team-a");
        assert_eq!(c.eviction, EvictionPolicy::Refuse);
        assert_eq!(c.server_url, "redis://u:hunter2@127.0.0.1:6380/2");
        assert!(!c.redacted.contains("hunter2"));
        assert!(parse_url("rediss://h").unwrap().tls);
        let c = parse_url("redis://h:1?protocol=resp3&prefix=p").unwrap();
        assert_eq!(
            (c.server_url.as_str(), c.prefix.as_str()),
            ("redis://h:1?protocol=resp3", "p")
        );
        for bad in [
            "redis://",
            "redis://h/x",
            "redis://h?prefix=a:b",
            "redis://h?prefix={x}",
            "redis://h?prefix=",
            "redis://h?eviction=maybe",
            "redis://u:hunter2@h?typo=1",
            "http://h",
        ] {
            let e = parse_url(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.is_invalid_input(), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }
}
