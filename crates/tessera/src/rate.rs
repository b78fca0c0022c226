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
//! fast as they can: in exact mode the first 50 calls pass at once, then 50 per second, until
//! 1,000 have passed within the minute (after 20 s); from then on each call waits until the
//! call 1,000 before it is a minute old. In smooth mode with burst 1 one call passes every
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
//! until it. Later callers are placed after earlier reservations (FIFO), so no caller polls
//! and no herd forms at window edges. If the wait would exceed the maximum, nothing is
//! reserved and the answer is `Limited`.
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
//! longest period are dropped; the state expires when the last admission is that old.
//!
//! The decision itself is one pure function shared by the memory and SQLite stores
//! (`rate/engine.rs`); the Redis script follows it line by line.

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
/// Longest wait [`RateLimiter::acquire`] may reserve ahead (one day).
pub const MAX_RATE_WAIT: Duration = Duration::from_secs(24 * 3600);

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

/// The limits and mode of one limiter, in canonical form (limits sorted by period, then
/// count, without duplicates). Sent with every request; the store compares it with what it
/// holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateConfig {
    limits: Vec<RateSpec>,
    mode: RateMode,
}

impl RateConfig {
    /// Checks and canonicalizes.
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
        })
    }
    /// The limits, sorted by period then count.
    pub fn limits(&self) -> &[RateSpec] {
        &self.limits
    }
    /// The mode.
    pub fn mode(&self) -> RateMode {
        self.mode
    }
    /// The largest cost one request may have.
    pub fn max_cost(&self) -> u32 {
        match self.mode {
            RateMode::Exact => self.limits.iter().map(|l| l.count).min().unwrap_or(0),
            RateMode::Smooth { burst } => burst,
        }
    }
    /// The longest period (how long the history is kept).
    pub fn horizon_us(&self) -> u64 {
        self.limits
            .iter()
            .map(RateSpec::period_us)
            .max()
            .unwrap_or(0)
    }
    /// The canonical text stored with the state: `exact|50/s,1000/min` or
    /// `smooth:1|50/s,1000/min`.
    pub fn encode(&self) -> String {
        let mode = match self.mode {
            RateMode::Exact => "exact".to_string(),
            RateMode::Smooth { burst } => format!("smooth:{burst}"),
        };
        let limits: Vec<String> = self.limits.iter().map(|l| l.to_string()).collect();
        format!("{mode}|{}", limits.join(","))
    }
    /// Parses [`RateConfig::encode`]'s text; `None` if it is not one.
    pub fn decode(s: &str) -> Option<RateConfig> {
        let (mode, limits) = s.split_once('|')?;
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
        RateConfig::new(&limits, mode).ok()
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
}

// ---- the façade ----------------------------------------------------------------------------

/// Options of a [`RateLimiter`].
#[derive(Debug, Clone)]
pub struct RateOptions {
    mode: RateMode,
    max_wait: Duration,
    update: bool,
}

impl Default for RateOptions {
    fn default() -> Self {
        RateOptions {
            mode: RateMode::Exact,
            max_wait: Duration::from_secs(60),
            update: false,
        }
    }
}

impl RateOptions {
    /// [`RateMode::Exact`] (default) or [`RateMode::Smooth`].
    pub fn mode(mut self, mode: RateMode) -> Self {
        self.mode = mode;
        self
    }
    /// Longest wait [`RateLimiter::acquire`] reserves (default 60 s, at most
    /// [`MAX_RATE_WAIT`]).
    pub fn max_wait(mut self, d: Duration) -> Self {
        self.max_wait = d;
        self
    }
    /// Replace the limits stored under this name if they differ (default: refuse with
    /// [`Error::RateMismatch`]). History is kept: admissions already made still count
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
        /// The store time the request was admitted at (for `acquire`, the reserved time,
        /// which has passed when it returns).
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
/// let _ = sms.acquire(1).await?;   // reserves the earliest slot, sleeps until it
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

impl RateLimiter {
    /// A limiter named `name` with `limits`. Checks the inputs only (typed errors, nothing
    /// sent): the store compares the limits at the first request. A store without rate
    /// limiting fails with [`Error::Unsupported`].
    pub fn new(
        store: &Store,
        name: &str,
        limits: &[RateSpec],
        opts: RateOptions,
    ) -> Result<RateLimiter> {
        let name = Name::new(name)?;
        let config = RateConfig::new(limits, opts.mode)?;
        if opts.max_wait > MAX_RATE_WAIT {
            return Err(InvalidInput::Other(format!(
                "max wait {:?} is longer than {MAX_RATE_WAIT:?}",
                opts.max_wait
            ))
            .into());
        }
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

    /// The limits and mode.
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

    /// [`RateLimiter::acquire_within`] with the limiter's maximum wait (default 60 s).
    pub async fn acquire(&self, cost: u32) -> Result<RateDecision> {
        self.acquire_within(cost, self.opts.max_wait).await
    }

    /// Reserves the earliest admissible time, if it is at most `max_wait` away, and sleeps
    /// until it; or answers `Limited` (with the earliest time) and reserves nothing.
    ///
    /// **Fairness**: reservations are served in the order the store received them; a later
    /// caller's time is never before an earlier caller's. **Cancel safety**: dropping the
    /// future while it sleeps returns the reservation if it is still the latest one and not
    /// yet due (the store then behaves as if it was never made); otherwise the cost stays
    /// charged at the reserved time (later reservations were computed after it, so taking it
    /// back could not move them earlier anyway). Sleeping uses only the duration the store
    /// computed, never the client's wall clock.
    pub async fn acquire_within(&self, cost: u32, max_wait: Duration) -> Result<RateDecision> {
        self.check_cost(cost)?;
        let req = RateRequest {
            cost,
            max_wait: Some(max_wait.min(MAX_RATE_WAIT)),
            update: self.opts.update,
        };
        match self
            .rate()
            .rate_acquire(&self.name, &self.config, &req)
            .await?
        {
            RateReply::Limited { retry_at, now } => Ok(limited(retry_at, now)),
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
                    // The store read `now` before its reply left, so sleeping `at - now` from
                    // the reply's arrival wakes at or after `at` on the store's clock.
                    tokio::time::sleep(at.since(now)).await;
                    guard.armed = false;
                }
                Ok(RateDecision::Admitted { at })
            }
        }
    }

    /// Each limit's usage in its current window and the next free time, or a limiter with
    /// no state (never used, or idle past its longest period) as all zero.
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
                    last_admit: now,
                    next_free: now,
                    now,
                })
            }
        }
    }

    /// The store this limiter lives in.
    pub fn store(&self) -> &Store {
        &self.store
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
}
