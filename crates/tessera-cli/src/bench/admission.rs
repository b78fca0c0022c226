//! The `admission` workload: clients that need a permit of a semaphore (`--capacity`,
//! default 4) and a turn within rate limits (`--rates`, default `50/s` and `1000/min`) for
//! each call, with demand above the limits, run two ways in the same run, each on fresh names
//! for `--rate-run` (default 10 s):
//!
//! - `admission`: one [`tessera::Admission`] per call (permits and windows in one step);
//! - `separate`: the permit first ([`tessera::Semaphore::acquire`]), then the turn
//!   ([`tessera::RateLimiter::acquire`]), as tools without admission do.
//!
//! Each call holds its permit for `--hold`, then releases it. Measured per way: calls per
//! second, the wait from asking to holding both (p50, p99, max), the admitted ratio against
//! the most the limits allow (see `rate.rs`), window violations in the admitted store times,
//! the most calls seen holding at once (against the capacity), and — the price of the
//! separate way — how long each call held its permit idle while it waited for its turn.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tessera::{RateSpec, SemaphoreOptions, Store};
use tokio::time::Instant;

use super::clients::{histogram, join_clients};
use super::rate::{max_admissions, window_violations};

/// The `admission` workload's parameters.
#[derive(Debug, Clone)]
pub struct AdmissionSpec {
    pub clients: usize,
    pub capacity: u32,
    pub limits: Vec<RateSpec>,
    pub hold: Duration,
    /// The measured run of each way.
    pub run: Duration,
}

/// The figures of one way.
#[derive(Debug, Clone, Serialize)]
pub struct AdmissionReport {
    /// `admission`.
    pub workload: String,
    /// `admission` or `separate`.
    pub way: String,
    pub store: String,
    pub clients: usize,
    pub capacity: u32,
    pub limits: Vec<String>,
    pub duration_s: f64,
    /// Calls that held a permit and a turn.
    pub calls: u64,
    /// Calls admitted in the run, per second of the run.
    pub calls_per_sec: f64,
    /// Turns admitted with store time in the run, and the most the limits allow.
    pub admitted: u64,
    pub max_allowed: u64,
    pub admitted_ratio: f64,
    /// From asking to holding both.
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    /// Per call, the time its permit was held while it waited for its turn (0 for
    /// `admission`, by construction; measured for `separate`).
    pub idle_permit_ms_per_call: f64,
    /// The most calls seen holding at once.
    pub most_at_once: usize,
    pub window_violations: u64,
    pub errors: u64,
}

struct Shared {
    end: Instant,
    hold: Duration,
    in_flight: AtomicUsize,
    most: AtomicUsize,
    errors: AtomicU64,
}

struct ClientResult {
    calls: u64,
    ats: Vec<u64>,
    wait: Histogram<u64>,
    idle_us: u64,
}

impl ClientResult {
    fn new() -> Self {
        ClientResult {
            calls: 0,
            ats: Vec::new(),
            wait: histogram(),
            idle_us: 0,
        }
    }
}

/// Runs both ways, one after the other.
pub async fn run(store_url: &str, spec: &AdmissionSpec) -> anyhow::Result<Vec<AdmissionReport>> {
    let mut out = Vec::new();
    for way in ["admission", "separate"] {
        out.push(run_way(store_url, spec, way).await?);
    }
    Ok(out)
}

async fn run_way(
    store_url: &str,
    spec: &AdmissionSpec,
    way: &str,
) -> anyhow::Result<AdmissionReport> {
    let name = format!("tessera-bench-{way}-{:08x}", rand::random::<u32>());
    let start = Instant::now();
    let shared = Arc::new(Shared {
        end: start + spec.run,
        hold: spec.hold,
        in_flight: AtomicUsize::new(0),
        most: AtomicUsize::new(0),
        errors: AtomicU64::new(0),
    });
    let mut tasks = Vec::new();
    for _ in 0..spec.clients {
        let store = Store::connect(store_url).await?;
        let s = Arc::clone(&shared);
        let (name, spec) = (name.clone(), spec.clone());
        let task = match way {
            "admission" => {
                tokio::spawn(async move { admission_client(store, &name, &spec, s).await })
            }
            _ => tokio::spawn(async move { separate_client(store, &name, &spec, s).await }),
        };
        tasks.push(task);
    }
    let hard = shared.end + spec.run.max(Duration::from_secs(5));
    let results = join_clients(tasks, hard, &shared.errors).await;

    let mut ats: Vec<u64> = results.iter().flat_map(|r| r.ats.iter().copied()).collect();
    ats.sort_unstable();
    let run_us = spec.run.as_micros() as u64;
    let admitted = match ats.first() {
        Some(&t0) => ats.iter().take_while(|&&t| t < t0 + run_us).count() as u64,
        None => 0,
    };
    let max_allowed = max_admissions(&spec.limits, spec.run);
    let mut wait = histogram();
    for r in &results {
        wait.add(&r.wait).expect("same bounds");
    }
    let calls: u64 = results.iter().map(|r| r.calls).sum();
    let idle_us: u64 = results.iter().map(|r| r.idle_us).sum();
    let ms = |us: u64| us as f64 / 1000.0;
    Ok(AdmissionReport {
        workload: "admission".to_string(),
        way: way.to_string(),
        store: tessera::backend::redact_url(store_url),
        clients: spec.clients,
        capacity: spec.capacity,
        limits: spec.limits.iter().map(|l| l.to_string()).collect(),
        duration_s: spec.run.as_secs_f64(),
        calls,
        calls_per_sec: admitted as f64 / spec.run.as_secs_f64().max(1e-9),
        admitted,
        max_allowed,
        admitted_ratio: if max_allowed > 0 {
            admitted as f64 / max_allowed as f64
        } else {
            0.0
        },
        wait_p50_ms: ms(wait.value_at_quantile(0.50)),
        wait_p99_ms: ms(wait.value_at_quantile(0.99)),
        wait_max_ms: ms(wait.max()),
        idle_permit_ms_per_call: if calls > 0 {
            idle_us as f64 / 1000.0 / calls as f64
        } else {
            0.0
        },
        most_at_once: shared.most.load(Ordering::Relaxed),
        window_violations: window_violations(&ats, &spec.limits),
        errors: shared.errors.load(Ordering::Relaxed),
    })
}

