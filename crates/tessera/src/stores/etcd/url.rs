//! The `etcd://` and `etcds://` URL (see the [store's docs](super)).
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]…][/prefix]
//! etcds://[user:password@]host[:port][,…][/prefix][?ca=FILE][&cert=FILE&key=FILE][&domain=NAME]
//! ```

use std::path::PathBuf;

use tessera_core::error::{redact_url, Error, InvalidInput, Result};
use tessera_core::stores::url::percent_decode;

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tessera";
/// Longest key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;
/// The port of an endpoint that names none.
pub const DEFAULT_PORT: u16 = 2379;

/// TLS settings of an `etcds://` URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Tls {
    /// PEM file of the CA that signed the servers' certificates.
    pub(crate) ca: Option<PathBuf>,
    /// PEM files of a client certificate and its key.
    pub(crate) identity: Option<(PathBuf, PathBuf)>,
    /// The name to check the servers' certificates against (default: the endpoint's host).
    pub(crate) domain: Option<String>,
}

/// A parsed `etcd://` or `etcds://` URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Config {
    /// `http://host:port` (or `https://`), one per endpoint.
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) prefix: String,
    pub(crate) tls: Option<Tls>,
    /// The URL for messages, password replaced.
    pub(crate) redacted: String,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted)
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

pub(crate) fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| -> Error {
        InvalidInput::StoreUrl {
            url: redacted.clone(),
            reason,
        }
        .into()
    };
    let (scheme, rest) = raw
        .split_once("://")
        .ok_or_else(|| bad("expected etcd://host:port".into()))?;
    let tls = match scheme {
        "etcd" => false,
        "etcds" => true,
        _ => return Err(bad("expected etcd:// or etcds://".into())),
    };
    if rest.contains('#') {
        return Err(bad("the URL takes no #fragment".into()));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    // user:password@ ends at the last '@' before the path (a prefix never holds '@').
    let (user, rest) = match rest.rfind('@') {
        Some(at) => {
            let (info, hosts) = (&rest[..at], &rest[at + 1..]);
            let (u, p) = info.split_once(':').unwrap_or((info, ""));
            let decode = |s: &str| {
                percent_decode(s)
                    .ok_or_else(|| bad("bad percent-encoding in user or password".into()))
            };
            let (u, p) = (decode(u)?, decode(p)?);
            if u.is_empty() {
                return Err(bad("empty user name before '@'".into()));
            }
            (Some((u, p)), hosts)
        }
        None => (None, rest),
    };
    let (hosts, prefix) = match rest.split_once('/') {
        Some((h, p)) => (h, p),
        None => (rest, ""),
    };
    let prefix = if prefix.is_empty() {
        DEFAULT_PREFIX.to_string()
    } else {
        check_prefix(prefix).map_err(bad)?;
        prefix.to_string()
    };
    let mut endpoints = Vec::new();
    for host in hosts.split(',') {
        endpoints.push(endpoint(host, tls).map_err(bad)?);
    }
    let mut tls_config = tls.then(Tls::default);
    let (mut cert, mut key) = (None, None);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or_else(|| bad(format!("bad percent-encoding in {k}")))?;
        let Some(t) = tls_config.as_mut() else {
            return Err(bad(format!(
                "unknown option {k:?}; etcd:// takes none (ca, cert, key, domain are for etcds://)"
            )));
        };
        if v.is_empty() {
            return Err(bad(format!("option {k} needs a value")));
        }
        match k {
            "ca" => t.ca = Some(PathBuf::from(v)),
            "cert" => cert = Some(PathBuf::from(v)),
            "key" => key = Some(PathBuf::from(v)),
            "domain" => t.domain = Some(v),
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: ca, cert, key, domain"
                )))
            }
        }
    }
    if let Some(t) = tls_config.as_mut() {
        match (cert, key) {
            (Some(c), Some(k)) => t.identity = Some((c, k)),
            (None, None) => {}
            _ => return Err(bad("cert and key go together".into())),
        }
    }
    Ok(Config {
        endpoints,
        user,
        prefix,
        tls: tls_config,
        redacted,
    })
}

