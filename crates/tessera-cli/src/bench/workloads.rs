//! Running one workload: the clients, the independent over-grant check, the round-trip limit
//! and the server CPU.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::time::Instant;

use super::args::{BenchArgs, Workload};
use super::clients::{histogram, join_clients};
use super::pauses::{LongWaits, PauseFigures, Pauses};
use super::report::WorkloadReport;

/// One workload, its defaults overridden by the command line.
#[derive(Debug, Clone)]
pub struct Spec {
    /// `w1`, `w2` or `w3`.
    pub name: &'static str,
    /// Number of clients, each with its own store connection.
    pub clients: usize,
    /// Capacity of the semaphore.
    pub capacity: u32,
    /// Pairs (W1) or grants (W2, W3) to run.
    pub ops: u64,
    /// How long each holder keeps its permit.
    pub hold: Duration,
    /// Hard time bound.
    pub duration: Duration,
    /// Extra holders kept on the semaphore during the workload (its capacity is raised by as
    /// many), to see how the per-operation cost grows with the number of holders.
    pub preload: u32,
    /// Runtime worker threads (`--threads`; 0: one current-thread runtime).
    pub threads: usize,
}

impl Spec {
    /// The report of a run of this workload, with the figures every workload measures
    /// alike: `done` operations in `secs` and the acquire latencies (µs) in `latency`. What a
    /// workload measures its own way starts empty (no hand-offs, no spread over clients, no
    /// check, costs or pauses), for the caller to fill in.
    pub(super) fn report(
        &self,
        store_url: &str,
        done: u64,
        secs: f64,
        latency: &Histogram<u64>,
    ) -> WorkloadReport {
        let ms = |us: u64| us as f64 / 1000.0;
        WorkloadReport {
            workload: self.name.to_string(),
            store: tessera::backend::redact_url(store_url),
            clients: self.clients,
            capacity: self.capacity,
            preload: self.preload,
            threads: self.threads,
            hold_ms: self.hold.as_secs_f64() * 1000.0,
            ops: done,
            completed: done >= self.ops,
            seconds: secs,
            ops_per_sec: done as f64 / secs,
            handoffs_per_sec: 0.0,
            p50_ms: ms(latency.value_at_quantile(0.50)),
            p99_ms: ms(latency.value_at_quantile(0.99)),
            max_ms: ms(latency.max()),
            first_acquire_max_ms: None,
            grants_per_client_min: 0,
            grants_per_client_max: 0,
            max_holders_seen: 0,
            over_grants: 0,
            over_grant_check: "in-process-counter".to_string(),
            server_cpu_us_per_grant: None,
            rtt_per_sec: None,
            rtt_limit_ratio: None,
            errors: 0,
            node_cpu_us_per_grant: Vec::new(),
            pauses: None,
        }
    }

    /// The workload's defaults (docs/performance.md) with the overrides of `args`.
    pub fn new(w: Workload, args: &BenchArgs) -> Spec {
        let (name, clients, capacity) = match w {
            Workload::W1 => ("w1", 1, 10),
            Workload::W2 | Workload::EtcdMutex => ("w2", 8, 1),
            Workload::Many => ("many", 4, 1),
            Workload::Depth => ("depth", 1_000, 1),
            Workload::W3
            | Workload::All
            | Workload::Rate
            | Workload::Admission
            | Workload::Tenants => ("w3", 32, 4),
        };
        Spec {
            name,
            clients: args.clients.unwrap_or(clients).max(1),
            capacity: args.capacity.unwrap_or(capacity).max(1),
            ops: args.ops.max(1),
            hold: args.hold,
            duration: args.duration,
            preload: args.preload,
            threads: args.threads,
        }
    }
}

/// Nobody has been granted yet (for hand-off counting).
const NOBODY: usize = usize::MAX;

/// The state all clients of one workload share.
struct Shared {
    spec: Spec,
    /// Operations claimed so far (a client claims one before acquiring).
    claimed: AtomicU64,
    /// Operations completed.
    done: AtomicU64,
    /// The client granted last, and the hand-offs counted.
    last: AtomicUsize,
    handoffs: AtomicU64,
    errors: AtomicU64,
    deadline: Instant,
    progress: ProgressBar,
    /// The clients' waits longer than [`LONG_WAIT`](super::pauses::LONG_WAIT).
    long_waits: LongWaits,
}