/// A call holding both: counted, held for `--hold`, then released by the caller.
async fn hold(s: &Shared) {
    let now = s.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    s.most.fetch_max(now, Ordering::SeqCst);
    if !s.hold.is_zero() {
        tokio::time::sleep(s.hold).await;
    }
    s.in_flight.fetch_sub(1, Ordering::SeqCst);
}

fn failed(s: &Shared, e: &tessera::Error) {
    s.errors.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(error = %e, "bench admission call failed");
}

async fn admission_client(
    store: Store,
    name: &str,
    spec: &AdmissionSpec,
    s: Arc<Shared>,
) -> ClientResult {
    let mut r = ClientResult::new();
    let adm = match admission(&store, name, spec) {
        Ok(a) => a,
        Err(e) => {
            failed(&s, &e);
            return r;
        }
    };
    loop {
        let asked = Instant::now();
        if asked >= s.end {
            break;
        }
        let ticket = match adm.acquire_timeout(s.end - asked).await {
            Ok(Some(t)) => t,
            Ok(None) => break,
            Err(e) => {
                failed(&s, &e);
                break;
            }
        };
        r.wait
            .saturating_record((asked.elapsed().as_micros() as u64).max(1));
        r.ats.push(ticket.admitted_at().as_micros());
        r.calls += 1;
        hold(&s).await;
        if let Err(e) = ticket.release().await {
            failed(&s, &e);
        }
    }
    r
}

fn admission(
    store: &Store,
    name: &str,
    spec: &AdmissionSpec,
) -> tessera::Result<tessera::Admission> {
    let mut limits = spec.limits.iter().copied();
    let first = limits.next().expect("at least one limit");
    let mut adm = store
        .admission(name)
        .permits(spec.capacity)
        .semaphore_options(SemaphoreOptions::default())
        .rate(first)?;
    for l in limits {
        adm = adm.rate(l)?;
    }
    Ok(adm)
}

async fn separate_client(
    store: Store,
    name: &str,
    spec: &AdmissionSpec,
    s: Arc<Shared>,
) -> ClientResult {
    let mut r = ClientResult::new();
    let (sem, limiter) = match (
        store.semaphore(name, spec.capacity),
        store.rate_limiter(name, &spec.limits),
    ) {
        (Ok(sem), Ok(l)) => (sem, l),
        (Err(e), _) | (_, Err(e)) => {
            failed(&s, &e);
            return r;
        }
    };
    loop {
        let asked = Instant::now();
        if asked >= s.end {
            break;
        }
        let permit = match sem.acquire_many_until(1, s.end).await {
            Ok(Some(p)) => p,
            Ok(None) => break,
            Err(e) => {
                failed(&s, &e);
                break;
            }
        };
        let held_at = Instant::now();
        let at = match limiter.acquire_until(1, s.end).await {
            Ok(tessera::RateDecision::Admitted { at }) => at,
            Ok(tessera::RateDecision::Limited { .. }) => break,
            Err(e) => {
                failed(&s, &e);
                break;
            }
        };
        r.idle_us += held_at.elapsed().as_micros() as u64;
        r.wait
            .saturating_record((asked.elapsed().as_micros() as u64).max(1));
        r.ats.push(at.as_micros());
        r.calls += 1;
        hold(&s).await;
        if let Err(e) = permit.release().await {
            failed(&s, &e);
        }
    }
    r
}

/// The summary of both ways.
pub fn table(reports: &[AdmissionReport]) -> String {
    let Some(first) = reports.first() else {
        return String::new();
    };
    let mut out = format!(
        "admission: {} clients, capacity {}, {} over {:.1}s each\n\
         {:<10} {:>8} {:>9} {:>7} {:>10} {:>10} {:>10} {:>11} {:>6} {:>10} {:>6}\n",
        first.clients,
        first.capacity,
        first.limits.join(" + "),
        first.duration_s,
        "way",
        "calls",
        "calls/s",
        "ratio",
        "wait p50",
        "wait p99",
        "wait max",
        "idle ms/call",
        "most",
        "violations",
        "errors",
    );
    for r in reports {
        out.push_str(&format!(
            "{:<10} {:>8} {:>9.1} {:>7.4} {:>10.3} {:>10.3} {:>10.3} {:>11.3} {:>6} {:>10} {:>6}\n",
            r.way,
            r.calls,
            r.calls_per_sec,
            r.admitted_ratio,
            r.wait_p50_ms,
            r.wait_p99_ms,
            r.wait_max_ms,
            r.idle_permit_ms_per_call,
            r.most_at_once,
            r.window_violations,
            r.errors,
        ));
    }
    out
}
