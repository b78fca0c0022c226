//! What tessera reports about itself: metrics through the [`metrics`] facade (any exporter
//! the program installs receives them; without one they cost an atomic load each) and a
//! `tracing` span around every store call.
//!
//! # The metrics
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `tessera_grants_total` | counter | `name` | leases granted (acquire and try-acquire) |
//! | `tessera_acquire_wait_seconds` | histogram | `name` | from an acquire's call to its grant |
//! | `tessera_acquire_outcomes_total` | counter | `name`, `outcome` | `granted`, `no_permit` (try), `timed_out`, `error` |
//! | `tessera_waits_total` | counter | `name` | acquires that joined the queue |
//! | `tessera_queue_length` | gauge | `name` | the queue length a waiter found when it joined (its position + 1) |
//! | `tessera_renewals_total` | counter | `outcome` | keep-alive renewals: `ok`, `gone`, `error` |
//! | `tessera_losses_total` | counter | `reason` | leases lost: `gone`, `renewals_failing`, `stalled`, `closed` |
//! | `tessera_store_call_seconds` | histogram | `op` | latency of each call to the store |
//! | `tessera_store_errors_total` | counter | `op`, `kind` | store calls that failed |
//! | `tessera_rate_decisions_total` | counter | `name`, `decision` | rate requests `admitted` or `limited` |
//!
//! Names are labels: a program with very many semaphore names gets as many series. A
//! semaphore handle that names a tenant (`SemaphoreOptions::tenant`, `docs/fair-shares.md`)
//! adds the label `tenant` to the series of the first five metrics (grants, wait, outcomes,
//! waits, queue length), so each tenant's grants and waits show apart; a program whose
//! tenants are unbounded (one per end user, say) gets a series per tenant.
//!
//! # Spans
//!
//! Every call through the store seam runs inside a `debug` span `store_call` with the fields
//! `op` (the seam operation) and `name` (the semaphore or limiter), so a subscriber at `debug`
//! sees how long each took and what it was for. The span is made only while a `tracing`
//! subscriber takes `debug` events (the `log` crate alone does not receive it). The wrapper that does both is
//! [`Instrumented`]; [`crate::Store::connect`] puts it around every store it opens.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use metrics::{Counter, Gauge, Histogram};
use tracing::Instrument;

use tessera_core::error::{Error, LossReason, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{Backend, Capabilities, RateBackend, RateConfig, RateReply, RateRequest};

/// The metric handles of one semaphore, registered at its first use rather than at every
/// event: a grant then costs a few atomic adds, not a label allocation and a registry lookup
/// per metric. Registered lazily, so a recorder installed after `Semaphore::new` but before
/// the first acquire still receives them.
///
/// A handle that names a tenant (`docs/fair-shares.md`) adds the label `tenant` to its
/// series: one set of series per name and tenant.
pub(crate) struct SemMetrics {
    handles: OnceLock<SemHandles>,
    tenant: Option<String>,
}

struct SemHandles {
    grants: Counter,
    granted: Counter,
    no_permit: Counter,
    timed_out: Counter,
    error: Counter,
    wait: Histogram,
    waits: Counter,
    queue: Gauge,
}

impl std::fmt::Debug for SemMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SemMetrics")
    }
}

impl SemMetrics {
    /// The handles of a semaphore handle acquiring as `tenant`.
    pub(crate) fn new(tenant: Option<&Tenant>) -> SemMetrics {
        SemMetrics {
            handles: OnceLock::new(),
            tenant: tenant.map(|t| t.name().to_string()),
        }
    }

    fn get(&self, name: &Name) -> &SemHandles {
        self.handles.get_or_init(|| {
            let mut labels = vec![metrics::Label::new("name", name.as_str().to_string())];
            if let Some(t) = &self.tenant {
                labels.push(metrics::Label::new("tenant", t.clone()));
            }
            let outcome = |o: &'static str| {
                let mut l = labels.clone();
                l.push(metrics::Label::new("outcome", o));
                metrics::counter!("tessera_acquire_outcomes_total", l)
            };
            SemHandles {
                grants: metrics::counter!("tessera_grants_total", labels.clone()),
                granted: outcome("granted"),
                no_permit: outcome("no_permit"),
                timed_out: outcome("timed_out"),
                error: outcome("error"),
                wait: metrics::histogram!("tessera_acquire_wait_seconds", labels.clone()),
                waits: metrics::counter!("tessera_waits_total", labels.clone()),
                queue: metrics::gauge!("tessera_queue_length", labels),
            }
        })
    }
}

/// A lease was granted `waited` after its acquire was called.
pub(crate) fn granted(m: &SemMetrics, name: &Name, waited: Duration) {
    let h = m.get(name);
    h.grants.increment(1);
    h.granted.increment(1);
    h.wait.record(waited);
}

