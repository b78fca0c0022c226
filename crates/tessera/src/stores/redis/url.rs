//! The `redis://` and `rediss://` URL, the Sentinel and Cluster forms
//! (`redis+sentinel://`, `redis+cluster://`, and their TLS `rediss+…` twins), and tessera's
//! options in them (`prefix`, `eviction`, `wait`, and on Sentinel `sentinel_user` and
//! `sentinel_password`; see the [store's docs](super)).

use tessera_core::error::{redact_url, Error, InvalidInput, Result};
use tessera_core::stores::url::not_a_url;

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
    /// Replicas every state-changing call waits for (`WAIT`) before it answers; 0: none.
    pub(crate) wait: u32,
    /// Where the server is.
    pub(crate) layout: Layout,
    /// The sentinels' own credentials (`sentinel_user`, `sentinel_password`), if the URL
    /// gives them; only on Sentinel.
    pub(crate) sentinel_auth: Option<SentinelAuth>,
}

/// Credentials the sentinels are asked with, apart from the master's (the URL's own).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelAuth {
    /// The ACL user; `None`: the sentinel's `default` user.
    pub(crate) user: Option<String>,
    pub(crate) password: String,
}

// Never the password, not even in a test's assertion message.
impl std::fmt::Debug for SentinelAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelAuth")
            .field("user", &self.user)
            .field("password", &"***")
            .finish()
    }
}

/// Which servers a URL names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One server: `server_url`.
    Single,
    /// The master that these sentinels name `master`; `server_url` carries the credentials,
    /// database and options, with the first sentinel's address as a placeholder.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
    /// A cluster reached through these seed nodes; `server_url` is the first one's URL.
    Cluster { nodes: Vec<(String, u16)> },
}

/// Default port of a sentinel.
const SENTINEL_PORT: u16 = 26379;
/// Default port of a Redis server.
const REDIS_PORT: u16 = 6379;
/// Most replicas `wait` may ask for.
const MAX_WAIT: u32 = 64;
/// Why `sentinel_user` or `sentinel_password` on another URL is refused.
const SENTINEL_ONLY: &str =
    "sentinel_user and sentinel_password are options of redis+sentinel:// URLs";

pub(super) fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| Error::bad_store_url(raw, reason);
    let (scheme, rest) = raw.split_once("://").unwrap_or((raw, ""));
    let (base, sentinel) = match scheme {
        "redis+sentinel" => ("redis", true),
        "rediss+sentinel" => ("rediss", true),
        "redis+cluster" => ("redis", false),
        "rediss+cluster" => ("rediss", false),
        _ => {
            let config = parse_single(raw, redacted.clone())?;
            if config.sentinel_auth.is_some() {
                return Err(bad(SENTINEL_ONLY.into()));
            }
            return Ok(config);
        }
    };
    // The `url` crate takes one host per URL: split the host list off by hand, then read the
    // rest (credentials, path, options) as a one-host URL.
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let default_port = if sentinel { SENTINEL_PORT } else { REDIS_PORT };
    let mut addrs = Vec::new();
    for h in hosts.split(',') {
        // An IPv6 literal comes in brackets, kept in the address: `[::1]:26379`.
        let (host, port, v6) = match h.strip_prefix('[').and_then(|v6| v6.split_once(']')) {
            Some((ip, rest)) => {
                if ip.parse::<std::net::Ipv6Addr>().is_err() {
                    return Err(bad(format!(
                        "{h:?}: the brackets must hold an IPv6 address"
                    )));
                }
                let port = match rest.strip_prefix(':') {
                    Some(port) => port
                        .parse::<u16>()
                        .map_err(|_| bad(format!("bad port in {h:?}")))?,
                    None if rest.is_empty() => default_port,
                    None => return Err(bad(format!("bad port in {h:?}"))),
                };
                (&h[..ip.len() + 2], port, true)
            }
            None => match h.rsplit_once(':') {
                Some((host, port)) => (
                    host,
                    port.parse::<u16>()
                        .map_err(|_| bad(format!("bad port in {h:?}")))?,
                    false,
                ),
                None => (h, default_port, false),
            },
        };
        if host.is_empty() || (!v6 && host.contains(['@', '[', ']', ' '])) {
            return Err(bad(format!(
                "expected host:port[,host:port…], e.g. {scheme}://127.0.0.1:{default_port}"
            )));
        }
        addrs.push((host.to_string(), port));
    }
    let (path, query) = match tail.find('?') {
        Some(q) => tail.split_at(q),
        None => (tail, ""),
    };
    let mut segments = path.trim_start_matches('/').split('/');
    let first = segments.next().unwrap_or("");
    let (layout, db) = if sentinel {
        if first.is_empty()
            || !first
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(bad(format!(
                "the path must name the master, e.g. {scheme}://127.0.0.1:26379/mymaster[/db]"
            )));
        }
        let db = segments.next().unwrap_or("");
        (
            Layout::Sentinel {
                sentinels: addrs.clone(),
                master: first.to_string(),
            },
            db,
        )
    } else {
        if !first.is_empty() && first != "0" {
            return Err(bad("a cluster has only database 0".into()));
        }
        (
            Layout::Cluster {
                nodes: addrs.clone(),
            },
            "",
        )
    };
    if segments.next().is_some() {
        return Err(bad(format!("unexpected path {path:?}")));
    }
    let (host, port) = &addrs[0];
    let slash = if db.is_empty() { "" } else { "/" };
    let one = format!("{base}://{userinfo}{host}:{port}{slash}{db}{query}");
    let mut config = parse_single(&one, redacted.clone())?;
    if matches!(layout, Layout::Cluster { .. }) && config.wait > 0 {
        return Err(bad(
            "wait is not supported on redis+cluster:// (use redis+sentinel://)".into(),
        ));
    }
    if matches!(layout, Layout::Cluster { .. }) && config.sentinel_auth.is_some() {
        return Err(bad(SENTINEL_ONLY.into()));
    }
    config.layout = layout;
    Ok(config)
}

