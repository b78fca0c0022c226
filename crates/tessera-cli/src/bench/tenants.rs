//! The `tenants` workload (`docs/fair-shares.md`): fair shares against a flood, beside plain
//! FIFO in the same run, each way on fresh names for `--rate-run` (default 10 s):
//!
//! - `flood` on a semaphore (`--capacity`, default 4, each call held `--hold`, default
//!   20 ms) and on an admission of `--rates` (default 50/s, 1000/min; permits not the
//!   limit), with exact windows and with smooth pacing (burst 1): one tenant, `bulk`, asks `--flood` times (default 2,000) at once; five others,
//!   `light-1` to `light-5`, ask once every 200 ms each. Measured per tenant: grants in the
//!   run and the wait from asking to holding (p50, p99, max).
//! - `shares` on the semaphore: three backlogged tenants with shares 1, 2 and 3, 16
//!   closed-loop clients each; measured: each tenant's part of the grants against its
//!   share, and Jain's index of the grants divided by the shares (1.0: exactly fair).
//!
//! `fifo` runs the same clients without tenants. A store without fair shares answers
//! `Unsupported` for the `shares` way, which is reported as an error.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tessera::{
    Admission, RateMode, RateOptions, RateSpec, Semaphore, SemaphoreOptions, Store, Tenant,
};
use tokio::time::Instant;

use super::clients::histogram;

/// The `tenants` workload's parameters.
#[derive(Debug, Clone)]
pub struct TenantsSpec {
    pub capacity: u32,
    pub hold: Duration,
    pub limits: Vec<RateSpec>,
    pub run: Duration,
    pub flood: usize,
}

/// One tenant's figures.
#[derive(Debug, Clone, Serialize)]
pub struct TenantFigures {
    pub tenant: String,
    pub share: u32,
    /// Grants made in the run.
    pub grants: u64,
    /// This tenant's part of the grants, and its share's part of the shares (`shares`).
    pub part: f64,
    pub share_part: f64,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, Serialize)]
pub struct TenantsReport {
    /// `tenants`.
    pub workload: String,
    /// `flood-semaphore`, `flood-admission` or `shares`.
    pub case: String,
    /// `shares` (tenants named) or `fifo` (none).
    pub way: String,
    pub store: String,
    pub duration_s: f64,
    pub tenants: Vec<TenantFigures>,
    /// The light tenants' waits together (flood cases).
    pub light_wait_p99_ms: f64,
    /// Jain's index of grants ÷ share over the tenants (`shares` case).
    pub jain: f64,
    pub errors: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Case {
    FloodSemaphore,
    /// Exact windows: with a backlog they free in bursts (a whole window's worth at once).
    FloodAdmission,
    /// Smooth pacing (burst 1): one admission every `1/N`.
    FloodAdmissionSmooth,
    Shares,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::FloodSemaphore => "flood-semaphore",
            Case::FloodAdmission => "flood-admission",
            Case::FloodAdmissionSmooth => "flood-admission-smooth",
            Case::Shares => "shares",
        }
    }
}

/// What a tenant's calls take.
#[derive(Clone)]
enum Taker {
    Semaphore(Semaphore),
    Admission(Admission),
}

struct Ctx {
    end: Instant,
    hard: Instant,
    hold: Duration,
    errors: AtomicU64,
    /// Per tenant: grants in the run and their waits (µs).
    seen: Mutex<BTreeMap<String, (u64, Histogram<u64>)>>,
}

impl Ctx {
    fn record(&self, tenant: &str, asked: Instant, wait: Duration) {
        if asked >= self.end {
            return;
        }
        let mut seen = self.seen.lock().unwrap();
        let (n, h) = seen
            .entry(tenant.to_string())
            .or_insert_with(|| (0, histogram()));
        *n += 1;
        let _ = h.record((wait.as_micros() as u64).max(1));
    }
}

