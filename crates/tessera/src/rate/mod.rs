//! The public rate limiter: several limits at once ("50 per second AND 1,000 per minute"),
//! checked and charged in one atomic step of the store, on the store's clock.
//!
//! # What a limit means
//!
//! A limit is a [`RateSpec`], "N per L". A [`RateLimiter`] holds one or more of them and a
//! [`RateMode`]:
//!
//! - **[`RateMode::Exact`]** (the default): the cost admitted in **any** window `(s - L, s]`
//!   of the store's clock is at most `N`, for every limit and every instant `s` — the
//!   guarantee an API provider enforces. With `50/s`: never 51 calls within one second, however
//!   the calls are spread or the windows are placed; with demand above the limit, 50 calls are
//!   admitted in every second (a request of cost 1 is admitted exactly when the 50th call
//!   before it leaves the window). State: one log of the admissions of the longest period,
//!   so at most `N` entries of that limit (plus reservations not yet due).
//! - **[`RateMode::Smooth`]** `{ burst: B }`: GCRA pacing, one number per limit. A limit
//!   `N/L` emits one unit of cost every `T = L/N` (rounded up to the microsecond), with a
//!   burst allowance of `B` units: after an idle period, `B` units pass at once, then one every
//!   `T`. In any window of length `L` at most `N + B - 1` units are admitted, and over any span
//!   `D` at most `D / T + B`. With `B = 1` (the default) that is again "at most `N` in any
//!   window of `L`", with admissions at least `T` apart: `50/s` admits one call every 20 ms.
//!   A request's cost must not exceed `B` (it would need `k` units at one instant).
//!
//! Numbers, for `RateLimiter` with `50/s` and `1000/min` and 200 callers each trying as
//! fast as they can: in exact mode the first 50 calls pass at once, then 50 per second (with
//! the default margin below, 50 every 1.02 s), until 1,000 have passed within the minute
//! (after about 20 s); from then on each call waits until the call 1,000 before it is a
//! minute (and 20 ms) old. In smooth mode with burst 1 one call passes every
//! 60 ms (the slower of 20 ms and 60 ms).
//!
//! # Answers and waits
//!
//! [`RateLimiter::try_acquire`] answers at once: [`RateDecision::Admitted`], or
//! [`RateDecision::Limited`] with the exact earliest store time at which the request would be
//! admitted if nobody else came first (its retry-after). Being limited is an answer, not an
//! error, and costs nothing: a refused request changes no state.
//!
//! [`RateLimiter::acquire`] **reserves**: in the same atomic step it computes the earliest
//! admissible time, charges every limit at that time, and returns it; the caller then sleeps
//! until it, and `acquire` returns the admission time: it always waits until admitted. Later
//! callers are placed after earlier reservations (FIFO), so no caller polls and no herd forms
//! at window edges. [`RateLimiter::acquire_until`] (and `acquire_within`) reserves only a time
//! before its deadline; beyond it, nothing is reserved and the answer is `Limited`.
//!
//! # The margin between admission and use
//!
//! What a downstream service counts is the moment each call is *made*, a few milliseconds
//! after its admission time: the reply's transit, the timer's slack, scheduling. Measured at
//! the moment of use, a 1 s window of `50/s` shared by 8 processes held 54–57 calls with the
//! windows enforced at exactly `L`. So each limiter has a margin `m`
//! ([`RateOptions::margin`]) and the store enforces every limit `N/L` on windows of `L + m`:
//! if admissions never exceed `N` in any window of `L + m`, calls made at most `m` after
//! their admission never exceed `N` in any window of `L`. The default is 20 ms in exact mode
//! (at most the shortest period), 0 in smooth mode, where the admissions are already `L/N`
//! apart (a margin there stretches the emission interval to `(L + m) / N`).
//!
//! The cost is throughput: with demand above the limit, a limit admits `N` per `L + m`,
//! i.e. `m / (L + m)` less. 20 ms on `50/s` costs 2% (49 per second); on `1000/min`
//! nothing measurable (0.03%); on a 100 ms window 17%, so set a smaller margin there (or
//! accept it, or 0 where calls follow admission closely). The margin is part of the stored
//! configuration: all clients of a limiter must enforce the same windows, so one declaring
//! another margin gets [`Error::RateMismatch`] like one declaring other limits. A caller
//! that makes its call later than `m` after admission (a stalled process) can still exceed
//! the limit at the moment of use; the store's own windows are never exceeded.
//!
//! # Implementation details
//!
//! Every admission is one entry `(t, P)` in one log per limiter, where `t` is the admit time
//! (now, or a reserved time in the future) and `P` the running total of admitted cost. Admit
//! times never decrease (a request is placed at or after the latest admission), so a cost in
//! `(t - L, t]` is a difference of two running totals, and for a limit `N/L` and a request of
//! cost `k` the binding entry is the first one whose `P >= P_last - N + k`: the request is
//! admissible from that entry's `t + L` on. One ordered lookup per limit (a sorted-set
//! `ZRANGEBYSCORE` on Redis, an index seek on SQLite), whatever `N`. Entries older than the
//! longest window are dropped; the state expires when the last admission is that old. Here
//! `L` is always the enforced window, the period plus the margin
//! ([`RateConfig::window_us`]).
//!
//! The decision itself is one pure function shared by the memory, SQLite and MySQL stores
//! (`rate/engine.rs`); the Redis script and the PostgreSQL function follow it line by line.

//!
//! # Layout
//!
//! `spec.rs` holds what a limit is (`RateSpec`, `RateMode`, `RateConfig`), `seam.rs` the
//! store seam (`RateBackend` and what crosses it; it imports no façade), `limiter.rs` the
//! façade users call, and `engine.rs` the decision shared by the memory and SQLite stores.

pub(crate) mod limiter;

pub use limiter::{RateDecision, RateLimiter, RateOptions};
pub use tessera_core::rate::seam::{LimitUsage, RateStatus};
pub use tessera_core::rate::spec::{
    RateMode, RateSpec, DEFAULT_ADMISSION_MARGIN, DEFAULT_RATE_MARGIN, MAX_LIMITS, MAX_RATE_COUNT,
    MAX_RATE_MARGIN, MAX_RATE_PERIOD, MAX_RATE_WAIT, MIN_RATE_PERIOD,
};