/// `host[:port]` to `http://host:port` (or `https://`).
fn endpoint(host: &str, tls: bool) -> std::result::Result<String, String> {
    if host.is_empty() {
        return Err("missing host, e.g. etcd://127.0.0.1:2379".into());
    }
    let (name, port) = match host.rsplit_once(':') {
        // An IPv6 literal "[::1]" without a port ends in ']'.
        Some((n, p)) if !p.ends_with(']') => (
            n,
            p.parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| format!("bad port {p:?} in {host:?}"))?,
        ),
        _ => (host, DEFAULT_PORT),
    };
    let ok = |b: u8| b.is_ascii_alphanumeric() || b".-_[]:".contains(&b);
    // A colon only inside an IPv6 literal's brackets: `h:1:2` is no host and port.
    let v6 = name.starts_with('[') && name.ends_with(']');
    if name.is_empty() || !name.bytes().all(ok) || (!v6 && name.contains([':', '[', ']'])) {
        return Err(format!("bad host {name:?}"));
    }
    let scheme = if tls { "https" } else { "http" };
    Ok(format!("{scheme}://{name}:{port}"))
}

fn check_prefix(p: &str) -> std::result::Result<(), String> {
    let ok = !p.is_empty()
        && p.len() <= MAX_PREFIX_LEN
        && p.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b))
        && !p.starts_with('/')
        && !p.ends_with('/')
        && !p.contains("//");
    if ok && p.split('/').any(|segment| segment == "sem") {
        // Keys are `PREFIX/sem/NAME` and names may hold '/': a prefix `a/sem/b` would share
        // the keys of the names `b/sem/…` under the prefix `a`.
        return Err(format!(
            "prefix {p:?} may not have a segment \"sem\": its keys would be another prefix's"
        ));
    }
    if ok {
        Ok(())
    } else {
        Err(format!(
            "prefix {p:?} must be 1-{MAX_PREFIX_LEN} bytes of A-Z a-z 0-9 . _ - and inner /"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let c = parse_url("etcd://u:hun%40ter2@127.0.0.1:2379,10.0.0.2,h3:23790/team-a/x").unwrap();
        assert_eq!(
            c.endpoints,
            [
                "http://127.0.0.1:2379",
                "http://10.0.0.2:2379",
                "http://h3:23790"
            ]
        );
        assert_eq!(c.user, Some(("u".into(), "hun@ter2".into())));
        assert_eq!(c.prefix, "team-a/x");
        assert!(c.tls.is_none());
        assert!(!format!("{c:?}").contains("ter2"), "{c:?}");
        let c = parse_url("etcd://h").unwrap();
        assert_eq!((c.prefix.as_str(), c.user), (DEFAULT_PREFIX, None));
        let c =
            parse_url("etcds://h:1/p?ca=/ca.pem&cert=/c.pem&key=/k.pem&domain=etcd.local").unwrap();
        assert_eq!(c.endpoints, ["https://h:1"]);
        let t = c.tls.unwrap();
        assert_eq!(t.ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(
            t.identity,
            Some((PathBuf::from("/c.pem"), PathBuf::from("/k.pem")))
        );
        assert_eq!(t.domain.as_deref(), Some("etcd.local"));
        for bad in [
            "etcd://",
            "etcd://u:hunter2@",
            "etcd://h:0",
            "etcd://h:x",
            "etcd://h,,g",
            "etcd://h/a//b",
            "etcd://h//",
            "etcd://h/a b",
            "etcd://u:hunter2@h?ca=/x",
            "etcds://u:hunter2@h?cert=/x",
            "etcds://u:hunter2@h?typo=1",
            "etcd://h#frag",
            "etcd://h:1:99",
            "etcd://h/a/sem/b",
            "etcd://h/sem",
            "etcd://:hunter2@h",
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