/// One call: ask, hold for `--hold`, release.
async fn call(ctx: Arc<Ctx>, taker: Taker, tenant: String) {
    let asked = Instant::now();
    let timeout = ctx.hard.saturating_duration_since(asked);
    let held = match &taker {
        Taker::Semaphore(s) => s
            .acquire_many_timeout(1, timeout)
            .await
            .map(|p| p.map(Held::Permit)),
        Taker::Admission(a) => a
            .acquire_timeout(timeout)
            .await
            .map(|t| t.map(Held::Ticket)),
    };
    match held {
        Ok(Some(h)) => {
            ctx.record(&tenant, asked, asked.elapsed());
            if !ctx.hold.is_zero() {
                tokio::time::sleep(ctx.hold).await;
            }
            let released = match h {
                Held::Permit(p) => p.release().await,
                Held::Ticket(t) => t.release().await,
            };
            if released.is_err() {
                ctx.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        Ok(None) => {}
        Err(e) => {
            ctx.errors.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %e, "bench tenants call failed");
        }
    }
}

enum Held {
    Permit(tessera::Permit),
    Ticket(tessera::Admitted),
}

/// Runs every case both ways, one after the other.
pub async fn run(store_url: &str, spec: &TenantsSpec) -> anyhow::Result<Vec<TenantsReport>> {
    let mut out = Vec::new();
    for case in [
        Case::FloodSemaphore,
        Case::FloodAdmission,
        Case::FloodAdmissionSmooth,
        Case::Shares,
    ] {
        for fair in [true, false] {
            out.push(run_case(store_url, spec, case, fair).await?);
        }
    }
    Ok(out)
}

async fn run_case(
    store_url: &str,
    spec: &TenantsSpec,
    case: Case,
    fair: bool,
) -> anyhow::Result<TenantsReport> {
    let store = Store::connect(store_url).await?;
    let way = if fair { "shares" } else { "fifo" };
    let name = format!(
        "tessera-bench-{}-{way}-{:08x}",
        case.name(),
        rand::random::<u32>()
    );
    let start = Instant::now();
    let ctx = Arc::new(Ctx {
        end: start + spec.run,
        hard: start + spec.run + Duration::from_secs(5),
        hold: match case {
            Case::FloodAdmission | Case::FloodAdmissionSmooth => Duration::ZERO,
            _ => spec.hold,
        },
        errors: AtomicU64::new(0),
        seen: Mutex::new(BTreeMap::new()),
    });
    let tenants: Vec<(String, u32)> = match case {
        Case::Shares => vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)],
        _ => std::iter::once(("bulk".to_string(), 1))
            .chain((1..=5).map(|i| (format!("light-{i}"), 1)))
            .collect(),
    };
    let mut takers = BTreeMap::new();
    for (t, share) in &tenants {
        let mut opts = SemaphoreOptions::default()
            .ttl(Duration::from_secs(30))
            .holder(t.clone())
            .queue_cap(100_000);
        if fair {
            opts = opts.tenant(Tenant::new(t, *share)?);
        }
        let taker = match case {
            Case::FloodAdmission | Case::FloodAdmissionSmooth => {
                let mut limits = spec.limits.iter().cloned();
                let first = limits.next().expect("at least one limit");
                let mut adm = store
                    .admission(&name)
                    .permits(100_000)
                    .semaphore_options(opts);
                if case == Case::FloodAdmissionSmooth {
                    adm = adm
                        .rate_options(RateOptions::default().mode(RateMode::Smooth { burst: 1 }));
                }
                let mut adm = adm.rate(first)?;
                for l in limits {
                    adm = adm.rate(l)?;
                }
                Taker::Admission(adm)
            }
            _ => Taker::Semaphore(Semaphore::new(&store, &name, spec.capacity, opts)?),
        };
        takers.insert(t.clone(), taker);
    }
    let mut tasks = Vec::new();
    match case {
        Case::Shares => {
            for (t, _) in &tenants {
                for _ in 0..16 {
                    let (ctx, taker, t) = (Arc::clone(&ctx), takers[t].clone(), t.clone());
                    tasks.push(tokio::spawn(async move {
                        while Instant::now() < ctx.end {
                            call(Arc::clone(&ctx), taker.clone(), t.clone()).await;
                        }
                    }));
                }
            }
        }
        _ => {
            for _ in 0..spec.flood {
                let (ctx, taker) = (Arc::clone(&ctx), takers["bulk"].clone());
                tasks.push(tokio::spawn(call(ctx, taker, "bulk".to_string())));
            }
            for i in 1..=5 {
                let t = format!("light-{i}");
                let (ctx, taker) = (Arc::clone(&ctx), takers[&t].clone());
                tasks.push(tokio::spawn(async move {
                    let mut tick = tokio::time::interval(Duration::from_millis(200));
                    let mut calls = Vec::new();
                    while Instant::now() < ctx.end {
                        tick.tick().await;
                        let c = call(Arc::clone(&ctx), taker.clone(), t.clone());
                        calls.push(tokio::spawn(c));
                    }
                    for c in calls {
                        let _ = c.await;
                    }
                }));
            }
        }
    }
    // The light tenants' last calls and the shares' clients end by themselves; the flood's
    // queue is given up at the hard bound (a dropped wait gives its place up).
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout_at(ctx.hard, t).await.is_err() {
            abort.abort();
        }
    }
    let seen = ctx.seen.lock().unwrap();
    let total: u64 = seen.values().map(|(n, _)| n).sum();
    let shares: u32 = tenants.iter().map(|t| t.1).sum();
    let ms = |us: u64| us as f64 / 1000.0;
    let mut light = histogram();
    let mut figures = Vec::new();
    for (t, share) in &tenants {
        let (grants, h) = seen.get(t).cloned().unwrap_or_else(|| (0, histogram()));
        if t.starts_with("light") {
            light.add(&h).expect("same bounds");
        }
        figures.push(TenantFigures {
            tenant: t.clone(),
            share: *share,
            grants,
            part: grants as f64 / total.max(1) as f64,
            share_part: *share as f64 / shares as f64,
            wait_p50_ms: ms(h.value_at_quantile(0.50)),
            wait_p99_ms: ms(h.value_at_quantile(0.99)),
            wait_max_ms: ms(h.max()),
        });
    }
    let normalized: Vec<f64> = figures
        .iter()
        .map(|f| f.grants as f64 / f.share as f64)
        .collect();
    Ok(TenantsReport {
        workload: "tenants".to_string(),
        case: case.name().to_string(),
        way: way.to_string(),
        store: tessera::backend::redact_url(store_url),
        duration_s: spec.run.as_secs_f64(),
        tenants: figures,
        light_wait_p99_ms: ms(light.value_at_quantile(0.99)),
        jain: jain(&normalized),
        errors: ctx.errors.load(Ordering::Relaxed),
    })
}

