//! The rate decision as pure functions of the state, the request and the store's time. The
//! memory, SQLite and MySQL stores call these; the Redis script (`rate_acquire.lua`) and the
//! PostgreSQL function (`stores/postgres/sql/rate_acquire.sql`) follow them line by line
//! (a status from either is computed here, by `status`).
//!
//! Every `L` below is a limit's enforced window, its period plus the limiter's margin
//! ([`RateConfig::window_us`]); the period alone is never used for a decision.
//!
//! # State
//!
//! - `config`: the canonical limits ([`RateConfig::encode`]);
//! - `last`: the latest admit time (reserved times included); every admission is placed at
//!   or after it, so admit times never decrease (FIFO reservations, and a sorted log);
//! - `p`: running total of admitted cost; `base`: the running total just before the oldest
//!   log entry still kept (entries older than the longest window are pruned);
//! - the log (exact mode): entries `(t, P)`, `P` the running total including the entry; `P`
//!   is strictly increasing (costs are `>= 1`) and so unique, and `t` is non-decreasing;
//! - `tat` (smooth mode): one theoretical arrival time per limit (GCRA);
//! - `seq`, `tail`, `prev_last`, `prev_tat`: enough to undo the latest admission (`tail` is
//!   its id, 0 once undone or when nothing can be undone).
//!
//! # Exact mode
//!
//! A request of cost `k` placed at `t >= max(now, last)` lies after every entry, so the
//! windows containing it hold at most what `(t - L, t]` holds, plus `k`. That cost is `p`
//! minus the running total before the first entry later than `t - L`, and it is at most
//! `N - k` exactly when every entry whose `P >= p - N + k` (the threshold) is at or before
//! `t - L`. The first such entry binds: `t >= t_entry + L`. The earliest admissible time is
//! the largest of these bounds over the limits and `max(now, last)`.
//!
//! # Smooth mode
//!
//! Limit `N/L` has emission interval `T = ceil(L / N)` µs and tolerance `(B - 1) T`. `k` units
//! at `t` pass when the last of them would: `t >= max(tat, t) + (k - 1) T - (B - 1) T`, i.e.
//! `t >= tat - (B - k) T` (with `k <= B`). Admitting sets `tat = max(tat, t) + k T`.

use std::collections::VecDeque;

use crate::error::{Error, Result};
use crate::model::{Name, StoreTime};
use crate::rate::seam::{LimitUsage, RateStatus};
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
use crate::rate::seam::{RateReply, RateRequest};
use crate::rate::spec::{RateConfig, RateMode};

/// One limiter's state (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateState {
    pub config: String,
    pub seq: u64,
    pub tail: u64,
    pub last: u64,
    pub prev_last: u64,
    pub p: u64,
    pub base: u64,
    pub tat: Vec<u64>,
    pub prev_tat: Vec<u64>,
    /// The expiry the state was stored with (0 for a new one): a save never lowers it. It is
    /// raised past what the state needs only to keep a count of expired admissions (see
    /// `stores/sql/rate.rs` `give_back`); a state kept longer answers as a fresh one would.
    pub kept_until: u64,
}

// `new` and `expires_at`, like the other items under this `cfg`, serve the stores that
// decide in Rust (memory, SQLite, MySQL, and the shared SQL step that a build with PostgreSQL
// alone compiles); the Redis scripts run the same step in Lua, PostgreSQL in PL/pgSQL.
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
impl RateState {
    pub fn new(config: &RateConfig) -> Self {
        let n = config.limits().len();
        RateState {
            config: config.encode(),
            seq: 0,
            tail: 0,
            last: 0,
            prev_last: 0,
            p: 0,
            base: 0,
            tat: vec![0; n],
            prev_tat: vec![0; n],
            kept_until: 0,
        }
    }

    /// When the state stops mattering: no entry within the longest window, no pacing
    /// debt. Past this time a fresh state answers the same. Never before `kept_until`.
    pub fn expires_at(&self, config: &RateConfig) -> u64 {
        let needed = match config.mode() {
            RateMode::Exact => self.last.saturating_add(config.horizon_us()),
            RateMode::Smooth { .. } => self.tat.iter().copied().fold(self.last, u64::max),
        };
        needed.max(self.kept_until)
    }
}

/// The entries at or before this time are pruned (exact mode).
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
pub fn prune_cutoff(config: &RateConfig, now: StoreTime) -> u64 {
    now.0.saturating_sub(config.horizon_us())
}