impl Shared {
    /// The state of a run of `spec` started at `start`: nothing claimed, done or handed off.
    fn new(spec: &Spec, start: Instant, progress: &ProgressBar) -> Arc<Shared> {
        Arc::new(Shared {
            spec: spec.clone(),
            claimed: AtomicU64::new(0),
            done: AtomicU64::new(0),
            last: AtomicUsize::new(NOBODY),
            handoffs: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            deadline: start + spec.duration,
            progress: progress.clone(),
            long_waits: LongWaits::default(),
        })
    }
}

/// The independent over-grant check: a counter of current holders kept outside tessera.
#[derive(Clone)]
enum Check {
    /// A counter key on the same Redis (INCR on entry, DECR on exit), one connection per
    /// client.
    Redis {
        conn: redis::aio::MultiplexedConnection,
        key: String,
    },
    /// An in-process counter (every client of this workload is a task of this process).
    Local(Arc<AtomicI64>),
}

impl Check {
    /// Counts a holder in; returns the number of holders now.
    async fn enter(&mut self) -> anyhow::Result<i64> {
        match self {
            Check::Redis { conn, key } => Ok(redis::cmd("INCR")
                .arg(&*key)
                .query_async(conn)
                .await
                .context("over-grant check: INCR")?),
            Check::Local(n) => Ok(n.fetch_add(1, Ordering::SeqCst) + 1),
        }
    }

    /// Counts a holder out.
    async fn exit(&mut self) -> anyhow::Result<()> {
        match self {
            Check::Redis { conn, key } => {
                let _: i64 = redis::cmd("DECR")
                    .arg(&*key)
                    .query_async(conn)
                    .await
                    .context("over-grant check: DECR")?;
                Ok(())
            }
            Check::Local(n) => {
                n.fetch_sub(1, Ordering::SeqCst);
                Ok(())
            }
        }
    }
}

/// What one client measured.
struct ClientResult {
    probe: Option<Interleaved>,
    grants: u64,
    latency: Histogram<u64>,
    max_holders: i64,
    over_grants: u64,
}

/// [`Spec::report`] of a run of [`client`]s (after [`warm_up`], whose first acquires are
/// `cold`), with what they measured: hand-offs, the spread of grants over clients, the
/// independent check's findings, pauses and errors.
fn clients_report(
    spec: &Spec,
    store_url: &str,
    elapsed: Duration,
    results: &[ClientResult],
    shared: &Shared,
    cold: &Histogram<u64>,
    pauses: PauseFigures,
) -> WorkloadReport {
    let mut latency = histogram();
    for r in results {
        latency.add(&r.latency).expect("same bounds");
    }
    let done = shared.done.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64().max(1e-9);
    WorkloadReport {
        handoffs_per_sec: shared.handoffs.load(Ordering::Relaxed) as f64 / secs,
        first_acquire_max_ms: Some(cold.max() as f64 / 1000.0),
        grants_per_client_min: results.iter().map(|r| r.grants).min().unwrap_or(0),
        grants_per_client_max: results.iter().map(|r| r.grants).max().unwrap_or(0),
        max_holders_seen: results.iter().map(|r| r.max_holders).max().unwrap_or(0),
        over_grants: results.iter().map(|r| r.over_grants).sum(),
        pauses: Some(pauses),
        errors: shared.errors.load(Ordering::Relaxed),
        ..spec.report(store_url, done, secs, &latency)
    }
}

/// The redis-rs URL of a tessera `redis://` URL (tessera's own options removed), or `None`
/// for other stores.
fn redis_url(store_url: &str) -> Option<String> {
    if !(store_url.starts_with("redis://") || store_url.starts_with("rediss://")) {
        return None;
    }
    Some(match store_url.split_once('?') {
        Some((base, _)) => base.to_string(),
        None => store_url.to_string(),
    })
}

