//! One folder per store, each file one role and the same role under the same name in every
//! store that has it: `mod.rs` is the [`tessera_core::seam::Backend`] glue (and the store's docs),
//! and no file below it imports it; `url.rs` parses the URL; `error.rs` maps the driver's
//! errors to [`Error`]; `conns.rs` connects and holds the connections; `migrate.rs` creates
//! and migrates the schema; `ops.rs` holds the atomic operations; `notify.rs` is the wake
//! path (how a waiter in another process learns of a grant); `heartbeats.rs` batches
//! waiters' heartbeats; `rate.rs` is the rate limiter. A store adds files for roles of its
//! own (etcd's `session.rs`, Redis's `topology.rs`, …). The SQL stores share one step
//! (`sql/`) and supply only their statements (their `ops.rs`).
//!
//! This module also chooses the store from a URL's scheme ([`open`]), so that neither the
//! seam (`tessera_core::seam`) nor the connection engine (`crate::conn`) names a store.

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "sqlite")]
pub mod sqlite;

use std::sync::Arc;

use tessera_core::error::{Error, Result};
use tessera_core::seam::Backend;

/// Whether opening a store may create it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Open {
    /// Create what is missing (the SQLite file and its folder).
    CreateIfMissing,
    /// Open only a store that already exists; a missing one is [`Error::NoStore`].
    ExistingOnly,
}

/// A scheme this code knows: the URL form shown in messages, and the cargo feature that
/// compiles its store in (`None`: no build has it yet).
struct Scheme {
    scheme: &'static str,
    form: &'static str,
    feature: Option<&'static str>,
}

/// Every scheme tessera knows, available or planned, in the order messages list them.
const SCHEMES: &[Scheme] = &[
    Scheme {
        scheme: "memory",
        form: "memory://",
        feature: Some("memory"),
    },
    Scheme {
        scheme: "sqlite",
        form: "sqlite:///absolute/path.db",
        feature: Some("sqlite"),
    },
    Scheme {
        scheme: "redis",
        form: "redis://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "rediss",
        form: "rediss://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "redis+sentinel",
        form: "redis+sentinel://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "rediss+sentinel",
        form: "rediss+sentinel://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "redis+cluster",
        form: "redis+cluster://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "rediss+cluster",
        form: "rediss+cluster://",
        feature: Some("redis"),
    },
    Scheme {
        scheme: "postgres",
        form: "postgres://",
        feature: Some("postgres"),
    },
    Scheme {
        scheme: "postgresql",
        form: "postgresql://",
        feature: Some("postgres"),
    },
    Scheme {
        scheme: "mysql",
        form: "mysql://",
        feature: Some("mysql"),
    },
    Scheme {
        scheme: "mariadb",
        form: "mariadb://",
        feature: Some("mysql"),
    },
    Scheme {
        scheme: "etcd",
        form: "etcd://",
        feature: Some("etcd"),
    },
    Scheme {
        scheme: "etcds",
        form: "etcds://",
        feature: Some("etcd"),
    },
];

/// Whether this build compiles in the store of cargo feature `feature`.
fn compiled_in(feature: &str) -> bool {
    const BUILD: &[(&str, bool)] = &[
        ("memory", cfg!(feature = "memory")),
        ("sqlite", cfg!(feature = "sqlite")),
        ("redis", cfg!(feature = "redis")),
        ("postgres", cfg!(feature = "postgres")),
        ("mysql", cfg!(feature = "mysql")),
        ("etcd", cfg!(feature = "etcd")),
    ];
    BUILD.iter().any(|&(f, on)| on && f == feature)
}

