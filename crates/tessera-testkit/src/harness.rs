//! Per-store harnesses for the conformance suite: each gives a test its own isolated store
//! (a private memory instance, a SQLite file in a temp dir, a key prefix on a throwaway
//! server), new clients of it with their own connection and fault switches, and says whether
//! other processes can share it.

use std::any::Any;
use std::sync::Arc;

use tessera::Store;

use crate::faults::{Faults, FaultyBackend};

/// One client of the store under test.
pub struct Client {
    /// The store handle (its backend obeys `faults`).
    pub store: Store,
    /// Fault switches of this client only.
    pub faults: Arc<Faults>,
}

/// An isolated store for one test.
pub struct Harness {
    kind: &'static str,
    url: String,
    multi_process: bool,
    _guard: Box<dyn Any + Send + Sync>,
}

impl Harness {
    /// A harness over any store URL; `guard` keeps servers or temp dirs alive.
    pub fn new(
        kind: &'static str,
        url: String,
        multi_process: bool,
        guard: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Harness {
            kind,
            url,
            multi_process,
            _guard: guard,
        }
    }

    /// A private in-memory instance.
    pub fn memory() -> Self {
        let url = format!("memory://t{:016x}", rand::random::<u64>());
        Harness::new("memory", url, false, Box::new(()))
    }

    /// A SQLite file in a fresh temp dir.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}/tessera.db", dir.path().display());
        Harness::new("sqlite", url, true, Box::new(dir))
    }

    /// A throwaway `redis-server` of its own (stopped when the harness drops), under a
    /// random key prefix.
    pub fn redis() -> Self {
        let server = crate::servers::redis::RedisServer::start();
        let url = format!("{}?prefix=t{:08x}", server.url(), rand::random::<u32>());
        Harness::new("redis", url, true, Box::new(server))
    }

    /// Which store this is.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The URL of the store under test.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether other processes can share this store (enables the multi-process tests).
    pub fn multi_process(&self) -> bool {
        self.multi_process
    }

    /// A new client: its own connection and its own fault switches.
    pub async fn client(&self) -> Client {
        let store = Store::connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", self.url));
        let faults = Arc::new(Faults::default());
        let backend = FaultyBackend::new(Arc::clone(store.backend()), Arc::clone(&faults));
        Client {
            store: Store::from_backend(Arc::new(backend), &self.url),
            faults,
        }
    }
}
