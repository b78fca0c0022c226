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
//! The decision itself is one pure function shared by the memory and SQLite stores
//! (`rate/engine.rs`); the Redis script follows it line by line.

// Only the stores call the engine; a build without any store has no use for it.
#[cfg(any(feature = "memory", feature = "sqlite", feature = "redis"))]
pub(crate) mod engine;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::error::{Error, InvalidInput, Result};
use crate::model::{Name, StoreTime};
use crate::store::Store;

/// Largest `N` of a limit.
pub const MAX_RATE_COUNT: u32 = 1_000_000;
/// Longest period of a limit.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);
/// Shortest period of a limit.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// Most limits on one limiter.
pub const MAX_LIMITS: usize = 8;
/// Longest wait one reservation may reach ahead (one day); [`RateLimiter::acquire`] waits
/// longer by asking again.
pub const MAX_RATE_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Longest margin between admission and use ([`RateOptions::margin`]).
pub const MAX_RATE_MARGIN: Duration = Duration::from_secs(1);
/// The margin of exact mode unless set ([`RateOptions::margin`]), at most the shortest period.
pub const DEFAULT_RATE_MARGIN: Duration = Duration::from_millis(20);

/// One limit: at most `count` per `period`. Parsed from `"50/s"`, `"1000/min"`, `"20000/h"`,
/// or with a multiple of a unit, `"10/500ms"`, `"60/3s"`, `"100/5min"`, `"7/2d"`.
///
/// Units: `ms`, `s`, `min`, `h`, `d` (also `sec`, `second`, `minute`, `hour`, `day`, and `us`
/// for periods that are not whole milliseconds, e.g. `3/1500us`). The count is 1 to
/// [`MAX_RATE_COUNT`]; the period 1 ms to 7 days. The text form ([`fmt::Display`]) uses the
/// largest unit that divides the period and parses back to the same limit. `m` is refused as ambiguous
/// (minute or millisecond?).
///
/// ```
/// use std::time::Duration;
/// use tessera::RateSpec;
/// let spec: RateSpec = "1000/min".parse()?;
/// assert_eq!((spec.count(), spec.period()), (1000, Duration::from_secs(60)));
/// assert_eq!("10/500ms".parse::<RateSpec>()?.to_string(), "10/500ms");
/// assert!("50/m".parse::<RateSpec>().is_err());
/// # Ok::<(), tessera::InvalidInput>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RateSpec {
    // Field order makes the derived order "by period, then count": the canonical order.
    period: Duration,
    count: u32,
}

impl RateSpec {
    /// At most `count` per `period`; checked like a parsed spec.
    pub fn new(count: u32, period: Duration) -> Result<Self, InvalidInput> {
        let spec = format!("{count}/{period:?}");
        if count == 0 || count > MAX_RATE_COUNT {
            return Err(InvalidInput::Rate {
                spec,
                reason: format!("the count must be between 1 and {MAX_RATE_COUNT}"),
            });
        }
        if period < MIN_RATE_PERIOD
            || period > MAX_RATE_PERIOD
            || !period.subsec_nanos().is_multiple_of(1_000)
        {
            return Err(InvalidInput::Rate {
                spec,
                reason: "the period must be between 1ms and 7d, in whole microseconds".into(),
            });
        }
        Ok(RateSpec { period, count })
    }
    /// `N` per second.
    pub fn per_second(count: u32) -> Result<Self, InvalidInput> {
        RateSpec::new(count, Duration::from_secs(1))
    }
    /// `N` per minute.
    pub fn per_minute(count: u32) -> Result<Self, InvalidInput> {
        RateSpec::new(count, Duration::from_secs(60))
    }
    /// `N` per hour.
    pub fn per_hour(count: u32) -> Result<Self, InvalidInput> {
        RateSpec::new(count, Duration::from_secs(3600))
    }
    /// `N`.
    pub fn count(&self) -> u32 {
        self.count
    }
    /// `L`.
    pub fn period(&self) -> Duration {
        self.period
    }
    pub(crate) fn period_us(&self) -> u64 {
        self.period.as_micros() as u64
    }
}