/// Why `scheme` cannot be opened by a build whose store features are `has_feature`, or
/// `None` when it can. Pure, so every build's answer can be tested in one build.
fn scheme_problem(scheme: &str, has_feature: &dyn Fn(&str) -> bool) -> Option<String> {
    match SCHEMES.iter().find(|s| s.scheme == scheme) {
        Some(Scheme {
            feature: Some(feature),
            ..
        }) if has_feature(feature) => None,
        Some(Scheme {
            feature: Some(feature),
            ..
        }) => Some(format!(
            "this build of tessera lacks the `{feature}` cargo feature \
             (tessera-locks = {{ version = \"0.1\", features = [\"{feature}\"] }})"
        )),
        Some(Scheme { feature: None, .. }) => Some(format!(
            "the {scheme}:// store is planned but not available in tessera yet; {}",
            expected(has_feature)
        )),
        // Echo the scheme only if it looks like one: whatever precedes "://" in a garbled
        // URL could be part of a password.
        None if scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b)) =>
        {
            Some(format!(
                "unknown scheme {scheme:?}; {}",
                expected(has_feature)
            ))
        }
        None => Some(format!("unknown scheme; {}", expected(has_feature))),
    }
}

/// "expected memory://, sqlite:///absolute/path.db, …": the schemes of this build.
fn expected(has_feature: &dyn Fn(&str) -> bool) -> String {
    let forms: Vec<&str> = SCHEMES
        .iter()
        .filter(|s| s.feature.is_some_and(has_feature))
        .map(|s| s.form)
        .collect();
    match forms.as_slice() {
        [] => "this build of tessera has no store compiled in".to_string(),
        [one] => format!("this build of tessera takes only {one}"),
        [rest @ .., last] => format!("expected {} or {last}", rest.join(", ")),
    }
}

/// The scheme of `url`, if this build has its store; otherwise
/// [`InvalidInput::StoreUrl`](tessera_core::error::InvalidInput::StoreUrl). Pure: the first
/// check [`open`] makes.
pub(crate) fn scheme_of(url: &str) -> Result<&str> {
    let bad = |reason: String| Error::bad_store_url(url, reason);
    let scheme = url.split_once("://").map(|(s, _)| s).ok_or_else(|| {
        bad("expected SCHEME://…, e.g. sqlite:///var/lib/app/tessera.db".to_string())
    })?;
    if let Some(reason) = scheme_problem(scheme, &compiled_in) {
        return Err(bad(reason));
    }
    Ok(scheme)
}

/// Opens the store named by `url`. A malformed URL, an unknown scheme or one whose store is
/// not compiled in is
/// [`InvalidInput::StoreUrl`](tessera_core::error::InvalidInput::StoreUrl), and nothing is
/// created. `open` only matters to stores that create something on connect (SQLite's file).
#[cfg_attr(
    not(any(feature = "sqlite", feature = "postgres", feature = "mysql")),
    allow(unused_variables)
)]
// A build without any store feature has only the `unreachable!` arm below.
#[cfg_attr(
    not(any(
        feature = "memory",
        feature = "sqlite",
        feature = "redis",
        feature = "postgres",
        feature = "mysql",
        feature = "etcd"
    )),
    allow(unreachable_code)
)]
pub(crate) async fn open(url: &str, open: Open) -> Result<Arc<dyn Backend>> {
    let scheme = scheme_of(url)?;
    let backend: Arc<dyn Backend> = match scheme {
        #[cfg(feature = "memory")]
        "memory" => Arc::new(memory::MemoryBackend::connect(url)?),
        #[cfg(feature = "sqlite")]
        "sqlite" => Arc::new(match open {
            Open::CreateIfMissing => sqlite::SqliteBackend::connect(url).await?,
            Open::ExistingOnly => sqlite::SqliteBackend::connect_existing(url).await?,
        }),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "rediss+sentinel" | "redis+cluster"
        | "rediss+cluster" => Arc::new(redis::RedisBackend::connect(url).await?),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Arc::new(match open {
            Open::CreateIfMissing => postgres::PostgresBackend::connect(url).await?,
            Open::ExistingOnly => postgres::PostgresBackend::connect_existing(url).await?,
        }),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Arc::new(match open {
            Open::CreateIfMissing => mysql::MysqlBackend::connect(url).await?,
            Open::ExistingOnly => mysql::MysqlBackend::connect_existing(url).await?,
        }),
        #[cfg(feature = "etcd")]
        "etcd" | "etcds" => Arc::new(etcd::EtcdBackend::connect(url).await?),
        // `scheme_problem` let through only the schemes compiled in above.
        _ => unreachable!("scheme {scheme:?} passed the check but has no store"),
    };
    Ok(backend)
}