/// Jain's fairness index: (Σx)² / (n Σx²); 1.0 when every x is equal.
fn jain(x: &[f64]) -> f64 {
    let sum: f64 = x.iter().sum();
    let sq: f64 = x.iter().map(|v| v * v).sum();
    if sq == 0.0 {
        return 0.0;
    }
    sum * sum / (x.len() as f64 * sq)
}

/// The table of `tessera bench --workload tenants`.
pub fn table(reports: &[TenantsReport]) -> String {
    let mut out = String::new();
    for r in reports {
        let light: u64 = r
            .tenants
            .iter()
            .filter(|t| t.tenant.starts_with("light"))
            .map(|t| t.grants)
            .sum();
        let summary = match r.case.as_str() {
            "shares" => format!("Jain's index of grants per share {:.3}", r.jain),
            _ if light == 0 => "no light tenant granted in the run".to_string(),
            _ => format!("light tenants' wait p99 {:.1} ms", r.light_wait_p99_ms),
        };
        out.push_str(&format!(
            "{} {} on {} ({:.0} s): {summary}, errors {}\n",
            r.case, r.way, r.store, r.duration_s, r.errors
        ));
        for t in &r.tenants {
            out.push_str(&format!(
                "  {:<8} share {} grants {:>6} ({:>5.1}% of them, share {:>5.1}%)  wait p50 {:>8.1} ms  p99 {:>8.1} ms  max {:>8.1} ms\n",
                t.tenant,
                t.share,
                t.grants,
                100.0 * t.part,
                100.0 * t.share_part,
                t.wait_p50_ms,
                t.wait_p99_ms,
                t.wait_max_ms
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::jain;

    #[test]
    fn jains_index_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[3.0, 3.0, 3.0]) - 1.0).abs() < 1e-12);
        assert!((jain(&[9.0, 0.0, 0.0]) - 1.0 / 3.0).abs() < 1e-12);
    }
}