async fn redis_conn(url: &str) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(url).context("redis URL")?;
    client
        .get_multiplexed_async_connection()
        .await
        .context("connecting to redis")
}

/// One client's bare round trips per second (`PING` on its own connection) for `time`;
/// `None` on stores without a bare round trip.
async fn round_trips(store_url: &str, time: Duration) -> anyhow::Result<Option<f64>> {
    let Some(url) = redis_url(store_url) else {
        return Ok(None);
    };
    let mut conn = redis_conn(&url).await?;
    // Warm up the connection.
    for _ in 0..100 {
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
    }
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < time {
        for _ in 0..100 {
            let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        }
        n += 100;
    }
    Ok(Some(n as f64 / start.elapsed().as_secs_f64()))
}

/// Round-trip slices interleaved with a single client's operations, so that the workload and
/// its round-trip limit see the same machine load (other processes come and go).
struct Interleaved {
    conn: redis::aio::MultiplexedConnection,
    /// A slice every `every` operations, of `slice` each.
    every: u64,
    slice: Duration,
    pings: u64,
    ping_time: Duration,
    /// Redis CPU time the slices took (µs), which is not the workload's.
    ping_cpu_us: f64,
}

/// Slices per workload.
const SLICES: u64 = 10;

impl Interleaved {
    async fn slice(&mut self) -> anyhow::Result<()> {
        let cpu_before = server_cpu_us(&mut self.conn).await?;
        let start = Instant::now();
        while start.elapsed() < self.slice {
            for _ in 0..20 {
                let _: String = redis::cmd("PING").query_async(&mut self.conn).await?;
            }
            self.pings += 20;
        }
        self.ping_time += start.elapsed();
        self.ping_cpu_us += server_cpu_us(&mut self.conn).await? - cpu_before;
        Ok(())
    }
}

/// Redis CPU time (system + user) in microseconds.
async fn server_cpu_us(conn: &mut redis::aio::MultiplexedConnection) -> anyhow::Result<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await?;
    let mut total = 0.0;
    for line in info.lines() {
        for field in ["used_cpu_sys:", "used_cpu_user:"] {
            if let Some(v) = line.strip_prefix(field) {
                total += v.trim().parse::<f64>().context("INFO cpu")?;
            }
        }
    }
    Ok(total * 1e6)
}

