//! `rate_status` without the limiter's lock: the step's answer computed from one consistent
//! snapshot, whose writes are left to the next step that writes.
//!
//! # Why
//!
//! The step's status ([`super::rate::status`], PostgreSQL's `tessera_rate_status`) locks the
//! limiter's row like every rate step (SQLite: the file's write lock), sweeps, prunes and
//! writes back. A dashboard or `tessera status --watch` polling a busy limiter then queues
//! with the admissions on that row lock, and each of its statuses commits a write.
//!
//! # What the step's status changes
//!
//! Read from the code of the three stores, at the step's instant `now`, the step's status
//! changes exactly this:
//!
//! 1. **sweep**: deletes up to 16 *other* limiters whose state expired by `now`, rows and
//!    logs (PostgreSQL, MySQL: skipping rows another step holds);
//! 2. **placeholder** (MySQL only): a name without a row gets a placeholder row, expired at
//!    birth, inserted to be locked, and deleted again by (3) in the same step;
//! 3. **expiry**: a state with `expires_at <= now` is deleted with its log, and the answer
//!    is `None` (as for a name without a row);
//! 4. **prune** (exact mode): log entries with `t <= now - horizon` (the longest window
//!    plus the margin, `engine::prune_cutoff`) are deleted and `base` becomes the largest
//!    running total deleted; the row is written back with only `base` changed (its
//!    `expires_at` is recomputed to the value it had: pruning moves neither `last` nor
//!    `kept_until`).
//!
//! Nothing else: no counter (`seq`, `tail`, `last`, `p`, `tat`), not the count of expired
//! admissions (`expired`), not the limits. The answer is then `engine::status` of the
//! pruned state and log at `now`, with `expired` where the row has the column.
//!
//! # The invariant, and the choice
//!
//! A store reads the limiter's row and its whole log in **one consistent snapshot** that
//! takes no lock and waits for none (PostgreSQL one statement; MySQL / MariaDB a
//! `REPEATABLE READ`, `READ ONLY` transaction started `WITH CONSISTENT SNAPSHOT`; SQLite a
//! deferred read transaction, which in WAL mode never waits for a writer), with the store's
//! clock (`now`) read inside it, after it was taken. From that snapshot [`settled`]
//! computes what the step would answer at `now`, applying (3) and (4) to its own copy:
//! `None` for no row or an expired one; otherwise the log without the entries (4) would
//! delete, `base` moved as (4) would move it, and `engine::status` of that: the same pure
//! function of the same values as the step's, so the same answer. (1) and (2) change no
//! answer about this limiter. So the answer is the step's **whether or not something is
//! due**, and a status never locks: it never falls back to the step because a prune or an
//! expiry is due.
//!
//! The writes (1), (3) and (4) are left undone, to the next step that writes. That changes
//! no later answer either: every step's load drops an expired state itself and every
//! acquire prunes before it decides (the cutoff only grows, so it deletes the same entries
//! and sets the same `base`); a cancel or a settle that reads the log past `base` finds the
//! same totals with or without the old entries (the largest of them *is* the `base` a prune
//! sets, and a settle ignores blocks at or before the cutoff); `rate_list` filters by
//! `expires_at > now`. It is also what the reference model does: the memory store's status
//! prunes a copy and writes nothing back, and the differential tests compare every status
//! and every later step with it. The state stays bounded: only writes add rows, and every
//! write sweeps and prunes.
//!
//! **The step runs only** when the snapshot reads wrong ([`crate::error::Error::Corrupt`]: an
//! unreadable value, a negative integer, a status the engine cannot compute), so that the
//! step's own checks answer for it (and a damaged state that has expired is dropped as
//! before), or when the snapshot could not be read without waiting (SQLite: busy; MySQL: a
//! lost connection), as `status` of a semaphore does (`snapshot.rs`).
//!
//! A step in flight (its lock held, not committed) is not in the snapshot: the status comes
//! before it, as it would have had it taken the lock first. `now` is read a little after the
//! snapshot's instant, and the answer is the step's at `now` over the snapshot's rows, which
//! is what a step that locked at that instant and read its clock at `now` would see, since
//! nothing but a step changes the rows.
//!
//! # What it costs
//!
//! One read (one round trip on PostgreSQL and MySQL), no commit, no write-ahead log, no
//! lock; the log read is what the step's status read too (at most the longest limit's `N`
//! entries plus reservations, and the entries a prune is due to delete).

use crate::error::{Error, Result};
use crate::model::{Name, StoreTime};
use crate::rate::engine::{self, VecLog};
use crate::rate::seam::RateStatus;
use crate::rate::spec::RateMode;

use super::rate::{non_negative, stored_config, RateRow};

/// A limiter as read in one snapshot, without a lock (see the module docs).
#[derive(Debug, Clone)]
pub struct RateSnapshot {
    /// The store's clock, read inside the snapshot once it was taken.
    pub now: StoreTime,
    /// The limiter's row (`None`: the name has none), read as the step's load reads it.
    pub row: Option<RateRow>,
    /// The whole log as `(t, p)`, ascending by `p`.
    pub log: Vec<(i64, i64)>,
    /// The row's count of admissions given back past their use-by instant (`None`: the row
    /// has no such column, or there is no row).
    pub expired: Option<i64>,
}

