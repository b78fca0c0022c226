//! Per-store harnesses, shared by the conformance suite, the chaos runner and the bench
//! tests: each gives its user an isolated store (a private memory instance, a SQLite file in
//! a temp dir, a key prefix on a throwaway server), new clients of it with their own
//! connection and fault switches, the faults it can inject on the server (restart, freeze,
//! cut), and says what the store supports ([`StoreTraits`]).
//!
//! What the *backend* can do (how waiters are woken, the minimum TTL, where fences come from,
//! when the hand-off runs) is declared by the backend itself,
//! [`tessera::backend::Capabilities`], and read with [`Harness::capabilities`]. What is about
//! the *test server* (can another process share it, can the harness restart it, whose clock
//! is the store's) is declared here. A test or scenario that needs a trait the store lacks
//! calls [`Harness::skip_unless`], which prints why it is skipped.

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tessera::backend::Capabilities;
use tessera::Store;

use crate::faults::{Faults, FaultyBackend};
use crate::servers::etcd::EtcdCluster;
use crate::servers::mysql::MariaDbServer;
use crate::servers::pgbouncer::PgBouncer;
use crate::servers::postgres::{PostgresServer, Shutdown};
use crate::servers::redis::RedisServer;
use crate::servers::redis_cluster::RedisCluster;
use crate::servers::redis_sentinel::SentinelTopology;

/// Whose clock the store's time is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockSource {
    /// Every client reads its host's wall clock (memory, SQLite): shifting a client's clock
    /// (libfaketime) shifts the store's time.
    Host,
    /// The server keeps the time (Redis `TIME`): clients' clocks do not matter.
    Server,
}

/// What the store under test and its test server support, beyond what the backend declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreTraits {
    /// Other processes can open the same store (a file, a server), so holders in other
    /// processes can be killed.
    pub multi_process: bool,
    /// Whose clock the store's time is.
    pub clock: ClockSource,
    /// Clients reach a server over TCP (not a file or the process's own memory).
    pub server: bool,
    /// The harness owns the server and can kill it and start it again on the same port; it
    /// comes back empty ([`Harness::restart`]).
    pub restartable: bool,
    /// The harness can start its server so that a restart keeps the data (an append-only
    /// file synced on every write).
    pub durable_restart: bool,
    /// The harness can freeze the server (every connection stays open, nothing answers) and
    /// thaw it ([`Harness::freeze`], [`Harness::thaw`]).
    pub freezable: bool,
    /// The harness owns the server's port, so a proxy in front of it can delay, black-hole
    /// and reset the clients' connections ([`Harness::server_port`]).
    pub proxyable: bool,
    /// The harness can close every client connection at the server ([`Harness::cut_clients`]).
    pub cuttable: bool,
    /// The harness can start its server with a memory limit under which it evicts keys.
    pub evicting: bool,
    /// The harness can write into the store's own data (rows, keys) behind the client.
    pub raw_access: bool,
}

/// A trait of [`StoreTraits`] (or of the backend's [`Capabilities`]) that a test needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// [`StoreTraits::multi_process`].
    MultiProcess,
    /// [`ClockSource::Host`].
    HostClock,
    /// [`StoreTraits::server`].
    Server,
    /// [`StoreTraits::restartable`].
    Restart,
    /// [`StoreTraits::durable_restart`].
    DurableRestart,
    /// [`StoreTraits::freezable`].
    Freeze,
    /// [`StoreTraits::proxyable`].
    Proxy,
    /// [`StoreTraits::cuttable`].
    CutClients,
    /// [`StoreTraits::evicting`].
    Eviction,
    /// [`StoreTraits::raw_access`].
    RawAccess,
}

impl StoreTraits {
    /// A store in the process's own memory.
    pub const IN_PROCESS: StoreTraits = StoreTraits {
        multi_process: false,
        clock: ClockSource::Host,
        server: false,
        restartable: false,
        durable_restart: false,
        freezable: false,
        proxyable: false,
        cuttable: false,
        evicting: false,
        raw_access: false,
    };