/// Runs one workload and measures it (with the round-trip limit around it).
pub async fn run(
    store_url: &str,
    spec: &Spec,
    rtt_time: Duration,
) -> anyhow::Result<WorkloadReport> {
    let redis = redis_url(store_url);
    let run_id = format!("{:08x}", rand::random::<u32>());
    let sem_name = format!("tessera-bench-{}-{run_id}", spec.name);

    // Every client its own store connection, opened before the clock starts.
    let mut stores = Vec::with_capacity(spec.clients);
    for _ in 0..spec.clients {
        stores.push(tessera::Store::connect(store_url).await?);
    }
    let mut checks = Vec::with_capacity(spec.clients);
    let check_key = format!("tessera-bench-check:{run_id}");
    let local = Arc::new(AtomicI64::new(0));
    for _ in 0..spec.clients {
        checks.push(match &redis {
            // With one client at most one permit is held at a time by construction: the
            // Redis counter would only add two round trips per pair to W1, so one client
            // is checked in process.
            Some(url) if spec.clients > 1 => Check::Redis {
                conn: redis_conn(url).await?,
                key: check_key.clone(),
            },
            _ => Check::Local(Arc::clone(&local)),
        });
    }
    let mut admin = match &redis {
        Some(url) => Some(redis_conn(url).await?),
        None => None,
    };

    // One client on Redis: round trips measured in slices between its operations. More
    // clients: before and after the workload.
    let mut interleaved = match &redis {
        Some(url) if spec.clients == 1 => {
            let mut conn = redis_conn(url).await?;
            for _ in 0..100 {
                let _: String = redis::cmd("PING").query_async(&mut conn).await?;
            }
            Some(Interleaved {
                conn,
                every: (spec.ops / SLICES).max(1),
                slice: rtt_time / SLICES as u32,
                pings: 0,
                ping_time: Duration::ZERO,
                ping_cpu_us: 0.0,
            })
        }
        _ => None,
    };
    // The extra holders, on a connection of their own, taken before the clock starts.
    let stored_capacity = spec.capacity + spec.preload;
    let mut preloaded = Vec::with_capacity(spec.preload as usize);
    if spec.preload > 0 {
        let store = tessera::Store::connect(store_url).await?;
        let sem = store.semaphore(&sem_name, stored_capacity)?;
        for _ in 0..spec.preload {
            preloaded.push(sem.acquire().await.context("preloading holders")?);
        }
    }

    let cold = warm_up(
        stores.iter().map(|s| (s, sem_name.as_str())),
        stored_capacity,
    )
    .await?;

    let rtt_before = match interleaved {
        Some(_) => None,
        None => round_trips(store_url, rtt_time / 2).await?,
    };

    let progress = ProgressBar::with_draw_target(Some(spec.ops), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{prefix:>3} [{bar:30}] {pos}/{len} {per_sec} {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    progress.set_prefix(spec.name);

    let cpu_before = match admin.as_mut() {
        Some(c) => Some(server_cpu_us(c).await?),
        None => None,
    };
    let pauses = Pauses::start();
    let start = Instant::now();
    let shared = Shared::new(spec, start, &progress);
    let mut tasks = Vec::with_capacity(spec.clients);
    for (i, (store, check)) in stores.iter().zip(checks).enumerate() {
        let sem = store.semaphore(&sem_name, stored_capacity)?;
        let probe = interleaved.take();
        tasks.push(tokio::spawn(client(
            i,
            sem,
            check,
            probe,
            Arc::clone(&shared),
        )));
    }
    // The hard bound: whatever still runs shortly after the deadline is aborted.
    let hard = shared.deadline + Duration::from_millis(500);
    let results = join_clients(tasks, hard, &shared.errors).await;
    let mut paused = Duration::ZERO;
    let mut paused_cpu_us = 0.0;
    let mut rtt_interleaved = None;
    for r in &results {
        if let Some(p) = &r.probe {
            paused += p.ping_time;
            paused_cpu_us += p.ping_cpu_us;
            if p.pings > 0 {
                rtt_interleaved = Some(p.pings as f64 / p.ping_time.as_secs_f64());
            }
        }
    }
    let elapsed = start.elapsed().saturating_sub(paused);
    let (waits, long_waits) = shared.long_waits.take();
    let pauses = pauses.finish(&waits, long_waits);
    let cpu_after = match admin.as_mut() {
        Some(c) => Some(server_cpu_us(c).await?),
        None => None,
    };
    progress.finish_and_clear();

    for p in preloaded {
        p.release().await?;
    }
    let rtt_after = match rtt_interleaved {
        Some(_) => None,
        None => round_trips(store_url, rtt_time / 2).await?,
    };
    if let Some(c) = admin.as_mut() {
        let _: () = redis::cmd("DEL").arg(&check_key).query_async(c).await?;
    }

    let rtt_per_sec = match (rtt_interleaved, rtt_before, rtt_after) {
        (Some(r), _, _) => Some(r),
        (None, Some(a), Some(b)) => Some((a + b) / 2.0),
        (None, a, b) => a.or(b),
    };
    let grants: u64 = results.iter().map(|r| r.grants).sum();
    let report = clients_report(spec, store_url, elapsed, &results, &shared, &cold, pauses);
    Ok(WorkloadReport {
        over_grant_check: if redis.is_some() && spec.clients > 1 {
            "redis-counter"
        } else {
            "in-process-counter"
        }
        .to_string(),
        // Without the Redis time of W1's round-trip slices, which run inside the window.
        server_cpu_us_per_grant: match (cpu_before, cpu_after) {
            (Some(a), Some(b)) if grants > 0 => {
                Some((b - a - paused_cpu_us).max(0.0) / grants as f64)
            }
            _ => None,
        },
        rtt_per_sec,
        rtt_limit_ratio: match (spec.name, rtt_per_sec) {
            ("w1", Some(rtt)) if rtt > 0.0 => Some(report.ops_per_sec / (rtt / 2.0)),
            _ => None,
        },
        ..report
    })
}

/// Contended acquire + release pairs each client makes, all clients at once, after its
/// first one and before the clock starts (see [`warm_up`]).
const WARM_ROUNDS: usize = 8;

/// Each client's first acquire + release, one client at a time, before the clock starts;
/// returns their acquire latencies. Then [`WARM_ROUNDS`] more pairs per client, all clients
/// at once, untimed.
///
/// A client's first call pays for what the store does once per connection (PostgreSQL
/// compiles the PL/pgSQL functions in each new session, MySQL reads the procedures, a pool
/// opens its first connection): tens of milliseconds that belong to start-up, not to the
/// hand-offs a workload measures. In a short run those first calls are a large share of the
/// samples (one in 47 for W3 with 1,500 grants, which made them its p99). They are reported
/// apart, as `first_acquire_max_ms`. The contended rounds take the paths a lone client never
/// does (enqueue, a release that hands off) through the same set-up: PostgreSQL plans each
/// statement of a function anew on its first five calls in a session and builds the plan it
/// keeps at the sixth.
async fn warm_up<'a>(
    clients: impl IntoIterator<Item = (&'a tessera::Store, &'a str)>,
    capacity: u32,
) -> anyhow::Result<Histogram<u64>> {
    let mut cold = histogram();
    let mut sems = Vec::new();
    for (store, name) in clients {
        let sem = store.semaphore(name, capacity)?;
        let t0 = Instant::now();
        let permit = sem.acquire().await.context("warming up a client")?;
        cold.saturating_record((t0.elapsed().as_micros() as u64).max(1));
        permit.release().await.context("warming up a client")?;
        sems.push(sem);
    }
    futures::future::try_join_all(sems.iter().map(|sem| async move {
        for _ in 0..WARM_ROUNDS {
            let permit = sem.acquire().await.context("warming up a client")?;
            permit.release().await.context("warming up a client")?;
        }
        anyhow::Ok(())
    }))
    .await?;
    Ok(cold)
}

/// One client: claim an operation, acquire (timed), check in, hold, check out, release.
async fn client(
    id: usize,
    sem: tessera::Semaphore,
    mut check: Check,
    probe: Option<Interleaved>,
    s: Arc<Shared>,
) -> ClientResult {
    let mut r = ClientResult {
        probe,
        grants: 0,
        latency: histogram(),
        max_holders: 0,
        over_grants: 0,
    };
    let capacity = s.spec.capacity as i64;
    while s.claimed.fetch_add(1, Ordering::Relaxed) < s.spec.ops {
        let t0 = Instant::now();
        if t0 >= s.deadline {
            break;
        }
        let permit = match sem.acquire_many_until(1, s.deadline).await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "bench acquire failed");
                break;
            }
        };
        let waited = t0.elapsed();
        s.long_waits.note(t0.into_std(), waited);
        let waited = waited.as_micros() as u64;
        r.latency.saturating_record(waited.max(1));
        r.grants += 1;
        let previous = s.last.swap(id, Ordering::Relaxed);
        if previous != NOBODY && previous != id {
            s.handoffs.fetch_add(1, Ordering::Relaxed);
        }
        match check.enter().await {
            Ok(holders) => {
                r.max_holders = r.max_holders.max(holders);
                if holders > capacity {
                    r.over_grants += 1;
                }
            }
            Err(e) => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "over-grant check failed");
            }
        }
        if !s.spec.hold.is_zero() {
            tokio::time::sleep(s.spec.hold).await;
        }
        if let Err(e) = check.exit().await {
            s.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "over-grant check failed");
        }
        if let Err(e) = permit.release().await {
            s.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "bench release failed");
        }
        if s.spec.clients > 1 {
            // Let the other clients run: on an in-process store (memory) nothing else yields,
            // and one task would take every grant while the others never get polled.
            tokio::task::yield_now().await;
        }
        let done = s.done.fetch_add(1, Ordering::Relaxed) + 1;
        s.progress.inc(1);
        if let Some(p) = r.probe.as_mut() {
            if done.is_multiple_of(p.every) || done == 1 {
                if let Err(e) = p.slice().await {
                    s.errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "round-trip probe failed");
                    r.probe = None;
                }
            }
        }
    }
    r
}

