//! `postgres://` and `postgresql://` URLs: what tessera reads from them and the sqlx
//! connection options it builds (see the module docs of `mod.rs` for the form).

use std::path::PathBuf;

use sqlx::postgres::{PgConnectOptions, PgSslMode};

use tessera_core::error::{redact_url, Error, Result};
use tessera_core::stores::url::{not_a_url, percent_decode};

/// The schema tessera's tables and functions live in unless `?schema=` says otherwise.
pub(crate) const DEFAULT_SCHEMA: &str = "tessera";
/// PostgreSQL identifiers are at most 63 bytes.
const MAX_SCHEMA_LEN: usize = 63;

/// A parsed URL.
#[derive(Clone)]
pub(crate) struct Config {
    /// Host, port, user, password, database and TLS, for sqlx (holds the password: never
    /// printed; `PgConnectOptions`' `Debug` shows it, so `Config` has no `Debug`).
    pub options: PgConnectOptions,
    /// The URL with its password replaced by `***`, for messages.
    pub redacted: String,
    /// The schema of tessera's tables and functions.
    pub schema: String,
    /// `synchronous_commit=off` was asked for (see the module docs: what it risks).
    #[cfg_attr(not(test), allow(dead_code))]
    pub async_commit: bool,
    /// The `SET` statements every new connection runs before its first call (see
    /// [`session_sql`]).
    pub session: String,
}

