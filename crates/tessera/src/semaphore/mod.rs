//! The public semaphore: `tokio::sync::Semaphore` carried over the network.
//!
//! How an acquire waits is in `wait.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::permit::Permit;
use crate::lease::SemaphoreConfig;
use crate::store::Store;
use tessera_core::error::{InvalidInput, Result};
use tessera_core::model::*;
use tessera_core::seam::Backend;

pub(crate) mod admit;
pub(crate) mod place;
mod wait;

pub use place::{QueuePace, QueuePlace};

/// Options of a [`Semaphore`] or [`crate::Lock`].
///
/// ```
/// use std::time::Duration;
/// let opts = tessera::SemaphoreOptions::default()
///     .ttl(Duration::from_secs(10))
///     .holder("worker-7")
///     .queue_cap(500);
/// # let _ = opts;
/// ```
#[derive(Debug, Clone)]
pub struct SemaphoreOptions {
    pub(crate) ttl: Duration,
    pub(crate) keep_alive: Option<Duration>,
    pub(crate) holder: Option<String>,
    pub(crate) queue_cap: u32,
    pub(crate) waiter_ttl: Duration,
    pub(crate) tenant: Option<Tenant>,
}

impl Default for SemaphoreOptions {
    fn default() -> Self {
        SemaphoreOptions {
            ttl: Duration::from_secs(30),
            keep_alive: None,
            holder: None,
            queue_cap: 10_000,
            waiter_ttl: Duration::from_secs(5),
            tenant: None,
        }
    }
}

impl SemaphoreOptions {
    /// Lease TTL (default 30 s, between 100 ms and 24 h): how long a permit outlives a
    /// holder that crashed or froze.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }
    /// Keep-alive interval (default TTL/3; must be below TTL/2).
    pub fn keep_alive(mut self, interval: Duration) -> Self {
        self.keep_alive = Some(interval);
        self
    }
    /// The tenant whose share this client's acquires count against (`docs/fair-shares.md`):
    /// under contention, permits go to the waiting tenants in proportion to their shares,
    /// FIFO within each. Default: none (the tenant `""` with share 1: plain FIFO). A store
    /// that cannot order by shares fails [`Semaphore::new`] with
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = Some(tenant);
        self
    }
    /// Holder label shown by `status` (default `hostname/pid`).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }
    /// Longest queue this client will join (default 10,000); beyond it acquire fails with
    /// [`Error::QueueFull`](crate::Error::QueueFull).
    pub fn queue_cap(mut self, cap: u32) -> Self {
        self.queue_cap = cap;
        self
    }
    /// How long a queued waiter stays in the queue without a heartbeat (default 5 s): a
    /// waiter that died leaves the queue within this time.
    pub fn waiter_ttl(mut self, ttl: Duration) -> Self {
        self.waiter_ttl = ttl;
        self
    }

    pub(crate) fn keep_alive_interval(&self) -> Duration {
        self.keep_alive.unwrap_or(self.ttl / 3)
    }
}

/// A semaphore of `capacity` permits shared by every process that opens the same name on the
/// same store.
///
/// **Fairness.** Waiters are served in the order the store received their acquires, weighted
/// head-of-line: a request for many permits at the head is not overtaken by smaller ones
/// behind it. `try_acquire` never jumps the queue.
///
/// **Cancel safety.** Every acquire may be dropped or timed out at any point: no permit is
/// leaked (a grant that raced with the cancellation is given back), but the waiter loses its
/// place in the queue.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // At most 4 heavy reports at once across every process sharing the store.
/// let store = tessera::Store::connect("memory://").await?;
/// let reports = store.semaphore("heavy-reports", 4)?;
/// let permit = reports.acquire().await?;
/// println!("seat {} fence {}", permit.seats()[0], permit.fence());
/// permit.release().await?;
/// # Ok::<(), tessera::Error>(()) }).unwrap();
/// ```
#[derive(Debug)]
pub struct Semaphore {
    store: Store,
    /// The capacity this handle declares; [`Semaphore::resize`] changes it.
    capacity: AtomicU32,
    config: Arc<SemaphoreConfig>,
}

impl Clone for Semaphore {
    fn clone(&self) -> Self {
        Semaphore {
            store: self.store.clone(),
            capacity: AtomicU32::new(self.capacity()),
            config: Arc::clone(&self.config),
        }
    }
}

impl Store {
    /// A semaphore of `capacity` permits with default options.
    pub fn semaphore(&self, name: &str, capacity: u32) -> Result<Semaphore> {
        Semaphore::new(self, name, capacity, SemaphoreOptions::default())
    }
}

