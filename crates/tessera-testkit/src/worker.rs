//! A worker that acquires, holds and releases permits at random and writes a grant log
//! ([`crate::grantlog`]). The `tessera-worker` binary runs one per process; tests also run
//! several as tasks of one process with [`run_worker_on`].
//!
//! With `--fenced ADDR` a holder also enters a fenced resource ([`crate::chaos::fenced`]):
//! right after the grant and every `--write-every-ms` while it holds, it writes each of its
//! seats with its fence, until its hold ends or `lost()` fires. It acts on its *belief*: it
//! keeps writing after its lease's certain validity ran out if it has not been told of a loss
//! yet (a process frozen by SIGSTOP, say), which is what fencing exists for; each write is
//! logged with whether it was certain.
//!
//! With `--waiters N` the process instead queues `N` acquires on a semaphore that someone
//! else keeps full and waits to be killed (the chaos runner's dead-waiters scenario). Each
//! acquire that returns before the kill prints one line on stdout, `GRANTED` or `FAILED
//! <error>`: the semaphore stays full, so every such line is what the application would
//! have seen go wrong.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::{Permit, Semaphore, SemaphoreOptions, Store};

use crate::grantlog::{instant_to_ns, AcquireMode, EventKind, EventLog, Outcome};

/// What one worker does.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "tessera-worker",
    about = "Acquires and releases permits at random, logging every grant"
)]
pub struct WorkerArgs {
    /// Store URL.
    #[arg(long)]
    pub store: String,
    /// Semaphore name.
    #[arg(long)]
    pub name: String,
    /// Semaphore capacity.
    #[arg(long)]
    pub permits: u32,
    /// Number of acquires.
    #[arg(long)]
    pub ops: u64,
    /// Largest weight per acquire (weights are uniform in 1..=max).
    #[arg(long, default_value_t = 1)]
    pub max_weight: u32,
    /// Longest hold in milliseconds (holds are uniform in 0..=max).
    #[arg(long, default_value_t = 20)]
    pub hold_ms_max: u64,
    /// Lease TTL in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// The grant log to write.
    #[arg(long)]
    pub log: PathBuf,
    /// This worker's id in the log.
    #[arg(long)]
    pub worker: String,
    /// Random seed (random if absent).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Share of acquires made with try_acquire.
    #[arg(long, default_value_t = 0.2)]
    pub try_ratio: f64,
    /// Share of acquires made with a short timeout.
    #[arg(long, default_value_t = 0.2)]
    pub timeout_ratio: f64,
    /// The short timeout, in milliseconds.
    #[arg(long, default_value_t = 10)]
    pub timeout_ms: u64,
    /// If set, timeouts are uniform in `timeout_ms..=timeout_ms_max`.
    #[arg(long)]
    pub timeout_ms_max: Option<u64>,
    /// Stop after this long even if `ops` acquires were not made.
    #[arg(long)]
    pub duration_ms: Option<u64>,
    /// The fenced resource to write to while holding (`127.0.0.1:PORT`).
    #[arg(long)]
    pub fenced: Option<String>,
    /// How often a holder writes to the fenced resource.
    #[arg(long, default_value_t = 20)]
    pub write_every_ms: u64,
    /// Waiter TTL in milliseconds (the library's default if absent).
    #[arg(long)]
    pub waiter_ttl_ms: Option<u64>,
    /// Queue this many acquires and wait to be killed, instead of the acquire loop.
    #[arg(long)]
    pub waiters: Option<u32>,
    /// The tenant every acquire names (`docs/fair-shares.md`), logged once.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The tenant's share.
    #[arg(long, default_value_t = 1)]
    pub share: u32,
}

