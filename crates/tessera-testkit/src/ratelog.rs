//! The rate-limit log: worker processes (`tessera-rate-worker`) share one limiter and log
//! every admission; [`check`] proves from the merged logs that no limit was exceeded in any
//! window.
//!
//! Each admission is logged with the store's admit time (`at_us`, the store's clock) and the
//! interval `[invoked_ns, returned_ns]` on the host's `CLOCK_MONOTONIC`, shared by every
//! process of the host. The true admission instant lies in that interval: the store read its
//! clock after the call was sent, and `acquire` returns only after sleeping until the
//! reserved time. Three checks, each sound (a correct store can never fail them):
//!
//! 1. **store windows**: on the store's admit times, every window `(s - L, s]` holds at most
//!    `N` (what the store itself claims);
//! 2. **certain windows on the monotonic clock**: no set of admissions whose intervals all fit
//!    in a span shorter than `L` costs more than `N` (those certainly shared a window,
//!    whatever the latencies);
//! 3. **clock consistency**: one offset between the store's clock and the monotonic clock
//!    puts every admit time inside its interval (within a small slack for clock slewing), so
//!    the store times of check 1 are the real ones, not invented.
//!
//! Each admission also records `used_us`, the host's wall clock (`CLOCK_REALTIME`) at the
//! moment `acquire` returned, when the caller would make its call: [`check_use_times`]
//! counts what a downstream service would count, in windows of those use times. The stores
//! of these tests (SQLite, a local Redis) keep time on the same host clock, so a use's
//! delay after its admission is `used_us - at_us`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tessera::{RateDecision, RateLimiter, RateOptions, RateSpec, Store};

use crate::grantlog::monotonic_ns;
use crate::window;

/// One admission.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct RateEvent {
    /// The store's admit time, µs.
    pub at_us: u64,
    /// The cost.
    pub cost: u32,
    /// When the call was made, `CLOCK_MONOTONIC` ns.
    pub invoked_ns: u64,
    /// When it returned, `CLOCK_MONOTONIC` ns.
    pub returned_ns: u64,
    /// Whether it was a reservation (`acquire`) rather than a `try_acquire`.
    pub reserved: bool,
    /// When the call returned, on the host's wall clock (µs since the epoch): the moment of
    /// use. 0 in logs written before it was recorded.
    #[serde(default)]
    pub used_us: u64,
}

/// What one rate worker does.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "tessera-rate-worker",
    about = "Hammers a rate limiter, logging every admission"
)]
pub struct RateWorkerArgs {
    /// Store URL.
    #[arg(long)]
    pub store: String,
    /// Limiter name.
    #[arg(long)]
    pub name: String,
    /// A limit, e.g. 50/s (repeat for several).
    #[arg(long = "rate", required = true)]
    pub rates: Vec<RateSpec>,
    /// How long to run, in milliseconds.
    #[arg(long)]
    pub run_ms: u64,
    /// The log to write (JSON lines).
    #[arg(long)]
    pub log: PathBuf,
    /// Largest cost (uniform in 1..=max).
    #[arg(long, default_value_t = 1)]
    pub max_cost: u32,
    /// Share of requests made with try_acquire (the rest reserve with acquire).
    #[arg(long, default_value_t = 0.5)]
    pub try_ratio: f64,
    /// The acquire's maximum wait, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub max_wait_ms: u64,
    /// Random seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Only `acquire` (wait until admitted), cost 1, as fast as admitted: the demand of
    /// callers that use each admission at once.
    #[arg(long)]
    pub acquire_only: bool,
    /// The limiter's margin between admission and use, in µs (default: the library's).
    #[arg(long)]
    pub margin_us: Option<u64>,
}

/// The host's wall clock (`CLOCK_REALTIME`), µs since the epoch.
pub fn wall_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A worker's own counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RateWorkerSummary {
    /// Admissions.
    pub admitted: u64,
    /// Limited answers.
    pub limited: u64,
    /// Requests (admitted + limited).
    pub requests: u64,
}