/// Checks the stored configuration against the declared one. Returns the state to use:
/// `state` unchanged if they match; a fresh state if there was none; with `update`, the
/// state moved to the new configuration (exact history kept; smooth pacing restarts from
/// `max(now, last)`). Without `update` a difference is [`Error::RateMismatch`].
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
pub fn check_config(
    name: &Name,
    state: Option<RateState>,
    config: &RateConfig,
    update: bool,
    now: StoreTime,
) -> Result<RateState> {
    let Some(mut state) = state else {
        return Ok(RateState::new(config));
    };
    let declared = config.encode();
    if state.config == declared {
        check_pacing(name, &state, config)?;
        return Ok(state);
    }
    if !update {
        return Err(Error::RateMismatch {
            name: name.to_string(),
            stored: state.config,
            declared,
        });
    }
    let start = now.0.max(state.last);
    let n = config.limits().len();
    state.config = declared;
    state.tat = vec![start; n];
    state.prev_tat = vec![start; n];
    state.tail = 0;
    Ok(state)
}

/// A stored state has one pacing value (and one to undo) per limit of its configuration;
/// anything else was not written by this code.
fn check_pacing(name: &Name, state: &RateState, config: &RateConfig) -> Result<()> {
    if state.tat.len() != config.limits().len() || state.prev_tat.len() != state.tat.len() {
        return Err(Error::Corrupt(format!(
            "rate limiter {name}: {} pacing values for {} limits",
            state.tat.len(),
            config.limits().len()
        )));
    }
    Ok(())
}

/// Exact mode: for each limit, the running total whose first entry binds the request, if
/// any entry can bind (`None`: the limit does not constrain). Look each up with
/// [`LogView::first_at_least`].
pub fn thresholds(state: &RateState, config: &RateConfig, cost: u32) -> Vec<Option<u64>> {
    config
        .limits()
        .iter()
        .map(|l| {
            // P >= p - N + k, and only entries still kept (P > base) can bind. Saturating:
            // a `p` read back from a store may be anything, and then no entry is found and
            // the caller reports the state as corrupt.
            let x = (state.p.saturating_add(cost as u64)).checked_sub(l.count() as u64)?;
            (x > state.base).then_some(x)
        })
        .collect()
}

/// The smooth-mode emission interval of each limit, in µs.
pub fn emission_intervals(config: &RateConfig) -> Vec<u64> {
    config
        .limits()
        .iter()
        .map(|l| config.window_us(l).div_ceil(l.count() as u64))
        .collect()
}

/// The earliest admissible time of a request of `cost`. `found[i]` is the admit time of the
/// first entry at or above `thresholds(..)[i]` (exact mode; ignored in smooth mode).
pub fn earliest(
    state: &RateState,
    config: &RateConfig,
    cost: u32,
    now: StoreTime,
    found: &[Option<u64>],
) -> Result<u64> {
    let mut t = now.0.max(state.last);
    match config.mode() {
        RateMode::Exact => {
            let wanted = thresholds(state, config, cost);
            for ((l, want), got) in config.limits().iter().zip(&wanted).zip(found) {
                match (want, got) {
                    (None, _) => {}
                    (Some(_), Some(at)) => t = t.max(at.saturating_add(config.window_us(l))),
                    (Some(x), None) => {
                        return Err(Error::Corrupt(format!(
                            "rate log has no entry at or above running total {x} (total {})",
                            state.p
                        )))
                    }
                }
            }
        }
        RateMode::Smooth { burst } => {
            let slack = (burst.saturating_sub(cost)) as u64;
            for (tat, interval) in state.tat.iter().zip(emission_intervals(config)) {
                t = t.max(tat.saturating_sub(slack * interval));
            }
        }
    }
    Ok(t)
}

/// Decides a request. On admission, updates `state` and returns the log entry `(t, P)` to
/// append (exact mode). On `Limited`, `state` is unchanged.
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
pub fn decide(
    state: &mut RateState,
    config: &RateConfig,
    req: &RateRequest,
    now: StoreTime,
    found: &[Option<u64>],
) -> Result<(RateReply, Option<(u64, u64)>)> {
    let t = earliest(state, config, req.cost, now, found)?;
    let wait = t - now.0;
    let admit = match req.max_wait {
        None => wait == 0,
        Some(max) => wait as u128 <= max.as_micros(),
    };
    if !admit {
        return Ok((
            RateReply::Limited {
                retry_at: StoreTime(t),
                now,
            },
            None,
        ));
    }
    state.prev_last = state.last;
    state.last = t;
    state.seq += 1;
    state.tail = state.seq;
    let k = req.cost as u64;
    let entry = match config.mode() {
        RateMode::Exact => {
            state.p += k;
            Some((t, state.p))
        }
        RateMode::Smooth { .. } => {
            state.prev_tat = state.tat.clone();
            for (tat, interval) in state.tat.iter_mut().zip(emission_intervals(config)) {
                *tat = (*tat).max(t) + k * interval;
            }
            None
        }
    };
    Ok((
        RateReply::Admitted {
            at: StoreTime(t),
            now,
            reservation: state.seq,
        },
        entry,
    ))
}

