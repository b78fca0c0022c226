//! The chaos runner: K worker processes hammer one semaphore through a fenced resource while
//! a scenario injects faults; afterwards the grant logs are checked.
//!
//! # How a scenario runs
//!
//! 1. A fresh store (a SQLite file in a temp dir, or a throwaway `redis-server` of its own,
//!    possibly behind a [`crate::proxy::Proxy`]) and a fresh [`fenced::FencedResource`].
//! 2. K `tessera-worker` processes loop: timed acquire or try-acquire → write every seat to
//!    the fenced resource with the fence, right away and every 20 ms → hold a random time →
//!    release. Every event goes to the worker's grant log on `CLOCK_MONOTONIC`.
//! 3. The scenario injects its faults, logging each start and heal on the same clock.
//! 4. Workers stop by themselves when the scenario's time is up; stragglers are killed.
//!    The runner waits until the store drained (no permit held, nobody queued) or reports
//!    the permits left as leaked.
//! 5. `report::analyse` checks the merged logs (C1–C4, C7 from [`crate::grantlog`]; C5,
//!    loss notices and the fenced resource here) into a [`report::ScenarioReport`].
//!
//! Every loop is bounded in count and time; every process and server is stopped when its
//! scenario ends; all traffic stays on loopback.

mod env;
pub mod fenced;
pub mod report;
mod run;
pub mod scenarios;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

pub use env::{harness, sibling_binary};
pub use report::ScenarioReport;
pub use run::Run;

/// How long and how hard to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// Seconds per scenario, one seed: part of the test suite.
    Short,
    /// Longer scenarios, several seeds: run by hand (`tessera-chaos --profile long`).
    Long,
}

/// The knobs a profile sets.
#[derive(Debug, Clone)]
pub struct Params {
    /// Worker processes.
    pub workers: usize,
    /// Semaphore capacity.
    pub permits: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// Waiter TTL of the workers.
    pub waiter_ttl: Duration,
    /// How long a plain scenario runs.
    pub duration: Duration,
    /// Seeds; each scenario runs once per seed.
    pub seeds: Vec<u64>,
    /// Waiters killed at once in the dead-waiters scenario, on a store that pushes
    /// wake-ups ([`tessera::backend::Waking::Push`]), and on MariaDB, whose waiters' polls
    /// go to the server gathered per semaphore.
    pub dead_waiters_push: u32,
    /// Same, on a store whose waiters each poll it (SQLite: every waiter polls the file).
    pub dead_waiters_polling: u32,
    /// How many times each fault is repeated in a scenario.
    pub rounds: u32,
    /// Workers as tenants ([`RunConfig::tenants`]).
    pub tenants: bool,
}

impl Profile {
    /// The parameters of the profile.
    pub fn params(self) -> Params {
        match self {
            Profile::Short => Params {
                workers: 5,
                permits: 2,
                ttl: Duration::from_millis(1000),
                waiter_ttl: Duration::from_millis(1000),
                duration: Duration::from_secs(3),
                seeds: vec![1],
                dead_waiters_push: 10_000,
                dead_waiters_polling: 300,
                rounds: 1,
                tenants: false,
            },
            Profile::Long => Params {
                workers: 8,
                permits: 3,
                ttl: Duration::from_millis(1000),
                waiter_ttl: Duration::from_millis(1000),
                duration: Duration::from_secs(12),
                seeds: vec![1, 2, 3],
                dead_waiters_push: 10_000,
                dead_waiters_polling: 1_000,
                rounds: 3,
                tenants: false,
            },
        }
    }
}

impl std::str::FromStr for Profile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "short" => Ok(Profile::Short),
            "long" => Ok(Profile::Long),
            _ => Err(format!("unknown profile {s:?}; expected short or long")),
        }
    }
}

