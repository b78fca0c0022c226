//! The `rate` workload: clients on one rate limiter (exact mode), as fast as they can.
//!
//! - `--rate-mode decisions`: every client loops `try_acquire(1)`; measures decisions per
//!   second (mostly "limited" when the limits are low) and admissions per second;
//! - `--rate-mode reserve`: every client loops `acquire_within(1, …)` (reserve the earliest
//!   slot, sleep until it): demand above the limit; measures the admitted cost against the
//!   most the limits allow.
//!
//! # The run and the admitted ratio
//!
//! The limiter has a fresh name (an empty log). The run of length `T` (`--rate-run`) starts at
//! the store time `t0` of the first admission; `admitted` counts the admissions whose store
//! time `at` lies in `[t0, t0 + T)`. Clients keep asking a little past `T` (so the last slots
//! of the run are asked for), and never reserve past the end of their loop.
//!
//! The most an exact-mode limiter can admit in `[t0, t0 + T)` is computed exactly, by the
//! greedy schedule: with unit costs, "at most `N` in any window `(s - L, s]`" on sorted admit
//! times `t_1 <= t_2 <= …` is the same as `t_k >= t_{k-N} + L` for every `k > N`, so the
//! earliest schedule is `g_k = max(t0, g_{k-1}, max over limits of g_{k-N} + L)`, and by
//! induction any feasible schedule has `t_k >= g_k`: the most admissions in the run is the
//! number of `g_k < t0 + T`. For one limit that is `N × ceil(T / L)` (batches of `N` at
//! `t0, t0 + L, …`). For several limits `min over limits of N × ceil(T / L)` is only an upper
//! bound: `50/s` + `1000/min` over 10 s gives 500 (the bound), but `10/s` + `15/2s` over 3 s
//! allows 25 (10 + 5 + 10), not min(30, 30) = 30. The bench therefore runs the greedy schedule
//! (capped; above the cap the upper bound is used, which only makes the ratio smaller).
//!
//! `limit_per_sec` is the tightest limit's `N / L`; `admitted_ratio` = admitted ÷ the greedy
//! maximum (≥ 0.98 is the target with demand above the limit over 10 s).
//!
//! # Checks
//!
//! Window violations, seen by the client: all admitted `at` (from every client, sorted); for
//! each limit `N/L`, every `k` with `t_k - t_{k-N} < L` is a window `(t_k - L, t_k]` holding
//! `N + 1` admissions. Must be 0.
//!
//! Latency: each call, from the call to its answer. In `decisions` mode that is the decision
//! latency (one store round trip); in `reserve` mode it includes the sleep until the reserved
//! slot (the wait a caller sees).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use tessera::{RateDecision, RateSpec};
use tokio::time::Instant;

use super::clients::{histogram, join_clients};

/// How the clients ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RateBenchMode {
    /// `try_acquire(1)` in a loop: decisions per second.
    Decisions,
    /// `acquire_within(1, …)` in a loop: admitted throughput against the limit.
    Reserve,
}

/// The `rate` workload's parameters.
#[derive(Debug, Clone)]
pub struct RateSpecBench {
    pub clients: usize,
    pub limits: Vec<RateSpec>,
    pub mode: RateBenchMode,
    /// The measured run `T`.
    pub run: Duration,
    /// The hard bound.
    pub duration: Duration,
}

/// The figures of one `rate` run.
#[derive(Debug, Clone, Serialize)]
pub struct RateReport {
    /// `rate`.
    pub workload: String,
    /// The store URL (password hidden).
    pub store: String,
    pub clients: usize,
    /// The limits, e.g. `["50/s", "1000/min"]`.
    pub limits: Vec<String>,
    /// `decisions` or `reserve`.
    pub mode: RateBenchMode,
    /// The measured run `T` (admissions counted in `[t0, t0 + T)`).
    pub duration_s: f64,
    /// Answers (admitted or limited) received.
    pub decisions: u64,
    /// Answers per second of the clients' loop.
    pub decisions_per_sec: f64,
    /// Admissions with store time in the run.
    pub admitted: u64,
    pub admitted_per_sec: f64,
    /// The tightest limit's `N / L`.
    pub limit_per_sec: f64,
    /// The most the limits allow in the run (greedy schedule, exact mode).
    pub max_allowed: u64,
    /// `admitted / max_allowed`.
    pub admitted_ratio: f64,
    /// Call latency (decisions: one decision; reserve: including the sleep until the slot).
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Windows of some limit holding more than its `N`, from the admitted store times.
    pub window_violations: u64,
    /// Failed store calls, panicked or aborted clients.
    pub errors: u64,
}

/// Greedy schedules longer than this are not simulated (the upper bound is used instead).
const GREEDY_CAP: u64 = 50_000_000;