/// The servers whose CPU the many workload reads: the one of a `redis://` URL, or every node
/// of a `redis+cluster://` URL (list the primaries), as plain `redis://` URLs.
fn cpu_nodes(store_url: &str) -> Vec<String> {
    let (scheme, rest) = store_url.split_once("://").unwrap_or(("", ""));
    let base = match scheme {
        "redis" | "redis+cluster" => "redis",
        "rediss" | "rediss+cluster" => "rediss",
        _ => return Vec::new(),
    };
    let rest = rest.split(['/', '?']).next().unwrap_or("");
    let (userinfo, hosts) = match rest.rfind('@') {
        Some(at) => (&rest[..=at], &rest[at + 1..]),
        None => ("", rest),
    };
    hosts
        .split(',')
        .map(|h| format!("{base}://{userinfo}{h}"))
        .collect()
}

/// The many workload: `names` locks (capacity `spec.capacity`), `spec.clients` clients per
/// name, all at once, until `spec.ops` grants in all. Over-grants are checked per name in
/// process (every client of a name is a task here).
pub async fn run_many(
    store_url: &str,
    spec: &Spec,
    names: usize,
) -> anyhow::Result<WorkloadReport> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let mut stores = Vec::with_capacity(names);
    for _ in 0..names {
        stores.push(tessera::Store::connect(store_url).await?);
    }
    let mut nodes = Vec::new();
    for url in cpu_nodes(store_url) {
        nodes.push(redis_conn(&url).await?);
    }
    let sem_names: Vec<String> = (0..names)
        .map(|n| format!("tessera-bench-many-{run_id}-{n}"))
        .collect();
    let clients = stores.iter().zip(sem_names.iter().map(String::as_str));
    let cold = warm_up(clients, spec.capacity).await?;
    let mut cpu_before = Vec::with_capacity(nodes.len());
    for n in nodes.iter_mut() {
        cpu_before.push(server_cpu_us(n).await?);
    }
    let progress = ProgressBar::with_draw_target(Some(spec.ops), ProgressDrawTarget::stderr());
    progress.set_prefix(spec.name);
    let pauses = Pauses::start();
    let start = Instant::now();
    let shared = Shared::new(spec, start, &progress);
    let mut tasks = Vec::with_capacity(names * spec.clients);
    for (n, (store, name)) in stores.iter().zip(&sem_names).enumerate() {
        let sem = store.semaphore(name, spec.capacity)?;
        let counter = Arc::new(AtomicI64::new(0));
        for c in 0..spec.clients {
            tasks.push(tokio::spawn(client(
                n * spec.clients + c,
                sem.clone(),
                Check::Local(Arc::clone(&counter)),
                None,
                Arc::clone(&shared),
            )));
        }
    }
    let hard = shared.deadline + Duration::from_millis(500);
    let results = join_clients(tasks, hard, &shared.errors).await;
    let elapsed = start.elapsed();
    let (waits, long_waits) = shared.long_waits.take();
    let pauses = pauses.finish(&waits, long_waits);
    let mut cpu_after = Vec::with_capacity(nodes.len());
    for n in nodes.iter_mut() {
        cpu_after.push(server_cpu_us(n).await?);
    }
    progress.finish_and_clear();
    let grants: u64 = results.iter().map(|r| r.grants).sum();
    let per_node: Vec<f64> = cpu_before
        .iter()
        .zip(&cpu_after)
        .map(|(a, b)| (b - a) / grants.max(1) as f64)
        .collect();
    Ok(WorkloadReport {
        workload: format!("{}x{}", spec.name, names),
        clients: spec.clients * names,
        preload: 0,
        server_cpu_us_per_grant: (!per_node.is_empty() && grants > 0)
            .then(|| per_node.iter().sum()),
        node_cpu_us_per_grant: per_node,
        ..clients_report(spec, store_url, elapsed, &results, &shared, &cold, pauses)
    })
}