    /// A SQLite file.
    pub const SQLITE: StoreTraits = StoreTraits {
        multi_process: true,
        raw_access: true,
        ..StoreTraits::IN_PROCESS
    };

    /// A `redis-server` the harness started.
    pub const OWN_REDIS: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        restartable: true,
        durable_restart: true,
        freezable: true,
        proxyable: true,
        cuttable: true,
        evicting: true,
        raw_access: true,
    };

    /// An etcd cluster the harness started (its server keeps the time; members can be
    /// killed, restarted and frozen through [`Harness::etcd_cluster`], and reached through
    /// a proxy on their client ports, [`crate::servers::etcd::EtcdCluster::client_port`]).
    pub const OWN_ETCD: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        proxyable: true,
        ..StoreTraits::IN_PROCESS
    };

    /// A Redis server someone else runs.
    pub const FOREIGN_REDIS: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        cuttable: true,
        ..StoreTraits::IN_PROCESS
    };

    /// A PostgreSQL server the harness started (`initdb` + `pg_ctl`): a restart keeps the
    /// data (it is a database), so it is a durable restart; no freeze, no eviction.
    pub const OWN_POSTGRES: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        restartable: false,
        durable_restart: true,
        freezable: false,
        proxyable: true,
        cuttable: true,
        evicting: false,
        raw_access: true,
    };

    /// A `mariadbd` the harness started: it can restart it (committed data survives, so
    /// this is a durable restart, never one that comes back empty), freeze it, proxy it,
    /// kill its connections and write into its rows.
    pub const OWN_MARIADB: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        durable_restart: true,
        freezable: true,
        proxyable: true,
        cuttable: true,
        raw_access: true,
        ..StoreTraits::IN_PROCESS
    };

    /// A Redis topology the harness started (Sentinel or Cluster): its faults are
    /// failovers ([`Harness::sentinel_mut`], [`Harness::cluster_mut`]), not the one-server
    /// faults above.
    pub const REDIS_TOPOLOGY: StoreTraits = StoreTraits {
        multi_process: true,
        clock: ClockSource::Server,
        server: true,
        ..StoreTraits::IN_PROCESS
    };

    /// Why a store with these traits cannot serve `need`, or `None` if it can.
    pub fn lacks(&self, need: Need) -> Option<&'static str> {
        let (has, why) = match need {
            Need::MultiProcess => (self.multi_process, "is in-process (no multi-process)"),
            Need::HostClock => (
                self.clock == ClockSource::Host,
                "keeps its own clock on the server (no host clock to shift)",
            ),
            Need::Server => (self.server, "has no server"),
            Need::Restart => (
                self.restartable,
                "has no server the harness owns (no restart)",
            ),
            Need::DurableRestart => (
                self.durable_restart,
                "has no server the harness can restart with its data (no durable restart)",
            ),
            Need::Freeze => (self.freezable, "has no server the harness owns (no freeze)"),
            Need::Proxy => (
                self.proxyable,
                "has no network connection the harness can proxy (no proxy)",
            ),
            Need::CutClients => (
                self.cuttable,
                "has no connections the harness can cut (no cut)",
            ),
            Need::Eviction => (
                self.evicting,
                "has no server the harness can give a memory limit (no eviction)",
            ),
            Need::RawAccess => (
                self.raw_access,
                "has no data the harness can write behind the client (no raw access)",
            ),
        };
        (!has).then_some(why)
    }
}

/// One client of the store under test.
pub struct Client {
    /// The store handle (its backend obeys `faults`).
    pub store: Store,
    /// Fault switches of this client only.
    pub faults: Arc<Faults>,
}

/// An isolated store for one test or scenario, with the server behind it (if any).
pub struct Harness {
    scheme: &'static str,
    url: String,
    traits: StoreTraits,
    redis: Option<RedisServer>,
    postgres: Option<PostgresServer>,
    /// A pooler between the clients and `postgres` ([`Harness::postgres_pgbouncer`]).
    pgbouncer: Option<PgBouncer>,
    mariadb: Option<MariaDbServer>,
    sqlite_file: Option<PathBuf>,
    _guard: Box<dyn Any + Send + Sync>,
}