impl WorkerArgs {
    /// Arguments with the defaults of the command line.
    pub fn new(store: &str, name: &str, permits: u32, log: PathBuf, worker: &str) -> Self {
        WorkerArgs {
            store: store.to_string(),
            name: name.to_string(),
            permits,
            ops: 100,
            max_weight: 1,
            hold_ms_max: 20,
            ttl_ms: 3000,
            log,
            worker: worker.to_string(),
            seed: None,
            try_ratio: 0.2,
            timeout_ratio: 0.2,
            timeout_ms: 10,
            timeout_ms_max: None,
            duration_ms: None,
            fenced: None,
            write_every_ms: 20,
            waiter_ttl_ms: None,
            waiters: None,
            tenant: None,
            share: 1,
        }
    }

    /// The command-line arguments that make `tessera-worker` parse back into `self`. Each is
    /// one `--flag=value` word, so a value that starts with `-` stays a value.
    pub fn to_args(&self) -> Vec<String> {
        let mut v: Vec<String> = [
            ("store", self.store.clone()),
            ("name", self.name.clone()),
            ("permits", self.permits.to_string()),
            ("ops", self.ops.to_string()),
            ("max-weight", self.max_weight.to_string()),
            ("hold-ms-max", self.hold_ms_max.to_string()),
            ("ttl-ms", self.ttl_ms.to_string()),
            ("log", self.log.display().to_string()),
            ("worker", self.worker.clone()),
            ("try-ratio", self.try_ratio.to_string()),
            ("timeout-ratio", self.timeout_ratio.to_string()),
            ("timeout-ms", self.timeout_ms.to_string()),
            ("write-every-ms", self.write_every_ms.to_string()),
            ("share", self.share.to_string()),
        ]
        .into_iter()
        .map(|(flag, value)| format!("--{flag}={value}"))
        .collect();
        let options = [
            ("seed", self.seed.map(|x| x.to_string())),
            ("timeout-ms-max", self.timeout_ms_max.map(|x| x.to_string())),
            ("duration-ms", self.duration_ms.map(|x| x.to_string())),
            ("fenced", self.fenced.clone()),
            ("waiter-ttl-ms", self.waiter_ttl_ms.map(|x| x.to_string())),
            ("waiters", self.waiters.map(|x| x.to_string())),
            ("tenant", self.tenant.clone()),
        ];
        for (flag, value) in options {
            if let Some(value) = value {
                v.push(format!("--{flag}={value}"));
            }
        }
        v
    }
}

/// What a worker did, by its own count.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    /// Grants.
    pub grants: u64,
    /// "No permit" answers.
    pub no_permit: u64,
    /// Timed-out acquires.
    pub timed_out: u64,
    /// Failed acquires and releases.
    pub errors: u64,
    /// `lost()` notices.
    pub losses: u64,
}

/// Connects to `args.store` and runs the worker.
pub async fn run_worker(args: &WorkerArgs) -> anyhow::Result<WorkerSummary> {
    let store = Store::connect(&args.store)
        .await
        .with_context(|| format!("connecting to {}", args.store))?;
    run_worker_on(&store, args).await
}