/// Parses a `postgres://` or `postgresql://` URL (see the module docs). Nothing connects.
pub(crate) fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| Error::bad_store_url(raw, reason);
    let url = match url::Url::parse(raw) {
        // `postgres://user@/db?host=/dir`: a user for a socket connection, no network host
        // (libpq's form, which the URL parser refuses as an empty host).
        Err(url::ParseError::EmptyHost) if raw.contains("@/") && has_socket_dir(raw) => {
            url::Url::parse(&raw.replacen("@/", "@localhost/", 1))
        }
        parsed => parsed,
    }
    .map_err(|e| bad(not_a_url(e)))?;
    if !matches!(url.scheme(), "postgres" | "postgresql") {
        return Err(bad("expected postgres:// or postgresql://".into()));
    }
    // `?host=/dir`: the server's Unix socket directory (as libpq reads it); the URL then
    // needs no host of its own (`postgres:///db?host=/var/run/postgresql`).
    let socket = url
        .query_pairs()
        .find(|(k, _)| k == "host")
        .map(|(_, v)| v.into_owned());
    if let Some(dir) = &socket {
        if !dir.starts_with('/') {
            return Err(bad(format!(
                "host={dir} must be the absolute path of the server's socket directory, e.g. \
                 host=/var/run/postgresql (a network host goes before the path)"
            )));
        }
    }
    let host = match url.host_str().filter(|h| !h.is_empty()) {
        Some(h) => h,
        None if socket.is_some() => "localhost",
        None => {
            return Err(bad(
                "missing host, e.g. postgres://user@127.0.0.1:5432/db or \
                 postgres:///db?host=/var/run/postgresql"
                    .into(),
            ))
        }
    };
    // `[::1]` arrives bracketed; sqlx wants the bare address.
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if url.fragment().is_some() {
        return Err(bad("postgres URLs take no #fragment".into()));
    }
    let mut options = PgConnectOptions::new_without_pgpass()
        .host(host)
        .port(url.port().unwrap_or(5432))
        .application_name("tessera");
    if let Some(dir) = &socket {
        options = options.socket(dir);
    }
    let decode = |s: &str, what: &str| -> Result<String> {
        percent_decode(s)
            .ok_or_else(|| bad(format!("the {what} is not valid percent-encoded UTF-8")))
    };
    if !url.username().is_empty() {
        options = options.username(&decode(url.username(), "user name")?);
    } else if std::env::var_os("PGUSER").is_none() {
        // As libpq: the role named like the operating-system user running the process.
        if let Ok(user) = whoami::username() {
            options = options.username(&user);
        }
    }
    if let Some(password) = url.password() {
        options = options.password(&decode(password, "password")?);
    }
    let path = url.path().trim_start_matches('/');
    if path.contains('/') {
        return Err(bad(format!(
            "the path must be one database name, e.g. /app, not /{path}"
        )));
    }
    if !path.is_empty() {
        options = options.database(&decode(path, "database name")?);
    }
    let mut schema = DEFAULT_SCHEMA.to_string();
    let mut async_commit = false;
    let mut ssl_mode = None;
    let mut root_cert = None;
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in url.query_pairs() {
        if seen.iter().any(|s| *s == *k) {
            return Err(bad(format!("the option {k:?} is given twice")));
        }
        seen.push(k.to_string());
        match &*k {
            "host" => {}
            "schema" => {
                let ok = !v.is_empty()
                    && v.len() <= MAX_SCHEMA_LEN
                    && v.bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
                    && v.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
                if !ok || v.starts_with("pg_") || v == "information_schema" {
                    return Err(bad(format!(
                        "schema {v:?} must be 1-{MAX_SCHEMA_LEN} bytes of a-z 0-9 _, \
                         starting with a letter or _, and not pg_… or information_schema \
                         (the server's own)"
                    )));
                }
                schema = v.into_owned();
            }
            "sslmode" => {
                ssl_mode = Some(match &*v {
                    "disable" => PgSslMode::Disable,
                    "allow" => PgSslMode::Allow,
                    "prefer" => PgSslMode::Prefer,
                    "require" => PgSslMode::Require,
                    "verify-ca" => PgSslMode::VerifyCa,
                    "verify-full" => PgSslMode::VerifyFull,
                    _ => {
                        return Err(bad(format!(
                            "sslmode={v} must be disable, allow, prefer, require, verify-ca or \
                             verify-full"
                        )))
                    }
                })
            }
            "sslrootcert" => {
                if v.is_empty() {
                    return Err(bad("sslrootcert must name a file".into()));
                }
                root_cert = Some(PathBuf::from(&*v));
            }
            "synchronous_commit" => {
                async_commit = match &*v {
                    "on" => false,
                    "off" => true,
                    _ => return Err(bad(format!("synchronous_commit={v} must be on or off"))),
                }
            }
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: schema, sslmode, sslrootcert, \
                     synchronous_commit, host"
                )))
            }
        }
    }
    if let Some(mode) = ssl_mode {
        options = options.ssl_mode(mode);
    }
    if let Some(cert) = root_cert {
        options = options.ssl_root_cert(cert);
    }
    // No startup parameter beyond the ones every pooler passes on: PgBouncer refuses a
    // connection that sends one it does not know (`extra_float_digits`, which sqlx sends by
    // default and tessera does not need; `options`).
    options = options.extra_float_digits(None);
    let session = session_sql(&schema, async_commit);
    Ok(Config {
        options,
        redacted,
        schema,
        async_commit,
        session,
    })
}

/// tessera's own statement limits, whatever the database's or role's defaults (often set for
/// an application's queries, e.g. `lock_timeout = '50ms'`): no `lock_timeout` and no
/// `transaction_timeout` (PostgreSQL 17 and later), and a `statement_timeout` equal to the
/// client's [`super::conns::RESPONSE_TIMEOUT`], so the server gives a call up when the client does.
/// A step waits for its semaphore's row lock while other steps, one statement each, hold it;
/// a short `lock_timeout` cancelled those waits under contention, and every cancelled step
/// was sent again (a W3 bench at `lock_timeout = '2ms'` made half the grants a second, with
/// waits of a second and tens of thousands of errors in the server's log).
fn limits() -> String {
    format!(
        "SELECT set_config(name, CASE name WHEN 'statement_timeout' THEN '{}' ELSE '0' END, false) \
         FROM pg_settings WHERE name IN ('lock_timeout', 'statement_timeout', 'transaction_timeout')",
        super::conns::RESPONSE_TIMEOUT.as_millis()
    )
}

