//! A worker that acquires, holds and releases permits at random and writes a grant log
//! ([`crate::grantlog`]). The `tessera-worker` binary runs one per process; tests also run
//! several as tasks of one process with [`run_worker_on`].

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
    let opts = SemaphoreOptions::default().ttl(ttl).holder(format!(
        "{}/{}",
        args.worker,
        std::process::id()
    ));
    let sem = Semaphore::new(store, &args.name, args.permits as u64, opts)?;
    let mut rng = match args.seed {
        Some(s) => StdRng::seed_from_u64(s),
        None => StdRng::from_os_rng(),
    };
    let mut summary = WorkerSummary::default();
    log.log(EventKind::Capacity {
        sem: args.name.clone(),
        capacity: args.permits,
    })?;

    for op in 0..args.ops {
        let weight = rng.random_range(1..=args.max_weight);
        let roll: f64 = rng.random();
        let mode = if roll < args.try_ratio {
            AcquireMode::TryAcquire
        } else if roll < args.try_ratio + args.timeout_ratio {
            AcquireMode::Timeout {
                timeout_ms: args.timeout_ms,
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
                hold_and_release(&log, permit, hold, ttl, &mut summary).await?;
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
    summary: &mut WorkerSummary,
) -> anyhow::Result<()> {
    let lease_id = permit.lease_id();
    let lost = permit.lost();
    tokio::pin!(lost);
    let done = tokio::time::sleep(hold);
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