/// Connects and runs a worker until `run_ms` passes.
pub async fn run_rate_worker(args: &RateWorkerArgs) -> anyhow::Result<RateWorkerSummary> {
    let store = Store::connect(&args.store)
        .await
        .with_context(|| format!("connect {}", args.store))?;
    let mut opts = RateOptions::default();
    if let Some(us) = args.margin_us {
        opts = opts.margin(Duration::from_micros(us));
    }
    let rl = RateLimiter::new(&store, &args.name, &args.rates, opts)?;
    let mut log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&args.log)
        .with_context(|| format!("open {}", args.log.display()))?;
    let mut rng = StdRng::seed_from_u64(args.seed);
    let mut summary = RateWorkerSummary::default();
    let end = tokio::time::Instant::now() + Duration::from_millis(args.run_ms);
    while tokio::time::Instant::now() < end {
        if args.acquire_only {
            let invoked_ns = monotonic_ns();
            let at = rl.acquire(1).await?;
            let used_us = wall_us();
            let event = RateEvent {
                at_us: at.0,
                cost: 1,
                invoked_ns,
                returned_ns: monotonic_ns(),
                reserved: true,
                used_us,
            };
            summary.requests += 1;
            summary.admitted += 1;
            let mut line = serde_json::to_vec(&event)?;
            line.push(b'\n');
            log.write_all(&line)?;
            continue;
        }
        let cost = rng.random_range(1..=args.max_cost.max(1));
        let try_it = rng.random_bool(args.try_ratio.clamp(0.0, 1.0));
        let invoked_ns = monotonic_ns();
        let left = end.saturating_duration_since(tokio::time::Instant::now());
        let decision = if try_it {
            rl.try_acquire(cost).await?
        } else {
            let wait = Duration::from_millis(args.max_wait_ms).min(left);
            rl.acquire_within(cost, wait).await?
        };
        let returned_ns = monotonic_ns();
        let used_us = wall_us();
        summary.requests += 1;
        match decision {
            RateDecision::Admitted { at } => {
                summary.admitted += 1;
                let event = RateEvent {
                    at_us: at.0,
                    cost,
                    invoked_ns,
                    returned_ns,
                    reserved: !try_it,
                    used_us,
                };
                let mut line = serde_json::to_vec(&event)?;
                line.push(b'\n');
                log.write_all(&line)?;
            }
            RateDecision::Limited { retry_after, .. } => {
                summary.limited += 1;
                // Retry when told, or a little earlier for a reservation (a later call may
                // fit within its maximum wait).
                let pause = if try_it {
                    retry_after
                } else {
                    retry_after.min(Duration::from_millis(20))
                };
                tokio::time::sleep(pause.min(left)).await;
            }
        }
    }
    Ok(summary)
}

/// Reads every `*.jsonl` log in `dir`.
pub fn read_logs(dir: &Path) -> anyhow::Result<Vec<RateEvent>> {
    let mut events = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") {
            for line in std::fs::read_to_string(&path)?.lines() {
                if let Ok(e) = serde_json::from_str(line) {
                    events.push(e);
                }
            }
        }
    }
    Ok(events)
}

/// What the checker found for one limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitReport {
    /// The limit.
    pub limit: RateSpec,
    /// The largest cost in any window on the store's admit times (check 1).
    pub max_store_window: u64,
    /// The largest cost certainly in one window on the monotonic clock (check 2).
    pub max_certain_window: u64,
}

/// The checker's findings.
#[derive(Debug, Clone)]
pub struct RateReport {
    /// Per limit.
    pub limits: Vec<LimitReport>,
    /// Admissions and their total cost.
    pub admissions: u64,
    /// Total cost admitted.
    pub cost: u64,
    /// Store admit times span (first to last), µs.
    pub span_us: u64,
    /// Check 3: the offset interval (ns) left after intersecting every event, or the
    /// amount by which it is empty (negative width).
    pub offset_width_ns: i128,
    /// Every violation, in words.
    pub violations: Vec<String>,
}

impl std::fmt::Display for RateReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} admissions, cost {} over {:.3}s; offset interval width {} ns",
            self.admissions,
            self.cost,
            self.span_us as f64 / 1e6,
            self.offset_width_ns
        )?;
        for l in &self.limits {
            writeln!(
                f,
                "  {}: max {} in a window on store times, max {} certainly in a window on CLOCK_MONOTONIC",
                l.limit, l.max_store_window, l.max_certain_window
            )?;
        }
        for v in &self.violations {
            writeln!(f, "  VIOLATION: {v}")?;
        }
        Ok(())
    }
}

impl RateReport {
    /// Panics with the report if anything was violated.
    pub fn assert_ok(&self) {
        assert!(self.violations.is_empty(), "{self}");
    }
}

/// The largest cost in any window `(s - L, s]` of the admit times.
pub fn max_store_window(events: &[RateEvent], period_us: u64) -> u64 {
    let points: Vec<(u64, u32)> = events.iter().map(|e| (e.at_us, e.cost)).collect();
    window::max_in_window(&points, period_us)
}

/// The largest cost of admissions whose intervals all lie in `[invoked_a, invoked_a + L)`
/// for some admission `a`: those certainly shared a window of length `L`.
pub fn max_certain_window(events: &[RateEvent], period_ns: u64) -> u64 {
    let mut v = events.to_vec();
    v.sort_by_key(|e| e.invoked_ns);
    let mut worst = 0;
    for (i, a) in v.iter().enumerate() {
        let end = a.invoked_ns + period_ns;
        let sum: u64 = v[i..]
            .iter()
            .take_while(|e| e.invoked_ns < end)
            .filter(|e| e.returned_ns < end)
            .map(|e| e.cost as u64)
            .sum();
        worst = worst.max(sum);
    }
    worst
}