/// Whether `reservation` (admitted at `at`) can be returned: it is the latest admission, not
/// undone, and not yet due. The admit time is checked too: ids restart when an expired state
/// is created afresh, but a stale id's time has passed by then (the state expires only after
/// its latest admission), so it can never match a new reservation that is not yet due. (After
/// an admin delete a reservation made before it may still be pending; it matches a new one
/// only if both its id and its admit time, to the microsecond, are equal.) If so, restores `last` (and smooth `tat`) and returns `true`; the caller then
/// removes the log's last entry (exact mode) and sets `p` to the running total before it.
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
pub fn cancel(
    state: &mut RateState,
    config: &RateConfig,
    reservation: u64,
    at: StoreTime,
    now: StoreTime,
) -> bool {
    if at.0 <= now.0 {
        return false;
    }
    undo_latest(state, config, reservation, at)
}

/// Undoes the latest admission (`reservation`, admitted at `at`), due or not: for an
/// admission given back unused (`crate::admission`). `false`, changing nothing, if it is not
/// the latest or was undone already. The exact-mode log entry is the caller's to drop. (A
/// state expires only a horizon after its latest admission, and a give-back comes a margin
/// after its own, so ids restarting with a fresh state cannot match here either.)
#[cfg(any(
    feature = "memory",
    feature = "sqlite",
    feature = "mysql",
    feature = "postgres"
))]
pub fn undo_latest(
    state: &mut RateState,
    config: &RateConfig,
    reservation: u64,
    at: StoreTime,
) -> bool {
    if reservation == 0 || state.tail != reservation || state.last != at.0 {
        return false;
    }
    state.last = state.prev_last;
    state.tail = 0;
    if let RateMode::Smooth { .. } = config.mode() {
        state.tat = state.prev_tat.clone();
    }
    true
}

/// What a settle does to the exact-mode log; the caller applies it in the same step.
#[cfg(any(feature = "memory", feature = "sqlite", feature = "mysql"))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogChange {
    /// Nothing (smooth mode, or no change).
    None,
    /// Append the entry `(t, P)` (an excess, charged like a forced admission).
    Append { t: u64, p: u64 },
    /// Give back `d` from the block of entries at `t` (running totals `before < P <= last`):
    /// the block becomes one entry `(t, last - d)` (none when that equals `before`), and
    /// every entry after `t` moves down by `d`.
    Lower {
        t: u64,
        before: u64,
        last: u64,
        d: u64,
    },
}

/// The block of exact-mode log entries a give-back of a settle lowers: the entries at the
/// latest admit time at or before `at` (`at` less the store's slack when its times come
/// back converted), as `(t, before, last)`: the running total before the block and at its
/// end. `None`: no kept entry is at or before `at` (pruned, or the state started afresh).
///
/// A block before the admission's own is safe to lower: every window that can still decide
/// and holds that earlier instant holds the admission's too, so none counts less than was
/// used.
#[cfg(feature = "memory")]
pub fn settle_block(log: &dyn LogView, base: u64, at: u64) -> Option<(u64, u64, u64)> {
    let (t, last) = log.last_at_or_before(at)?;
    let before = t
        .checked_sub(1)
        .and_then(|b| log.total_at(b))
        .unwrap_or(base);
    (last > before).then_some((t, before, last))
}

