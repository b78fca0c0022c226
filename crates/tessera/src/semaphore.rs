//! The public semaphore: `tokio::sync::Semaphore` carried over the network.
//!
//! # Implementation details
//!
//! An acquire picks a random lease id, registers for wake-ups on it ([`crate::wake`]), then
//! sends one acquire-or-enqueue to the store. If queued, it sleeps until a wake-up (the store
//! pushed a grant), its heartbeat interval (the safety net for a lost wake-up, and what keeps
//! its queue entry alive), or its deadline. Each wake-up or heartbeat asks the store whether
//! the hand-off granted it. Grants happen only inside the store's atomic steps, so the client
//! never decides anything by itself.
//!
//! Until an acquire returns a [`Permit`], a guard owns the lease id: if the future is dropped
//! or times out, the guard sends a cancel that removes the waiter or, if the grant raced with
//! the cancellation, releases the lease. Retries of a request reuse the lease id, so the
//! store answers them idempotently.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cleanup::{self, Job};
use crate::error::{Error, InvalidInput, Result};
use crate::model::*;
use crate::permit::Permit;
use crate::seam::{Backend, Waking};
use crate::store::Store;
use crate::telemetry;
use crate::wake;

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
}

impl Default for SemaphoreOptions {
    fn default() -> Self {
        SemaphoreOptions {
            ttl: Duration::from_secs(30),
            keep_alive: None,
            holder: None,
            queue_cap: 10_000,
            waiter_ttl: Duration::from_secs(5),
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
    /// Holder label shown by `status` (default `hostname/pid`).
    pub fn holder(mut self, holder: impl Into<String>) -> Self {
        self.holder = Some(holder.into());
        self
    }
    /// Longest queue this client will join (default 10,000); beyond it acquire fails with
    /// [`Error::QueueFull`].
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
                metrics: Default::default(),
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
        match self.acquire_inner(weight, None).await? {
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
        self.acquire_inner(weight, Some(Instant::now() + timeout))
            .await
    }

    /// Waits for `weight` permits until `deadline`; `Ok(None)` if none came in time.
    pub async fn acquire_many_until(
        &self,
        weight: u32,
        deadline: Instant,
    ) -> Result<Option<Permit>> {
        self.acquire_inner(weight, Some(deadline)).await
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
        let lease = LeaseId::random();
        let request = self.request(lease, weight, false);
        let sent = Instant::now();
        let (reply, mut pending) =
            match self
                .backend()
                .acquire_now(&self.config.name, self.capacity(), &request)
            {
                // Answered at once: nothing to cancel if this future is dropped.
                Some(r) => (r?, Pending::new(self, lease)),
                None => {
                    let pending = Pending::new(self, lease);
                    let reply = self
                        .backend()
                        .acquire(&self.config.name, self.capacity(), &request)
                        .await?;
                    (reply, pending)
                }
            };
        match reply {
            AcquireReply::Granted(grant) => {
                pending.disarm();
                telemetry::granted(&self.config.metrics, &self.config.name, sent.elapsed());
                Ok(Some(self.permit(grant, sent, None)))
            }
            AcquireReply::NoPermit { .. } => {
                pending.disarm();
                telemetry::not_granted(&self.config.metrics, &self.config.name, "no_permit");
                Ok(None)
            }
            AcquireReply::Queued { .. } => {
                Err(Error::Corrupt("the store queued a try-acquire".to_string()))
            }
        }
    }

    /// A snapshot of this semaphore (an empty one if the store holds nothing for it).
    pub async fn status(&self) -> Result<SemaphoreStatus> {
        Ok(self
            .backend()
            .status(&self.config.name)
            .await?
            .unwrap_or_else(|| SemaphoreStatus {
                name: self.config.name.to_string(),
                capacity: self.capacity(),
                used: 0,
                available: self.capacity(),
                now: StoreTime(0),
                holders: vec![],
                queue: vec![],
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

    fn request(&self, lease_id: LeaseId, weight: u32, wait: bool) -> AcquireRequest {
        AcquireRequest {
            lease_id,
            weight,
            ttl: self.config.ttl,
            holder: self.config.holder.clone(),
            wait: wait.then_some(WaitSpec {
                waiter_ttl: self.config.waiter_ttl,
                queue_cap: self.config.queue_cap,
            }),
        }
    }

    fn permit(
        &self,
        grant: Grant,
        sent: Instant,
        registration: Option<wake::Registration>,
    ) -> Permit {
        Permit::start(
            &self.store,
            Arc::clone(&self.config),
            grant,
            sent,
            registration,
        )
    }

    async fn acquire_inner(
        &self,
        weight: u32,
        deadline: Option<Instant>,
    ) -> Result<Option<Permit>> {
        let weight = self.check_weight(weight)?;
        let called = Instant::now();
        let name = &self.config.name;
        let mut start = called;
        loop {
            // A fresh lease id per attempt, so a lease id is never granted twice.
            match self.wait_in_queue(weight, deadline, start).await {
                Ok(Attempt::Granted(permit)) => {
                    telemetry::granted(&self.config.metrics, name, called.elapsed());
                    return Ok(Some(permit));
                }
                Ok(Attempt::TimedOut) => {
                    telemetry::not_granted(&self.config.metrics, name, "timed_out");
                    return Ok(None);
                }
                Ok(Attempt::Rejoin) => start = Instant::now(),
                Err(e) => {
                    telemetry::not_granted(&self.config.metrics, name, "error");
                    return Err(e);
                }
            }
        }
    }

    /// One attempt: join the queue under a new lease id and wait (see [`Attempt`]). `start`
    /// is an instant before this call (the clock is read once per acquire).
    async fn wait_in_queue(
        &self,
        weight: u32,
        deadline: Option<Instant>,
        start: Instant,
    ) -> Result<Attempt> {
        let lease = LeaseId::random();
        let request = self.request(lease, weight, true);
        let name = &self.config.name;

        // A store whose step runs at once (memory): an immediate grant registers no wake-up
        // and arms no cancel, as there is no wait and no await to drop. A queued reply
        // registers late, which still receives a grant made in between (see `crate::wake`).
        // A transient error goes the long way below, which retries it.
        match self.backend().acquire_now(name, self.capacity(), &request) {
            Some(Ok(AcquireReply::Granted(grant))) => {
                return Ok(Attempt::Granted(self.permit(grant, start, None)));
            }
            Some(Ok(reply)) => {
                let registration = wake::Registration::late(lease);
                let pending = Pending::new(self, lease);
                let queued = InQueue {
                    lease,
                    registration,
                    pending,
                    sent: start,
                    reply,
                };
                return Box::pin(self.wait_for_grant(queued, deadline)).await;
            }
            Some(Err(e)) if !e.is_transient() => return Err(e),
            Some(Err(_)) | None => {}
        }

        // Register before sending, so a wake-up that overtakes the reply is kept.
        let registration = wake::Registration::new(lease);
        let pending = Pending::new(self, lease);

        // Every store call is bounded by the deadline: a hung store cannot hold the caller past
        // it. On expiry the pending guard cancels in the background (the waiter leaves the
        // queue, or a grant that raced with the deadline is released).
        //
        // A transient fault (a dropped connection, a busy store) is retried with the same
        // lease id for up to the waiter TTL: the store answers a repeated acquire with the
        // grant or queue place the first one may have made, so nothing is taken twice.
        let first_try = start;
        let mut sent = first_try;
        let mut backoff = Duration::from_millis(10);
        let reply = loop {
            let Some(r) = bounded(
                deadline,
                self.backend().acquire(name, self.capacity(), &request),
            )
            .await
            else {
                return Ok(Attempt::TimedOut);
            };
            match r {
                Err(e) if e.is_transient() && first_try.elapsed() < self.config.waiter_ttl => {
                    tracing::debug!(%name, error = %e, "acquire failed; retrying");
                    if bounded(deadline, tokio::time::sleep(backoff))
                        .await
                        .is_none()
                    {
                        return Ok(Attempt::TimedOut);
                    }
                    backoff = (backoff * 2).min(Duration::from_millis(250));
                    sent = Instant::now();
                }
                r => break r?,
            }
        };
        match reply {
            // The uncontended case: granted at once, without waiting.
            AcquireReply::Granted(grant) => {
                let mut pending = pending;
                pending.disarm();
                Ok(Attempt::Granted(self.permit(
                    grant,
                    sent,
                    Some(registration),
                )))
            }
            // The waiting loop lives in a future of its own, boxed, so that the future of
            // every acquire is not as large as the waiting it seldom does.
            reply => {
                let queued = InQueue {
                    lease,
                    registration,
                    pending,
                    sent,
                    reply,
                };
                Box::pin(self.wait_for_grant(queued, deadline)).await
            }
        }
    }

    /// Waits in the queue after the acquire answered (see [`Semaphore::wait_in_queue`]).
    async fn wait_for_grant(&self, queued: InQueue, deadline: Option<Instant>) -> Result<Attempt> {
        let InQueue {
            lease,
            registration,
            mut pending,
            mut sent,
            mut reply,
        } = queued;
        let name = &self.config.name;
        if let AcquireReply::Queued { position } = reply {
            telemetry::queued(&self.config.metrics, name, position);
        }

        // A lost wake-up costs at most one heartbeat interval; a granted waiter must also find
        // out well before its lease (which runs from the grant) could expire.
        let heartbeat = (self.config.waiter_ttl / 3).min(self.config.ttl / 4);
        let (mut poll, poll_max) = match self.backend().capabilities().waking {
            Waking::Push => (heartbeat, heartbeat),
            Waking::PushWithPoll { min, max } | Waking::Poll { min, max } => {
                (min, max.min(heartbeat))
            }
        };
        let mut failing_since: Option<Instant> = None;
        loop {
            match reply {
                AcquireReply::Granted(grant) => {
                    pending.disarm();
                    return Ok(Attempt::Granted(self.permit(
                        grant,
                        sent,
                        Some(registration),
                    )));
                }
                AcquireReply::Queued { .. } => {}
                AcquireReply::NoPermit { .. } => {
                    return Err(Error::Corrupt(
                        "the store refused a queued acquire".to_string(),
                    ))
                }
            }
            // Also when a lease or queue entry may expire sooner (see `Backend::next_expiry`):
            // a permit freed by a holder that died is handed on at its expiry.
            let mut wake_at = Instant::now() + poll;
            if let Some(expiry) = self.backend().next_expiry(name) {
                let at = expiry + EXPIRY_SLACK;
                if at > Instant::now() && at < wake_at {
                    wake_at = at;
                }
            }
            let timed_out = tokio::select! {
                _ = registration.notified() => false,
                _ = tokio::time::sleep_until(wake_at) => false,
                _ = sleep_until_opt(deadline) => true,
            };
            if timed_out {
                // Leave the queue before answering, so that on return nothing is held and
                // nobody waits in our name. A store too slow to answer within the grace
                // leaves it to the pending guard, in the background.
                pending.cancel_within(CANCEL_GRACE).await;
                return Ok(Attempt::TimedOut);
            }
            // A grant pushed with the wake-up: the store granted it after it received our
            // last request (the waiter record existed), so that request's send instant is
            // an earlier bound of the grant, and the lease is certainly valid until `sent`
            // plus its remaining time. Used only if most of that is still ahead; otherwise
            // the heartbeat below fetches the grant with a fresh bound. A hand-off grant
            // runs until our queue entry would have expired (`crate::permit`), at least two
            // thirds of the waiter TTL after our last heartbeat, unless that is behind.
            if let Some(grant) = registration.take_grant() {
                let remaining = grant.lease.expires_at.since(grant.now);
                let full = self.config.ttl.min(self.config.waiter_ttl);
                if grant.lease.lease_id == lease
                    && sent + remaining / 2 > Instant::now()
                    && remaining >= full / 2
                {
                    pending.disarm();
                    return Ok(Attempt::Granted(self.permit(
                        grant,
                        sent,
                        Some(registration),
                    )));
                }
            }
            poll = (poll * 2).min(poll_max);
            // `sent` moves only when a heartbeat is answered: a failed one may never have
            // reached the store, so a grant pushed later may predate it.
            let beat_sent = Instant::now();
            let Some(beat) = bounded(
                deadline,
                self.backend()
                    .heartbeat(name, lease, self.config.waiter_ttl),
            )
            .await
            else {
                return Ok(Attempt::TimedOut);
            };
            let beat = match beat {
                // A blip (a dropped connection, a busy store) does not end the wait: the queue
                // entry lives for the waiter TTL, so keep trying for that long. If the entry
                // expired meanwhile, the next heartbeat says `Gone` and the caller rejoins.
                Err(e) if e.is_transient() => {
                    let since = *failing_since.get_or_insert(beat_sent);
                    if since.elapsed() < self.config.waiter_ttl {
                        tracing::debug!(%name, error = %e, "waiter heartbeat failed; retrying");
                        continue;
                    }
                    return Err(e);
                }
                other => {
                    failing_since = None;
                    sent = beat_sent;
                    other?
                }
            };
            reply = match beat {
                WaitReply::Granted(grant) => AcquireReply::Granted(grant),
                WaitReply::Waiting => AcquireReply::Queued { position: 0 },
                WaitReply::Gone => {
                    pending.disarm();
                    return Ok(Attempt::Rejoin);
                }
            };
        }
    }
}

/// How one attempt to wait in the queue ended.
enum Attempt {
    /// Granted: the permit is held.
    Granted(Permit),
    /// The deadline passed first; nothing is held and nobody waits in our name.
    TimedOut,
    /// The queue entry vanished (this process stalled past the waiter TTL, or an admin
    /// deleted the semaphore): join again, at the tail, under a new lease id.
    Rejoin,
}

/// How long after an expiry the store is asked about it (see [`Backend::next_expiry`]): the
/// hint is converted from the store's clock when its reply arrived, so the expiry is not
/// ahead of it; the slack covers clock-rate drift over a few seconds and the timer's grain.
const EXPIRY_SLACK: Duration = Duration::from_millis(5);

/// How long a timed-out acquire waits for its cancel before leaving it to the background.
const CANCEL_GRACE: Duration = Duration::from_millis(250);

/// `f`'s output, or `None` if `deadline` passes first.
async fn bounded<T>(
    deadline: Option<Instant>,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
        None => Some(f.await),
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What a queued acquire carries into its waiting loop.
struct InQueue {
    lease: LeaseId,
    registration: wake::Registration,
    pending: Pending,
    /// When the last answered request was sent.
    sent: Instant,
    reply: AcquireReply,
}

/// Owns a lease id from the first request until a permit (or a definite "no") is returned;
/// if dropped before, cancels the wait or releases a grant that raced with the drop.
struct Pending {
    store: Store,
    config: Arc<SemaphoreConfig>,
    lease: LeaseId,
    armed: bool,
}

impl Pending {
    fn new(sem: &Semaphore, lease: LeaseId) -> Self {
        Pending {
            store: sem.store.clone(),
            config: Arc::clone(&sem.config),
            lease,
            armed: true,
        }
    }
    fn disarm(&mut self) {
        self.armed = false;
    }

    /// Cancels now if the store answers within `grace`; otherwise stays armed so the drop
    /// cancels in the background.
    async fn cancel_within(&mut self, grace: Duration) {
        let cancel = self.store.backend().cancel(&self.config.name, self.lease);
        if let Ok(Ok(_)) = tokio::time::timeout(grace, cancel).await {
            self.disarm();
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        cleanup::spawn(
            &self.store,
            Job::Cancel {
                name: self.config.name.clone(),
                lease: self.lease,
            },
        );
    }
}