impl FromStr for RateSpec {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        let bad = |reason: &str| InvalidInput::Rate {
            spec: s.chars().take(64).collect(),
            reason: reason.to_string(),
        };
        let (count, per) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| bad("expected N/UNIT, e.g. 50/s, 1000/min, 10/500ms"))?;
        let count: u32 = count
            .trim()
            .parse()
            .map_err(|_| bad("the count before '/' must be a whole number"))?;
        let per = per.trim();
        let digits = per.bytes().take_while(u8::is_ascii_digit).count();
        let multiple: u64 = match digits {
            0 => 1,
            _ => per[..digits]
                .parse()
                .map_err(|_| bad("the multiple of the unit is too large"))?,
        };
        if multiple == 0 {
            return Err(bad("the period must not be zero"));
        }
        let unit_us: u64 = match &per[digits..] {
            "us" => 1,
            "ms" => 1_000,
            "s" | "sec" | "second" => 1_000_000,
            "min" | "minute" => 60_000_000,
            "h" | "hour" => 3_600_000_000,
            "d" | "day" => 86_400_000_000,
            "m" => return Err(bad("'m' is ambiguous: write min or ms")),
            _ => return Err(bad("unknown unit; expected ms, s, min, h or d")),
        };
        let period = multiple
            .checked_mul(unit_us)
            .ok_or_else(|| bad("the period is too long"))?;
        RateSpec::new(count, Duration::from_micros(period)).map_err(|e| match e {
            InvalidInput::Rate { reason, .. } => bad(&reason),
            other => other,
        })
    }
}

impl fmt::Display for RateSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.period_us();
        let (n, unit) = [
            (86_400_000_000, "d"),
            (3_600_000_000, "h"),
            (60_000_000, "min"),
            (1_000_000, "s"),
            (1_000, "ms"),
            (1, "us"),
        ]
        .into_iter()
        .find(|(u, _)| us.is_multiple_of(*u))
        .map(|(u, name)| (us / u, name))
        .unwrap_or((us, "us"));
        match n {
            1 => write!(f, "{}/{unit}", self.count),
            n => write!(f, "{}/{n}{unit}", self.count),
        }
    }
}

impl Serialize for RateSpec {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for RateSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// How a limiter enforces its limits (see the module docs for the exact guarantees).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub enum RateMode {
    /// At most `N` in any window of length `L` (a sliding log of admissions).
    #[default]
    Exact,
    /// GCRA pacing, one number per limit: one unit every `L/N`, after a burst of up to
    /// `burst` units. `1 <= burst <=` the smallest `N`; a request's cost must be `<= burst`.
    Smooth {
        /// Units admitted at once after an idle period.
        burst: u32,
    },
}

/// The limits, mode and margin of one limiter, in canonical form (limits sorted by period,
/// then count, without duplicates). Sent with every request; the store compares it with what
/// it holds, so every client of a limiter enforces the same windows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConfig {
    limits: Vec<RateSpec>,
    mode: RateMode,
    margin: Duration,
}

