//! The store seam: the handful of atomic operations every store implements ([`Backend`],
//! and [`RateBackend`] for rate limits), what crosses it, and what each store declares it can
//! and cannot do ([`Capabilities`]). This module imports no façade and no store: stores
//! depend on it, and it depends on nothing above it.
//!
//!
//! # The model every backend implements
//!
//! A semaphore in a store is: a capacity `C`; a running count `used` of the permits held by
//! unexpired leases; the holders (lease id → weight, seats, fence, holder label, expiry); a
//! FIFO queue of waiters (lease id, weight, lease TTL to grant with, heartbeat expiry); and the
//! last fence issued. Every operation runs as **one atomic step on the store's clock** and
//! follows one shape:
//!
//! 1. **purge**: drop holders whose lease expired and waiters whose heartbeat expired;
//! 2. **hand off**: while the queue head's weight fits in `C - used`, grant it (lowest free
//!    seats, next fence, expiry = now + its TTL) and pop it. Strict FIFO: a head that does not
//!    fit blocks everyone behind it, so a large request is never starved by small ones;
//! 3. **decide** the operation itself;
//! 4. hand off again if the operation freed permits or removed the head;
//! 5. **notify**: push a wake-up to exactly the waiters granted in this step and to holders
//!    whose lease was revoked or deleted (see [`crate::wake`]).
//!
//! Invariants kept by every step: `used` equals the sum of holder weights and never exceeds
//! `C` (except transiently after a shrinking resize, when no grant happens until it does);
//! the seats of all holders are distinct; a fence is `max(last_fence + 1, now in µs, hwm + 1)`
//! where `hwm` is a store-wide high-water mark of issued fences, so `last_fence` never
//! decreases, even across deletion of the semaphore (the high-water mark) and loss of the
//! store's state (the time floor); a retried acquire with a granted or queued lease id returns
//! that state. The client never reuses a lease id for a new acquire, so a lease id is granted
//! at most once.
//!
//! Policy — waiting, heartbeats, keep-alive, cancellation, loss detection — lives once, above
//! this seam, in `tessera::Semaphore` and `tessera::Permit`.
//!
//! # What a store declares
//!
//! [`Backend::capabilities`] says what the client must not assume: the shortest lease TTL and
//! its granularity (etcd leases are whole seconds, at least 2 s by default), where fences come
//! from (the store-time floor above, or the store's own revision), whether a release hands
//! its permits to the queue in the same atomic step or a later step (a watch) does, and how
//! waiters learn of grants. The client checks every TTL against them, with typed errors.
//!
//! # Where what comes next goes
//!
//! Each of these is an addition to the step or to this seam, not a rewrite:
//!
//! - **A permit and rate windows in one admission** (all or nothing): built on the memory,
//!   SQLite, Redis, MySQL and PostgreSQL stores as [`AdmissionBackend`]
//!   ([`Backend::admission`]); its step runs the semaphore's *decide* and the limiter's
//!   charge under one atomic step, and the hand-off stops at an admission waiter. Stores
//!   whose rate state lives beside the semaphore's (one Redis hash tag, one SQL transaction)
//!   can do it in one call.
//! - **Fair shares per tenant inside a global cap**: a `tenant` field on the waiter and a
//!   per-tenant `used` count; *hand off* picks the head of the least-served tenant instead
//!   of the global head, still strictly FIFO within a tenant.
//! - **A waiter's queue position and expected wait**: the heartbeat's reply already knows
//!   the position ([`AcquireReply::Queued`]); a `WaitReply::Waiting { position }` field, and
//!   an estimate from the holders' acquire times, are additions to the reply.
//! - **Handing a held lease to another process**: a `transfer(name, lease, new_holder)`
//!   operation that rewrites the holder label and bumps the fence in one step; the receiver
//!   starts a keeper on the same lease id.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::*;

pub use crate::admission::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, GiveBack, Settlement,
};
pub use crate::rate::seam::{RateBackend, RateReply, RateRequest};
pub use crate::rate::spec::RateConfig;