/// Turns `idle_session_timeout` (PostgreSQL 14 and later; nothing before) off for this
/// session: tessera keeps its few connections open between calls on purpose (a lease's
/// renewal comes every TTL / 3, a listener waits for `NOTIFY`), and a server that ends them
/// while idle would fail the next call on each, or drop the listener's wake-ups until the
/// listener's next ping notices. The listener's connections run it too (`notify.rs`).
pub(crate) const KEEP_IDLE: &str = "SELECT set_config(name, '0', false) FROM pg_settings \
     WHERE name = 'idle_session_timeout'";

/// The settings of tessera's sessions, as statements a new connection runs (one round trip)
/// rather than as the startup parameter `options`, which PgBouncer refuses: the schema
/// (`search_path`), index scans only (see the module docs of `mod.rs`, "Plans"), `READ
/// COMMITTED` whatever the database's or role's default isolation (the functions lock the
/// semaphore's row and then read what was committed before the lock; under `REPEATABLE READ`
/// or `SERIALIZABLE` every contended step would fail with a serialization error), and the
/// commit mode: asynchronous if asked for, otherwise at least `on` (a database or role whose
/// default is `off` does not make tessera's grants non-durable; `local`, `remote_write` and
/// `remote_apply` stay as the administrator chose), no idle-session timeout ([`KEEP_IDLE`])
/// and tessera's own statement limits ([`limits`]). All are set in the session, so a later reload of the server's
/// configuration changes none of them. `schema` is a checked identifier (no quote).
pub(crate) fn session_sql(schema: &str, async_commit: bool) -> String {
    let mut sql = format!(
        "SET search_path TO \"{schema}\"; SET enable_seqscan TO off; \
         SET default_transaction_isolation TO 'read committed'; "
    );
    sql.push_str(KEEP_IDLE);
    sql.push_str("; ");
    sql.push_str(&limits());
    sql.push_str("; ");
    sql.push_str(if async_commit {
        "SET synchronous_commit TO off"
    } else {
        "SELECT set_config('synchronous_commit', CASE current_setting('synchronous_commit') \
         WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"
    });
    sql
}

/// Whether the URL's query names a socket directory (`host=/…`).
fn has_socket_dir(raw: &str) -> bool {
    raw.split_once('?').is_some_and(|(_, q)| {
        q.split('&').any(|kv| {
            kv.starts_with("host=/") || kv.starts_with("host=%2F") || kv.starts_with("host=%2f")
        })
    })
}

#[cfg(test)]
mod tests {
    use tessera_core::error::InvalidInput;

    use super::*;

    fn reason(url: &str) -> String {
        match parse_url(url) {
            Err(Error::InvalidInput(InvalidInput::StoreUrl { reason, url })) => {
                assert!(!url.contains("hunter2"), "{url}");
                assert!(!reason.contains("hunter2"), "{reason}");
                reason
            }
            Err(e) => panic!("{url}: {e}"),
            Ok(_) => panic!("{url} was accepted"),
        }
    }