impl RateConfig {
    /// Checks and canonicalizes; the margin is 0 (see [`RateConfig::with_margin`]).
    pub fn new(limits: &[RateSpec], mode: RateMode) -> Result<Self, InvalidInput> {
        let mut sorted = limits.to_vec();
        sorted.sort();
        sorted.dedup();
        let other = |s: &str| InvalidInput::Other(s.to_string());
        if sorted.is_empty() {
            return Err(other("a rate limiter needs at least one limit"));
        }
        if sorted.len() > MAX_LIMITS {
            return Err(other("a rate limiter takes at most 8 limits"));
        }
        if let RateMode::Smooth { burst } = mode {
            let min_n = sorted.iter().map(|l| l.count).min().unwrap_or(1);
            if burst == 0 || burst > min_n {
                return Err(other(&format!(
                    "smooth burst {burst} must be between 1 and the smallest limit count {min_n}"
                )));
            }
        }
        Ok(RateConfig {
            limits: sorted,
            mode,
            margin: Duration::ZERO,
        })
    }
    /// The same limits with a margin `m` between admission and use: the store enforces each
    /// limit `N/L` on windows of `L + m` (see the module docs). `m` is 0 to
    /// [`MAX_RATE_MARGIN`], in whole microseconds, and at most the shortest period.
    pub fn with_margin(mut self, margin: Duration) -> Result<Self, InvalidInput> {
        let shortest = self.limits[0].period;
        if margin > MAX_RATE_MARGIN
            || margin > shortest
            || !margin.subsec_nanos().is_multiple_of(1_000)
        {
            return Err(InvalidInput::Other(format!(
                "rate margin {margin:?} must be between 0 and {MAX_RATE_MARGIN:?} in whole \
                 microseconds, and at most the shortest period ({shortest:?})"
            )));
        }
        self.margin = margin;
        Ok(self)
    }
    /// The limits, sorted by period then count.
    pub fn limits(&self) -> &[RateSpec] {
        &self.limits
    }
    /// The mode.
    pub fn mode(&self) -> RateMode {
        self.mode
    }
    /// The margin between admission and use.
    pub fn margin(&self) -> Duration {
        self.margin
    }
    /// The window the store enforces `limit` on, `L + m`, in µs: every admission, pruning,
    /// expiry and status computation uses it (and the Redis scripts receive it as the
    /// period), never `L` alone.
    pub fn window_us(&self, limit: &RateSpec) -> u64 {
        limit.period_us() + self.margin.as_micros() as u64
    }
    /// The largest cost one request may have.
    pub fn max_cost(&self) -> u32 {
        match self.mode {
            RateMode::Exact => self.limits.iter().map(|l| l.count).min().unwrap_or(0),
            RateMode::Smooth { burst } => burst,
        }
    }
    /// The longest enforced window (how long the history is kept).
    pub fn horizon_us(&self) -> u64 {
        self.limits
            .iter()
            .map(|l| self.window_us(l))
            .max()
            .unwrap_or(0)
    }
    /// The canonical text stored with the state: `exact|50/s,1000/min`,
    /// `smooth:1|50/s,1000/min`, and with a margin `exact+20ms|50/s,1000/min` (a margin of
    /// 0 is not written, so states stored before margins existed read as margin 0).
    pub fn encode(&self) -> String {
        let mut mode = match self.mode {
            RateMode::Exact => "exact".to_string(),
            RateMode::Smooth { burst } => format!("smooth:{burst}"),
        };
        if !self.margin.is_zero() {
            let us = self.margin.as_micros() as u64;
            mode.push_str(&match us {
                _ if us.is_multiple_of(1_000_000) => format!("+{}s", us / 1_000_000),
                _ if us.is_multiple_of(1_000) => format!("+{}ms", us / 1_000),
                _ => format!("+{us}us"),
            });
        }
        let limits: Vec<String> = self.limits.iter().map(|l| l.to_string()).collect();
        format!("{mode}|{}", limits.join(","))
    }
    /// Parses [`RateConfig::encode`]'s text; `None` if it is not one.
    pub fn decode(s: &str) -> Option<RateConfig> {
        let (mode, limits) = s.split_once('|')?;
        let (mode, margin) = match mode.split_once('+') {
            None => (mode, Duration::ZERO),
            Some((mode, m)) => {
                let digits = m.bytes().take_while(u8::is_ascii_digit).count();
                let n: u64 = m[..digits].parse().ok()?;
                let unit_us: u64 = match &m[digits..] {
                    "us" => 1,
                    "ms" => 1_000,
                    "s" => 1_000_000,
                    _ => return None,
                };
                (mode, Duration::from_micros(n.checked_mul(unit_us)?))
            }
        };
        let mode = match mode {
            "exact" => RateMode::Exact,
            m => RateMode::Smooth {
                burst: m.strip_prefix("smooth:")?.parse().ok()?,
            },
        };
        let limits: Vec<RateSpec> = limits
            .split(',')
            .map(|l| l.parse().ok())
            .collect::<Option<_>>()?;
        RateConfig::new(&limits, mode)
            .ok()?
            .with_margin(margin)
            .ok()
    }
}

impl fmt::Display for RateConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.encode())
    }
}

// ---- the store seam ------------------------------------------------------------------------

/// What a client asks of the store in one rate step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRequest {
    /// The cost `k` (1 ..= [`RateConfig::max_cost`], checked by the client).
    pub cost: u32,
    /// `None`: admit now or answer limited (try). `Some(w)`: reserve the earliest admissible
    /// time if it is at most `w` from now.
    pub max_wait: Option<Duration>,
    /// Replace stored limits that differ from the declared ones instead of failing with
    /// [`Error::RateMismatch`].
    pub update: bool,
}