/// Which store to run against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreSpec {
    /// A SQLite file per scenario, in a temp dir or next to the given path.
    Sqlite(Option<PathBuf>),
    /// A throwaway `redis-server` per scenario (`None`), or an existing server whose URL is
    /// given: scenarios that must restart or reconfigure the server are then skipped.
    Redis(Option<String>),
    /// A throwaway PostgreSQL server per scenario (`initdb` + `pg_ctl`).
    Postgres,
    /// A throwaway `mariadbd` per scenario (`mysql://`).
    Mariadb,
    /// A throwaway single-member etcd per scenario (`None`), or an existing cluster whose
    /// URL is given. Leases there are whole seconds of at least 2 s, so the profile's
    /// shorter TTLs are raised to 2 s.
    Etcd(Option<String>),
    /// A throwaway Sentinel topology per scenario (1 master, 1 replica, 3 sentinels), whose
    /// clients wait for `wait` replicas after every write (`?wait=N`; 0: they do not).
    RedisSentinel {
        /// The `wait` option of the URL.
        wait: u32,
    },
    /// A throwaway 3-primary Redis Cluster with one replica per primary, per scenario.
    RedisCluster,
}

impl StoreSpec {
    /// `sqlite`, `sqlite:///path/file.db`, `redis`, `redis://host:port[?…]`, `postgres`,
    /// `mariadb`, `etcd`, `etcd://host:port`, `redis+sentinel`, `redis+sentinel?wait=1` or `redis+cluster` (the last three: a
    /// throwaway topology per scenario).
    pub fn parse(s: &str) -> anyhow::Result<StoreSpec> {
        Ok(match s {
            "sqlite" | "sqlite://" => StoreSpec::Sqlite(None),
            "redis" | "redis://" => StoreSpec::Redis(None),
            "postgres" | "postgres://" => StoreSpec::Postgres,
            "mariadb" | "mysql" => StoreSpec::Mariadb,
            "etcd" | "etcd://" => StoreSpec::Etcd(None),
            _ if s.starts_with("etcd://") => {
                let hosts = s["etcd://".len()..].split('/').next().unwrap_or("");
                anyhow::ensure!(
                    hosts.split(',').all(|h| h.starts_with("127.0.0.1:")
                        || h.starts_with("localhost:")),
                    "the chaos runner only talks to loopback stores, not {hosts:?}"
                );
                StoreSpec::Etcd(Some(s.to_string()))
            }
            "redis+sentinel" => StoreSpec::RedisSentinel { wait: 0 },
            "redis+cluster" => StoreSpec::RedisCluster,
            _ if s.starts_with("redis+sentinel?wait=") => StoreSpec::RedisSentinel {
                wait: s["redis+sentinel?wait=".len()..]
                    .parse()
                    .ok()
                    .filter(|n| (1..=1).contains(n))
                    .with_context(|| format!("expected redis+sentinel?wait=1, got {s:?}"))?,
            },
            _ if s.starts_with("sqlite://") => {
                let path = &s["sqlite://".len()..];
                anyhow::ensure!(
                    path.starts_with('/'),
                    "expected sqlite:///absolute/path.db, got {s:?}"
                );
                StoreSpec::Sqlite(Some(PathBuf::from(path)))
            }
            _ if s.starts_with("redis://") => {
                let url = url::Url::parse(s).with_context(|| format!("bad store URL {s:?}"))?;
                let host = url.host_str().unwrap_or("");
                anyhow::ensure!(
                    host == "127.0.0.1" || host == "localhost" || host == "[::1]",
                    "the chaos runner only talks to loopback stores, not {host:?}"
                );
                StoreSpec::Redis(Some(s.to_string()))
            }
            _ => anyhow::bail!(
                "unknown store {s:?}; expected sqlite, sqlite:///path.db, redis, redis://127.0.0.1:PORT, redis+sentinel, redis+sentinel?wait=1, redis+cluster, postgres, mariadb, etcd or etcd://127.0.0.1:PORT"
            ),
        })
    }

