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

pub mod fenced;
pub mod report;
pub mod scenarios;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tessera::Store;

use crate::grantlog::{EventKind, EventLog, FaultPhase};
use crate::servers::redis::RedisServer;
use crate::worker::WorkerArgs;

pub use report::ScenarioReport;

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
    /// Waiters killed at once in the dead-waiters scenario, per store kind.
    pub dead_waiters_redis: u32,
    /// Same, on SQLite (every waiter polls the file).
    pub dead_waiters_sqlite: u32,
    /// How many times each fault is repeated in a scenario.
    pub rounds: u32,
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
                dead_waiters_redis: 10_000,
                dead_waiters_sqlite: 300,
                rounds: 1,
            },
            Profile::Long => Params {
                workers: 8,
                permits: 3,
                ttl: Duration::from_millis(1000),
                waiter_ttl: Duration::from_millis(1000),
                duration: Duration::from_secs(12),
                seeds: vec![1, 2, 3],
                dead_waiters_redis: 10_000,
                dead_waiters_sqlite: 1_000,
                rounds: 3,
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
}

impl StoreSpec {
    /// `sqlite`, `sqlite:///path/file.db`, `redis` or `redis://host:port[?…]`.
    pub fn parse(s: &str) -> anyhow::Result<StoreSpec> {
        Ok(match s {
            "sqlite" | "sqlite://" => StoreSpec::Sqlite(None),
            "redis" | "redis://" => StoreSpec::Redis(None),
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
                "unknown store {s:?}; expected sqlite, sqlite:///path.db, redis or redis://127.0.0.1:PORT"
            ),
        })
    }

    /// `sqlite` or `redis`.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreSpec::Sqlite(_) => "sqlite",
            StoreSpec::Redis(_) => "redis",
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

/// Path of a binary of this crate built next to the running executable (a test binary lives
/// in `target/<profile>/deps`, the binaries in `target/<profile>`).
pub fn sibling_binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().context("exe dir")?;
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    anyhow::bail!(
        "{name} is not built next to {}; build the workspace (cargo build -p tessera-testkit) first",
        exe.display()
    )
}

/// The store of one scenario, and whatever keeps it alive.
pub struct Env {
    /// `sqlite` or `redis`.
    pub kind: &'static str,
    /// The store's URL, straight to the store.
    pub url: String,
    /// The throwaway server, if the runner owns it.
    pub redis: Option<RedisServer>,
    _dir: tempfile::TempDir,
}

impl Env {
    /// A fresh store for scenario `name`; `redis_args` are extra server options for a
    /// throwaway server.
    pub fn new(
        spec: &StoreSpec,
        name: &str,
        seed: u64,
        redis_args: &[&str],
    ) -> anyhow::Result<Env> {
        let dir = tempfile::tempdir()?;
        let tag = format!("chaos-{name}-{seed}-{:08x}", rand::random::<u32>());
        Ok(match spec {
            StoreSpec::Sqlite(None) => Env {
                kind: "sqlite",
                url: format!("sqlite://{}/tessera.db", dir.path().display()),
                redis: None,
                _dir: dir,
            },
            StoreSpec::Sqlite(Some(path)) => Env {
                kind: "sqlite",
                url: format!("sqlite://{}.{tag}.db", path.display()),
                redis: None,
                _dir: dir,
            },
            StoreSpec::Redis(None) => {
                let server = RedisServer::start_with(redis_args);
                Env {
                    kind: "redis",
                    url: format!("{}?prefix={tag}", server.url()),
                    redis: Some(server),
                    _dir: dir,
                }
            }
            StoreSpec::Redis(Some(url)) => {
                let sep = if url.contains('?') { '&' } else { '?' };
                Env {
                    kind: "redis",
                    url: format!("{url}{sep}prefix={tag}"),
                    redis: None,
                    _dir: dir,
                }
            }
        })
    }
}

/// A worker process.
struct WorkerProc {
    id: String,
    child: Child,
}

