//! How an acquire waits: the engine under the [`Semaphore`] façade.
//!
//! An acquire picks a random lease id, registers for wake-ups on it ([`tessera_core::wake`]), then
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

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::place::Watch;
use super::Semaphore;
use crate::cleanup::{self, Job};
use crate::lease::permit::Permit;
use crate::lease::SemaphoreConfig;
use crate::store::Store;
use crate::telemetry;
use tessera_core::error::{Error, Result};
use tessera_core::model::*;
use tessera_core::wake;

impl Semaphore {
    /// One try-acquire of `weight` (checked) permits: granted or not, never queued.
    pub(super) async fn try_acquire_inner(&self, weight: u32) -> Result<Option<Permit>> {
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
                    // Waits its turn among this process's new requests on the name before
                    // anything is sent, so there is nothing to cancel until then.
                    let _pass = self.arrive(None).await;
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

    pub(super) fn request(&self, lease_id: LeaseId, weight: u32, wait: bool) -> AcquireRequest {
        AcquireRequest {
            lease_id,
            weight,
            ttl: self.config.ttl,
            holder: self.config.holder.clone(),
            wait: wait.then_some(WaitSpec {
                waiter_ttl: self.config.waiter_ttl,
                queue_cap: self.config.queue_cap,
            }),
            tenant: self.config.tenant.clone(),
            first_send: false,
        }
    }

    pub(super) fn permit(
        &self,
        grant: Grant,
        sent: Instant,
        registration: Option<wake::Registration>,
    ) -> Permit {
        Permit::start(
            self.store.conn(),
            Arc::clone(&self.config),
            grant,
            sent,
            registration,
        )
    }

    pub(super) async fn acquire_inner(
        &self,
        weight: u32,
        deadline: Option<Instant>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Option<Permit>> {
        let weight = self.check_weight(weight)?;
        let Some(watch) = watch else {
            return self.acquire_checked(weight, deadline, None).await;
        };
        // The place is read beside the wait, which never waits for it.
        tokio::select! {
            r = self.acquire_checked(weight, deadline, Some(watch)) => r,
            never = watch.run(self.backend().as_ref(), &self.config.name) => match never {},
        }
    }

    async fn acquire_checked(
        &self,
        weight: u32,
        deadline: Option<Instant>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Option<Permit>> {
        let called = Instant::now();
        let name = &self.config.name;
        let mut start = called;
        loop {
            // A fresh lease id per attempt, so a lease id is never granted twice.
            match self.wait_in_queue(weight, deadline, start, watch).await {
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
        watch: Option<&Watch<'_>>,
    ) -> Result<Attempt> {
        let lease = LeaseId::random();
        if let Some(w) = watch {
            w.waiting_as(lease);
        }
        let mut request = self.request(lease, weight, true);
        let name = &self.config.name;

        // A store whose step runs at once (memory): an immediate grant registers no wake-up
        // and arms no cancel, as there is no wait and no await to drop. A queued reply
        // registers late, which still receives a grant made in between (see `tessera_core::wake`).
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
                return Box::pin(self.wait_for_grant(queued, deadline, watch)).await;
            }
            Some(Err(e)) if !e.is_transient() => return Err(e),
            Some(Err(_)) => {}
            // Nothing was sent yet: the first send below is the first of this new lease id.
            None => request.first_send = true,
        }

        // Its turn among this process's new requests on the name (`crate::arrivals`), before
        // anything is sent: a request that times out here leaves nothing to cancel.
        let Some(pass) = self.arrive(deadline).await else {
            return Ok(Attempt::TimedOut);
        };
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
                    // The failed call may have reached the store: the retry must find
                    // what it made.
                    request.first_send = false;
                }
                r => break r?,
            }
        };
        drop(pass);
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
                Box::pin(self.wait_for_grant(queued, deadline, watch)).await
            }
        }
    }

    /// Waits in the queue after the acquire answered (see [`Semaphore::wait_in_queue`]).
    async fn wait_for_grant(
        &self,
        queued: InQueue,
        deadline: Option<Instant>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Attempt> {
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
            if let Some(w) = watch {
                w.queued(position, None, None);
            }
        }

        // A lost wake-up costs at most one heartbeat interval; a granted waiter must also find
        // out well before its lease (which runs from the grant) could expire.
        let (mut poll, poll_max) = self.poll_bounds();
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
            // runs until our queue entry would have expired (`crate::lease::permit`), at least two
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

impl Semaphore {
    /// A waiter's first and longest pause between asks: its heartbeat on a store that
    /// pushes every grant; from the store's polling bounds (never above the heartbeat) on
    /// one whose pushes can be missed. The heartbeat keeps the queue entry alive, and lets a
    /// granted waiter find out well before its lease (which runs from the grant) could expire.
    pub(super) fn poll_bounds(&self) -> (Duration, Duration) {
        let heartbeat = (self.config.waiter_ttl / 3).min(self.config.ttl / 4);
        match self.backend().capabilities().waking.poll_bounds() {
            None => (heartbeat, heartbeat),
            Some((min, max)) => (min, max.min(heartbeat)),
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
pub(super) const CANCEL_GRACE: Duration = Duration::from_millis(250);

/// `f`'s output, or `None` if `deadline` passes first.
pub(super) async fn bounded<T>(
    deadline: Option<Instant>,
    f: impl std::future::Future<Output = T>,
) -> Option<T> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
        None => Some(f.await),
    }
}

pub(super) async fn sleep_until_opt(deadline: Option<Instant>) {
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
pub(super) struct Pending {
    store: Store,
    config: Arc<SemaphoreConfig>,
    lease: LeaseId,
    armed: bool,
}

impl Pending {
    pub(super) fn new(sem: &Semaphore, lease: LeaseId) -> Self {
        Pending {
            store: sem.store.clone(),
            config: Arc::clone(&sem.config),
            lease,
            armed: true,
        }
    }
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Cancels now if the store answers within `grace`; otherwise stays armed so the drop
    /// cancels in the background.
    pub(super) async fn cancel_within(&mut self, grace: Duration) {
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
            self.store.conn(),
            Job::Cancel {
                name: self.config.name.clone(),
                lease: self.lease,
            },
        );
    }
}
