//! An admission's wait (the engine under `crate::admission`): the semaphore's queue, with
//! permits and windows decided together in the store's step ([`AdmissionBackend::admit`]).
//!
//! The waiter registers for wake-ups, sends one admit-or-enqueue, and while queued sleeps
//! until a wake-up (the hand-off found its permits free: its turn), the instant the store said
//! its windows admit it, an expiry the store may hand on, its heartbeat, or its deadline; each
//! time it sends the same request again (same lease id), which renews its queue place and, on
//! its turn, decides — except as follows. Until it returns, a guard owns the lease id and
//! cancels the wait if the future is dropped.
//!
//! **The heartbeat, and the ask at an expiry, are a waiter's heartbeat, not the whole
//! step**, on a store that pushes every turn ([`Waking::Push`]). An admission is a step under
//! the semaphore's lock (on the SQL stores, its row lock): with every queued admission re-sent
//! once per heartbeat, 2,000 queued admissions asked PostgreSQL for about 1,100 locked steps a
//! second and the queue stalled behind its own heartbeats (`tessera bench --workload tenants`,
//! 2026-12-06), and one expiry woke every queued admission at once. A waiter's heartbeat
//! ([`Backend::heartbeat`], gathered into one call per semaphore on PostgreSQL and Redis)
//! renews the place and runs the store's purge and hand-off, which pushes the turn. The whole
//! request is still re-sent every `p`th heartbeat for a waiter the store last placed `p`
//! ahead of the head (at least every [`ADMIT_EVERY`]th, at most every [`ADMIT_EVERY_MAX`]th),
//! and at every heartbeat while at the head: the safety net for a wake-up lost without a
//! sign (a listener's reconnect wakes every waiter already), which would leave the head, and
//! everyone behind it, waiting.
//!
//! **A late admission keeps its place.** An admission granted past its use-by instant is
//! given back and waits again at the head of the queue. Its new request goes first and the
//! give-back second ([`Join::Replacing`]): the give-back's hand-off then finds the new
//! request at the head, and an admission waiter behind it, woken by that hand-off, finds
//! itself behind the head. Given back first, the next waiter's own step could run between the
//! give-back and the new request and be admitted first: on MariaDB under load, where a granted
//! step took more than the 100 ms margin, a queued admission was seen admitted before the one
//! ahead of it. While the late admission holds its permits the new request usually cannot
//! take them and queues at the head; it is sent again at once after the give-back freed
//! them. Where the permits fit beside the late admission's, the new request is decided at
//! once, and its charge comes after the late one, which the give-back then cannot return
//! (only the latest charge is): the windows count more than was used, never less.
//!
//! **A store that pushes but also polls** ([`Waking::PushWithPoll`]: SQLite, MySQL /
//! MariaDB, whose pushes can be missed) does the same at each poll, with the whole request
//! re-sent at most every [`ADMIT_EVERY_POLLED`]th poll: there a missed push is found by the
//! request sent again, so a waiter that became the head without its push learns it within
//! that many polls (SQLite: 8 × 250 ms, MySQL: 8 × 1 s). Re-sent at every poll, 2,000 queued
//! admissions asked SQLite's one writer for up to 8,000 steps a second, and it admitted
//! fewer than the windows allowed. A store that only polls ([`Waking::Poll`]) re-sends the
//! request at each poll.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use super::place::Watch;
use super::wait::{bounded, sleep_until_opt, Pending, CANCEL_GRACE};
use super::Semaphore;
use crate::lease::permit::Permit;
use crate::telemetry;
use tessera_core::error::{Error, Result};
use tessera_core::model::*;
use tessera_core::rate::spec::RateConfig;
use tessera_core::seam::{AdmissionBackend, AdmitReply, AdmitRequest, Waking};
use tessera_core::wake;

/// On a store that pushes every turn, a queued admission re-sends its request at least every
/// this many heartbeats (and at each one while at the head); the others renew its place alone.
pub(crate) const ADMIT_EVERY: u32 = 4;
/// ... and at most every this many, further back in the queue.
pub(crate) const ADMIT_EVERY_MAX: u32 = 32;

/// On a store that pushes but also polls, at most every this many polls.
pub(crate) const ADMIT_EVERY_POLLED: u32 = 8;

/// Every how many heartbeats a queued admission last placed `position` ahead of the head
/// re-sends its request: [`ADMIT_EVERY`] near the head, up to [`ADMIT_EVERY_MAX`] deep in
/// the queue, whose wake-up (the only one a lost push could stall the queue on) is that many
/// hand-offs away; on a store that also polls, up to [`ADMIT_EVERY_POLLED`]. `None`: at every
/// one (a store that only polls).
fn admit_every(waking: Waking, position: u64) -> Option<u32> {
    let most = match waking {
        Waking::Push => ADMIT_EVERY_MAX,
        Waking::PushWithPoll { .. } => ADMIT_EVERY_POLLED,
        _ => return None,
    };
    Some(
        u32::try_from(position)
            .unwrap_or(u32::MAX)
            .clamp(ADMIT_EVERY, most),
    )
}

