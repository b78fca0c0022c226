//! `status` without the semaphore's lock: the answer read from one consistent snapshot when
//! the step would change nothing at that snapshot's instant, else the step as before.
//!
//! # Why
//!
//! The step's `status` ([`super::status`], PostgreSQL's `tessera_status`) locks the
//! semaphore's row like every write (SQLite: the file's write lock), purges, hands off, then
//! reads. A dashboard, `tessera status --watch` or a watched waiter (`acquire_many_watching`,
//! `tessera serve`'s waits, `tessera run`'s line, every 500 ms) polling a busy semaphore
//! then competes with the hot path: on MariaDB a status every 100 ms during a flood of
//! 10,000 waiters kept the row locked often enough that heartbeats came late and thousands
//! of waiters expired at once (the chaos runner's `QUEUE_COUNT_EVERY`).
//!
//! # The invariant
//!
//! A store reads the semaphore's row (`capacity`, `used`, `queued`), its holders (by
//! `(acquired_at, fence)`) and its waiters (in queue order, with the head's `gate`) in **one
//! consistent snapshot** that takes no lock and waits for none: PostgreSQL one statement
//! (one statement is one snapshot); MySQL / MariaDB a `REPEATABLE READ`, `READ ONLY`
//! transaction started `WITH CONSISTENT SNAPSHOT` (InnoDB's non-locking consistent read);
//! SQLite a deferred read transaction, which in WAL mode never blocks a writer nor waits for
//! one. The store's clock (`now`) is read inside that snapshot, after it was taken.
//!
//! At the snapshot's instant, the step's status does exactly this and nothing else (no tag,
//! no fence, no capacity declared):
//!
//! 1. purge the holders with `expires_at <= now` and the waiters with `expires_at <= now`;
//! 2. hand off: while `queued > 0` and `used < capacity`, grant the queue head if its weight
//!    fits in `capacity - used` and it has no gate; else, if the head is an admission waiter
//!    (a gate) that fits and whose gate is at most `now`, mark it woken and wake it;
//! 3. finish: delete a row with nothing used and nothing queued (with its free seats and
//!    tenants; PostgreSQL also raises the fence high-water mark then), and answer `None`;
//! 4. answer `capacity`, `used`, `now`, the holders and the queue.
//!
//! (PostgreSQL's step also recomputes the row's `purge_at` once `now` has passed it; a
//! bound no answer shows, and the next step recomputes it just the same.)
//!
//! So **when none of 1–3 applies at `now`** ([`settled`] checks it: no holder and no waiter
//! has expired, the queue head does not fit or is gated past `now`, the row has something
//! used or queued, and the row's counters agree with the rows read), the step would write
//! nothing and answer exactly the snapshot: that answer is returned, and `status` stays
//! linearizable, at the snapshot's instant. `now` is read a little after that instant, which
//! only makes every check stricter: an entry unexpired at `now` was unexpired before, a gate
//! not reached at `now` was not reached before. A step in flight (its row lock held, not
//! committed) is not in the snapshot: the status comes before it, as it would have had it
//! taken the lock first.
//!
//! **Otherwise the store runs the step**, lock included, exactly as before: an expiry or a
//! hand-off is due, or a value reads wrong (the step's own checks then answer
//! [`crate::error::Error::Corrupt`]), or the snapshot could not be read without waiting (SQLite:
//! busy). The differential test compares every status with the reference model's, which
//! stays a step: both paths must give the model's answer.
//!
//! A rate limiter's status reads the same kind of snapshot and never locks: its step's
//! writes change no answer, so the snapshot computes the step's answer in every case
//! (`rate_snapshot.rs`).
//!
//! # What it costs
//!
//! One read (one round trip on PostgreSQL and MySQL), no commit, no write-ahead log. A
//! status never waits behind a step and never delays one, except when something is due,
//! which its step then does for the next operation anyway.

use crate::error::Result;
use crate::model::{Lease, Name, SemaphoreStatus, StoreTime, Waiter, MAX_CAPACITY};

use super::dialect::{HolderRow, WaiterRow};
use super::step::{lease_of_row, waiter_of_row};

/// A semaphore as read in one snapshot, without a lock (see the module docs).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The store's clock, read inside the snapshot once it was taken.
    pub now: StoreTime,
    /// The row's counters, as stored.
    pub capacity: i64,
    pub used: i64,
    pub queued: i64,
    /// The holders, by `(acquired_at, fence)`.
    pub holders: Vec<Lease>,
    /// The waiters in queue order, head first.
    pub queue: Vec<Waiter>,
    /// The queue head's gate: `None` for a plain waiter (or an empty queue), `Some` for an
    /// admission waiter (`SemRows::wake_gated_head`).
    pub head_gate: Option<i64>,
}

impl Snapshot {
    /// The holders and waiters of a dialect's rows, checked as the step checks them.
    pub fn rows(holders: &[HolderRow], waiters: &[WaiterRow]) -> Result<(Vec<Lease>, Vec<Waiter>)> {
        let holders = holders.iter().map(lease_of_row).collect::<Result<_>>()?;
        let queue = waiters.iter().map(waiter_of_row).collect::<Result<_>>()?;
        Ok((holders, queue))
    }
}

/// What a snapshot read tells `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// The step would change nothing at the snapshot's instant: its answer (`None`: the
    /// semaphore has no row).
    Settled(Option<SemaphoreStatus>),
    /// Something is due, or something reads wrong: run the step.
    Step,
}