/// The `slack` of [`check`] for logs written by several processes of one host on one SQLite
/// file. The store keeps its times on the boot clock and each process converts them to wall
/// time with the offset it measured, replaced only when it moves by 10 ms or more (a
/// wall-clock step; see the SQLite store's module docs): a smaller step between two
/// processes' first replies leaves their reported times up to that far apart.
pub const SQLITE_PROCESSES_SLACK: Duration = Duration::from_millis(11);

/// Runs the three checks (see the module docs) for `limits`. `slack` bounds the drift
/// between the store's clock and `CLOCK_MONOTONIC` over the run.
pub fn check(events: &[RateEvent], limits: &[RateSpec], slack: Duration) -> RateReport {
    let mut violations = Vec::new();
    let mut reports = Vec::new();
    for &limit in limits {
        let period_us = limit.period().as_micros() as u64;
        let store = max_store_window(events, period_us);
        let certain = max_certain_window(events, period_us * 1000);
        if store > limit.count() as u64 {
            violations.push(format!(
                "{limit}: {store} admitted in one window of the store's clock"
            ));
        }
        if certain > limit.count() as u64 {
            violations.push(format!(
                "{limit}: {certain} admitted certainly within one window on CLOCK_MONOTONIC"
            ));
        }
        reports.push(LimitReport {
            limit,
            max_store_window: store,
            max_certain_window: certain,
        });
    }
    // offset = store ns - monotonic ns lies in [at - returned, at - invoked] for every event.
    let (mut lo, mut hi) = (i128::MIN, i128::MAX);
    for e in events {
        let at = e.at_us as i128 * 1000;
        lo = lo.max(at - e.returned_ns as i128);
        hi = hi.min(at - e.invoked_ns as i128);
    }
    let width = if events.is_empty() { 0 } else { hi - lo };
    if width < -(slack.as_nanos() as i128) {
        violations.push(format!(
            "store admit times do not fit the calls' monotonic intervals (by {} µs)",
            -width / 1000
        ));
    }
    let first = events.iter().map(|e| e.at_us).min().unwrap_or(0);
    let last = events.iter().map(|e| e.at_us).max().unwrap_or(0);
    RateReport {
        limits: reports,
        admissions: events.len() as u64,
        cost: events.iter().map(|e| e.cost as u64).sum(),
        span_us: last - first,
        offset_width_ns: width,
        violations,
    }
}

/// What [`check_use_times`] found for one limit.
#[derive(Debug, Clone)]
pub struct UseReport {
    /// The limit.
    pub limit: RateSpec,
    /// The largest cost in any window `(s - L, s]` of the use times.
    pub max_use_window: u64,
    /// The same, counting only the uses made within the margin after their admission: the
    /// guarantee is that this never exceeds `N`, however loaded the machine.
    pub max_on_time_window: u64,
    /// Uses made later than the margin after their admission (the process did not run in
    /// time: scheduling, a loaded machine).
    pub late_uses: u64,
    /// All uses.
    pub uses: u64,
    /// The delays (use time minus admission time, µs) of the uses in the fullest window,
    /// largest first.
    pub worst_window_delays_us: Vec<i64>,
    /// Delays over all uses, µs: median, 99th percentile, largest.
    pub delay_p50_us: i64,
    /// See `delay_p50_us`.
    pub delay_p99_us: i64,
    /// See `delay_p50_us`.
    pub delay_max_us: i64,
    /// Whole periods `L` between the first and the last admission (demand all along).
    pub full_periods: u64,
    /// The cost admitted in those whole periods, from the first admission on.
    pub admitted_in_full_periods: u64,
}

impl std::fmt::Display for UseReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: max {} in a window of use times ({} counting only the {} of {} uses made \
             within the margin); {} admitted in {} full periods ({:.1}% of \
             the limit); delay after admission p50 {} µs, p99 {} µs, max {} µs",
            self.limit,
            self.max_use_window,
            self.max_on_time_window,
            self.uses - self.late_uses,
            self.uses,
            self.admitted_in_full_periods,
            self.full_periods,
            self.admitted_in_full_periods as f64 * 100.0
                / (self.limit.count() as u64 * self.full_periods.max(1)) as f64,
            self.delay_p50_us,
            self.delay_p99_us,
            self.delay_max_us
        )
    }
}