/// An acquire ended without a grant: `no_permit` (try), `timed_out` or `error`.
pub(crate) fn not_granted(m: &SemMetrics, name: &Name, outcome: &'static str) {
    let h = m.get(name);
    match outcome {
        "no_permit" => &h.no_permit,
        "timed_out" => &h.timed_out,
        _ => &h.error,
    }
    .increment(1);
}

/// An acquire joined the queue at `position` (0-based).
pub(crate) fn queued(m: &SemMetrics, name: &Name, position: u64) {
    let h = m.get(name);
    h.waits.increment(1);
    h.queue.set(position.saturating_add(1) as f64);
}

/// A keep-alive renewal answered: `ok`, `gone` or `error`.
pub(crate) fn renewal(outcome: &'static str) {
    metrics::counter!("tessera_renewals_total", "outcome" => outcome).increment(1);
}

/// A lease was lost.
pub(crate) fn lost(reason: &LossReason) {
    metrics::counter!("tessera_losses_total", "reason" => reason.label()).increment(1);
}

/// An admission was given back unused, past its use-by instant (`crate::admission`).
pub(crate) fn admission_expired(name: &Name) {
    metrics::counter!("tessera_admissions_expired_total", "name" => name.as_str().to_string())
        .increment(1);
}

/// A rate request was decided.
pub(crate) fn rate_decision(name: &Name, admitted: bool) {
    let decision = if admitted { "admitted" } else { "limited" };
    metrics::counter!("tessera_rate_decisions_total", "name" => name.as_str().to_string(), "decision" => decision)
        .increment(1);
}

/// A backend that times and traces every call of the one it wraps (see the module docs).
/// Everything else — `Debug`, capabilities, the rate seam's presence — is the inner one's.
pub struct Instrumented {
    inner: Arc<dyn Backend>,
    /// The latency histogram of each operation, registered at its first call.
    latency: [OnceLock<Histogram>; OPS.len()],
}

/// The operations of the seam, in the order of [`Instrumented`]'s histograms.
const OPS: [&str; 15] = [
    "acquire",
    "heartbeat",
    "cancel",
    "release",
    "renew",
    "status",
    "list",
    "resize",
    "revoke",
    "delete",
    "rate_acquire",
    "rate_cancel",
    "rate_status",
    "rate_list",
    "rate_delete",
];

impl Instrumented {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>) -> Instrumented {
        Instrumented {
            inner,
            latency: Default::default(),
        }
    }
}