    #[test]
    fn urls_are_parsed_and_checked() {
        let c = parse_url(
            "postgres://app:hunter2@127.0.0.1:6543/orders?schema=team_a&sslmode=require&synchronous_commit=off",
        )
        .unwrap();
        assert_eq!(c.schema, "team_a");
        assert!(c.async_commit);
        assert_eq!(c.options.get_host(), "127.0.0.1");
        assert_eq!(c.options.get_port(), 6543);
        assert_eq!(c.options.get_username(), "app");
        assert_eq!(c.options.get_database(), Some("orders"));
        assert!(matches!(c.options.get_ssl_mode(), PgSslMode::Require));
        // Nothing a pooler would refuse at startup; the settings are SET after connecting.
        assert_eq!(c.options.get_options(), None);
        assert_eq!(
            c.session,
            "SET search_path TO \"team_a\"; SET enable_seqscan TO off; \
             SET default_transaction_isolation TO 'read committed'; SELECT set_config(name, '0', \
             false) FROM pg_settings WHERE name = 'idle_session_timeout'; SELECT set_config(name, \
             CASE name WHEN 'statement_timeout' THEN '5000' ELSE '0' END, false) FROM pg_settings \
             WHERE name IN ('lock_timeout', 'statement_timeout', 'transaction_timeout'); \
             SET synchronous_commit TO off"
        );
        assert_eq!(
            c.redacted,
            "postgres://app:***@127.0.0.1:6543/orders?schema=team_a&sslmode=require&synchronous_commit=off"
        );
        let c = parse_url("postgresql://u@db.internal/x").unwrap();
        assert_eq!(c.schema, DEFAULT_SCHEMA);
        assert!(!c.async_commit);
        assert!(
            c.session.ends_with(
                "WHEN 'off' THEN 'on' ELSE current_setting('synchronous_commit') END, false)"
            ),
            "{}",
            c.session
        );
        assert_eq!(c.options.get_port(), 5432);
        let c = parse_url("postgres://u:p%40ss%2Fw@h/d%20b").unwrap();
        assert_eq!(c.options.get_database(), Some("d b"));
        let c = parse_url("postgres:///d?host=%2Fvar%2Frun%2Fpostgresql&schema=s").unwrap();
        assert_eq!(
            c.options.get_socket().map(|p| p.display().to_string()),
            Some("/var/run/postgresql".into())
        );
        assert_eq!(
            (c.schema.as_str(), c.options.get_database()),
            ("s", Some("d"))
        );
    }

    #[test]
    fn a_url_without_a_user_connects_as_the_operating_system_user_as_libpq_does() {
        // What `id -un` says, unless PGUSER names another role (which sqlx then takes).
        let os_user = std::process::Command::new("id")
            .arg("-un")
            .output()
            .unwrap();
        let os_user = String::from_utf8(os_user.stdout)
            .unwrap()
            .trim()
            .to_string();
        let expected = std::env::var("PGUSER").unwrap_or(os_user);
        for url in [
            "postgres:///db?host=/var/run/postgresql",
            "postgres://127.0.0.1:5432/db",
        ] {
            let c = parse_url(url).unwrap();
            assert_eq!(c.options.get_username(), expected, "{url}");
        }
        // A user for a socket connection, with no network host (libpq's form).
        let c = parse_url("postgres://app:hunter2@/db?host=/var/run/postgresql&schema=s").unwrap();
        assert_eq!(c.options.get_username(), "app");
        assert_eq!(c.options.get_database(), Some("db"));
        assert_eq!(
            c.options.get_socket().map(|p| p.display().to_string()),
            Some("/var/run/postgresql".into())
        );
        assert!(!c.redacted.contains("hunter2"), "{}", c.redacted);
    }

    #[test]
    fn bad_urls_are_refused_without_echoing_the_password() {
        assert!(reason("postgres:///db").contains("missing host"));
        assert!(reason("postgres:///db?host=relative/dir").contains("absolute path"));
        assert!(reason("postgres://u:hunter2@/db").contains("host"));
        assert!(reason("postgres://u:hunter2@h/db?schema=Bad").contains("schema"));
        assert!(reason("postgres://u:hunter2@h/db?schema=pg_catalog").contains("schema"));
        assert!(reason("postgres://u:hunter2@h/db?schema=information_schema").contains("schema"));
        assert!(reason("postgres://u:hunter2@h/db?schema=a&schema=b").contains("twice"));
        assert!(reason("postgres://u:hunter2@h/db?schema=").contains("schema"));
        assert!(reason("postgres://u:hunter2@h/db?sslmode=maybe").contains("sslmode"));
        // An unencoded # in the password: the rest reads as a fragment, the port as garbage.
        assert!(reason("postgres://u:hunter2#@h:5432/db").contains("# as %23"));
        assert!(reason("postgres://u:hunter2@h/db?synchronous_commit=local")
            .contains("synchronous_commit"));
        assert!(reason("postgres://u:hunter2@h/db?pool=9").contains("unknown option"));
        assert!(reason("postgres://u:hunter2@h/a/b").contains("one database name"));
        assert!(reason("postgres://u:hunter2@h/db#x").contains("fragment"));
        assert!(reason("postgres://u:hunter2%ff@h/db").contains("password"));
    }
}
