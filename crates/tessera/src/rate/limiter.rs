//! The façade: [`RateLimiter`], its options and its answers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::store::Store;
use tessera_core::error::{InvalidInput, Result};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::seam::{LimitUsage, RateBackend, RateReply, RateRequest, RateStatus};
use tessera_core::rate::spec::{
    RateConfig, RateMode, RateSpec, DEFAULT_RATE_MARGIN, MAX_RATE_WAIT,
};
use tessera_core::seam::unsupported_rate;

/// Options of a [`RateLimiter`].
#[derive(Debug, Clone, Default)]
pub struct RateOptions {
    mode: RateMode,
    margin: Option<Duration>,
    /// The exact-mode margin when `margin` is not set (`None`: [`DEFAULT_RATE_MARGIN`]).
    default_margin: Option<Duration>,
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
    /// stretches the emission interval to `(L + m) / N`). 0 to [`MAX_RATE_MARGIN`](crate::MAX_RATE_MARGIN) and at
    /// most the shortest period, else [`RateLimiter::new`] fails with [`InvalidInput`]. Part
    /// of the stored configuration: every client of a limiter must declare the same margin.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = Some(margin);
        self
    }
    /// The exact-mode margin unless [`RateOptions::margin`] sets one: an admission's is
    /// [`DEFAULT_ADMISSION_MARGIN`](crate::DEFAULT_ADMISSION_MARGIN).
    pub(crate) fn default_margin(mut self, margin: Duration) -> Self {
        self.default_margin = Some(margin);
        self
    }
    /// Replace the limits (and margin) stored under this name if they differ (default:
    /// refuse with [`Error::RateMismatch`](crate::Error::RateMismatch)). History is kept: admissions already made still count
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
    backend: Arc<dyn tessera_core::seam::Backend>,
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

impl Store {
    /// A rate limiter with `limits` in exact mode (at most N in any window of L) and default
    /// options; see [`RateLimiter`].
    pub fn rate_limiter(&self, name: &str, limits: &[RateSpec]) -> Result<RateLimiter> {
        RateLimiter::new(self, name, limits, RateOptions::default())
    }
}

impl RateLimiter {
    /// A limiter named `name` with `limits`. Checks the inputs only (typed errors, nothing
    /// sent): the store compares the limits (and margin) at the first request. A store
    /// without rate limiting fails with [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn new(
        store: &Store,
        name: &str,
        limits: &[RateSpec],
        opts: RateOptions,
    ) -> Result<RateLimiter> {
        let name = Name::new(name)?;
        let config = RateConfig::new(limits, opts.mode)?;
        let margin = opts.margin.unwrap_or(if opts.mode.is_smooth() {
            Duration::ZERO
        } else {
            opts.default_margin
                .unwrap_or(DEFAULT_RATE_MARGIN)
                .min(config.limits()[0].period())
        });
        let config = config.with_margin(margin)?;
        if store.backend().rate().is_none() {
            return Err(unsupported_rate(store.url(), &**store.backend()));
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

    /// The options it was made with.
    pub(crate) fn options(&self) -> &RateOptions {
        &self.opts
    }

    /// Whether requests replace differing stored limits ([`RateOptions::update`]).
    pub(crate) fn updates(&self) -> bool {
        self.opts.update
    }

    pub(crate) fn check_cost(&self, cost: u32) -> Result<()> {
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
            RateReply::Admitted { at, .. } => {
                crate::telemetry::rate_decision(&self.name, true);
                Ok(RateDecision::Admitted { at })
            }
            RateReply::Limited { retry_at, now } => {
                crate::telemetry::rate_decision(&self.name, false);
                Ok(limited(retry_at, now))
            }
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
                        crate::telemetry::rate_decision(&self.name, false);
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
                    crate::telemetry::rate_decision(&self.name, true);
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
                    mode: self.config.mode(),
                    limits: self
                        .config
                        .limits()
                        .iter()
                        .map(|&limit| LimitUsage {
                            limit,
                            used: 0,
                            reserved: 0,
                            next_free: now,
                        })
                        .collect(),
                    margin: self.config.margin(),
                    last_admit: now,
                    next_free: now,
                    expired_unused: None,
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
            self.store.conn(),
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