impl std::fmt::Debug for Instrumented {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

/// The index of `op` in [`OPS`], evaluated at compile time at every call site.
const fn op_index(op: &str) -> usize {
    let mut i = 0;
    while i < OPS.len() {
        let (a, b) = (OPS[i].as_bytes(), op.as_bytes());
        if a.len() == b.len() {
            let mut j = 0;
            while j < a.len() && a[j] == b[j] {
                j += 1;
            }
            if j == a.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not an operation of the seam")
}

impl Instrumented {
    fn latency(&self, i: usize) -> &Histogram {
        self.latency[i]
            .get_or_init(|| metrics::histogram!("tessera_store_call_seconds", "op" => OPS[i]))
    }
}

/// Whether the `store_call` spans reach anyone: a `tracing` subscriber that takes `debug`
/// events. Without one, no span is made (making and entering a disabled span still costs
/// more than an in-process store call).
fn spans_enabled() -> bool {
    tracing::level_enabled!(tracing::Level::DEBUG)
}

/// Runs one store call inside its span, and records its latency (and its failure).
async fn call<T>(
    latency: &Histogram,
    op: &'static str,
    name: &str,
    f: impl Future<Output = Result<T>>,
) -> Result<T> {
    let start = Instant::now();
    let r = if spans_enabled() {
        f.instrument(tracing::debug_span!("store_call", op, name))
            .await
    } else {
        f.await
    };
    latency.record(start.elapsed());
    count_error(op, &r);
    r
}

/// [`call`] for a step run at once ([`Backend::acquire_now`]); `None` if the inner store has
/// no such step (nothing is recorded then).
fn call_now<T>(
    latency: &Histogram,
    op: &'static str,
    name: &str,
    f: impl FnOnce() -> Option<Result<T>>,
) -> Option<Result<T>> {
    let start = Instant::now();
    let r = if spans_enabled() {
        tracing::debug_span!("store_call", op, name).in_scope(f)?
    } else {
        f()?
    };
    latency.record(start.elapsed());
    count_error(op, &r);
    Some(r)
}

fn count_error<T>(op: &'static str, r: &Result<T>) {
    if let Err(e) = r {
        let kind = match e {
            Error::Store { kind, .. } => match kind {
                StoreErrorKind::Connection => "connection",
                StoreErrorKind::Timeout => "timeout",
                StoreErrorKind::Busy => "busy",
                _ => "other",
            },
            Error::Corrupt(_) => "corrupt",
            _ => "refused",
        };
        metrics::counter!("tessera_store_errors_total", "op" => op, "kind" => kind).increment(1);
    }
}

#[async_trait]
impl Backend for Instrumented {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        call(
            self.latency(const { op_index("acquire") }),
            "acquire",
            name.as_str(),
            self.inner.acquire(name, capacity, req),
        )
        .await
    }

    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        call(
            self.latency(const { op_index("heartbeat") }),
            "heartbeat",
            name.as_str(),
            self.inner.heartbeat(name, lease, waiter_ttl),
        )
        .await
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        call(
            self.latency(const { op_index("cancel") }),
            "cancel",
            name.as_str(),
            self.inner.cancel(name, lease),
        )
        .await
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        call(
            self.latency(const { op_index("release") }),
            "release",
            name.as_str(),
            self.inner.release(name, lease),
        )
        .await
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        call(
            self.latency(const { op_index("renew") }),
            "renew",
            name.as_str(),
            self.inner.renew(name, lease, ttl),
        )
        .await
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        call(
            self.latency(const { op_index("status") }),
            "status",
            name.as_str(),
            self.inner.status(name),
        )
        .await
    }

    async fn list(&self) -> Result<Vec<String>> {
        call(
            self.latency(const { op_index("list") }),
            "list",
            "",
            self.inner.list(),
        )
        .await
    }

    /// Forwarded as is: a health probe pings twice a second, and its round trips would
    /// crowd the operations' latencies and counts.
    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        call(
            self.latency(const { op_index("resize") }),
            "resize",
            name.as_str(),
            self.inner.resize(name, capacity),
        )
        .await
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        call(
            self.latency(const { op_index("revoke") }),
            "revoke",
            name.as_str(),
            self.inner.revoke(name, lease),
        )
        .await
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        call(
            self.latency(const { op_index("delete") }),
            "delete",
            name.as_str(),
            self.inner.delete(name),
        )
        .await
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    /// An administrator's call, rare: forwarded without a series of its own.
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        self.inner.set_tenant_limits(name, tenant, limits).await
    }

    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        self.inner.tenant_limits(name).await
    }

    fn acquire_now(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Option<Result<AcquireReply>> {
        call_now(
            self.latency(const { op_index("acquire") }),
            "acquire",
            name.as_str(),
            || self.inner.acquire_now(name, capacity, req),
        )
    }

    fn release_now(&self, name: &Name, lease: LeaseId) -> Option<Result<bool>> {
        call_now(
            self.latency(const { op_index("release") }),
            "release",
            name.as_str(),
            || self.inner.release_now(name, lease),
        )
    }

    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        self.inner.next_expiry(name)
    }

    fn rate(&self) -> Option<&dyn RateBackend> {
        self.inner.rate().map(|_| self as &dyn RateBackend)
    }

    fn rate_unsupported(&self) -> Option<&'static str> {
        self.inner.rate_unsupported()
    }

    /// Admission steps are not timed apart yet: the inner store's, as they are.
    fn admission(&self) -> Option<&dyn tessera_core::seam::AdmissionBackend> {
        self.inner.admission()
    }
}

impl Instrumented {
    fn inner_rate(&self) -> &dyn RateBackend {
        self.inner
            .rate()
            .expect("Instrumented::rate offers the rate seam only when the inner backend has it")
    }
}

#[async_trait]
impl RateBackend for Instrumented {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        call(
            self.latency(const { op_index("rate_acquire") }),
            "rate_acquire",
            name.as_str(),
            self.inner_rate().rate_acquire(name, config, req),
        )
        .await
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        call(
            self.latency(const { op_index("rate_cancel") }),
            "rate_cancel",
            name.as_str(),
            self.inner_rate().rate_cancel(name, reservation, at),
        )
        .await
    }

    async fn rate_status(
        &self,
        name: &Name,
    ) -> Result<Option<tessera_core::rate::seam::RateStatus>> {
        call(
            self.latency(const { op_index("rate_status") }),
            "rate_status",
            name.as_str(),
            self.inner_rate().rate_status(name),
        )
        .await
    }

    async fn rate_list(&self) -> Result<Vec<String>> {
        call(
            self.latency(const { op_index("rate_list") }),
            "rate_list",
            "",
            self.inner_rate().rate_list(),
        )
        .await
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        call(
            self.latency(const { op_index("rate_delete") }),
            "rate_delete",
            name.as_str(),
            self.inner_rate().rate_delete(name),
        )
        .await
    }
}
