//! The stores that keep tenant limits, each private to one test, for the tests of tenant
//! limits and window ceilings: the memory store (the reference model), SQLite in a file of
//! its own, and throwaway MariaDB, PostgreSQL, Redis and Redis Cluster servers.
#![allow(dead_code)] // each test file runs its scenarios on the stores it needs

use tessera::{LeaseId, Store};

/// What a store of a test needs kept alive while it is used: its file's directory, or its
/// throwaway server.
type Keep = Option<Box<dyn std::any::Any + Send>>;

/// A store private to one test, with what keeps it alive.
pub struct Fixture {
    pub store: Store,
    _keep: Keep,
}

pub async fn memory(test: &str) -> Fixture {
    let url = format!("memory://tenants-{test}-{}", LeaseId::random());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: None,
    }
}

/// A throwaway PostgreSQL server (stopped on drop), its schema named after the test.
#[cfg(feature = "postgres")]
pub async fn postgres(test: &str) -> Fixture {
    let server = tessera_testkit::servers::postgres::PostgresServer::start();
    Fixture {
        store: Store::connect(&server.url_with_schema(test)).await.unwrap(),
        _keep: Some(Box::new(server)),
    }
}

/// A file of its own in a temporary directory.
#[cfg(feature = "sqlite")]
pub async fn sqlite(test: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/{test}.db", dir.path().display());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: Some(Box::new(dir)),
    }
}

/// A throwaway MariaDB (it dies with the thread that started it: the test's own).
#[cfg(feature = "mysql")]
pub async fn mariadb(test: &str) -> Fixture {
    let server = tessera_testkit::servers::mysql::MariaDbServer::start();
    Fixture {
        store: Store::connect(&server.url(test)).await.unwrap(),
        _keep: Some(Box::new(server)),
    }
}

/// A throwaway `redis-server` per test.
#[cfg(feature = "redis")]
pub async fn redis(test: &str) -> Fixture {
    let server = tessera_testkit::servers::redis::RedisServer::start();
    let url = format!("{}?prefix=tenants-{test}", server.url());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: Some(Box::new(server)),
    }
}

/// A throwaway Redis Cluster (three primaries) per test: a name's semaphore, its limiter
/// and its tenants' own limiters share one slot.
#[cfg(feature = "redis")]
pub async fn redis_cluster(test: &str) -> Fixture {
    let cluster = tessera_testkit::servers::redis_cluster::RedisCluster::start(false);
    let url = format!("{}?prefix=tenants-{test}", cluster.url());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: Some(Box::new(cluster)),
    }
}