/// Counts, for `limit`, the cost in every window `(s - L, s]` of the use times (what a
/// downstream service counts) — of all uses, and of the uses made within `margin` after their
/// admission —, the delays of the uses after their admission, and the cost admitted over the
/// whole periods of the run. Events without a use time are ignored.
pub fn check_use_times(events: &[RateEvent], limit: RateSpec, margin: Duration) -> UseReport {
    let period_us = limit.period().as_micros() as u64;
    let delay = |e: &RateEvent| e.used_us as i64 - e.at_us as i64;
    let mut v: Vec<&RateEvent> = events.iter().filter(|e| e.used_us > 0).collect();
    v.sort_by_key(|e| e.used_us);
    let (worst, range) = fullest_window(&v, period_us);
    let margin_us = margin.as_micros() as i64;
    let on_time: Vec<&RateEvent> = v
        .iter()
        .copied()
        .filter(|e| delay(e) <= margin_us)
        .collect();
    let (max_on_time_window, _) = fullest_window(&on_time, period_us);
    let mut worst_window_delays_us: Vec<i64> =
        v[range.0..range.1].iter().map(|e| delay(e)).collect();
    worst_window_delays_us.sort_unstable_by(|a, b| b.cmp(a));
    let mut delays: Vec<i64> = v.iter().map(|e| delay(e)).collect();
    delays.sort_unstable();
    let pct = |p: usize| {
        delays
            .get((delays.len() * p / 100).min(delays.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let first = v.iter().map(|e| e.at_us).min().unwrap_or(0);
    let last = v.iter().map(|e| e.at_us).max().unwrap_or(0);
    let full_periods = (last - first) / period_us;
    let admitted_in_full_periods = v
        .iter()
        .filter(|e| e.at_us < first + full_periods * period_us)
        .map(|e| e.cost as u64)
        .sum();
    UseReport {
        limit,
        max_use_window: worst,
        max_on_time_window,
        late_uses: (v.len() - on_time.len()) as u64,
        uses: v.len() as u64,
        worst_window_delays_us,
        delay_p50_us: pct(50),
        delay_p99_us: pct(99),
        delay_max_us: delays.last().copied().unwrap_or(0),
        full_periods,
        admitted_in_full_periods,
    }
}

/// The largest cost in a window `(s - L, s]` of the use times of `v` (sorted by use time),
/// and the range of `v` it holds.
fn fullest_window(v: &[&RateEvent], period_us: u64) -> (u64, (usize, usize)) {
    let points: Vec<(u64, u32)> = v.iter().map(|e| (e.used_us, e.cost)).collect();
    let (worst, range) = window::fullest_window(&points, period_us);
    (worst, (range.start, range.end))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(at_ms: u64, lat_ms: u64) -> RateEvent {
        RateEvent {
            at_us: 5_000_000 + at_ms * 1000,
            cost: 1,
            invoked_ns: at_ms * 1_000_000,
            returned_ns: (at_ms + lat_ms) * 1_000_000,
            reserved: false,
            used_us: 5_000_000 + (at_ms + lat_ms) * 1000,
        }
    }

    #[test]
    fn the_checker_catches_violations_and_passes_correct_logs() {
        let limit: RateSpec = "2/100ms".parse().unwrap();
        let ok = [ev(0, 1), ev(1, 1), ev(100, 1), ev(101, 1)];
        check(&ok, &[limit], Duration::ZERO).assert_ok();
        let over = [ev(0, 1), ev(1, 1), ev(50, 1)];
        let r = check(&over, &[limit], Duration::ZERO);
        assert_eq!(r.limits[0].max_store_window, 3);
        assert_eq!(r.limits[0].max_certain_window, 3);
        assert_eq!(r.violations.len(), 2, "{r}");
        // Admit times the calls' intervals cannot hold.
        let mut invented = ok;
        invented[3].at_us += 50_000;
        assert!(!check(&invented, &[limit], Duration::from_millis(1))
            .violations
            .is_empty());
    }

    #[test]
    fn use_times_are_counted_in_windows_with_their_delays() {
        let limit: RateSpec = "2/100ms".parse().unwrap();
        // Admitted 100 ms apart (fine on the store's clock), the first used 30 ms late.
        let mut late = [ev(0, 30), ev(1, 1), ev(100, 1), ev(101, 1)];
        let r = check_use_times(&late, limit, Duration::from_millis(20));
        assert_eq!(r.max_use_window, 3);
        assert_eq!(r.worst_window_delays_us, vec![30_000, 1_000, 1_000]);
        // The late use explains the excess: on time, the window holds 2.
        assert_eq!((r.max_on_time_window, r.late_uses, r.uses), (2, 1, 4));
        late[0].used_us = late[0].at_us + 1_000;
        let r = check_use_times(&late, limit, Duration::from_millis(20));
        assert_eq!(r.max_use_window, 2);
        assert_eq!((r.full_periods, r.admitted_in_full_periods), (1, 2));
    }
}