impl Semaphore {
    /// Opens a semaphore. Nothing is written to the store until the first acquire.
    ///
    /// Errors (typed, nothing changed): an invalid name, a capacity of 0 or above
    /// [`MAX_CAPACITY`], a TTL, keep-alive interval, waiter TTL, queue cap or holder label out
    /// of range.
    pub fn new(store: &Store, name: &str, capacity: u32, opts: SemaphoreOptions) -> Result<Self> {
        let name = Name::new(name)?;
        let capacity = validate_capacity(capacity)?;
        // The client's range, and the store's own limits (e.g. whole seconds on etcd).
        let caps = store.backend().capabilities();
        caps.check_ttl(opts.ttl)?;
        caps.check_ttl(opts.waiter_ttl)?;
        let keep_alive = opts.keep_alive_interval();
        if keep_alive < Duration::from_millis(1) || keep_alive >= opts.ttl / 2 {
            return Err(InvalidInput::KeepAlive {
                interval: keep_alive,
                ttl: opts.ttl,
            }
            .into());
        }
        if opts.queue_cap == 0 || opts.queue_cap > MAX_QUEUE_CAP {
            return Err(InvalidInput::QueueCap(opts.queue_cap as u64).into());
        }
        let holder = opts.holder.clone().unwrap_or_else(default_holder);
        validate_holder(&holder)?;
        if opts.tenant.is_some() && !caps.fair_shares {
            return Err(tessera_core::error::Error::Unsupported(format!(
                "fair shares between tenants are not available on {} yet \
                 (docs/fair-shares.md)",
                store.url()
            )));
        }
        Ok(Semaphore {
            store: store.clone(),
            capacity: AtomicU32::new(capacity),
            config: Arc::new(SemaphoreConfig {
                name,
                ttl: opts.ttl,
                keep_alive,
                holder,
                queue_cap: opts.queue_cap,
                waiter_ttl: opts.waiter_ttl,
                tenant: opts.tenant.clone(),
                metrics: crate::telemetry::SemMetrics::new(opts.tenant.as_ref()),
            }),
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.config.name.as_str()
    }

    /// The capacity this client declared (or set with [`Semaphore::resize`]).
    pub fn capacity(&self) -> u32 {
        self.capacity.load(Ordering::Relaxed)
    }

    /// The name, as the seam takes it.
    pub(crate) fn config_name(&self) -> &Name {
        &self.config.name
    }

    /// The store this handle was made on.
    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    /// A place at the store for a new request on this semaphore (see `crate::arrivals`),
    /// held until its reply is in; `None` once `deadline` passed, having sent nothing.
    async fn arrive(
        &self,
        deadline: Option<tokio::time::Instant>,
    ) -> Option<crate::arrivals::Pass> {
        let arrive = self
            .store
            .conn()
            .arrive(&self.config.name, self.config.tenant.as_ref());
        wait::bounded(deadline, arrive).await
    }

    fn backend(&self) -> &Arc<dyn Backend> {
        self.store.backend()
    }

    /// Waits for one permit. See [`Semaphore::acquire_many`].
    pub async fn acquire(&self) -> Result<Permit> {
        self.acquire_many(1).await
    }

    /// Waits for `weight` permits, as one lease.
    ///
    /// On success the permit is held and kept alive until the [`Permit`] is dropped or
    /// released. Transient store faults (a dropped connection, a busy store) are retried under
    /// the same lease id for up to the waiter TTL. On error no permit is held (a grant that
    /// raced with the error is given back in the background). Fails at once with a typed error if `weight` is 0 or above the
    /// capacity, if the store holds another capacity for this name, or if the queue is full.
    pub async fn acquire_many(&self, weight: u32) -> Result<Permit> {
        match self.acquire_inner(weight, None, None).await? {
            Some(p) => Ok(p),
            None => unreachable!("an acquire without a deadline returns a permit or an error"),
        }
    }

    /// Waits for `weight` permits for at most `timeout`; `Ok(None)` if none came in time.
    ///
    /// On `Ok(None)` nothing is held and the place in the queue is given up: the cancel is sent
    /// at the deadline and awaited for up to 250 ms (one round trip on a healthy store); a store
    /// that has not answered by then is cancelled in the background, and until that lands the
    /// stale queue entry can delay others by at most its waiter TTL.
    pub async fn acquire_many_timeout(
        &self,
        weight: u32,
        timeout: Duration,
    ) -> Result<Option<Permit>> {
        self.acquire_inner(weight, Some(Instant::now() + timeout), None)
            .await
    }

    /// Waits for `weight` permits until `deadline`; `Ok(None)` if none came in time.
    pub async fn acquire_many_until(
        &self,
        weight: u32,
        deadline: Instant,
    ) -> Result<Option<Permit>> {
        self.acquire_inner(weight, Some(deadline), None).await
    }

    /// Waits for `weight` permits until `deadline` (`None`: as long as it takes), as
    /// [`Semaphore::acquire_many_until`], and while queued publishes its place and expected
    /// wait on `place` (see [`QueuePlace`]). The last place published stays when the wait
    /// ends (after a timeout: where it stood).
    ///
    /// The place is read with one status call of the semaphore every
    /// [`READ_EVERY`](place::READ_EVERY) while the acquire waits (a call whose cost grows
    /// with the queue); the expected wait is unknown until the place has moved once. Fairness,
    /// cancel safety and every exit path are those of [`Semaphore::acquire_many_until`].
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = tessera::Store::connect("memory://").await?;
    /// let exports = store.semaphore("exports", 1)?;
    /// let (place, mut seen) = tokio::sync::watch::channel::<Option<tessera::QueuePlace>>(None);
    /// tokio::spawn(async move {
    ///     while seen.changed().await.is_ok() {
    ///         if let Some(p) = *seen.borrow() {
    ///             eprintln!("{} ahead, about {:?} to go", p.position, p.expected_wait);
    ///         }
    ///     }
    /// });
    /// let permit = exports.acquire_many_watching(1, None, &place).await?;
    /// # drop(permit);
    /// # Ok::<(), tessera::Error>(()) }).unwrap();
    /// ```
    pub async fn acquire_many_watching(
        &self,
        weight: u32,
        deadline: Option<Instant>,
        place: &tokio::sync::watch::Sender<Option<QueuePlace>>,
    ) -> Result<Option<Permit>> {
        let watch = place::Watch::new(place);
        self.acquire_inner(weight, deadline, Some(&watch)).await
    }

    /// Takes one permit if one is free and nobody is queued; `Ok(None)` otherwise. Never
    /// waits and never jumps the queue.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_acquire_many(1).await
    }

    /// Takes `weight` permits if they are free and nobody is queued; `Ok(None)` otherwise
    /// (nothing changed in the store).
    pub async fn try_acquire_many(&self, weight: u32) -> Result<Option<Permit>> {
        let weight = self.check_weight(weight)?;
        self.try_acquire_inner(weight).await
    }

    /// Adopts a lease that another process handed over ([`Permit::detach`], sent as it is:
    /// [`Lease`] is serializable): renews it by id at once, with this handle's TTL, and keeps
    /// it alive from here as if this handle had acquired it. The lease keeps its id, fence
    /// and seats, and the store never granted it twice; there is no gap as long as it arrives
    /// before [`Lease::expires_at`]. The process that detached it watches it no more (its
    /// `lost()` never fires, its guard is gone). Fails with
    /// [`Error::Lost`](crate::Error::Lost) (`Gone`) if the store no longer holds it under
    /// this name (it expired on the way, or was released or revoked), changing nothing.
    pub async fn adopt(&self, lease: Lease) -> Result<Permit> {
        let sent = Instant::now();
        let renewed = self
            .backend()
            .renew(&self.config.name, lease.lease_id, self.config.ttl)
            .await?;
        match renewed {
            RenewReply::Renewed { expires_at, now } => {
                let lease = Lease {
                    expires_at,
                    ..lease
                };
                Ok(self.permit(Grant { lease, now }, sent, None))
            }
            RenewReply::Gone => Err(tessera_core::error::Error::Lost(
                tessera_core::error::LossReason::Gone,
            )),
        }
    }

    /// A snapshot of this semaphore (an empty one if the store holds nothing for it).
    pub async fn status(&self) -> Result<SemaphoreStatus> {
        Ok(self
            .backend()
            .status(&self.config.name)
            .await?
            .unwrap_or_else(|| {
                SemaphoreStatus::new(
                    &self.config.name,
                    self.capacity(),
                    0,
                    StoreTime(0),
                    vec![],
                    vec![],
                )
            }))
    }

    /// Changes the capacity in the store and the capacity this handle declares (its clones
    /// keep theirs); returns the old stored capacity. See [`Store::resize`]. On error nothing
    /// changed.
    pub async fn resize(&self, capacity: u32) -> Result<u32> {
        let capacity = validate_capacity(capacity)?;
        let old = self.backend().resize(&self.config.name, capacity).await?;
        self.capacity.store(capacity, Ordering::Relaxed);
        Ok(old)
    }

    fn check_weight(&self, weight: u32) -> Result<u32> {
        let capacity = self.capacity();
        if weight == 0 || weight > capacity {
            return Err(InvalidInput::Weight { weight, capacity }.into());
        }
        let max = self.backend().capabilities().max_weight;
        if weight > max {
            return Err(InvalidInput::WeightAboveStoreLimit { weight, max }.into());
        }
        Ok(weight)
    }
}