/// What a snapshot read tells `rate_status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateRead {
    /// The step's answer at the snapshot's instant (`None`: no state).
    Settled(Option<RateStatus>),
    /// Something reads wrong: run the step, whose checks answer for it.
    Step,
}

/// The answer of `rate_status` from what a store read (see the module docs). A read that
/// failed as [`Error::Corrupt`] is left to the step; other errors are the caller's.
pub fn read_rate_status(name: &Name, read: Result<RateSnapshot>) -> Result<RateRead> {
    match read {
        Ok(snap) => Ok(settled(name, snap)),
        Err(Error::Corrupt(_)) => Ok(RateRead::Step),
        Err(e) => Err(e),
    }
}

/// The step's answer computed from `snap` ([`RateRead::Settled`]), or [`RateRead::Step`]
/// when a value reads wrong.
pub fn settled(name: &Name, snap: RateSnapshot) -> RateRead {
    match answer(name, snap) {
        Ok(answer) => RateRead::Settled(answer),
        Err(_) => RateRead::Step,
    }
}

/// The step's status, with its expiry (3) and its prune (4) applied to the snapshot's copy.
fn answer(name: &Name, snap: RateSnapshot) -> Result<Option<RateStatus>> {
    let now = snap.now;
    // No row, a placeholder (expired at birth) or an expired state: the step answers `None`.
    let Some(row) = snap.row.filter(|r| r.expires_at > now.0) else {
        return Ok(None);
    };
    let mut state = row.state;
    let config = stored_config(name, &state)?;
    let mut log = VecLog::default();
    if let RateMode::Exact = config.mode() {
        // The prune: entries at or before the cutoff go, `base` becomes the largest total
        // among them (the step's `DELETE … WHERE t <= cutoff`, whatever their order).
        let cutoff = engine::prune_cutoff(&config, now);
        let mut pruned = None;
        for &(t, p) in &snap.log {
            let (t, p) = (non_negative(t, "t")?, non_negative(p, "p")?);
            match t <= cutoff {
                true => pruned = Some(pruned.map_or(p, |m: u64| m.max(p))),
                false => log.0.push_back((t, p)),
            }
        }
        if let Some(p) = pruned {
            state.base = p;
        }
    }
    let mut status = engine::status(name, &state, &config, &log, now)?;
    if let Some(n) = snap.expired {
        status.expired_unused = Some(non_negative(n, "expired count")?);
    }
    Ok(Some(status))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::engine::RateState;
    use crate::rate::spec::RateConfig;

    const NOW: u64 = 10_000_000;

    fn config() -> RateConfig {
        RateConfig::new(&["2/s".parse().unwrap()], RateMode::Exact).unwrap()
    }

    /// Two admissions of cost 1: one a horizon before `NOW` (due to be pruned), one at `NOW - 1`.
    fn snap() -> RateSnapshot {
        let c = config();
        let mut state = RateState::new(&c);
        (state.p, state.last, state.seq, state.tail) = (2, NOW - 1, 2, 2);
        let expires_at = state.expires_at(&c);
        RateSnapshot {
            now: StoreTime(NOW),
            row: Some(RateRow { state, expires_at }),
            log: vec![((NOW - 1_000_000) as i64, 1), ((NOW - 1) as i64, 2)],
            expired: Some(3),
        }
    }

    fn name() -> Name {
        Name::new("r").unwrap()
    }

    #[test]
    fn a_due_prune_is_applied_to_the_copy_as_the_step_would() {
        let RateRead::Settled(Some(s)) = settled(&name(), snap()) else {
            panic!("not settled");
        };
        // The entry at the cutoff is pruned: one admission in the window, as the step says.
        assert_eq!(s.limits[0].used, 1);
        assert_eq!(s.expired_unused, Some(3));
        // The same answer as the engine gives for the pruned state (what the step computes).
        let mut pruned = snap().row.unwrap().state;
        pruned.base = 1;
        let log = VecLog([(NOW - 1, 2)].into_iter().collect());
        let mut want = engine::status(&name(), &pruned, &config(), &log, StoreTime(NOW)).unwrap();
        want.expired_unused = Some(3);
        assert_eq!(s, want);
    }

    #[test]
    fn no_row_a_placeholder_or_an_expired_state_answers_none() {
        let mut none = snap();
        none.row = None;
        assert_eq!(settled(&name(), none), RateRead::Settled(None));
        let mut expired = snap();
        expired.row.as_mut().unwrap().expires_at = NOW;
        assert_eq!(settled(&name(), expired), RateRead::Settled(None));
        let mut placeholder = snap();
        let row = placeholder.row.as_mut().unwrap();
        (row.state.config, row.expires_at) = (String::new(), 0);
        assert_eq!(settled(&name(), placeholder), RateRead::Settled(None));
    }

    #[test]
    fn a_value_that_reads_wrong_is_left_to_the_step() {
        let mut s = snap();
        s.log[1].1 = -2;
        assert_eq!(settled(&name(), s), RateRead::Step);
        let mut s = snap();
        s.row.as_mut().unwrap().state.config = "nonsense".into();
        assert_eq!(settled(&name(), s), RateRead::Step);
        let mut s = snap();
        s.expired = Some(-1);
        assert_eq!(settled(&name(), s), RateRead::Step);
        assert_eq!(
            read_rate_status(&name(), Err(Error::Corrupt("x".into()))).unwrap(),
            RateRead::Step
        );
    }
}