/// The store's answer to a rate step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateReply {
    /// Charged at `at` (`== now`, or a reserved time after `now`). `reservation` names the
    /// admission for [`RateBackend::rate_cancel`].
    Admitted {
        at: StoreTime,
        now: StoreTime,
        reservation: u64,
    },
    /// Not admitted, nothing changed; `retry_at` is the earliest admissible time.
    Limited { retry_at: StoreTime, now: StoreTime },
}

/// Usage of one limit, in a [`RateStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitUsage {
    /// The limit.
    pub limit: RateSpec,
    /// Exact mode: the cost admitted in `(now - L, now]`. Smooth mode: the units still
    /// draining from the bucket (`ceil((TAT - now) / T)`).
    pub used: u64,
    /// Exact mode: the cost reserved after `now`. Smooth mode: 0.
    pub reserved: u64,
    /// The earliest time a request of cost 1 would pass this limit.
    pub next_free: StoreTime,
}

/// A snapshot of one limiter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateStatus {
    /// Name.
    pub name: String,
    /// Mode.
    pub mode: RateMode,
    /// Each limit's usage.
    pub limits: Vec<LimitUsage>,
    /// The margin between admission and use the limits are enforced with: each limit's
    /// window is its period plus this (`used` counts over that window).
    #[serde(default, rename = "margin_us", with = "duration_us")]
    pub margin: Duration,
    /// The latest admission (reserved times included).
    pub last_admit: StoreTime,
    /// The earliest time a request of cost 1 would be admitted (all limits, and after every
    /// reservation).
    pub next_free: StoreTime,
    /// The store's time of the snapshot.
    pub now: StoreTime,
}

/// The rate-limit seam: one atomic step per method, on the store's clock. A store offers it
/// through [`crate::backend::Backend::rate`]. PostgreSQL and MySQL stores implement the same three
/// steps in one short transaction each.
#[async_trait]
pub trait RateBackend: Send + Sync + fmt::Debug {
    /// Prunes, checks the stored configuration (creating or, with `req.update`, replacing
    /// it), then admits, reserves or answers limited — all limits at once, all or nothing.
    /// Fails with [`Error::RateMismatch`] if the stored limits differ and `update` is off.
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply>;

    /// Returns a reservation not yet due (`reservation` and `at` as admitted): only the latest
    /// admission of the limiter, only once, and only before its time; `true` if it was
    /// returned. Otherwise nothing changes.
    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool>;

    /// A snapshot, or `None` if the store holds no state for this limiter.
    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>>;

    /// Names of the limiters the store holds state for.
    async fn rate_list(&self) -> Result<Vec<String>>;

    /// Deletes the limiter's state (its limits, history and reservations); `true` if the
    /// store held state for it. Afterwards the limiter behaves as never used, and the next
    /// request may declare any limits. Deleting an unknown name changes nothing.
    async fn rate_delete(&self, name: &Name) -> Result<bool>;
}

/// `Duration` as whole microseconds in JSON (`margin_us`).
mod duration_us {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_micros() as u64)
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_micros)
    }
}

// ---- the façade ----------------------------------------------------------------------------

/// Options of a [`RateLimiter`].
#[derive(Debug, Clone, Default)]
pub struct RateOptions {
    mode: RateMode,
    margin: Option<Duration>,
    update: bool,
}

impl RateOptions {
    /// [`RateMode::Exact`] (default) or [`RateMode::Smooth`].
    pub fn mode(mut self, mode: RateMode) -> Self {
        self.mode = mode;
        self
    }
    /// The margin `m` between admission and use (see the module docs): each limit `N/L` is
    /// enforced on windows of `L + m`, so calls made at most `m` after their admission time
    /// never exceed `N` in any window of `L`. Default: [`DEFAULT_RATE_MARGIN`] (20 ms) in
    /// exact mode, or the shortest period if that is shorter; 0 in smooth mode (where it
    /// stretches the emission interval to `(L + m) / N`). 0 to [`MAX_RATE_MARGIN`] and at
    /// most the shortest period, else [`RateLimiter::new`] fails with [`InvalidInput`]. Part
    /// of the stored configuration: every client of a limiter must declare the same margin.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }
    /// Replace the limits (and margin) stored under this name if they differ (default:
    /// refuse with [`Error::RateMismatch`]). History is kept: admissions already made still count
    /// against the new limits (in exact mode; smooth pacing restarts).
    pub fn update(mut self, update: bool) -> Self {
        self.update = update;
        self
    }
}