/// How waiters learn about grants on this store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Waking {
    /// The store pushes a wake-up to the granted waiter ([`crate::wake::notify`]); waiters
    /// only heartbeat, as the safety net for a lost push (memory, Redis).
    Push,
    /// The store pushes where it can, and waiters also poll with exponential backoff between
    /// `min` and `max`, because a push can be missed without a sign (SQLite: a process's wake
    /// socket may be missing or unreachable).
    PushWithPoll { min: Duration, max: Duration },
    /// No push: waiters poll with exponential backoff between `min` and `max`.
    Poll { min: Duration, max: Duration },
}

impl Waking {
    /// The bounds of a waiter's polling backoff, `None` where the store pushes every grant
    /// and waiters only heartbeat.
    pub fn poll_bounds(self) -> Option<(Duration, Duration)> {
        match self {
            Waking::Push => None,
            Waking::PushWithPoll { min, max } | Waking::Poll { min, max } => Some((min, max)),
        }
    }
}

/// Where a store's fences come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FenceSource {
    /// `max(last_fence + 1, now in µs, hwm + 1)`: the store's clock is the floor that keeps
    /// fences increasing after the store loses its state (see the module docs).
    StoreTimeFloor,
    /// The store's own revision counter (etcd), which never goes back.
    Revision,
}

/// When the permits a release frees reach the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandOff {
    /// In the same atomic step as the release (every store today).
    SameStep,
    /// In a later step that the release triggers (a watch firing on the next waiter).
    NextStep,
}

/// What a store can and cannot do; the client checks requests against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// How waiters learn about grants.
    pub waking: Waking,
    /// The shortest lease or waiter TTL the store keeps exactly (at least [`MIN_TTL`]).
    pub min_ttl: Duration,
    /// TTLs must be whole multiples of this (1 µs: any).
    pub ttl_granularity: Duration,
    /// Where fences come from.
    pub fence: FenceSource,
    /// When a release's permits reach the queue.
    pub hand_off: HandOff,
    /// The most permits one lease may take on this store ([`crate::limits::MAX_CAPACITY`] where any
    /// weight up to the capacity works; etcd grants in one transaction of bounded size).
    pub max_weight: u32,
    /// Whether the store orders its queue by tenants' shares (`docs/fair-shares.md`); a
    /// request that names a tenant on a store without is [`Error::Unsupported`](crate::error::Error::Unsupported).
    pub fair_shares: bool,
    /// Whether the store keeps tenants' ceilings and floors ([`Backend::set_tenant_limits`]).
    pub tenant_limits: bool,
    /// Whether the store keeps tenants' window ceilings ([`TenantLimits::window_ceiling`])
    /// and holds admissions to them.
    pub window_ceilings: bool,
    /// How many new requests (acquires, try-acquires and admissions, as first sent) one
    /// process sends to one semaphore at once; the others wait in the process, taking turns
    /// by tenant (`docs/fair-shares.md`, "A process's own arrivals"). 0: no limit. Set by
    /// stores whose step locks the semaphore, where a flood sent at once would otherwise
    /// queue every later request (and release) of the process behind it.
    pub arrivals_in_flight: u32,
}

/// [`Capabilities::arrivals_in_flight`] of the stores whose step locks the semaphore
/// (PostgreSQL, MySQL / MariaDB, SQLite): one request running under the lock and one on its
/// way to it.
pub const LOCKED_STEP_ARRIVALS: u32 = 2;

impl Capabilities {
    /// A store that pushes wake-ups, hands off in the release's own step, takes any TTL the
    /// client allows (in µs), and floors fences at its clock.
    pub const fn push() -> Capabilities {
        Capabilities {
            waking: Waking::Push,
            min_ttl: MIN_TTL,
            ttl_granularity: Duration::from_micros(1),
            fence: FenceSource::StoreTimeFloor,
            hand_off: HandOff::SameStep,
            max_weight: MAX_CAPACITY,
            fair_shares: false,
            tenant_limits: false,
            window_ceilings: false,
            arrivals_in_flight: 0,
        }
    }

    /// The same, with at most `n` of a process's new requests on one semaphore at the store
    /// at once ([`Capabilities::arrivals_in_flight`]).
    pub const fn with_arrivals_in_flight(mut self, n: u32) -> Capabilities {
        self.arrivals_in_flight = n;
        self
    }

    /// The same, keeping tenants' ceilings and floors.
    pub const fn with_tenant_limits(mut self) -> Capabilities {
        self.tenant_limits = true;
        self
    }

    /// The same, keeping tenants' window ceilings.
    pub const fn with_window_ceilings(mut self) -> Capabilities {
        self.window_ceilings = true;
        self
    }