/// The most admissions of cost 1 that `limits` (exact mode) allow in `[0, run)` from an empty
/// log (see the module docs).
pub fn max_admissions(limits: &[RateSpec], run: Duration) -> u64 {
    let run_us = run.as_micros() as u64;
    let bound = limits
        .iter()
        .map(|l| {
            let p = l.period().as_micros() as u64;
            u64::from(l.count()) * run_us.div_ceil(p)
        })
        .min()
        .unwrap_or(0);
    if limits.len() <= 1 || bound > GREEDY_CAP {
        return bound;
    }
    let mut g: Vec<u64> = Vec::with_capacity(bound as usize);
    loop {
        let k = g.len();
        let mut t = g.last().copied().unwrap_or(0);
        for l in limits {
            let n = l.count() as usize;
            if k >= n {
                t = t.max(g[k - n] + l.period().as_micros() as u64);
            }
        }
        if t >= run_us {
            return g.len() as u64;
        }
        g.push(t);
    }
}

/// Windows holding more than a limit's `N`, in sorted admit times (µs).
pub fn window_violations(sorted: &[u64], limits: &[RateSpec]) -> u64 {
    let mut v = 0;
    for l in limits {
        let n = l.count() as usize;
        let p = l.period().as_micros() as u64;
        for k in n..sorted.len() {
            if sorted[k] - sorted[k - n] < p {
                v += 1;
            }
        }
    }
    v
}

struct Shared {
    mode: RateBenchMode,
    /// Clients start no call after this.
    end: Instant,
    /// The longest period (the longest useful reservation).
    horizon: Duration,
    errors: AtomicU64,
    progress: ProgressBar,
}

struct ClientResult {
    decisions: u64,
    ats: Vec<u64>,
    latency: Histogram<u64>,
}

/// How long clients keep asking past `T` (the first admission comes a moment after they
/// start, and the run is counted from it).
const GRACE: Duration = Duration::from_millis(250);

/// Runs the `rate` workload.
pub async fn run(store_url: &str, spec: &RateSpecBench) -> anyhow::Result<RateReport> {
    let run_id = format!("{:08x}", rand::random::<u32>());
    let name = format!("tessera-bench-rate-{run_id}");
    let mut limiters = Vec::with_capacity(spec.clients);
    for _ in 0..spec.clients {
        let store = tessera::Store::connect(store_url).await?;
        limiters.push(store.rate_limiter(&name, &spec.limits)?);
    }
    let run = spec.run.min(spec.duration);
    let horizon = spec
        .limits
        .iter()
        .map(|l| l.period())
        .max()
        .unwrap_or(Duration::from_secs(1));

    let progress = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("rate {spinner} {pos} decisions {per_sec} {elapsed}")
            .expect("valid template"),
    );
    let start = Instant::now();
    let deadline = start + spec.duration;
    let shared = Arc::new(Shared {
        mode: spec.mode,
        end: (start + run + GRACE).min(deadline),
        horizon,
        errors: AtomicU64::new(0),
        progress: progress.clone(),
    });
    let tasks: Vec<_> = limiters
        .into_iter()
        .map(|rl| tokio::spawn(client(rl, Arc::clone(&shared), spec.clients > 1)))
        .collect();
    let hard = deadline + Duration::from_millis(500);
    let results = join_clients(tasks, hard, &shared.errors).await;
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    progress.finish_and_clear();

    let mut ats: Vec<u64> = results.iter().flat_map(|r| r.ats.iter().copied()).collect();
    ats.sort_unstable();
    let run_us = run.as_micros() as u64;
    let admitted = match ats.first() {
        Some(&t0) => ats.iter().take_while(|&&t| t < t0 + run_us).count() as u64,
        None => 0,
    };
    let max_allowed = max_admissions(&spec.limits, run);
    let mut latency = histogram();
    for r in &results {
        latency.add(&r.latency).expect("same bounds");
    }
    let decisions: u64 = results.iter().map(|r| r.decisions).sum();
    let ms = |us: u64| us as f64 / 1000.0;
    let run_s = run.as_secs_f64().max(1e-9);
    Ok(RateReport {
        workload: "rate".to_string(),
        store: tessera::backend::redact_url(store_url),
        clients: spec.clients,
        limits: spec.limits.iter().map(|l| l.to_string()).collect(),
        mode: spec.mode,
        duration_s: run_s,
        decisions,
        decisions_per_sec: decisions as f64 / elapsed,
        admitted,
        admitted_per_sec: admitted as f64 / run_s,
        limit_per_sec: spec
            .limits
            .iter()
            .map(|l| f64::from(l.count()) / l.period().as_secs_f64())
            .fold(f64::INFINITY, f64::min),
        max_allowed,
        admitted_ratio: if max_allowed > 0 {
            admitted as f64 / max_allowed as f64
        } else {
            0.0
        },
        p50_ms: ms(latency.value_at_quantile(0.50)),
        p99_ms: ms(latency.value_at_quantile(0.99)),
        max_ms: ms(latency.max()),
        window_violations: window_violations(&ats, &spec.limits),
        errors: shared.errors.load(Ordering::Relaxed),
    })
}