/// The outcome of a rate request: an answer, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum RateDecision {
    /// Admitted; the cost is charged to every limit.
    Admitted {
        /// The store time the request was admitted at (for `acquire_until`, the reserved
        /// time, which has passed when it returns).
        at: StoreTime,
    },
    /// Not admitted, nothing charged.
    Limited {
        /// The earliest store time at which this request would be admitted, if nobody else
        /// came first.
        retry_at: StoreTime,
        /// `retry_at` minus the store's time of the answer.
        retry_after: Duration,
    },
}

impl RateDecision {
    /// Whether the request was admitted.
    pub fn is_admitted(&self) -> bool {
        matches!(self, RateDecision::Admitted { .. })
    }
    /// How long to wait before retrying (`None` when admitted).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            RateDecision::Limited { retry_after, .. } => Some(*retry_after),
            RateDecision::Admitted { .. } => None,
        }
    }
}

/// A distributed rate limiter: one or more limits, charged atomically in the store.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use tessera::{RateDecision, Store};
///
/// let store = Store::connect("memory://").await?;
/// let sms = store.rate_limiter("sms-api", &["50/s".parse()?, "1000/min".parse()?])?;
/// match sms.try_acquire(1).await? {
///     RateDecision::Admitted { .. } => { /* send */ }
///     RateDecision::Limited { retry_after, .. } => println!("retry in {retry_after:?}"),
/// }
/// sms.acquire(1).await?;   // reserves the earliest slot, sleeps until it: send now
/// # Ok::<(), tessera::Error>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct RateLimiter {
    store: Store,
    backend: Arc<dyn crate::store::Backend>,
    name: Name,
    config: RateConfig,
    opts: RateOptions,
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.name)
            .field("config", &self.config.encode())
            .finish_non_exhaustive()
    }
}

/// What one reservation attempt of `acquire`/`acquire_until` came to.
enum Attempt {
    Admitted(StoreTime),
    /// Not admissible within the deadline: nothing reserved.
    Limited(RateDecision),
}

impl RateLimiter {
    /// A limiter named `name` with `limits`. Checks the inputs only (typed errors, nothing
    /// sent): the store compares the limits (and margin) at the first request. A store
    /// without rate limiting fails with [`Error::Unsupported`].
    pub fn new(
        store: &Store,
        name: &str,
        limits: &[RateSpec],
        opts: RateOptions,
    ) -> Result<RateLimiter> {
        let name = Name::new(name)?;
        let config = RateConfig::new(limits, opts.mode)?;
        let margin = opts.margin.unwrap_or(match opts.mode {
            RateMode::Exact => DEFAULT_RATE_MARGIN.min(config.limits[0].period),
            RateMode::Smooth { .. } => Duration::ZERO,
        });
        let config = config.with_margin(margin)?;
        if store.backend().rate().is_none() {
            return Err(Error::Unsupported(format!(
                "rate limiting is not available on {}",
                store.url()
            )));
        }
        Ok(RateLimiter {
            store: store.clone(),
            backend: Arc::clone(store.backend()),
            name,
            config,
            opts,
        })
    }

    /// The name.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The limits, mode and margin.
    pub fn config(&self) -> &RateConfig {
        &self.config
    }

    fn rate(&self) -> &dyn RateBackend {
        self.backend.rate().expect("checked in RateLimiter::new")
    }

    fn check_cost(&self, cost: u32) -> Result<()> {
        let max = self.config.max_cost();
        if cost == 0 || cost > max {
            return Err(InvalidInput::Cost { cost, max }.into());
        }
        Ok(())
    }

    /// Admits a request of cost `cost` now, or answers limited with the earliest time it
    /// would be admitted. Never waits and never jumps ahead of reservations.
    ///
    /// On `Admitted` every limit is charged; on `Limited` and on error nothing is (an error
    /// after the request reached the store — a lost reply — may have charged it: retrying
    /// then charges twice, which only ever admits less, never more). A cost of 0 or above the
    /// smallest limit (smooth: above the burst) is [`InvalidInput::Cost`] at once.
    pub async fn try_acquire(&self, cost: u32) -> Result<RateDecision> {
        self.check_cost(cost)?;
        let req = RateRequest {
            cost,
            max_wait: None,
            update: self.opts.update,
        };
        match self
            .rate()
            .rate_acquire(&self.name, &self.config, &req)
            .await?
        {
            RateReply::Admitted { at, .. } => Ok(RateDecision::Admitted { at }),
            RateReply::Limited { retry_at, now } => Ok(limited(retry_at, now)),
        }
    }