/// Settles an admission's cost (`docs/admission.md`, invariant 6): `charged` was charged at
/// `at`, the call cost `actual`.
///
/// - **More** (`actual > charged`): the excess `e` is charged at `max(now, last)` without a
///   check, as a forced admission: smooth `tat = max(tat, t) + e·T`; exact, a new log entry.
///   A window that can still decide and holds `at` holds that instant too, so the excess
///   counts wherever the call did (and, in some windows, where it did not: more, never
///   less).
/// - **Less**, and only if `held` (this step released the lease, so a settle gives back
///   once): exact, `d = charged - actual` (at most the block's own cost) is taken from
///   `block` (see [`settle_block`]) unless it is at or before the pruning cutoff (in no
///   window that can still decide); smooth, only while the admission is the latest
///   (`tail == reservation`, `last == at`): `tat = max(prev_tat, at) + actual·T` (a later
///   admission's `tat` cannot be unwound exactly, so the estimate stands).
///
/// Any change makes `tail` 0: the log's last entry may no longer be one admission's alone,
/// so nothing can be undone any more (a later give-back keeps its charge).
// PostgreSQL and Redis run the same decision on the server (`tessera_settle`, `settle.lua`).
#[allow(clippy::too_many_arguments)]
#[cfg(any(feature = "memory", feature = "sqlite", feature = "mysql"))]
pub fn settle(
    state: &mut RateState,
    config: &RateConfig,
    reservation: u64,
    at: StoreTime,
    charged: u32,
    actual: u32,
    held: bool,
    now: StoreTime,
    block: Option<(u64, u64, u64)>,
) -> LogChange {
    if actual > charged {
        let e = (actual - charged) as u64;
        let t = now.0.max(state.last);
        state.last = t;
        state.tail = 0;
        return match config.mode() {
            RateMode::Exact => {
                state.p = state.p.saturating_add(e);
                LogChange::Append { t, p: state.p }
            }
            RateMode::Smooth { .. } => {
                for (tat, interval) in state.tat.iter_mut().zip(emission_intervals(config)) {
                    *tat = (*tat).max(t).saturating_add(e.saturating_mul(interval));
                }
                LogChange::None
            }
        };
    }
    if actual == charged || !held {
        return LogChange::None;
    }
    match config.mode() {
        RateMode::Exact => {
            // A block at or before the pruning cutoff is in no window that can still
            // decide: nothing to give back (whether or not a step has pruned it yet).
            let Some((t, before, last)) = block.filter(|b| b.0 > prune_cutoff(config, now)) else {
                return LogChange::None;
            };
            let d = ((charged - actual) as u64).min(last - before);
            state.p -= d.min(state.p);
            state.tail = 0;
            LogChange::Lower { t, before, last, d }
        }
        RateMode::Smooth { .. } => {
            if reservation == 0 || state.tail != reservation || state.last != at.0 {
                return LogChange::None;
            }
            let intervals = emission_intervals(config);
            for ((tat, prev), interval) in state.tat.iter_mut().zip(&state.prev_tat).zip(intervals)
            {
                *tat = (*prev).max(at.0) + actual as u64 * interval;
            }
            state.tail = 0;
            LogChange::None
        }
    }
}

/// Reads of the log needed by a decision and a status.
pub trait LogView {
    /// The admit time of the first entry with running total `>= x`.
    fn first_at_least(&self, x: u64) -> Option<u64>;
    /// The running total of the last entry at or before `t` (`None`: no kept entry is).
    fn total_at(&self, t: u64) -> Option<u64>;
    /// The admit time and running total of the last entry at or before `t`.
    fn last_at_or_before(&self, t: u64) -> Option<(u64, u64)>;
}

/// A log in memory: entries `(t, P)` in order.
#[derive(Debug, Default, Clone)]
pub struct VecLog(pub VecDeque<(u64, u64)>);

// Only the memory store keeps the log in a `VecLog` between calls and prunes it there.
#[cfg(feature = "memory")]
impl VecLog {
    /// Drops entries at or before `cutoff`; returns the running total of the last dropped.
    pub fn prune(&mut self, cutoff: u64) -> Option<u64> {
        let mut dropped = None;
        while let Some(&(t, p)) = self.0.front() {
            if t > cutoff {
                break;
            }
            dropped = Some(p);
            self.0.pop_front();
        }
        dropped
    }
}

impl LogView for VecLog {
    fn first_at_least(&self, x: u64) -> Option<u64> {
        let i = self.0.partition_point(|&(_, p)| p < x);
        self.0.get(i).map(|&(t, _)| t)
    }
    fn total_at(&self, t: u64) -> Option<u64> {
        self.last_at_or_before(t).map(|(_, p)| p)
    }
    fn last_at_or_before(&self, t: u64) -> Option<(u64, u64)> {
        let i = self.0.partition_point(|&(at, _)| at <= t);
        i.checked_sub(1).map(|i| self.0[i])
    }
}