#[cfg(test)]
mod tests {
    use tessera_core::error::InvalidInput;

    use super::*;
    use crate::store::Store;

    /// A build of exactly `features`.
    fn build(features: &'static [&'static str]) -> impl Fn(&str) -> bool {
        move |f| features.contains(&f)
    }

    #[test]
    fn a_scheme_compiled_out_names_its_cargo_feature() {
        let sqlite_only = build(&["sqlite"]);
        assert_eq!(
            scheme_problem("memory", &sqlite_only).unwrap(),
            "this build of tessera lacks the `memory` cargo feature \
             (tessera-locks = { version = \"0.1\", features = [\"memory\"] })"
        );
        for scheme in ["redis", "rediss"] {
            let why = scheme_problem(scheme, &sqlite_only).unwrap();
            assert!(why.contains("lacks the `redis` cargo feature"), "{why}");
        }
        assert_eq!(scheme_problem("sqlite", &sqlite_only), None);
        assert!(scheme_problem("sqlite", &build(&["memory"]))
            .unwrap()
            .contains("`sqlite` cargo feature"));
    }

    #[test]
    fn etcd_urls_name_the_etcd_feature_when_it_is_missing() {
        for scheme in ["etcd", "etcds"] {
            let why = scheme_problem(scheme, &build(&["sqlite"])).unwrap();
            assert!(why.contains("lacks the `etcd` cargo feature"), "{why}");
            assert_eq!(scheme_problem(scheme, &build(&["etcd"])), None);
        }
    }

    #[test]
    fn an_unknown_scheme_lists_exactly_the_compiled_in_stores() {
        assert_eq!(
            scheme_problem("ftp", &build(&["memory", "sqlite", "redis"])).unwrap(),
            "unknown scheme \"ftp\"; expected memory://, sqlite:///absolute/path.db, \
             redis://, rediss://, redis+sentinel://, rediss+sentinel://, redis+cluster:// or \
             rediss+cluster://"
        );
        assert_eq!(
            scheme_problem("ftp", &build(&["memory", "sqlite"])).unwrap(),
            "unknown scheme \"ftp\"; expected memory:// or sqlite:///absolute/path.db"
        );
        assert_eq!(
            scheme_problem("ftp", &build(&["sqlite"])).unwrap(),
            "unknown scheme \"ftp\"; this build of tessera takes only sqlite:///absolute/path.db"
        );
        assert_eq!(
            scheme_problem("u:secret@x", &build(&["memory"])).unwrap(),
            "unknown scheme; this build of tessera takes only memory://"
        );
        assert_eq!(
            scheme_problem("etcd", &build(&["memory"])).unwrap(),
            "this build of tessera lacks the `etcd` cargo feature \
             (tessera-locks = { version = \"0.1\", features = [\"etcd\"] })"
        );
    }

    /// What this very build says, through the public API.
    #[tokio::test]
    async fn this_build_names_its_own_schemes() {
        let err = Store::connect("ftp://x").await.unwrap_err();
        let Error::InvalidInput(InvalidInput::StoreUrl { reason, .. }) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(*reason, scheme_problem("ftp", &compiled_in).unwrap());
        #[cfg(all(feature = "memory", feature = "sqlite", feature = "redis"))]
        assert!(reason.contains("memory://, sqlite:///absolute/path.db, redis://, rediss://"));
        #[cfg(feature = "postgres")]
        assert!(reason.contains("postgres://, postgresql://"), "{reason}");
        #[cfg(feature = "mysql")]
        assert!(reason.contains("mysql://, mariadb://"), "{reason}");
        #[cfg(feature = "etcd")]
        assert!(reason.contains("etcd:// or etcds://"), "{reason}");
        #[cfg(not(feature = "memory"))]
        assert!(Store::connect("memory://")
            .await
            .unwrap_err()
            .to_string()
            .contains("lacks the `memory` cargo feature"));
    }
}