    /// Waits until a request of cost `cost` is admitted, and returns its admission time (on
    /// the store's clock; it has passed when this returns, so the caller may make its call).
    ///
    /// It reserves the earliest admissible time and sleeps until it. If that time is further
    /// away than one reservation may reach ([`MAX_RATE_WAIT`], a day), nothing is reserved:
    /// it sleeps until the time is within reach and asks again, so it never answers
    /// "limited".
    ///
    /// **Fairness**: reservations are served in the order the store received them; a later
    /// caller's time is never before an earlier caller's (a wait beyond a day loses that
    /// order while it is not yet reserved). **Cancel safety**: dropping the future while it
    /// sleeps returns the reservation if it is still the latest one and not yet due (the
    /// store then behaves as if it was never made); otherwise the cost stays charged at the
    /// reserved time (later reservations were computed after it, so taking it back could not
    /// move them earlier anyway). Sleeping uses only the durations the store computed, never
    /// the client's wall clock.
    ///
    /// On `Ok` every limit is charged at the returned time. On error nothing is charged,
    /// except after a lost reply (as for [`RateLimiter::try_acquire`]). A cost of 0 or above
    /// [`RateConfig::max_cost`] is [`InvalidInput::Cost`] at once.
    pub async fn acquire(&self, cost: u32) -> Result<StoreTime> {
        self.check_cost(cost)?;
        match self.reserve(cost, None).await? {
            Attempt::Admitted(at) => Ok(at),
            Attempt::Limited(d) => unreachable!("acquire without a deadline answered {d:?}"),
        }
    }

    /// Reserves the earliest admissible time if it is before `deadline` and sleeps until it
    /// (`Admitted`); otherwise answers `Limited` with the earliest time, and reserves
    /// nothing. A deadline already passed makes it a [`RateLimiter::try_acquire`].
    ///
    /// Fairness, cancel safety and errors as for [`RateLimiter::acquire`]. On `Admitted`
    /// every limit is charged at `at`, which has passed; on `Limited` nothing is charged.
    /// The deadline is compared with the store's answer (the wait it computed, measured from
    /// the reply's arrival), not with the store's clock.
    pub async fn acquire_until(
        &self,
        cost: u32,
        deadline: tokio::time::Instant,
    ) -> Result<RateDecision> {
        self.check_cost(cost)?;
        Ok(self.reserve(cost, Some(deadline)).await?.into_decision())
    }

    /// [`RateLimiter::acquire_until`] with the deadline `max_wait` from now (a bounded wait;
    /// same fairness, cancel safety and post-conditions).
    pub async fn acquire_within(&self, cost: u32, max_wait: Duration) -> Result<RateDecision> {
        self.check_cost(cost)?;
        let deadline = tokio::time::Instant::now().checked_add(max_wait);
        // A deadline past what `Instant` holds is no deadline.
        Ok(self.reserve(cost, deadline).await?.into_decision())
    }