/// The give-back of an admission that came too late to use, sent by [`Join::Replacing`].
pub(crate) type Late = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// Where a waiting admission joins the queue.
pub(crate) enum Join {
    /// At the tail: a new request.
    Tail,
    /// At the head: a request that has just given back an admission it could not use.
    Head,
    /// At the head, in the place of an admission it could not use, still held: `Late`, its
    /// give-back, runs once this request's first reply is in (queued at the head, or
    /// granted), so that nobody behind it is served in between (see the module docs).
    Replacing(Late),
}

/// The windows' part of an admission.
pub(crate) struct Windows<'a> {
    pub config: &'a RateConfig,
    pub cost: u32,
    pub update: bool,
}

/// How one admission attempt ended.
pub(crate) enum Admit {
    /// Permits held, windows charged. `sent`: when the request that was granted left, an
    /// instant at or before the store's admission instant.
    Granted {
        permit: Permit,
        reservation: u64,
        sent: Instant,
    },
    /// A try: not admitted, nothing charged.
    Refused,
    /// The deadline passed first; nothing is held and nobody waits in our name.
    TimedOut,
}

impl Semaphore {
    /// The store's admission seam, or the typed error of a store without it.
    pub(crate) fn admission_backend(&self) -> Result<&dyn AdmissionBackend> {
        self.backend().admission().ok_or_else(|| {
            Error::Unsupported(format!(
                "admission (permits and rate windows in one step) is not available on {} yet; \
                 use a Semaphore and a RateLimiter",
                self.store.url()
            ))
        })
    }