/// Runs the worker on an existing store (`args.store` is ignored).
pub async fn run_worker_on(store: &Store, args: &WorkerArgs) -> anyhow::Result<WorkerSummary> {
    anyhow::ensure!(
        args.max_weight >= 1 && args.max_weight <= args.permits,
        "--max-weight must be in 1..=--permits"
    );
    let log = EventLog::create(&args.log)?;
    let ttl = Duration::from_millis(args.ttl_ms);
    let mut opts = SemaphoreOptions::default().ttl(ttl).holder(format!(
        "{}/{}",
        args.worker,
        std::process::id()
    ));
    if let Some(ms) = args.waiter_ttl_ms {
        opts = opts.waiter_ttl(Duration::from_millis(ms));
    }
    if let Some(t) = &args.tenant {
        opts = opts.tenant(tessera::Tenant::new(t, args.share)?);
    }
    let sem = Semaphore::new(store, &args.name, args.permits, opts)?;
    if let Some(n) = args.waiters {
        return run_waiters(&sem, n, args).await;
    }
    let mut fenced = match &args.fenced {
        Some(addr) => Some(FencedClient::connect(addr).await?),
        None => None,
    };
    let started = tokio::time::Instant::now();
    let duration = args.duration_ms.map(Duration::from_millis);
    let mut rng = match args.seed {
        Some(s) => StdRng::seed_from_u64(s),
        None => StdRng::from_os_rng(),
    };
    let mut summary = WorkerSummary::default();
    log.log(EventKind::Capacity {
        sem: args.name.clone(),
        capacity: args.permits,
    })?;
    if let Some(t) = &args.tenant {
        log.log(EventKind::Tenant {
            worker: args.worker.clone(),
            tenant: t.clone(),
        })?;
    }

    for op in 0..args.ops {
        if duration.is_some_and(|d| started.elapsed() >= d) {
            break;
        }
        let weight = rng.random_range(1..=args.max_weight);
        let roll: f64 = rng.random();
        let mode = if roll < args.try_ratio {
            AcquireMode::TryAcquire
        } else if roll < args.try_ratio + args.timeout_ratio {
            AcquireMode::Timeout {
                timeout_ms: match args.timeout_ms_max {
                    Some(max) if max > args.timeout_ms => rng.random_range(args.timeout_ms..=max),
                    _ => args.timeout_ms,
                },
            }
        } else {
            AcquireMode::Acquire
        };
        log.log(EventKind::AcquireInvoked {
            worker: args.worker.clone(),
            op,
            sem: args.name.clone(),
            weight,
            mode,
        })?;
        let result = match mode {
            AcquireMode::Acquire => sem.acquire_many(weight).await.map(Some),
            AcquireMode::TryAcquire => sem.try_acquire_many(weight).await,
            AcquireMode::Timeout { timeout_ms } => {
                sem.acquire_many_timeout(weight, Duration::from_millis(timeout_ms))
                    .await
            }
        };
        let (outcome, permit) = match result {
            Ok(Some(p)) => (
                Outcome::Granted {
                    lease_id: p.lease_id(),
                    fence: p.fence(),
                    seats: p.seats().to_vec(),
                    weight: p.weight(),
                    valid_until_ns: instant_to_ns(p.valid_until()),
                },
                Some(p),
            ),
            Ok(None) if mode == AcquireMode::TryAcquire => (Outcome::NoPermit, None),
            Ok(None) => (Outcome::TimedOut, None),
            Err(e) => (
                Outcome::Error {
                    message: e.to_string(),
                },
                None,
            ),
        };
        // Logged after the acquire returned: the certainly-held interval starts no earlier
        // than the grant.
        log.log(EventKind::AcquireReturned {
            worker: args.worker.clone(),
            op,
            outcome: outcome.clone(),
        })?;
        match (outcome, permit) {
            (Outcome::Granted { .. }, Some(permit)) => {
                summary.grants += 1;
                let hold = Duration::from_millis(rng.random_range(0..=args.hold_ms_max));
                let fence = fenced.as_mut().map(|f| (f, args.write_every_ms));
                hold_and_release(&log, permit, hold, ttl, fence, &mut summary).await?;
            }
            (Outcome::NoPermit, _) => summary.no_permit += 1,
            (Outcome::TimedOut, _) => summary.timed_out += 1,
            _ => {
                summary.errors += 1;
                // Do not spin on a failing store.
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    Ok(summary)
}

/// Holds `permit` for `hold` unless it is lost first, logging every move of its certain
/// validity, then releases it.
async fn hold_and_release(
    log: &EventLog,
    permit: Permit,
    hold: Duration,
    ttl: Duration,
    mut fenced: Option<(&mut FencedClient, u64)>,
    summary: &mut WorkerSummary,
) -> anyhow::Result<()> {
    let lease_id = permit.lease_id();
    let mut write = tokio::time::interval(Duration::from_millis(
        fenced.as_ref().map_or(1000, |(_, every)| (*every).max(1)),
    ));
    let lost = permit.lost();
    tokio::pin!(lost);
    // A hold of zero is over at once: `sleep(ZERO)` would wait for the timer's next
    // millisecond tick (1–2 ms), which made `scripts/contend.sh`'s "hold ≈ 0" a hold of
    // about 1.5 ms and capped 2 permits at about 1,300 grants/s whatever the store.
    let done = async {
        if !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
    };
    tokio::pin!(done);
    // Renewals are not announced by the permit; look at valid_until often enough to log
    // each one well before the previous validity runs out.
    let mut tick = tokio::time::interval((ttl / 20).max(Duration::from_millis(5)));
    let mut valid_until = permit.valid_until();
    loop {
        tokio::select! {
            biased;
            reason = &mut lost => {
                summary.losses += 1;
                log.log(EventKind::Lost { lease_id, reason: reason.to_string() })?;
                break;
            }
            _ = &mut done => break,
            _ = write.tick(), if fenced.is_some() => {
                let Some((client, _)) = fenced.as_mut() else { unreachable!() };
                for &seat in permit.seats() {
                    let certain = tokio::time::Instant::now() < permit.valid_until();
                    let accepted = client.write(seat, permit.fence()).await?;
                    log.log(EventKind::ResourceWrite {
                        lease_id,
                        seat,
                        fence: permit.fence(),
                        accepted,
                        certain,
                    })?;
                }
            }
            _ = tick.tick() => {
                let now = permit.valid_until();
                if now != valid_until {
                    valid_until = now;
                    log.log(EventKind::Renewed { lease_id, valid_until_ns: instant_to_ns(now) })?;
                }
            }
        }
    }
    // Logged before the release is sent: the certainly-held interval ends no later than the
    // store's release.
    log.log(EventKind::ReleaseInvoked { lease_id })?;
    let kind = match permit.release().await {
        Ok(was_held) => EventKind::ReleaseReturned {
            lease_id,
            was_held,
            error: None,
        },
        Err(e) => {
            summary.errors += 1;
            EventKind::ReleaseReturned {
                lease_id,
                was_held: false,
                error: Some(e.to_string()),
            }
        }
    };
    log.log(kind)
}

/// Queues `n` acquires and waits (at most `duration_ms`, default 10 minutes) to be killed;
/// an acquire that returns meanwhile prints `GRANTED` (holding its permit) or `FAILED
/// <error>`.
async fn run_waiters(sem: &Semaphore, n: u32, args: &WorkerArgs) -> anyhow::Result<WorkerSummary> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move {
                match sem.acquire().await {
                    Ok(permit) => {
                        println!("GRANTED");
                        std::future::pending::<()>().await;
                        drop(permit);
                    }
                    Err(e) => println!("FAILED {e}"),
                }
            })
        })
        .collect();
    println!("WAITING {n}");
    let limit = Duration::from_millis(args.duration_ms.unwrap_or(600_000));
    tokio::time::sleep(limit).await;
    for t in tasks {
        t.abort();
    }
    Ok(WorkerSummary::default())
}

/// A connection to the fenced resource ([`crate::chaos::fenced`]).
struct FencedClient {
    reader: tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
    writer: tokio::net::tcp::OwnedWriteHalf,
    line: String,
}

impl FencedClient {
    async fn connect(addr: &str) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to the fenced resource at {addr}"))?;
        stream.set_nodelay(true)?;
        let (r, writer) = stream.into_split();
        Ok(FencedClient {
            reader: tokio::io::BufReader::new(r),
            writer,
            line: String::new(),
        })
    }

    /// Writes `seat` with `fence`; `true` if the resource accepted it.
    async fn write(&mut self, seat: u32, fence: u64) -> anyhow::Result<bool> {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let exchange = async {
            self.writer
                .write_all(format!("W {seat} {fence}\n").as_bytes())
                .await?;
            self.line.clear();
            self.reader.read_line(&mut self.line).await?;
            anyhow::Ok(self.line.starts_with("OK"))
        };
        tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .context("the fenced resource did not answer")?
    }
}