    /// Reserves (until `deadline`, or without one) and sleeps until the reserved time.
    async fn reserve(&self, cost: u32, deadline: Option<tokio::time::Instant>) -> Result<Attempt> {
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            let req = RateRequest {
                cost,
                max_wait: Some(left.unwrap_or(MAX_RATE_WAIT).min(MAX_RATE_WAIT)),
                update: self.opts.update,
            };
            match self
                .rate()
                .rate_acquire(&self.name, &self.config, &req)
                .await?
            {
                RateReply::Limited { retry_at, now } => {
                    let after = retry_at.since(now);
                    if left.is_some_and(|left| after > left) {
                        return Ok(Attempt::Limited(limited(retry_at, now)));
                    }
                    // Beyond one reservation's reach, but not beyond the deadline: wait
                    // until it is within reach, then ask again (others may have reserved
                    // meanwhile; the answer is then later, never earlier than allowed).
                    tokio::time::sleep(after.saturating_sub(MAX_RATE_WAIT)).await;
                }
                RateReply::Admitted {
                    at,
                    now,
                    reservation,
                } => {
                    if at > now {
                        let mut guard = Reserved {
                            store: self.store.clone(),
                            name: self.name.clone(),
                            reservation,
                            at,
                            armed: true,
                        };
                        // The store read `now` before its reply left, so sleeping `at - now`
                        // from the reply's arrival wakes at or after `at` on the store's
                        // clock.
                        tokio::time::sleep(at.since(now)).await;
                        guard.armed = false;
                    }
                    return Ok(Attempt::Admitted(at));
                }
            }
        }
    }

    /// Each limit's usage in its current window and the next free time, or a limiter with
    /// no state (never used, or idle past its longest window) as all zero.
    pub async fn status(&self) -> Result<RateStatus> {
        match self.rate().rate_status(&self.name).await? {
            Some(s) => Ok(s),
            None => {
                let now = StoreTime(0);
                Ok(RateStatus {
                    name: self.name.to_string(),
                    mode: self.config.mode,
                    limits: self
                        .config
                        .limits
                        .iter()
                        .map(|&limit| LimitUsage {
                            limit,
                            used: 0,
                            reserved: 0,
                            next_free: now,
                        })
                        .collect(),
                    margin: self.config.margin,
                    last_admit: now,
                    next_free: now,
                    now,
                })
            }
        }
    }

    /// Deletes the limiter's state in the store (admin): its limits, its history and every
    /// reservation, due or not; `true` if there was any. A full limit then admits again at
    /// once, and the next request may declare other limits. Callers sleeping on a
    /// reservation are not told; they wake at their reserved time as before (their cost no
    /// longer counts).
    pub async fn delete(&self) -> Result<bool> {
        self.rate().rate_delete(&self.name).await
    }

    /// The store this limiter lives in.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl Attempt {
    fn into_decision(self) -> RateDecision {
        match self {
            Attempt::Admitted(at) => RateDecision::Admitted { at },
            Attempt::Limited(d) => d,
        }
    }
}

fn limited(retry_at: StoreTime, now: StoreTime) -> RateDecision {
    RateDecision::Limited {
        retry_at,
        retry_after: retry_at.since(now),
    }
}

