//! The `mysql://` and `mariadb://` URL (see the [store's docs](super)).

use std::path::PathBuf;

use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use tessera_core::error::{redact_url, Error, Result};
use tessera_core::stores::url::{not_a_url, percent_decode};

/// The default MySQL / MariaDB port.
pub(crate) const DEFAULT_PORT: u16 = 3306;

/// How waiters in other processes learn of a grant (see `notify.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WakeMode {
    /// A doorbell connection per client, rung with `KILL QUERY` (the default).
    Doorbell,
    /// Waiters in other processes only poll (backed off); for comparison and for servers
    /// where `KILL QUERY` on the user's own threads is not allowed.
    Poll,
}

/// A parsed `mysql://` or `mariadb://` URL.
pub(crate) struct Config {
    pub(crate) options: MySqlConnectOptions,
    /// The URL for messages, password replaced.
    pub(crate) redacted: String,
    pub(crate) wake: WakeMode,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("url", &self.redacted)
            .finish_non_exhaustive()
    }
}

/// Parses `mysql://[user[:password]@]host[:port]/database[?ssl-mode=…&ssl-ca=…&wake=…]`.
pub(crate) fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| Error::bad_store_url(raw, reason);
    let url = url::Url::parse(raw).map_err(|e| bad(not_a_url(e)))?;
    if !matches!(url.scheme(), "mysql" | "mariadb") {
        return Err(bad("expected mysql:// or mariadb://".into()));
    }
    let host = url
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| bad("missing host, e.g. mysql://127.0.0.1:3306/app".into()))?;
    let decode = |s: &str, what: &str| -> Result<String> {
        percent_decode(s)
            .ok_or_else(|| bad(format!("the {what} is not valid percent-encoded UTF-8")))
    };
    let database = decode(url.path().trim_start_matches('/'), "database name")?;
    if database.is_empty() {
        return Err(bad(
            "missing database, e.g. mysql://127.0.0.1:3306/app (tessera's tables go there)".into(),
        ));
    }
    if database.len() > 64 || database.contains('/') {
        return Err(bad(
            "the path must be one database name of at most 64 characters".into(),
        ));
    }
    if url.fragment().is_some() {
        return Err(bad("mysql URLs take no #fragment".into()));
    }
    let mut options = MySqlConnectOptions::new()
        .host(host.trim_start_matches('[').trim_end_matches(']'))
        .port(url.port().unwrap_or(DEFAULT_PORT))
        .database(&database)
        .timezone(Some("+00:00".to_string()))
        .charset("utf8mb4")
        // No TLS unless asked for (as the `mysql` client): `ssl-mode=required` or stricter.
        .ssl_mode(MySqlSslMode::Disabled);
    if !url.username().is_empty() {
        options = options.username(&decode(url.username(), "user name")?);
    } else {
        options = options.username("root");
    }
    if let Some(p) = url.password() {
        // Never echo the password, even as a decoding error.
        let p = percent_decode(p)
            .ok_or_else(|| bad("the password is not valid percent-encoded UTF-8".into()))?;
        options = options.password(&p);
    }
    let mut wake = WakeMode::Doorbell;
    let mut ssl_mode = None;
    let mut ssl_ca: Option<PathBuf> = None;
    // Each option once, its two spellings one option: with two values, which one the user
    // meant is a guess.
    let mut seen: Vec<&str> = Vec::new();
    for (k, v) in url.query_pairs() {
        let option = match &*k {
            "sslmode" => "ssl-mode",
            "sslca" => "ssl-ca",
            other => other,
        };
        if seen.contains(&option) {
            return Err(bad(format!("the option {option:?} is given twice")));
        }
        if let Some(known) = ["ssl-mode", "ssl-ca", "socket", "wake"]
            .into_iter()
            .find(|known| *known == option)
        {
            seen.push(known);
        }
        match &*k {
            "ssl-mode" | "sslmode" => {
                ssl_mode = Some(match v.to_ascii_lowercase().replace('-', "_").as_str() {
                    "disabled" => MySqlSslMode::Disabled,
                    "preferred" => MySqlSslMode::Preferred,
                    "required" => MySqlSslMode::Required,
                    "verify_ca" => MySqlSslMode::VerifyCa,
                    "verify_identity" => MySqlSslMode::VerifyIdentity,
                    _ => {
                        return Err(bad(format!(
                            "ssl-mode={v} must be disabled, preferred, required, verify_ca or \
                             verify_identity"
                        )))
                    }
                })
            }
            "ssl-ca" | "sslca" => {
                let path = PathBuf::from(&*v);
                if !path.is_absolute() {
                    return Err(bad(format!("ssl-ca={v} must be an absolute path")));
                }
                ssl_ca = Some(path);
            }
            "socket" => {
                // The server's Unix socket (as the `mysql` client's `--socket`), instead of
                // the URL's host and port.
                let path = PathBuf::from(&*v);
                if !path.is_absolute() {
                    return Err(bad(format!("socket={v} must be an absolute path")));
                }
                options = options.socket(path);
            }
            "wake" => {
                wake = match &*v {
                    "doorbell" => WakeMode::Doorbell,
                    "poll" => WakeMode::Poll,
                    _ => return Err(bad(format!("wake={v} must be doorbell or poll"))),
                }
            }
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: ssl-mode, ssl-ca, wake, socket"
                )))
            }
        }
    }
    if let Some(ca) = ssl_ca {
        // Read it now: a missing or empty file is a bad URL, not a failed handshake later.
        match std::fs::read_to_string(&ca) {
            Ok(pem) if pem.contains("-----BEGIN CERTIFICATE-----") => {}
            Ok(_) => {
                return Err(bad(format!(
                    "ssl-ca={} holds no PEM certificate",
                    ca.display()
                )))
            }
            Err(e) => return Err(bad(format!("ssl-ca={} cannot be read: {e}", ca.display()))),
        }
        options = options.ssl_ca(ca);
        // A CA without a mode means: verify the server against it.
        options = options.ssl_mode(ssl_mode.unwrap_or(MySqlSslMode::VerifyIdentity));
    } else if let Some(mode) = ssl_mode {
        options = options.ssl_mode(mode);
    }
    Ok(Config {
        options,
        redacted,
        wake,
    })
}