fn parse_single(raw: &str, redacted: String) -> Result<Config> {
    let bad = |reason: String| -> Error {
        InvalidInput::StoreUrl {
            url: redacted.clone(),
            reason,
        }
        .into()
    };
    let mut url = url::Url::parse(raw).map_err(|e| bad(not_a_url(e)))?;
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
    let mut wait = 0;
    let (mut sentinel_user, mut sentinel_password) = (None, None);
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
            "wait" => {
                wait = v
                    .parse::<u32>()
                    .ok()
                    .filter(|n| *n <= MAX_WAIT)
                    .ok_or_else(|| {
                        bad(format!(
                            "wait={v} must be a number of replicas, 0-{MAX_WAIT}"
                        ))
                    })?
            }
            // Percent-decoded by `query_pairs` (a `+` reads as a space: write `%2B`).
            "sentinel_user" | "sentinel_password" if v.is_empty() => {
                return Err(bad(format!("{k} must not be empty")))
            }
            "sentinel_user" => sentinel_user = Some(v.into_owned()),
            "sentinel_password" => sentinel_password = Some(v.into_owned()),
            "protocol" => passed.push((k.into_owned(), v.into_owned())),
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: prefix, eviction, wait, protocol, \
                     sentinel_user, sentinel_password"
                )))
            }
        }
    }
    let sentinel_auth = match (sentinel_user, sentinel_password) {
        (user, Some(password)) => Some(SentinelAuth { user, password }),
        (Some(_), None) => {
            return Err(bad(
                "sentinel_user needs sentinel_password (a sentinel's user logs in with one)".into(),
            ))
        }
        (None, None) => None,
    };
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
        wait,
        layout: Layout::Single,
        sentinel_auth,
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
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h:x/m",
            "redis+sentinel://h:1,/m",
            "redis+sentinel://u:hunter2@h:1/m/x",
            "redis+sentinel://u:hunter2@h:1/m?wait=x",
            "redis+sentinel://u:hunter2@h:1/m?wait=65",
            "redis+cluster://h:1/3",
            "redis+cluster://u:hunter2@h:1?wait=1",
            "redis+cluster://u:hunter2@h:1,h:2?typo=1",
            "redis+cluster://[not-v6]:7000",
            "redis+cluster://[::1]x",
            "redis+cluster://[::1]:x",
            "redis+sentinel://[::1:1/m",
            "redis://h?sentinel_password=hunter2",
            "redis+cluster://h:1?sentinel_password=hunter2",
            "redis+sentinel://h:1/m?sentinel_user=s",
            "redis+sentinel://h:1/m?sentinel_password=",
            "redis+sentinel://h:1/m?sentinel_user=&sentinel_password=hunter2",
        ] {
            let e = parse_url(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.is_invalid_input(), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn sentinel_and_cluster_urls_name_their_servers() {
        let c = parse_url("redis+sentinel://u:hunter2@a:1,b,c:3/main/2?prefix=p&wait=1").unwrap();
        assert_eq!(
            c.layout,
            Layout::Sentinel {
                sentinels: vec![("a".into(), 1), ("b".into(), 26379), ("c".into(), 3)],
                master: "main".into(),
            }
        );
        assert_eq!(c.server_url, "redis://u:hunter2@a:1/2");
        assert_eq!((c.prefix.as_str(), c.wait, c.tls), ("p", 1, false));
        assert!(!c.redacted.contains("hunter2"), "{}", c.redacted);
        let c = parse_url("rediss+cluster://x:7000,y:7001").unwrap();
        assert_eq!(
            c.layout,
            Layout::Cluster {
                nodes: vec![("x".into(), 7000), ("y".into(), 7001)],
            }
        );
        assert!(c.tls);
        assert_eq!(parse_url("redis://h").unwrap().layout, Layout::Single);
        // IPv6 literals in brackets, with or without a port.
        let c = parse_url("redis+sentinel://[::1]:7610,[fe80::2]/m").unwrap();
        assert_eq!(
            c.layout,
            Layout::Sentinel {
                sentinels: vec![("[::1]".into(), 7610), ("[fe80::2]".into(), 26379)],
                master: "m".into(),
            }
        );
        assert_eq!(c.server_url, "redis://[::1]:7610");
        // The sentinels' own credentials, percent-decoded, never in the server URL or a
        // message.
        let c = parse_url(
            "rediss+sentinel://:data-pw@a:1/m?sentinel_user=watch&sentinel_password=hun%2Bter2%26",
        )
        .unwrap();
        assert_eq!(
            c.sentinel_auth,
            Some(SentinelAuth {
                user: Some("watch".into()),
                password: "hun+ter2&".into(),
            })
        );
        assert_eq!(c.server_url, "rediss://:data-pw@a:1");
        assert!(!c.redacted.contains("hun"), "{}", c.redacted);
        assert!(!format!("{:?}", c.sentinel_auth).contains("hun"));
        let c = parse_url("redis+sentinel://a:1/m?sentinel_password=pw").unwrap();
        assert_eq!(c.sentinel_auth.unwrap().user, None);
        assert_eq!(
            parse_url("redis+sentinel://a:1/m").unwrap().sentinel_auth,
            None
        );
        let c = parse_url("redis+cluster://[::1]:7000,h:7001").unwrap();
        assert_eq!(
            c.layout,
            Layout::Cluster {
                nodes: vec![("[::1]".into(), 7000), ("h".into(), 7001)],
            }
        );
    }
}