/// Owns a reservation while `acquire` sleeps; if the future is dropped first, asks the store
/// to return it.
struct Reserved {
    store: Store,
    name: Name,
    reservation: u64,
    at: StoreTime,
    armed: bool,
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        crate::cleanup::spawn(
            &self.store,
            crate::cleanup::Job::RateCancel {
                name: self.name.clone(),
                reservation: self.reservation,
                at: self.at,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_specs_parse_and_print_canonically() {
        for (text, count, us, shown) in [
            ("50/s", 50, 1_000_000, "50/s"),
            ("1000/min", 1000, 60_000_000, "1000/min"),
            ("20000/h", 20000, 3_600_000_000, "20000/h"),
            ("10/500ms", 10, 500_000, "10/500ms"),
            ("60/3s", 60, 3_000_000, "60/3s"),
            ("5/60s", 5, 60_000_000, "5/min"),
            (" 7 / 2d ", 7, 172_800_000_000, "7/2d"),
            ("3/second", 3, 1_000_000, "3/s"),
            ("1/1000ms", 1, 1_000_000, "1/s"),
            ("3/1500us", 3, 1_500, "3/1500us"),
        ] {
            let s: RateSpec = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!((s.count(), s.period_us()), (count, us), "{text}");
            assert_eq!(s.to_string(), shown);
            assert_eq!(shown.parse::<RateSpec>().unwrap(), s);
        }
        for bad in [
            "",
            "50",
            "/s",
            "50/",
            "0/s",
            "50/0s",
            "50/m",
            "50/x",
            "-5/s",
            "5.5/s",
            "50/1.5s",
            "50/8d",
            "2000000/s",
            "50/99999999999999999999s",
        ] {
            let e = bad.parse::<RateSpec>().unwrap_err();
            assert!(matches!(e, InvalidInput::Rate { .. }), "{bad}: {e:?}");
        }
    }

    #[test]
    fn configs_are_canonical_and_round_trip() {
        let a = RateConfig::new(
            &["1000/min".parse().unwrap(), "50/s".parse().unwrap()],
            RateMode::Exact,
        )
        .unwrap();
        let b = RateConfig::new(
            &[
                "50/s".parse().unwrap(),
                "1000/min".parse().unwrap(),
                "50/s".parse().unwrap(),
            ],
            RateMode::Exact,
        )
        .unwrap();
        assert_eq!(a, b);
        assert_eq!(a.encode(), "exact|50/s,1000/min");
        assert_eq!(RateConfig::decode(&a.encode()), Some(a.clone()));
        assert_eq!(a.max_cost(), 50);
        let s = RateConfig::new(a.limits(), RateMode::Smooth { burst: 5 }).unwrap();
        assert_eq!(s.encode(), "smooth:5|50/s,1000/min");
        assert_eq!(RateConfig::decode(&s.encode()), Some(s));
        assert!(RateConfig::decode("smooth:x|50/s").is_none());
        assert!(RateConfig::new(a.limits(), RateMode::Smooth { burst: 51 }).is_err());
    }

    #[test]
    fn margins_are_encoded_and_the_old_form_reads_as_margin_zero() {
        let limits = ["1000/min".parse().unwrap(), "50/s".parse().unwrap()];
        let plain = RateConfig::new(&limits, RateMode::Exact).unwrap();
        assert_eq!(plain.margin(), Duration::ZERO);
        assert_eq!(
            RateConfig::decode("exact|50/s,1000/min"),
            Some(plain.clone())
        );
        for (margin, text) in [
            (Duration::from_millis(20), "exact+20ms|50/s,1000/min"),
            (Duration::from_secs(1), "exact+1s|50/s,1000/min"),
            (Duration::from_micros(1500), "exact+1500us|50/s,1000/min"),
            (Duration::ZERO, "exact|50/s,1000/min"),
        ] {
            let c = plain.clone().with_margin(margin).unwrap();
            assert_eq!(c.encode(), text);
            assert_eq!(RateConfig::decode(text), Some(c.clone()));
            // Every window the store enforces is the period plus the margin.
            assert_eq!(
                c.limits()
                    .iter()
                    .map(|l| c.window_us(l))
                    .collect::<Vec<_>>(),
                vec![
                    1_000_000 + margin.as_micros() as u64,
                    60_000_000 + margin.as_micros() as u64
                ]
            );
            assert_eq!(c.horizon_us(), 60_000_000 + margin.as_micros() as u64);
        }
        let smooth = RateConfig::new(&limits, RateMode::Smooth { burst: 2 })
            .unwrap()
            .with_margin(Duration::from_millis(5))
            .unwrap();
        assert_eq!(smooth.encode(), "smooth:2+5ms|50/s,1000/min");
        assert_eq!(RateConfig::decode(&smooth.encode()), Some(smooth));
        // Out of range: above 1 s, above the shortest period, not whole µs.
        for bad in [Duration::from_millis(1001), Duration::from_nanos(1500)] {
            assert!(plain.clone().with_margin(bad).is_err(), "{bad:?}");
        }
        let short = RateConfig::new(&["5/10ms".parse().unwrap()], RateMode::Exact).unwrap();
        assert!(short
            .clone()
            .with_margin(Duration::from_millis(11))
            .is_err());
        for bad in [
            "exact+|50/s",
            "exact+20|50/s",
            "exact+2m|50/s",
            "exact+2s|50/s",
            "exact+20ms+1ms|50/s",
            "exact+99999999999999999999s|50/s",
        ] {
            assert!(RateConfig::decode(bad).is_none(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_default_margin_is_20ms_in_exact_mode_at_most_the_shortest_period() {
        let store = Store::connect("memory://").await.unwrap();
        let margin = |limits: &[&str], opts: RateOptions| {
            let limits: Vec<RateSpec> = limits.iter().map(|l| l.parse().unwrap()).collect();
            RateLimiter::new(&store, "m", &limits, opts)
                .unwrap()
                .config()
                .margin()
        };
        let ms = Duration::from_millis;
        assert_eq!(
            margin(&["50/s", "1000/min"], RateOptions::default()),
            ms(20)
        );
        assert_eq!(margin(&["5/10ms"], RateOptions::default()), ms(10));
        let smooth = RateOptions::default().mode(RateMode::Smooth { burst: 1 });
        assert_eq!(margin(&["50/s"], smooth.clone()), ms(0));
        assert_eq!(margin(&["50/s"], smooth.margin(ms(5))), ms(5));
        assert_eq!(
            margin(&["50/s"], RateOptions::default().margin(ms(0))),
            ms(0)
        );
        let e = RateLimiter::new(
            &store,
            "m",
            &["50/s".parse().unwrap()],
            RateOptions::default().margin(ms(1001)),
        )
        .unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }
}