// Only the memory store applies a settle to a `VecLog`; the SQL stores run the same
// statements on their tables.
#[cfg(feature = "memory")]
impl VecLog {
    /// Applies what [`settle`] decided.
    pub fn apply(&mut self, change: LogChange) {
        match change {
            LogChange::None => {}
            LogChange::Append { t, p } => self.0.push_back((t, p)),
            LogChange::Lower { t, before, last, d } => {
                self.0.retain(|&(at, _)| at != t);
                for e in self.0.iter_mut().filter(|e| e.0 > t) {
                    e.1 -= d;
                }
                if last - d > before {
                    let i = self.0.partition_point(|&(at, _)| at < t);
                    self.0.insert(i, (t, last - d));
                }
            }
        }
    }
}

/// A snapshot of one limiter from its state and log.
pub fn status(
    name: &Name,
    state: &RateState,
    config: &RateConfig,
    log: &dyn LogView,
    now: StoreTime,
) -> Result<RateStatus> {
    // Read back from a store, so checked like a state an acquire loads (check_config).
    check_pacing(name, state, config)?;
    let found: Vec<Option<u64>> = thresholds(state, config, 1)
        .into_iter()
        .map(|x| x.and_then(|x| log.first_at_least(x)))
        .collect();
    let next_free = earliest(state, config, 1, now, &found)?;
    let intervals = emission_intervals(config);
    let mut limits = Vec::new();
    for (i, &limit) in config.limits().iter().enumerate() {
        let usage = match config.mode() {
            RateMode::Exact => {
                let at_now = log.total_at(now.0).unwrap_or(state.base);
                let before = log
                    .total_at(now.0.saturating_sub(config.window_us(&limit)))
                    .unwrap_or(state.base);
                let one = RateConfig::new(&[limit], RateMode::Exact)
                    .and_then(|c| c.with_margin(config.margin()))
                    .map_err(Error::from)?;
                let f: Vec<Option<u64>> = thresholds(state, &one, 1)
                    .into_iter()
                    .map(|x| x.and_then(|x| log.first_at_least(x)))
                    .collect();
                LimitUsage {
                    limit,
                    used: at_now.saturating_sub(before),
                    reserved: state.p.saturating_sub(at_now),
                    next_free: StoreTime(earliest(state, &one, 1, now, &f)?),
                }
            }
            RateMode::Smooth { .. } => {
                let tat = state.tat[i];
                let interval = intervals[i];
                LimitUsage {
                    limit,
                    used: tat.saturating_sub(now.0).div_ceil(interval),
                    reserved: 0,
                    next_free: StoreTime(
                        now.0
                            .max(tat.saturating_sub((config.max_cost() as u64 - 1) * interval)),
                    ),
                }
            }
        };
        limits.push(usage);
    }
    Ok(RateStatus {
        name: name.to_string(),
        mode: config.mode(),
        limits,
        margin: config.margin(),
        last_admit: StoreTime(state.last),
        next_free: StoreTime(next_free),
        now,
        expired_unused: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::spec::RateSpec;

    fn state(config: &RateConfig) -> RateState {
        RateState::new(config)
    }

    /// A state read back from a store is arbitrary: a running total at `u64::MAX` (found by
    /// the `redis_replies` fuzz target) is corrupt data, not an overflow panic.
    #[test]
    fn a_running_total_at_the_maximum_is_corrupt_not_a_panic() {
        let name = Name::new("n").unwrap();
        let config =
            RateConfig::new(&[RateSpec::per_second(31).unwrap()], RateMode::Exact).unwrap();
        let mut s = state(&config);
        s.p = u64::MAX;
        let err = status(&name, &s, &config, &VecLog::default(), StoreTime(5)).unwrap_err();
        assert!(err.is_corrupt(), "{err:?}");
    }

    /// A smooth limiter's status with fewer pacing values than limits (found by the
    /// `redis_replies` fuzz target; the SQLite store reads the same columns) is corrupt data,
    /// not an index panic.
    #[test]
    fn missing_pacing_values_are_corrupt_not_a_panic() {
        let name = Name::new("n").unwrap();
        let config = RateConfig::new(
            &[RateSpec::per_second(5).unwrap()],
            RateMode::Smooth { burst: 1 },
        )
        .unwrap();
        for (tat, prev_tat) in [
            (vec![], vec![]),
            (vec![1], vec![]),
            (vec![1, 2], vec![1, 2]),
        ] {
            let mut s = state(&config);
            s.tat = tat;
            s.prev_tat = prev_tat;
            let err = status(&name, &s, &config, &VecLog::default(), StoreTime(5)).unwrap_err();
            assert!(err.is_corrupt(), "{err:?}");
        }
    }
}