    /// One admission of `weight` (checked) permits and `windows`: a try (`wait` false) or a
    /// wait until `deadline`, joining the queue where `join` says. With
    /// [`Join::Replacing`], the late admission is given back once the first reply is in, or
    /// in the background if the call ends before that (a deadline, an error).
    pub(crate) async fn admit_inner(
        &self,
        weight: u32,
        windows: &Windows<'_>,
        wait: bool,
        join: Join,
        deadline: Option<Instant>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Admit> {
        let (at_head, late) = match join {
            Join::Tail => (false, None),
            Join::Head => (true, None),
            Join::Replacing(late) => (true, Some(late)),
        };
        // Given back in the background if the call ends before the first reply.
        let mut late = LateGuard(late);
        let weight = self.check_weight(weight)?;
        let admission = self.admission_backend()?;
        let name = &self.config.name;
        let lease = LeaseId::random();
        if let Some(w) = watch {
            w.waiting_as(lease);
        }
        let req = AdmitRequest {
            acquire: self.request(lease, weight, wait),
            cost: windows.cost,
            update: windows.update,
            at_head,
        };
        // Its turn among this process's new requests on the name (`crate::arrivals`), held
        // until the first reply is in; nothing is sent before it.
        let Some(pass) = self.arrive(deadline).await else {
            return Ok(Admit::TimedOut);
        };
        let mut pass = Some(pass);
        let registration = wake::Registration::new(lease);
        let mut pending = Pending::new(self, lease);
        // A store whose pushes can be missed without a sign is also polled, as a plain
        // waiter polls it (`wait.rs`).
        let (mut poll, poll_max) = self.poll_bounds();
        let called = Instant::now();
        let mut failing_since: Option<Instant> = None;
        let mut counted = false;
        // On a store that pushes every turn, heartbeats mostly renew the place alone (see
        // the module docs).
        let waking = self.backend().capabilities().waking;
        loop {
            let sent = Instant::now();
            let Some(reply) = bounded(
                deadline,
                admission.admit(name, self.capacity(), windows.config, &req),
            )
            .await
            else {
                // The pending guard cancels in the background.
                return Ok(Admit::TimedOut);
            };
            drop(pass.take());
            let reply = match reply {
                // A blip does not end the wait: the queue entry lives for the waiter TTL, and
                // the same request answers the grant or place it may have made.
                Err(e) if e.is_transient() => {
                    let since = *failing_since.get_or_insert(sent);
                    if since.elapsed() < self.config.waiter_ttl {
                        tracing::debug!(%name, error = %e, "admission failed; retrying");
                        if bounded(deadline, tokio::time::sleep(Duration::from_millis(50)))
                            .await
                            .is_none()
                        {
                            return Ok(Admit::TimedOut);
                        }
                        continue;
                    }
                    return Err(e);
                }
                other => {
                    failing_since = None;
                    other?
                }
            };
            // The request is at the head of the queue (or granted): the late admission it
            // replaces is given back now, and a queued request asks again at once for the
            // permits that give-back freed.
            let replaced = match late.0.take() {
                Some(give_back) => {
                    give_back.await;
                    true
                }
                None => false,
            };
            let (position, window_at, now) = match reply {
                AdmitReply::Granted { grant, reservation } => {
                    pending.disarm();
                    telemetry::granted(&self.config.metrics, name, called.elapsed());
                    let permit = self.permit(grant, sent, Some(registration));
                    return Ok(Admit::Granted {
                        permit,
                        reservation,
                        sent,
                    });
                }
                AdmitReply::Refused { .. } => {
                    pending.disarm();
                    telemetry::not_granted(&self.config.metrics, name, "no_permit");
                    return Ok(Admit::Refused);
                }
                AdmitReply::Queued {
                    position,
                    window_at,
                    now,
                } => {
                    if !counted {
                        telemetry::queued(&self.config.metrics, name, position);
                        counted = true;
                    }
                    if replaced {
                        continue;
                    }
                    (position, window_at, now)
                }
            };
            // Asked again at the next of: a wake-up (our turn), the instant the windows admit
            // us (read from the reply's store time, so never early by more than the
            // reply's trip), an expiry the store may hand on, the poll or heartbeat (the last
            // two, on a store that pushes every turn, mostly renew the place alone).
            let received = Instant::now();
            let mut heartbeat = received + poll;
            poll = (poll * 2).min(poll_max);
            let mut reask_at = None::<Instant>;
            if let Some(t) = window_at {
                reask_at = Some(received + t.since(now));
            }
            if let Some(w) = watch {
                w.queued(position, None, window_at.map(|t| received + t.since(now)));
            }
            // An expiry the store may hand on is asked about as a heartbeat (on a store that
            // pushes every turn, a waiter's heartbeat runs the store's purge and hand-off,
            // and the hand-off pushes the turn): a queue of admissions all woken by one
            // expiry sends heartbeats, gathered per semaphore, not one step each.
            let mut expiry = self
                .backend()
                .next_expiry(name)
                .filter(|&e| e > received && e < heartbeat);
            let mut beats = 0u32;
            loop {
                let beat_at = expiry.unwrap_or(heartbeat);
                let wake_at = reask_at.map_or(beat_at, |t| t.min(beat_at));
                let woken = tokio::select! {
                    _ = registration.notified() => Some(true),
                    _ = tokio::time::sleep_until(wake_at) => Some(false),
                    _ = sleep_until_opt(deadline) => None,
                };
                let Some(notified) = woken else {
                    pending.cancel_within(CANCEL_GRACE).await;
                    telemetry::not_granted(&self.config.metrics, name, "timed_out");
                    return Ok(Admit::TimedOut);
                };
                let renew_only = !notified
                    && reask_at.is_none_or(|t| wake_at < t)
                    && position > 0
                    && admit_every(waking, position).is_some_and(|every| beats + 1 < every);
                if !renew_only {
                    break;
                }
                beats += 1;
                let reply = bounded(
                    deadline,
                    self.backend()
                        .heartbeat(name, lease, self.config.waiter_ttl),
                )
                .await;
                match reply {
                    None => {
                        pending.cancel_within(CANCEL_GRACE).await;
                        telemetry::not_granted(&self.config.metrics, name, "timed_out");
                        return Ok(Admit::TimedOut);
                    }
                    // Still queued: asleep until the next heartbeat or an earlier reason.
                    Some(Ok(WaitReply::Waiting)) => {
                        let at = Instant::now();
                        heartbeat = at + poll_max;
                        expiry = self
                            .backend()
                            .next_expiry(name)
                            .filter(|&e| e > at && e < heartbeat);
                    }
                    // Gone, granted (the admission's own step says what that means) or a
                    // failed heartbeat: the request, sent again, answers it.
                    Some(_) => break,
                }
            }
        }
    }
}

/// A late admission's give-back that [`Semaphore::admit_inner`] has not run yet: run in the
/// background if the call ends before its request's first reply (a deadline, an error), as
/// the pending guard cancels the request.
struct LateGuard(Option<Late>);

impl Drop for LateGuard {
    fn drop(&mut self) {
        let Some(give_back) = self.0.take() else {
            return;
        };
        // Outside a runtime the give-back is dropped unrun: the late admission's permit,
        // dropped with it, is released by the clean-up (its charge then stands).
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(give_back);
        }
    }
}