    /// The same, ordering the queue by tenants' shares.
    pub const fn with_fair_shares(mut self) -> Capabilities {
        self.fair_shares = true;
        self
    }

    /// The same with another way of waking.
    pub const fn with_waking(mut self, waking: Waking) -> Capabilities {
        self.waking = waking;
        self
    }

    /// The same with TTLs of at least `min`, in whole multiples of `granularity`.
    pub const fn with_ttls(mut self, min: Duration, granularity: Duration) -> Capabilities {
        self.min_ttl = min;
        self.ttl_granularity = granularity;
        self
    }

    /// The same with fences from `fence` and hand-offs at `hand_off`.
    pub const fn with_order(mut self, fence: FenceSource, hand_off: HandOff) -> Capabilities {
        self.fence = fence;
        self.hand_off = hand_off;
        self
    }

    /// The same with at most `max_weight` permits per lease.
    pub const fn with_max_weight(mut self, max_weight: u32) -> Capabilities {
        self.max_weight = max_weight;
        self
    }

    /// Checks a lease or waiter TTL against the store's limits (after the client's own
    /// range, [`MIN_TTL`]..=[`MAX_TTL`]).
    pub fn check_ttl(&self, ttl: Duration) -> Result<(), crate::error::InvalidInput> {
        let min = self.min_ttl.max(MIN_TTL);
        let step = self.ttl_granularity.as_micros().max(1);
        if ttl < min || ttl > MAX_TTL {
            return Err(crate::error::InvalidInput::Ttl {
                ttl,
                min,
                max: MAX_TTL,
            });
        }
        if !ttl.as_micros().is_multiple_of(step) {
            return Err(crate::error::InvalidInput::TtlStep {
                ttl,
                step: self.ttl_granularity,
            });
        }
        Ok(())
    }
}