/// One scenario in progress: the store, the fenced resource, the workers and the fault log.
pub struct Run {
    /// The profile's parameters.
    pub params: Params,
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The store.
    pub env: Env,
    /// The URL workers use (through a proxy, for the network scenarios).
    pub worker_url: String,
    /// The semaphore's name.
    pub name: String,
    /// The fenced resource.
    pub fenced: fenced::FencedResource,
    /// The runner's own client of the store (straight, never through the proxy).
    pub store: Store,
    logs: tempfile::TempDir,
    faults: EventLog,
    workers: Vec<WorkerProc>,
    spawned: usize,
    started: tokio::time::Instant,
    /// How long workers run.
    pub duration: Duration,
    /// Notes for the report.
    pub notes: Vec<String>,
    /// Violations found by the scenario itself.
    pub violations: Vec<String>,
    /// Figures the scenario measured itself (e.g. reclaim times), in ms.
    pub reclaim_ms: Vec<u64>,
    /// Environment variables of the worker processes.
    pub worker_env: Vec<(String, String)>,
}

impl Run {
    /// Prepares a scenario whose workers run for `duration`.
    pub async fn new(
        scenario: &str,
        params: &Params,
        seed: u64,
        env: Env,
        worker_url: Option<String>,
        duration: Duration,
    ) -> anyhow::Result<Run> {
        let logs = tempfile::tempdir()?;
        let faults = EventLog::create(logs.path().join("runner.jsonl"))?;
        faults.log(EventKind::Capacity {
            sem: "chaos".into(),
            capacity: params.permits,
        })?;
        let store = Store::connect(&env.url)
            .await
            .with_context(|| format!("connecting to {}", env.url))?;
        Ok(Run {
            params: params.clone(),
            scenario: scenario.to_string(),
            seed,
            worker_url: worker_url.unwrap_or_else(|| env.url.clone()),
            env,
            name: "chaos".into(),
            fenced: fenced::FencedResource::start().await?,
            store,
            logs,
            faults,
            workers: Vec::new(),
            spawned: 0,
            started: tokio::time::Instant::now(),
            duration,
            notes: Vec::new(),
            violations: Vec::new(),
            reclaim_ms: Vec::new(),
            worker_env: Vec::new(),
        })
    }

    /// The directory of the grant logs.
    pub fn log_dir(&self) -> &std::path::Path {
        self.logs.path()
    }

    /// Time left until the workers stop.
    pub fn remaining(&self) -> Duration {
        self.duration.saturating_sub(self.started.elapsed())
    }

    /// The worker arguments of this run for worker `id`.
    pub fn worker_args(&self, id: &str) -> WorkerArgs {
        let ttl_ms = self.params.ttl.as_millis() as u64;
        WorkerArgs {
            ops: 1_000_000,
            hold_ms_max: ttl_ms / 2,
            ttl_ms,
            seed: Some(self.seed * 1000 + self.spawned as u64),
            try_ratio: 0.15,
            timeout_ratio: 0.85,
            timeout_ms: 20,
            timeout_ms_max: Some(2 * ttl_ms),
            duration_ms: Some(self.remaining().as_millis() as u64),
            fenced: Some(self.fenced.addr()),
            write_every_ms: 20,
            waiter_ttl_ms: Some(self.params.waiter_ttl.as_millis() as u64),
            ..WorkerArgs::new(
                &self.worker_url,
                &self.name,
                self.params.permits,
                self.logs.path().join(format!("{id}.jsonl")),
                id,
            )
        }
    }

    /// Starts the K workers; the run's clock starts now.
    pub fn start_workers(&mut self) -> anyhow::Result<()> {
        self.started = tokio::time::Instant::now();
        for _ in 0..self.params.workers {
            self.spawn_worker()?;
        }
        Ok(())
    }