/// One client: ask until the end of the run, record every admitted store time.
async fn client(rl: tessera::RateLimiter, s: Arc<Shared>, yield_between: bool) -> ClientResult {
    let mut r = ClientResult {
        decisions: 0,
        ats: Vec::new(),
        latency: histogram(),
    };
    loop {
        let t0 = Instant::now();
        if t0 >= s.end {
            break;
        }
        let answer = match s.mode {
            RateBenchMode::Decisions => rl.try_acquire(1).await,
            // Never reserve past the end of the loop (the hard bound stays a bound).
            RateBenchMode::Reserve => rl.acquire_within(1, s.horizon.min(s.end - t0)).await,
        };
        let took = t0.elapsed().as_micros() as u64;
        r.latency.saturating_record(took.max(1));
        r.decisions += 1;
        s.progress.inc(1);
        match answer {
            Ok(RateDecision::Admitted { at }) => r.ats.push(at.as_micros()),
            Ok(RateDecision::Limited { retry_after, .. }) => {
                if s.mode == RateBenchMode::Reserve {
                    // The earliest slot is beyond what may be reserved: past the end of the
                    // loop (stop), or more than the longest period ahead (wait until it
                    // comes within reach).
                    let now = Instant::now();
                    if now + retry_after >= s.end {
                        break;
                    }
                    let wake = now + retry_after.saturating_sub(s.horizon);
                    tokio::time::sleep_until(wake.max(now + Duration::from_millis(1))).await;
                }
            }
            Err(e) => {
                s.errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "bench rate call failed");
                break;
            }
        }
        if yield_between {
            // On an in-process store nothing else yields: let the other clients run.
            tokio::task::yield_now().await;
        }
    }
    r
}

/// The summary of a `rate` run.
pub fn table(r: &RateReport) -> String {
    let mode = match r.mode {
        RateBenchMode::Decisions => "decisions",
        RateBenchMode::Reserve => "reserve",
    };
    format!(
        "rate ({mode}): {} clients on {} over {:.1}s\n\
         decisions     {} ({:.0}/s)\n\
         admitted      {} ({:.1}/s; limit {:.1}/s)\n\
         ratio         {:.4} (of at most {} in the run)\n\
         latency ms    p50 {:.3}  p99 {:.3}  max {:.3}\n\
         violations    {}\n\
         errors        {}\n",
        r.clients,
        r.limits.join(" + "),
        r.duration_s,
        r.decisions,
        r.decisions_per_sec,
        r.admitted,
        r.admitted_per_sec,
        r.limit_per_sec,
        r.admitted_ratio,
        r.max_allowed,
        r.p50_ms,
        r.p99_ms,
        r.max_ms,
        r.window_violations,
        r.errors,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specs(s: &[&str]) -> Vec<RateSpec> {
        s.iter().map(|l| l.parse().unwrap()).collect()
    }

    #[test]
    fn the_most_admissions_follow_the_greedy_schedule() {
        let s = Duration::from_secs;
        assert_eq!(max_admissions(&specs(&["50/s"]), s(10)), 500);
        assert_eq!(max_admissions(&specs(&["20/s"]), s(1)), 20);
        assert_eq!(
            max_admissions(&specs(&["20/s"]), Duration::from_millis(1001)),
            40
        );
        assert_eq!(max_admissions(&specs(&["50/s", "1000/min"]), s(10)), 500);
        assert_eq!(max_admissions(&specs(&["50/s", "1000/min"]), s(30)), 1000);
        // 1,000 in 20 batches of 50, then 50 more when the first batch is a minute old.
        assert_eq!(max_admissions(&specs(&["50/s", "1000/min"]), s(61)), 1050);
        // Interfering limits: the bound min(N × ceil(T/L)) = 30 is not reachable.
        assert_eq!(max_admissions(&specs(&["10/s", "15/2s"]), s(3)), 25);
    }

    #[test]
    fn violations_are_windows_over_the_limit() {
        let l = specs(&["2/s"]);
        assert_eq!(window_violations(&[0, 0, 1_000_000, 1_000_000], &l), 0);
        assert_eq!(window_violations(&[0, 0, 999_999], &l), 1);
        assert_eq!(window_violations(&[0, 1, 2, 3], &l), 2);
    }
}