/// The answer of `status` from what a store read (`None`: no semaphore row), if the step
/// would change nothing at the snapshot's instant (see the module docs). A read that failed
/// as [`crate::error::Error::Corrupt`] is left to the step, whose checks answer for it.
pub fn read_status(name: &Name, read: Result<Option<Snapshot>>) -> Result<Read> {
    match read {
        Ok(None) => Ok(Read::Settled(None)),
        Ok(Some(snap)) => Ok(settled(name, snap)),
        Err(crate::error::Error::Corrupt(_)) => Ok(Read::Step),
        Err(e) => Err(e),
    }
}

/// [`Read::Settled`] with the snapshot as the step would answer it, when none of the
/// step's changes applies at `snap.now`; [`Read::Step`] otherwise.
pub fn settled(name: &Name, snap: Snapshot) -> Read {
    let now = snap.now;
    let (Ok(capacity), Ok(used), Ok(queued)) = (
        u32::try_from(snap.capacity),
        u32::try_from(snap.used),
        u64::try_from(snap.queued),
    ) else {
        return Read::Step;
    };
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Read::Step;
    }
    // The finish would delete the row (3).
    if used == 0 && queued == 0 {
        return Read::Step;
    }
    // Counters that disagree with the rows: the step's checks decide.
    let held: u64 = snap.holders.iter().map(|h| h.weight as u64).sum();
    if held != used as u64 || snap.queue.len() as u64 != queued {
        return Read::Step;
    }
    // The purge (1).
    if snap.holders.iter().any(|h| h.expires_at <= now)
        || snap.queue.iter().any(|w| w.expires_at <= now)
    {
        return Read::Step;
    }
    // The hand-off (2): a head that fits is granted, or woken if gated and its gate came.
    if let Some(head) = snap.queue.first() {
        let available = capacity.saturating_sub(used);
        let due = snap.head_gate.is_none_or(|gate| gate <= now.0 as i64);
        if used < capacity && head.weight <= available && due {
            return Read::Step;
        }
    }
    Read::Settled(Some(SemaphoreStatus::new(
        name,
        capacity,
        used,
        now,
        snap.holders,
        snap.queue,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::LeaseId;

    const NOW: u64 = 1_000_000;

    fn lease(weight: u32, expires_at: u64) -> Lease {
        Lease {
            lease_id: LeaseId::random(),
            weight,
            seats: (0..weight).collect(),
            fence: 1,
            holder: "h".into(),
            acquired_at: StoreTime(1),
            expires_at: StoreTime(expires_at),
            tenant: None,
        }
    }

    fn waiter(weight: u32, expires_at: u64) -> Waiter {
        Waiter {
            lease_id: LeaseId::random(),
            weight,
            holder: "w".into(),
            enqueued_at: StoreTime(1),
            expires_at: StoreTime(expires_at),
            tenant: None,
        }
    }

    /// Capacity 2, one holder of 2 and one waiter of 1, nothing expired.
    fn full() -> Snapshot {
        Snapshot {
            now: StoreTime(NOW),
            capacity: 2,
            used: 2,
            queued: 1,
            holders: vec![lease(2, NOW + 1)],
            queue: vec![waiter(1, NOW + 1)],
            head_gate: None,
        }
    }

    fn is_step(snap: Snapshot) -> bool {
        settled(&Name::new("s").unwrap(), snap) == Read::Step
    }

    #[test]
    fn a_full_semaphore_with_nothing_expired_is_answered_from_the_snapshot() {
        let snap = full();
        let Read::Settled(Some(s)) = settled(&Name::new("s").unwrap(), snap.clone()) else {
            panic!("not settled");
        };
        assert_eq!(
            (s.capacity, s.used, s.available, s.now),
            (2, 2, 0, snap.now)
        );
        assert_eq!((s.holders, s.queue), (snap.holders, snap.queue));
    }

    #[test]
    fn an_expiry_at_now_or_before_is_left_to_the_step() {
        let mut snap = full();
        snap.holders[0].expires_at = StoreTime(NOW);
        assert!(is_step(snap));
        let mut snap = full();
        snap.queue[0].expires_at = StoreTime(NOW);
        assert!(is_step(snap));
    }

    #[test]
    fn a_head_that_fits_is_left_to_the_step_unless_gated_past_now() {
        let mut snap = full();
        snap.holders = vec![lease(1, NOW + 1)];
        snap.used = 1;
        assert!(is_step(snap.clone()));
        snap.head_gate = Some(NOW as i64);
        assert!(
            is_step(snap.clone()),
            "a gated head whose gate came is woken"
        );
        snap.head_gate = Some(NOW as i64 + 1);
        assert!(!is_step(snap.clone()), "a gated head before its gate waits");
        // A head that does not fit blocks the queue: nothing to hand off.
        snap.head_gate = None;
        snap.queue[0].weight = 2;
        assert!(!is_step(snap));
    }

    #[test]
    fn counters_that_disagree_with_the_rows_or_an_idle_row_are_left_to_the_step() {
        let mut snap = full();
        snap.used = 1;
        assert!(is_step(snap));
        let mut snap = full();
        snap.queued = 2;
        assert!(is_step(snap));
        let mut snap = full();
        (snap.used, snap.queued, snap.holders, snap.queue) = (0, 0, vec![], vec![]);
        assert!(is_step(snap));
        let mut snap = full();
        snap.capacity = 0;
        assert!(is_step(snap));
    }
}