    /// What a store of this spec supports (the traits of the [`harness`] it gets).
    pub fn traits(&self) -> crate::harness::StoreTraits {
        use crate::harness::StoreTraits;
        match self {
            StoreSpec::Sqlite(_) => StoreTraits::SQLITE,
            StoreSpec::Redis(None) => StoreTraits::OWN_REDIS,
            StoreSpec::Redis(Some(_)) => StoreTraits::FOREIGN_REDIS,
            // The runner freezes every process of its PostgreSQL server
            // ([`crate::servers::postgres::PostgresServer::freeze`]).
            StoreSpec::Postgres => StoreTraits {
                freezable: true,
                ..StoreTraits::OWN_POSTGRES
            },
            StoreSpec::Mariadb => StoreTraits::OWN_MARIADB,
            // Its own single member: SIGKILLed and started again on its data directory (a
            // durable restart), or frozen.
            StoreSpec::Etcd(None) => StoreTraits {
                durable_restart: true,
                freezable: true,
                ..StoreTraits::OWN_ETCD
            },
            StoreSpec::Etcd(Some(_)) => StoreTraits::OWN_ETCD,
            StoreSpec::RedisSentinel { .. } | StoreSpec::RedisCluster => {
                StoreTraits::REDIS_TOPOLOGY
            }
        }
    }

    /// `sqlite`, `redis`, `redis+sentinel`, `redis+sentinel?wait=1`, `redis+cluster`,
    /// `postgres`, `mariadb` or `etcd`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Sqlite(_) => "sqlite",
            StoreSpec::Redis(_) => "redis",
            StoreSpec::Postgres => "postgres",
            StoreSpec::Mariadb => "mariadb",
            StoreSpec::Etcd(_) => "etcd",
            StoreSpec::RedisSentinel { wait: 0 } => "redis+sentinel",
            StoreSpec::RedisSentinel { .. } => "redis+sentinel?wait=1",
            StoreSpec::RedisCluster => "redis+cluster",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The store.
    pub store: StoreSpec,
    /// The profile.
    pub profile: Profile,
    /// Only these scenarios (by name); all if empty.
    pub scenarios: Vec<String>,
    /// Only this seed, if set (instead of the profile's seeds).
    pub seed: Option<u64>,
    /// Workers as three tenants, `t0`, `t1` and `t2` in turn, with shares 1, 2 and 3
    /// (`docs/fair-shares.md`); `t0` has a ceiling of one permit fewer than the capacity (at
    /// least 1), which the grant logs are checked against like a capacity. Not on etcd,
    /// which refuses tenants.
    pub tenants: bool,
}

/// Runs the scenarios and returns one report per scenario and seed.
pub async fn run(cfg: &RunConfig) -> anyhow::Result<Vec<ScenarioReport>> {
    run_with(cfg, |_| {}).await
}

/// [`run`], calling `each` with every report as soon as its scenario ends.
pub async fn run_with(
    cfg: &RunConfig,
    mut each: impl FnMut(&ScenarioReport),
) -> anyhow::Result<Vec<ScenarioReport>> {
    let mut params = cfg.profile.params();
    if let Some(seed) = cfg.seed {
        params.seeds = vec![seed];
    }
    params.tenants = cfg.tenants;
    anyhow::ensure!(
        !(cfg.tenants && matches!(cfg.store, StoreSpec::Etcd(_))),
        "etcd keeps no tenants (docs/fair-shares.md): run without --tenants"
    );
    if let StoreSpec::Etcd(_) = cfg.store {
        // etcd keeps leases of whole seconds, at least 2 s (its backend's capabilities).
        let min = std::time::Duration::from_secs(2);
        params.ttl = params.ttl.max(min);
        params.waiter_ttl = params.waiter_ttl.max(min);
    }
    let names = scenarios::names();
    for only in &cfg.scenarios {
        anyhow::ensure!(
            names.contains(&only.as_str()),
            "unknown scenario {only:?}; known: {}",
            names.join(", ")
        );
    }
    let mut reports = Vec::new();
    for name in names {
        if !cfg.scenarios.is_empty() && !cfg.scenarios.iter().any(|s| s == name) {
            continue;
        }
        for &seed in &params.seeds {
            let r = scenarios::run(name, &cfg.store, &params, seed)
                .await
                .with_context(|| {
                    format!("scenario {name} on {} (seed {seed})", cfg.store.kind())
                })?;
            each(&r);
            reports.push(r);
        }
    }
    Ok(reports)
}
