//! What a limit is: `N` per `L` ([`RateSpec`]), how limits are enforced ([`RateMode`]), and
//! one limiter's canonical configuration ([`RateConfig`]), as the store keeps it.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::InvalidInput;

/// Largest `N` of a limit.
pub const MAX_RATE_COUNT: u32 = 1_000_000;
/// Longest period of a limit.
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(7 * 24 * 3600);
/// Shortest period of a limit.
pub const MIN_RATE_PERIOD: Duration = Duration::from_millis(1);
/// Most limits on one limiter.
pub const MAX_LIMITS: usize = 8;
/// Longest wait one reservation may reach ahead (one day); `RateLimiter::acquire` waits
/// longer by asking again.
pub const MAX_RATE_WAIT: Duration = Duration::from_secs(24 * 3600);
/// Longest margin between admission and use (`RateOptions::margin`).
pub const MAX_RATE_MARGIN: Duration = Duration::from_secs(1);
/// The margin of exact mode unless set (`RateOptions::margin`), at most the shortest period.
pub const DEFAULT_RATE_MARGIN: Duration = Duration::from_millis(20);
/// The margin of an admission's exact windows unless set (at most the shortest period): the
/// delay from admission to the call measured through `tessera serve` on a busy 2-core host
/// reached 51–81 ms at p99 and 85–168 ms at most (`docs/admission.md`); with 20 ms about as
/// many admissions went stale and were given back as were used, with 100 ms none, and both
/// windows were used whole.
pub const DEFAULT_ADMISSION_MARGIN: Duration = Duration::from_millis(100);

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
    pub fn period_us(&self) -> u64 {
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
        let count = count.trim();
        let count: u32 = count.parse().map_err(|_| {
            if !count.is_empty() && count.bytes().all(|b| b.is_ascii_digit()) {
                bad(&format!("the count must be between 1 and {MAX_RATE_COUNT}"))
            } else {
                bad("the count before '/' must be a whole number")
            }
        })?;
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

impl RateMode {
    /// The burst: how many admissions smooth pacing lets through at once (0 in exact mode,
    /// as the Redis scripts and the PostgreSQL functions take it).
    pub fn burst(self) -> u32 {
        match self {
            RateMode::Exact => 0,
            RateMode::Smooth { burst } => burst,
        }
    }

    /// Whether admissions are paced (smooth) rather than counted in windows (exact).
    pub fn is_smooth(self) -> bool {
        match self {
            RateMode::Exact => false,
            RateMode::Smooth { .. } => true,
        }
    }
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
    /// A tenant's own limiter under a window ceiling of `percent` (`docs/fair-shares.md`):
    /// each limit `N per L` becomes `max(1, floor(N × percent / 100)) per L`, a smooth burst
    /// `B` likewise, in the same mode with the same margin. `percent` is 1 to 100 (checked
    /// by [`crate::model::TenantLimits::with_window_ceiling`]; other values are clamped).
    pub fn scaled(&self, percent: u8) -> RateConfig {
        let pct = u64::from(percent.clamp(1, 100));
        let scale = |n: u32| ((u64::from(n) * pct / 100) as u32).max(1);
        let limits: Vec<RateSpec> = self
            .limits
            .iter()
            .map(|l| RateSpec {
                period: l.period,
                count: scale(l.count),
            })
            .collect();
        let mode = match self.mode {
            RateMode::Exact => RateMode::Exact,
            RateMode::Smooth { burst } => RateMode::Smooth {
                burst: scale(burst),
            },
        };
        let mut sorted = limits;
        sorted.sort();
        sorted.dedup();
        RateConfig {
            limits: sorted,
            mode,
            margin: self.margin,
        }
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
        // A count too large for any limit says so, not that it is no number.
        let e = "99999999999/s".parse::<RateSpec>().unwrap_err().to_string();
        assert!(e.contains("between 1 and"), "{e}");
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
}
