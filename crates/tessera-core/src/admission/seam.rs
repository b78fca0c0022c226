//! The admission seam: permits and rate windows in one atomic step (see `docs/admission.md`).
//! Imports no façade and no store.
//!
//! A store that offers it ([`crate::seam::Backend::admission`]) keeps, per name, the
//! semaphore's state and the limiter's state where one step reaches both, and runs
//! [`AdmissionBackend::admit`] as one step on its clock:
//!
//! 1. purge and hand off, as every semaphore step (see [`crate::seam`]); the hand-off never
//!    grants an **admission waiter**: a head that is one stops it (strict FIFO: nobody behind
//!    it is granted), and, once its permits fit, the store wakes it so that its own step
//!    decides;
//! 2. a retry of a granted lease id answers the grant; a queued lease id renews its queue
//!    entry;
//! 3. the request's turn is when nobody waits (a newcomer) or it is the head (a waiter), and
//!    its weight fits. On its turn the windows are asked for `cost` at the step's instant
//!    `t`: if they admit it, the lease is written and every window charged at `t`, in this
//!    step ([`AdmitReply::Granted`]); if not, nothing is charged and the reply says when the
//!    windows will admit it (`window_at`);
//! 4. otherwise a waiting request joins the queue as an admission waiter (at the tail, or at
//!    the head for a request that gave back an admission it could not use in time), and a
//!    try is refused. A refusal, a queue place and an error charge no window.

use std::fmt;

use async_trait::async_trait;

use crate::error::Result;
use crate::model::{AcquireRequest, Grant, LeaseId, Name, StoreTime};
use crate::rate::spec::RateConfig;

/// One admission request: the semaphore's part (lease id, weight, TTL, holder, wait) and the
/// windows' part (`cost` under the limiter's configuration).
#[derive(Debug, Clone)]
pub struct AdmitRequest {
    /// The semaphore's part; `acquire.wait` set: queue if it is not this request's turn.
    pub acquire: AcquireRequest,
    /// The cost charged to every window (1 ..= [`RateConfig::max_cost`], checked by the
    /// client).
    pub cost: u32,
    /// Replace stored limits that differ from the declared ones instead of failing with
    /// [`Error::RateMismatch`](crate::error::Error::RateMismatch).
    pub update: bool,
    /// Join the queue at its head, not its tail: only for a request that has just given back
    /// an admission it could not use before its use-by instant.
    pub at_head: bool,
}

/// The store's answer to an admission step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AdmitReply {
    /// The permits are held and every window was charged `cost` at `grant.now` (the lease's
    /// `acquired_at`). `reservation` names the charge for [`AdmissionBackend::give_back`].
    Granted { grant: Grant, reservation: u64 },
    /// Waiting at `position` (0: the head). `window_at`: the head's permits fit but the
    /// windows do not admit its cost before this store instant; `None` otherwise.
    Queued {
        position: u64,
        window_at: Option<StoreTime>,
        now: StoreTime,
    },
    /// A try only: not admitted, nothing changed. `window_at` as for `Queued`, when the
    /// permits were free and only the windows refused.
    Refused {
        available: u32,
        queued: u64,
        window_at: Option<StoreTime>,
        now: StoreTime,
    },
}

/// An admission given back unused, for [`AdmissionBackend::give_back`]: the charge made at
/// `at` (named by `reservation`), and whether it was given back because it was past its
/// use-by instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GiveBack {
    /// The admission's charge, as [`AdmitReply::Granted`] named it (0: nothing to return).
    pub reservation: u64,
    /// The store instant of the admission (the lease's `acquired_at`).
    pub at: StoreTime,
    /// Past its use-by instant: counted in the limiter's state.
    pub expired: bool,
}

/// What an admission actually cost, for [`AdmissionBackend::settle`]: the charge made at
/// `at` (named by `reservation`) was `charged`; the call cost `actual`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settlement {
    /// The admission's charge, as [`AdmitReply::Granted`] named it.
    pub reservation: u64,
    /// The store instant of the admission (the lease's `acquired_at`).
    pub at: StoreTime,
    /// The cost charged at `at`.
    pub charged: u32,
    /// The cost the call turned out to have.
    pub actual: u32,
}

/// Admission: one atomic step over a name's semaphore and limiter (see the module docs).
/// The other operations on an admission's lease are the semaphore's: renew, release,
/// cancel.
#[async_trait]
pub trait AdmissionBackend: Send + Sync + fmt::Debug {
    /// Grants and charges, queues, or refuses, all or nothing (see the module docs). Fails
    /// with [`Error::CapacityMismatch`](crate::error::Error::CapacityMismatch),
    /// [`Error::RateMismatch`](crate::error::Error::RateMismatch) or
    /// [`Error::QueueFull`](crate::error::Error::QueueFull) having changed nothing.
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply>;

    /// Gives back an admission that was not used: releases `lease` and, if its charge
    /// (`give_back.reservation`, made at `give_back.at`) is still the limiter's latest, returns it to every
    /// window; a later admission keeps it charged (the windows only count more than was
    /// used, never less). With `expired` (it was past its use-by instant), the same step
    /// counts it in the limiter's state ([`RateStatus::expired_unused`](crate::rate::seam::RateStatus))
    /// if it released the lease (so a give-back sent twice counts once), whether or not the
    /// charge could be returned. `true` if the lease was still held.
    async fn give_back(&self, name: &Name, lease: LeaseId, give_back: GiveBack) -> Result<bool>;

    /// Releases `lease` and settles its admission's cost in one step (`docs/admission.md`,
    /// invariant 6): an excess (`actual > charged`) is charged to every window at the step's
    /// instant (or after the latest reservation), whether or not the lease was still held;
    /// a smaller cost gives the difference back only if this step released the lease
    /// (so a settle counts once), in exact mode from the log entries at the admission's
    /// instant, in smooth mode only while the admission is the limiter's latest. The windows
    /// never count less than was used. `true` if the lease was still held.
    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        let _ = (name, lease, settlement);
        Err(crate::error::Error::Unsupported(
            "settling an admission's cost on this store".to_string(),
        ))
    }
}