#[cfg(test)]
mod tests {
    use tessera_core::error::InvalidInput;

    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let c = parse_url("mysql://app:hunter%32@db.example:3307/jobs?wake=poll").unwrap();
        assert_eq!(c.options.get_host(), "db.example");
        assert_eq!(c.options.get_port(), 3307);
        assert_eq!(c.options.get_username(), "app");
        assert_eq!(c.options.get_database(), Some("jobs"));
        assert_eq!(c.wake, WakeMode::Poll);
        assert!(!c.redacted.contains("hunter"), "{}", c.redacted);
        assert!(!format!("{c:?}").contains("hunter"));
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
        let c = parse_url(&format!("mariadb://h/db?ssl-ca={}", ca.display())).unwrap();
        assert_eq!(c.options.get_port(), 3306);
        assert!(matches!(
            c.options.get_ssl_mode(),
            MySqlSslMode::VerifyIdentity
        ));
        assert_eq!(c.wake, WakeMode::Doorbell);
        let c = parse_url("mysql://h/db?ssl-mode=REQUIRED").unwrap();
        assert!(matches!(c.options.get_ssl_mode(), MySqlSslMode::Required));
        for bad in [
            "mysql://",
            "mysql://h",
            "mysql://h/",
            "mysql://h/a/b",
            "mysql://u:hunter2@h/db?typo=1",
            "mysql://u:hunter2@h/db?ssl-mode=maybe",
            "mysql://h/db?ssl-ca=relative.pem",
            "mysql://u:hunter2@h/db?ssl-ca=/nonexistent/ca.pem",
            "mysql://h/db?wake=shout",
            "mysql://u:hunter2@h/db?wake=poll&wake=doorbell",
            "mysql://h/db?ssl-mode=required&sslmode=disabled",
            "mysql://u:hunter2@h/db#x",
            "mysql://u:%ff%fe@h/db",
            "http://h/db",
        ] {
            let e = parse_url(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.is_invalid_input(), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
        let e = parse_url("mysql://u:hunter2@h/db?wake=poll&wake=doorbell").unwrap_err();
        assert!(
            matches!(
                &e,
                Error::InvalidInput(InvalidInput::StoreUrl { reason, .. })
                    if reason.contains("\"wake\" is given twice")
            ),
            "{e:?}"
        );
    }
}