    /// Starts one more worker for the rest of the run.
    pub fn spawn_worker(&mut self) -> anyhow::Result<()> {
        let id = format!("w{}", self.spawned);
        let args = self.worker_args(&id);
        self.spawned += 1;
        let child = Command::new(sibling_binary("tessera-worker")?)
            .args(args.to_args())
            .envs(self.worker_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting tessera-worker")?;
        self.workers.push(WorkerProc { id, child });
        Ok(())
    }

    /// Logs a fault.
    pub fn fault(&self, action: &str, phase: FaultPhase, worker: Option<&str>) {
        let _ = self.faults.log(EventKind::Fault {
            action: action.to_string(),
            phase,
            worker: worker.map(str::to_string),
        });
    }

    /// The workers that currently hold a permit, by the store's word: (index, id, lease).
    pub async fn holders(&mut self) -> Vec<(usize, String, tessera::LeaseId)> {
        let Ok(Some(status)) = self.store.status(&self.name).await else {
            return vec![];
        };
        let mut out = vec![];
        for lease in status.holders {
            let Some((id, pid)) = lease.holder.split_once('/') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if let Some(i) = self
                .workers
                .iter_mut()
                .position(|w| w.id == id && w.child.id() == pid)
            {
                if matches!(self.workers[i].child.try_wait(), Ok(None)) {
                    out.push((i, id.to_string(), lease.lease_id));
                }
            }
        }
        out
    }

    /// A current holder, chosen by the seed: one the store shows holding the same lease
    /// twice 30 ms apart, so that it is holding rather than still receiving its grant. Waits
    /// (up to about two seconds) for one.
    pub async fn pick_holder(&mut self, round: u32) -> Option<(usize, String, tessera::LeaseId)> {
        for _ in 0..50 {
            let before = self.holders().await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            let mut h = self.holders().await;
            h.retain(|x| before.contains(x));
            if !h.is_empty() {
                let k = (self.seed as usize + round as usize) % h.len();
                return Some(h[k].clone());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Sends `signal` to worker `i`.
    pub fn signal(&mut self, i: usize, signal: libc::c_int) {
        let pid = self.workers[i].child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid of a child we started and have not reaped yet.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// SIGKILLs worker `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        let _ = self.workers[i].child.kill();
        let _ = self.workers[i].child.wait();
    }

    /// Indices of the workers still running.
    pub fn live_workers(&mut self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| matches!(self.workers[i].child.try_wait(), Ok(None)))
            .collect()
    }

    /// Sleeps until the workers' time is up.
    pub async fn run_out(&self) {
        tokio::time::sleep(self.remaining()).await;
    }

    /// Waits for the workers to stop (killing stragglers), waits for the store to drain,
    /// and checks everything.
    pub async fn finish(mut self) -> anyhow::Result<ScenarioReport> {
        // Workers stop by themselves at the end of their duration, after at most one acquire
        // timeout (2 TTL) and one hold; give them that and a margin.
        let grace = self.params.ttl * 4 + Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + self.remaining() + grace;
        let mut stragglers = vec![];
        for i in 0..self.workers.len() {
            // A stopped worker never finishes: make sure none stays stopped.
            self.signal(i, libc::SIGCONT);
        }
        for i in 0..self.workers.len() {
            loop {
                match self.workers[i].child.try_wait() {
                    Ok(Some(status)) => {
                        // Killed workers end by a signal; a worker that failed by itself is
                        // worth a look.
                        if status.code().is_some_and(|c| c != 0) {
                            self.violations.push(format!(
                                "worker {} exited with {status}",
                                self.workers[i].id
                            ));
                        }
                        break;
                    }
                    Ok(None) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => {
                        stragglers.push(self.workers[i].id.clone());
                        self.kill(i);
                        break;
                    }
                }
            }
        }
        if !stragglers.is_empty() {
            self.violations.push(format!(
                "workers {stragglers:?} did not stop within {grace:?} of the end and were killed"
            ));
        }
        let leaked = self.drain().await;
        report::analyse(self, leaked)
    }

    /// Waits until the store holds no permit and nobody queues (killed holders' leases
    /// expire within the TTL, dead waiters leave within the waiter TTL); returns the permits
    /// still held after that.
    async fn drain(&mut self) -> u32 {
        let limit = self.params.ttl * 2 + self.params.waiter_ttl + Duration::from_secs(2);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.store.status(&self.name).await {
                Ok(None) => return 0,
                Ok(Some(s)) if s.used == 0 && s.queue.is_empty() => return 0,
                Ok(Some(s)) if tokio::time::Instant::now() > deadline => {
                    self.violations.push(format!(
                        "leak: {limit:?} after the end, {} permits still held by {:?} and {} waiters queued",
                        s.used,
                        s.holders.iter().map(|h| &h.holder).collect::<Vec<_>>(),
                        s.queue.len()
                    ));
                    return s.used.max(1);
                }
                Err(e) if tokio::time::Instant::now() > deadline => {
                    self.violations
                        .push(format!("the store did not answer after the run: {e}"));
                    return 0;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}
