//! Store URLs: everything `Store::connect` and `Store::connect_existing` parse before they
//! touch the network or the disk (`tessera::fuzzing::store_url`: the scheme check, then the
//! memory, SQLite or Redis parser and redis-rs's), and `tessera::backend::redact_url`.
//!
//! Properties, beyond "no panic":
//! - parsing is deterministic (same result, same messages, twice);
//! - a password never appears in the redacted form, in an error's `Display` or `Debug`, or in
//!   what a Redis URL parses to. The input is built as `SCHEME://USER:PASSWORD@REST` with
//!   delimiters kept out of USER and PASSWORD, so the password is unambiguous; a text leaks
//!   it when it contains the password (or its percent-decoded form) and the same text for
//!   the URL with `***` in its place does not (so a password that is also a host name or a
//!   word of a message is not a false alarm).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::backend::redact_url;
use tessera::fuzzing::{store_url, StoreUrl};

#[derive(Arbitrary, Debug)]
enum Input {
    /// Any text.
    Raw(String),
    /// `SCHEME://USER:PASSWORD@REST[?QUERY][#FRAGMENT]`.
    WithPassword {
        scheme: Scheme,
        user: String,
        password: String,
        rest: String,
        query: Vec<(Key, String)>,
        fragment: Option<String>,
    },
}

#[derive(Arbitrary, Debug)]
enum Scheme {
    Memory,
    Sqlite,
    Redis,
    Rediss,
    Postgres,
    Other(String),
}

#[derive(Arbitrary, Debug)]
enum Key {
    Prefix,
    Eviction,
    Protocol,
    Other(String),
}

fn without(s: &str, banned: &str) -> String {
    s.chars().filter(|c| !banned.contains(*c)).collect()
}

impl Input {
    /// The URL, and the password with the URL that has `***` in its place.
    fn build(&self) -> (String, Option<(String, String)>) {
        let (scheme, user, password, rest, query, fragment) = match self {
            Input::Raw(raw) => {
                // A password url::Url finds is one too, if it occurs once in the text (where
                // it also occurs elsewhere, e.g. in the user name, it is not clear which
                // occurrence `***` should replace).
                let found = tessera_url_password(raw)
                    .filter(|p| raw.matches(p.as_str()).count() == 1)
                    .and_then(|p| {
                        let needle = format!(":{p}@");
                        raw.find(&needle).map(|at| (p, at, needle.len()))
                    })
                    .map(|(p, at, len)| {
                        let masked = format!("{}:***@{}", &raw[..at], &raw[at + len..]);
                        (p, masked)
                    });
                return (raw.clone(), found);
            }
            Input::WithPassword {
                scheme,
                user,
                password,
                rest,
                query,
                fragment,
            } => (scheme, user, password, rest, query, fragment),
        };
        let scheme = match scheme {
            Scheme::Memory => "memory".to_string(),
            Scheme::Sqlite => "sqlite".to_string(),
            Scheme::Redis => "redis".to_string(),
            Scheme::Rediss => "rediss".to_string(),
            Scheme::Postgres => "postgres".to_string(),
            Scheme::Other(s) => s
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || "+-.".contains(*c))
                .collect(),
        };
        let user = without(user, ":@/?#\\");
        let password = without(password, "@/?#\\");
        let rest = without(rest, "@");
        let mut tail = String::new();
        for (i, (k, v)) in query.iter().enumerate() {
            tail.push(if i == 0 { '?' } else { '&' });
            tail.push_str(&match k {
                Key::Prefix => "prefix".to_string(),
                Key::Eviction => "eviction".to_string(),
                Key::Protocol => "protocol".to_string(),
                Key::Other(k) => without(k, "&#="),
            });
            tail.push('=');
            tail.push_str(&without(v, "&#"));
        }
        if let Some(f) = fragment {
            tail.push('#');
            tail.push_str(f);
        }
        let url = |p: &str| format!("{scheme}://{user}:{p}@{rest}{tail}");
        (url(&password), Some((password.clone(), url("***"))))
    }
}

/// The password `url::Url` sees in `raw`, if any (as written in `raw`).
fn tessera_url_password(raw: &str) -> Option<String> {
    url::Url::parse(raw).ok()?.password().map(str::to_string)
}

/// Every text that tessera shows for `url`: its redacted form and the outcome of parsing it
/// (an error's Display and Debug; for Redis, what it parsed to).
fn texts(url: &str) -> Vec<String> {
    let mut out = vec![redact_url(url)];
    match store_url(url) {
        Ok(parsed @ StoreUrl::Redis { .. }) => out.push(format!("{parsed:?}")),
        // A memory instance name or a SQLite path is the user's own text, never a password.
        Ok(_) => {}
        Err(e) => {
            out.push(e.to_string());
            out.push(format!("{e:?}"));
        }
    }
    out
}

fn check_no_leak(url: &str, password: &str, masked: &str) {
    let shown = texts(url);
    let masked_shown = texts(masked).join("\n");
    let decoded = percent_encoding::percent_decode_str(password)
        .decode_utf8_lossy()
        .into_owned();
    for secret in [password, decoded.as_str()] {
        // Short passwords match too much by chance (a one-letter host).
        if secret.chars().count() < 4 || masked_shown.contains(secret) {
            continue;
        }
        for text in &shown {
            assert!(
                !text.contains(secret),
                "password {secret:?} of {url:?} appears in {text:?}"
            );
        }
    }
}

fuzz_target!(|input: Input| {
    let (url, password) = input.build();

    // Deterministic: the same answer and the same words, twice.
    let first = format!("{:?}", store_url(&url));
    let second = format!("{:?}", store_url(&url));
    assert_eq!(first, second, "{url:?}");
    assert_eq!(redact_url(&url), redact_url(&url));

    if let Ok(StoreUrl::Redis { redacted, .. }) = store_url(&url) {
        assert_eq!(redacted, redact_url(&url));
    }

    if let Some((password, masked)) = password {
        check_no_leak(&url, &password, &masked);
    }
});