impl Harness {
    /// A harness over any store URL with the traits it declares; `guard` keeps temp dirs or
    /// servers alive (a store in another crate plugs in here).
    pub fn new(
        scheme: &'static str,
        url: String,
        traits: StoreTraits,
        guard: Box<dyn Any + Send + Sync>,
    ) -> Self {
        Harness {
            scheme,
            url,
            traits,
            redis: None,
            postgres: None,
            pgbouncer: None,
            mariadb: None,
            sqlite_file: None,
            _guard: guard,
        }
    }

    /// A private in-memory instance.
    pub fn memory() -> Self {
        let url = format!("memory://t{:016x}", rand::random::<u64>());
        Harness::new("memory://", url, StoreTraits::IN_PROCESS, Box::new(()))
    }

    /// A SQLite file in a fresh temp dir.
    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = dir.path().join("tessera.db");
        let mut h = Harness::sqlite_file(&file);
        h._guard = Box::new(dir);
        h
    }

    /// A SQLite file at `file` (absolute), created on first use and left in place.
    pub fn sqlite_file(file: &Path) -> Self {
        let url = format!("sqlite://{}", file.display());
        let mut h = Harness::new("sqlite://", url, StoreTraits::SQLITE, Box::new(()));
        h.sqlite_file = Some(file.to_path_buf());
        h
    }

    /// A throwaway `redis-server` of its own (stopped when the harness drops), under a
    /// random key prefix.
    pub fn redis() -> Self {
        Harness::redis_with(&[], &format!("t{:08x}", rand::random::<u32>()))
    }

    /// A throwaway `redis-server` started with `server_args` (e.g. `--appendonly yes`), with
    /// tessera's keys under `prefix`.
    pub fn redis_with(server_args: &[&str], prefix: &str) -> Self {
        let server = RedisServer::start_with(server_args);
        let url = format!("{}?prefix={prefix}", server.url());
        let mut h = Harness::new("redis://", url, StoreTraits::OWN_REDIS, Box::new(()));
        h.redis = Some(server);
        h
    }

    /// A Redis server someone else runs (at `url`), with tessera's keys under `prefix`: the
    /// harness can cut its clients but not restart, freeze or reconfigure it.
    pub fn redis_at(url: &str, prefix: &str) -> Self {
        let sep = if url.contains('?') { '&' } else { '?' };
        let url = format!("{url}{sep}prefix={prefix}");
        Harness::new("redis://", url, StoreTraits::FOREIGN_REDIS, Box::new(()))
    }

    /// A throwaway PostgreSQL server of its own (stopped when the harness drops), with
    /// tessera's tables in a random schema.
    pub fn postgres() -> Self {
        let server = PostgresServer::start();
        let url = server.url_with_schema(&format!("t{:08x}", rand::random::<u32>()));
        let mut h = Harness::new("postgres://", url, StoreTraits::OWN_POSTGRES, Box::new(()));
        h.postgres = Some(server);
        h
    }

    /// A throwaway PostgreSQL server behind a throwaway PgBouncer in session pooling mode
    /// with its stock settings; the clients connect to the pooler. Faults act on the server
    /// (restarts, killed backends), the fault proxy sits between the clients and the pooler.
    pub fn postgres_pgbouncer() -> Self {
        let server = PostgresServer::start();
        let pooler = PgBouncer::start(server.port());
        let url = format!("{}?schema=t{:08x}", pooler.url(), rand::random::<u32>());
        let mut h = Harness::new("postgres://", url, StoreTraits::OWN_POSTGRES, Box::new(()));
        h.postgres = Some(server);
        h.pgbouncer = Some(pooler);
        h
    }

    /// The PostgreSQL server the harness owns, for faults only it has (restarts by mode,
    /// killed backends, read-only, rows).
    pub fn postgres_server(&self) -> Option<&PostgresServer> {
        self.postgres.as_ref()
    }

    /// The same, mutable (restarts).
    pub fn postgres_server_mut(&mut self) -> Option<&mut PostgresServer> {
        self.postgres.as_mut()
    }

    /// A throwaway `mariadbd` of its own (stopped when the harness drops), with tessera's
    /// tables in a fresh database.
    pub fn mariadb() -> Self {
        Harness::mariadb_with(&[])
    }

    /// A throwaway `mariadbd` started with `server_args`, tessera's tables in database `t`.
    pub fn mariadb_with(server_args: &[&str]) -> Self {
        let server = MariaDbServer::start_with(server_args);
        let url = server.url("t");
        let mut h = Harness::new("mysql://", url, StoreTraits::OWN_MARIADB, Box::new(()));
        h.mariadb = Some(server);
        h
    }

    /// A throwaway single-member etcd cluster (stopped when the harness drops), under a
    /// random key prefix.
    pub fn etcd() -> Self {
        Harness::etcd_with(1)
    }

    /// A throwaway etcd cluster of `members` members on loopback ports, under a random key
    /// prefix; [`Harness::etcd_cluster`] injects faults into it.
    pub fn etcd_with(members: usize) -> Self {
        let cluster = EtcdCluster::start(members);
        let url = format!("{}/t{:08x}", cluster.url(), rand::random::<u32>());
        Harness::new("etcd://", url, StoreTraits::OWN_ETCD, Box::new(cluster))
    }

    /// The etcd cluster the harness owns, for its faults (kill, restart, freeze a member,
    /// compaction).
    pub fn etcd_cluster(&mut self) -> Option<&mut EtcdCluster> {
        self._guard.downcast_mut::<EtcdCluster>()
    }

    /// A throwaway Sentinel topology of its own (1 master, 1 replica, 3 sentinels; stopped
    /// when the harness drops) behind `redis+sentinel://…?prefix=<random>`; `options` are
    /// more URL options (e.g. `&wait=1`).
    pub fn redis_sentinel(options: &str) -> Self {
        let topo = SentinelTopology::start();
        let url = format!(
            "{}?prefix=t{:08x}{options}",
            topo.url(),
            rand::random::<u32>()
        );
        Harness::new(
            "redis+sentinel://",
            url,
            StoreTraits::REDIS_TOPOLOGY,
            Box::new(topo),
        )
    }

    /// A throwaway 3-primary Redis Cluster of its own (with a replica per primary if
    /// `replicas`; stopped when the harness drops) behind `redis+cluster://…?prefix=<random>`.
    pub fn redis_cluster(replicas: bool) -> Self {
        let cluster = RedisCluster::start(replicas);
        let url = format!("{}?prefix=t{:08x}", cluster.url(), rand::random::<u32>());
        Harness::new(
            "redis+cluster://",
            url,
            StoreTraits::REDIS_TOPOLOGY,
            Box::new(cluster),
        )
    }

    /// The Sentinel topology of a [`Harness::redis_sentinel`], for failovers.
    pub fn sentinel_mut(&mut self) -> Option<&mut SentinelTopology> {
        self._guard.downcast_mut()
    }

    /// The cluster of a [`Harness::redis_cluster`], for failovers.
    pub fn cluster_mut(&mut self) -> Option<&mut RedisCluster> {
        self._guard.downcast_mut()
    }

    /// The store's URL scheme (`memory://`, `sqlite://`, `redis://`), for messages.
    pub fn scheme(&self) -> &'static str {
        self.scheme
    }

    /// The URL of the store under test.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// What the store and its test server support.
    pub fn traits(&self) -> &StoreTraits {
        &self.traits
    }

    /// What the backend declares about itself (waking, minimum TTL, fences, hand-off).
    pub async fn capabilities(&self) -> Capabilities {
        self.client().await.store.backend().capabilities()
    }

    /// `true` (and a line on stderr naming what is missing) if the store cannot serve
    /// `need`: the caller returns at once, e.g.
    /// `if h.skip_unless(Need::MultiProcess) { return; }`.
    pub fn skip_unless(&self, need: Need) -> bool {
        match self.traits.lacks(need) {
            Some(why) => {
                let test = std::thread::current()
                    .name()
                    .unwrap_or("this test")
                    .to_string();
                eprintln!("skipped: {test}: {} {why}", self.scheme);
                true
            }
            None => false,
        }
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

    /// The loopback port of the server the harness owns ([`StoreTraits::proxyable`]).
    pub fn server_port(&self) -> Option<u16> {
        if let Some(p) = &self.pgbouncer {
            return Some(p.port());
        }
        if let Some(s) = &self.redis {
            return Some(s.port());
        }
        if let Some(s) = &self.postgres {
            return Some(s.port());
        }
        if let Some(s) = &self.mariadb {
            return Some(s.port());
        }
        if self.traits.server {
            return url::Url::parse(&self.url).ok()?.port();
        }
        None
    }

    /// Kills the server and starts it again on the same port ([`StoreTraits::restartable`]);
    /// blocks until it answers. Panics without one.
    pub fn restart(&mut self) {
        if let Some(pg) = &mut self.postgres {
            pg.restart_with(Shutdown::Immediate);
            return;
        }
        // MariaDB's restart keeps the committed data (StoreTraits::durable_restart).
        if let Some(s) = &mut self.mariadb {
            return s.restart();
        }
        // etcd: member 0 is SIGKILLed and started again on its data directory.
        if let Some(c) = self.etcd_cluster() {
            return c.restart(0);
        }
        self.own_redis_mut("restart").restart();
    }

    /// Freezes the server ([`StoreTraits::freezable`]): Redis, MariaDB, every process of
    /// PostgreSQL, or etcd's member 0. Panics without one.
    pub fn freeze(&self) {
        if let Some(s) = &self.mariadb {
            return s.freeze();
        }
        if let Some(s) = &self.postgres {
            return s.freeze();
        }
        if let Some(c) = self._guard.downcast_ref::<EtcdCluster>() {
            return c.freeze(0);
        }
        self.own_redis("freeze").freeze();
    }

    /// Thaws a frozen server.
    pub fn thaw(&self) {
        if let Some(s) = &self.mariadb {
            return s.thaw();
        }
        if let Some(s) = &self.postgres {
            return s.thaw();
        }
        if let Some(c) = self._guard.downcast_ref::<EtcdCluster>() {
            return c.thaw(0);
        }
        self.own_redis("thaw").thaw();
    }

    /// Closes every client connection at the server ([`StoreTraits::cuttable`]).
    pub fn cut_clients(&self) -> anyhow::Result<()> {
        if let Some(s) = &self.redis {
            s.cut_clients();
            return Ok(());
        }
        if let Some(s) = &self.postgres {
            s.terminate_all();
            return Ok(());
        }
        if let Some(s) = &self.mariadb {
            s.cut_clients();
            return Ok(());
        }
        anyhow::ensure!(self.traits.cuttable, "{} cannot cut clients", self.scheme);
        let port = self
            .server_port()
            .ok_or_else(|| anyhow::anyhow!("no port in {}", self.url))?;
        for kind in ["normal", "pubsub"] {
            crate::servers::redis::command_at(port, &["CLIENT", "KILL", "TYPE", kind])?;
        }
        Ok(())
    }

    /// The Redis server the harness owns, for faults only Redis has (eviction, its keys).
    pub fn redis_server(&self) -> Option<&RedisServer> {
        self.redis.as_ref()
    }

    /// The MariaDB server the harness owns, for faults written into its rows.
    pub fn mariadb_server(&self) -> Option<&MariaDbServer> {
        self.mariadb.as_ref()
    }

    /// The SQLite file, for faults written into its rows.
    pub fn sqlite_path(&self) -> Option<&Path> {
        self.sqlite_file.as_deref()
    }

    fn own_redis(&self, what: &str) -> &RedisServer {
        self.redis
            .as_ref()
            .unwrap_or_else(|| panic!("{what}: {} has no server of its own", self.scheme))
    }

    fn own_redis_mut(&mut self, what: &str) -> &mut RedisServer {
        let scheme = self.scheme;
        self.redis
            .as_mut()
            .unwrap_or_else(|| panic!("{what}: {scheme} has no server of its own"))
    }
}