/// The store seam. Every method is one atomic step on the store (see the module docs).
///
/// Implementations validate nothing that the client already validated (names, weights,
/// TTLs), but must never panic on data they find in the store: unreadable data is
/// [`Error::Corrupt`](crate::error::Error::Corrupt).
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Grants, queues (when `req.wait` is set) or refuses. Retrying with the same lease id
    /// (and `first_send` false) returns the grant or queue place it already has; a request
    /// marked `first_send` may be taken as new without that lookup. Fails with
    /// [`Error::CapacityMismatch`](crate::error::Error::CapacityMismatch) if the stored capacity differs from `capacity`, and with
    /// [`Error::QueueFull`](crate::error::Error::QueueFull) if the queue is at its cap. `try` (no `wait`) never jumps the
    /// queue: it is refused while anyone waits.
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply>;

    /// A waiter's heartbeat: renews its queue entry for `waiter_ttl`, or returns the grant the
    /// hand-off gave it, or `Gone`.
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply>;

    /// Gives up a wait: removes the waiter, or releases the lease if it was already granted.
    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply>;

    /// Releases a lease; `true` if it was still held. Idempotent.
    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool>;

    /// Extends a held lease to `now + ttl`.
    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply>;

    /// A snapshot, or `None` if the store holds nothing for this name.
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>>;

    /// Names of the semaphores the store currently holds state for.
    async fn list(&self) -> Result<Vec<String>>;

    /// One round trip to the store that writes nothing and waits for no lock a step takes:
    /// `Ok` once the store answered (see `tessera::Store::ping`). A server's health probe
    /// calls it twice a second, so it must cost the store next to nothing.
    ///
    /// The default reads the status of [`PING_NAME`], a name nobody uses; every store of this
    /// crate overrides it with a cheaper read (a status is a whole step on some stores).
    /// Wrappers forward it.
    async fn ping(&self) -> Result<()> {
        self.status(&Name::new(PING_NAME)?).await.map(drop)
    }

    /// Changes the capacity; returns the old one. [`Error::NotFound`](crate::error::Error::NotFound) if the semaphore does
    /// not exist. Shrinking never revokes: holders keep their permits and no grant happens
    /// until `used` fits the new capacity.
    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32>;

    /// Removes another holder's lease (admin). The victim learns it through `lost()`.
    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool>;

    /// Removes the semaphore with its holders and waiters; `true` if it existed. Fences stay
    /// monotonic afterwards.
    async fn delete(&self, name: &Name) -> Result<bool>;

    /// What this store can and cannot do (see the module docs). Wrappers forward it.
    fn capabilities(&self) -> Capabilities;

    /// Sets `tenant`'s ceiling and floor on the semaphore `name` (`docs/fair-shares.md`);
    /// [`TenantLimits::is_none`] removes them. Kept for the name, also while it is idle,
    /// until changed or [`Backend::delete`]. The new limits apply from the next grant: a
    /// tenant above a lowered ceiling keeps what it holds. A floor that would bring the
    /// floors of a semaphore that exists above its capacity is
    /// [`Error::InvalidInput`](crate::error::Error::InvalidInput), and nothing changes.
    /// The default: [`Error::Unsupported`](crate::error::Error::Unsupported) (see
    /// [`Capabilities::tenant_limits`]). Wrappers forward it.
    async fn set_tenant_limits(
        &self,
        _name: &Name,
        _tenant: &str,
        _limits: TenantLimits,
    ) -> Result<()> {
        Err(crate::error::Error::Unsupported(
            "this store keeps no tenant ceilings or floors".into(),
        ))
    }

    /// The tenants' ceilings and floors set on `name`, by tenant. The default: none.
    /// Wrappers forward it.
    async fn tenant_limits(&self, _name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        Ok(BTreeMap::new())
    }

    /// The step of [`Backend::acquire`] run at once on the caller's thread, for a store whose
    /// steps need no I/O (memory); `None` (the default) means "await [`Backend::acquire`]".
    /// It spares the in-process store the boxed future and the scheduling of an async call,
    /// which cost more than its step itself. Wrappers forward it, or return `None` to have
    /// the call go through their async path (fault injection does when a fault is set).
    #[doc(hidden)]
    fn acquire_now(
        &self,
        _name: &Name,
        _capacity: u32,
        _req: &AcquireRequest,
    ) -> Option<Result<AcquireReply>> {
        None
    }

    /// The step of [`Backend::release`] run at once, as [`Backend::acquire_now`].
    #[doc(hidden)]
    fn release_now(&self, _name: &Name, _lease: LeaseId) -> Option<Result<bool>> {
        None
    }

    /// When a lease or queue entry of `name` may next expire, as this process last learned
    /// it from the store (a step's reply, or the in-process state); `None` if unknown.
    ///
    /// A waiter wakes then as well as at its heartbeat, and asks the store (a heartbeat,
    /// whose step purges and hands off): on a store where expiries are purged only by steps,
    /// a permit freed by a holder that died reaches the queue when its lease expires, not up
    /// to a heartbeat interval later. An instant that has passed means nothing. Local and
    /// cheap: no I/O. Wrappers forward it.
    fn next_expiry(&self, _name: &Name) -> Option<tokio::time::Instant> {
        None
    }

    /// The rate-limit operations of this store, if it has them (see [`crate::rate::seam::RateBackend`]).
    /// Wrappers (fault injection) forward this.
    fn rate(&self) -> Option<&dyn RateBackend> {
        None
    }

    /// Admission, the semaphore and limiter of a name in one step (see
    /// [`AdmissionBackend`]), if this store has it. Wrappers forward this.
    fn admission(&self) -> Option<&dyn AdmissionBackend> {
        None
    }

    /// Why this store has no rate limiting (when [`Backend::rate`] is `None`), if it has a
    /// reason worth telling the user: it is the message of the
    /// [`Error::Unsupported`](crate::error::Error::Unsupported) a rate limiter on it gets. Wrappers
    /// forward this.
    fn rate_unsupported(&self) -> Option<&'static str> {
        None
    }
}

/// The name [`Backend::ping`]'s default implementation reads (never written).
pub const PING_NAME: &str = "tessera-ping";

/// The [`Error::Unsupported`](crate::error::Error::Unsupported) a rate limiter gets on the store at
/// `url` (redacted) whose `backend` has no rate limiting, with the store's reason if it gives
/// one.
pub fn unsupported_rate(url: &str, backend: &dyn Backend) -> crate::error::Error {
    let mut message = format!("rate limiting is not available on {url}");
    if let Some(why) = backend.rate_unsupported() {
        message.push_str(": ");
        message.push_str(why);
    }
    crate::error::Error::Unsupported(message)
}
