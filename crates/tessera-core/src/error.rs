//! One error type for every store, with classifiers so callers never match on strings.
//!
//! "No permit free" and "limited" are *answers* (`Ok(None)`, `RateDecision::Limited`), not
//! errors. Errors are for impossible requests (caught before the store is touched) and faults.
//! No variant ever carries a password: store URLs are redacted before they are stored here.

use std::fmt;

use crate::limits::{MAX_CAPACITY, MAX_QUEUE_CAP};

/// Result alias used across tessera.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a request was refused before anything was sent to the store.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The semaphore or limiter name is empty, too long or uses a character outside the
    /// allowed set (`A-Z a-z 0-9 . _ - : / @`, first character alphanumeric).
    #[error("invalid name {name:?}: {reason}")]
    Name { name: String, reason: &'static str },
    /// Capacity must be between 1 and [`crate::limits::MAX_CAPACITY`].
    #[error("invalid capacity {0}: must be between 1 and {max}", max = MAX_CAPACITY)]
    Capacity(u32),
    /// Weight must be between 1 and the semaphore's capacity.
    #[error("invalid weight {weight}: must be between 1 and the capacity {capacity}")]
    Weight { weight: u32, capacity: u32 },
    /// Weight above what the store grants to one lease (`Capabilities::max_weight`; etcd:
    /// one transaction per grant, which compares every seat it takes).
    #[error("invalid weight {weight}: this store grants at most {max} permits to one lease")]
    WeightAboveStoreLimit { weight: u32, max: u32 },
    /// A lease TTL outside the supported range.
    #[error(
        "invalid lease TTL {}: must be between {} and {}",
        DurationText(*ttl),
        DurationText(*min),
        DurationText(*max)
    )]
    Ttl {
        ttl: std::time::Duration,
        min: std::time::Duration,
        max: std::time::Duration,
    },
    /// A lease TTL that is not a whole number of the store's steps (etcd: whole seconds).
    #[error(
        "invalid lease TTL {}: this store keeps TTLs in steps of {}",
        DurationText(*ttl),
        DurationText(*step)
    )]
    TtlStep {
        ttl: std::time::Duration,
        step: std::time::Duration,
    },
    /// The keep-alive interval must be shorter than half the TTL.
    #[error(
        "invalid keep-alive interval {}: must be between 1ms and half the TTL ({})",
        DurationText(*interval),
        DurationText(*ttl)
    )]
    KeepAlive {
        interval: std::time::Duration,
        ttl: std::time::Duration,
    },
    /// Queue cap must be between 1 and [`crate::limits::MAX_QUEUE_CAP`].
    #[error("invalid queue cap {0}: must be between 1 and {max}", max = MAX_QUEUE_CAP)]
    QueueCap(u64),
    /// The holder label is too long or contains control characters.
    #[error("invalid holder label: {0}")]
    Holder(&'static str),
    /// The store URL could not be understood. The URL itself is shown with any password
    /// replaced by `***`.
    #[error("invalid store URL {url}: {reason}")]
    StoreUrl { url: String, reason: String },
    /// A lease id that is not 32 hexadecimal digits.
    #[error("invalid lease id {0:?}: expected 32 hexadecimal digits")]
    LeaseId(String),
    /// A rate limit that could not be parsed or is out of range (see [`crate::rate::spec::RateSpec`]).
    #[error("invalid rate limit {spec:?}: {reason}")]
    Rate { spec: String, reason: String },
    /// A rate request's cost must be between 1 and the limiter's largest cost (the smallest
    /// limit's count; in smooth mode, the burst).
    #[error("invalid cost {cost}: must be between 1 and {max}")]
    Cost { cost: u32, max: u32 },
    /// A settled cost must be between 0 and [`crate::rate::spec::MAX_RATE_COUNT`].
    #[error("invalid settled cost {actual}: must be between 0 and {max}")]
    SettleCost { actual: u32, max: u32 },
    /// Any other malformed argument.
    #[error("{0}")]
    Other(String),
}

/// Everything that can go wrong in tessera.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request can never succeed; nothing was sent to the store.
    #[error(transparent)]
    InvalidInput(#[from] InvalidInput),
    /// The semaphore exists in the store with another capacity. Changing capacity is an
    /// explicit `tessera::Semaphore::resize`.
    #[error("semaphore {name:?} has capacity {stored} in the store, but this client declared {declared}; use resize to change it")]
    CapacityMismatch {
        name: String,
        stored: u32,
        declared: u32,
    },
    /// The wait queue of the semaphore is full (see `tessera::SemaphoreOptions::queue_cap`).
    #[error("the wait queue of {name:?} is full ({cap} waiters)")]
    QueueFull { name: String, cap: u32 },
    /// No semaphore or lease by that name or id.
    #[error("not found: {0}")]
    NotFound(String),
    /// `tessera::Store::connect_existing` found no store at the URL (a SQLite file that does
    /// not exist); nothing was created. The URL is redacted.
    #[error("no store at {url}: {reason}; nothing was created")]
    NoStore { url: String, reason: String },
    /// The store could not be reached or answered with an error.
    #[error("store error ({kind}): {message}")]
    Store {
        kind: StoreErrorKind,
        message: String,
    },
    /// Data in the store that tessera did not write (or a newer, incompatible version wrote).
    #[error("unexpected data in the store: {0}")]
    Corrupt(String),
    /// The lease was lost (expired, revoked or the store forgot it).
    #[error("lease lost: {0}")]
    Lost(LossReason),
    /// The rate limiter exists in the store with other limits or another mode. Changing them
    /// is explicit: `tessera::RateOptions::update`.
    #[error("rate limiter {name:?} has limits {stored} in the store, but this client declared {declared}; use update to change them")]
    RateMismatch {
        name: String,
        stored: String,
        declared: String,
    },
    /// The store does not offer this operation (e.g. rate limiting on a store without it).
    #[error("unsupported: {0}")]
    Unsupported(String),
}

/// Rough classes of store faults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// Could not connect, or the connection dropped.
    Connection,
    /// The store did not answer in time.
    Timeout,
    /// The store is busy (e.g. SQLite's write lock held past the busy timeout).
    Busy,
    /// The store refused the credentials (a wrong user or password, a missing permission).
    Auth,
    /// Anything else the store reported.
    Other,
}

impl fmt::Display for StoreErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StoreErrorKind::Connection => "connection",
            StoreErrorKind::Timeout => "timeout",
            StoreErrorKind::Busy => "busy",
            StoreErrorKind::Auth => "auth",
            StoreErrorKind::Other => "other",
        })
    }
}

/// Why a permit was lost; see `tessera::Permit::lost`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// The store says the lease no longer exists: it expired, was revoked by an admin, or the
    /// store lost its state.
    Gone,
    /// Renewals kept failing and the lease could expire soon; the holder must stop now.
    RenewalsFailing(String),
    /// This process did not run for the given time (it was stopped with SIGSTOP, suspended,
    /// or starved of CPU), so its lease was not renewed and may have expired.
    Stalled(std::time::Duration),
    /// `tessera::Store::close` released the lease.
    Closed,
}

impl LossReason {
    /// The reason's label in metrics (`tessera_losses_total`'s `reason`).
    pub fn label(&self) -> &'static str {
        match self {
            LossReason::Gone => "gone",
            LossReason::RenewalsFailing(_) => "renewals_failing",
            LossReason::Stalled(_) => "stalled",
            LossReason::Closed => "closed",
        }
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Gone => f.write_str(
                "the store no longer holds the lease (expired, revoked or store state lost)",
            ),
            LossReason::RenewalsFailing(e) => {
                write!(f, "renewals kept failing ({e}); the lease may expire")
            }
            LossReason::Stalled(d) => write!(
                f,
                "this process did not run for {:.1} s (stopped, suspended or starved of CPU), so the lease was not renewed and may have expired",
                d.as_secs_f64()
            ),
            LossReason::Closed => f.write_str("the store was closed (Store::close released the lease)"),
        }
    }
}

impl Error {
    #[allow(dead_code)]
    pub fn store(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        Error::Store {
            kind,
            message: message.into(),
        }
    }

    /// [`InvalidInput::StoreUrl`] for `url`, shown with its passwords replaced by `***`
    /// ([`redact_url`]): what every store's URL parser answers for a URL it refuses.
    pub fn bad_store_url(url: &str, reason: impl Into<String>) -> Self {
        InvalidInput::StoreUrl {
            url: redact_url(url),
            reason: reason.into(),
        }
        .into()
    }

    /// The request was refused before reaching the store.
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::InvalidInput(_))
    }
    /// The stored capacity differs from the declared one.
    pub fn is_capacity_mismatch(&self) -> bool {
        matches!(self, Error::CapacityMismatch { .. })
    }
    /// The wait queue is full.
    pub fn is_queue_full(&self) -> bool {
        matches!(self, Error::QueueFull { .. })
    }
    /// The store did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::Store {
                kind: StoreErrorKind::Timeout,
                ..
            }
        )
    }
    /// The connection to the store failed or dropped.
    pub fn is_connection(&self) -> bool {
        matches!(
            self,
            Error::Store {
                kind: StoreErrorKind::Connection,
                ..
            }
        )
    }
    /// The store refused the credentials of the URL ([`StoreErrorKind::Auth`]).
    pub fn is_auth(&self) -> bool {
        matches!(
            self,
            Error::Store {
                kind: StoreErrorKind::Auth,
                ..
            }
        )
    }
    /// A transient fault worth retrying (connection, timeout, busy).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Store {
                kind: StoreErrorKind::Connection | StoreErrorKind::Timeout | StoreErrorKind::Busy,
                ..
            }
        )
    }
    /// The store held data tessera cannot read.
    pub fn is_corrupt(&self) -> bool {
        matches!(self, Error::Corrupt(_))
    }
    /// The lease was lost.
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost(_))
    }
    /// The stored rate limits differ from the declared ones.
    pub fn is_rate_mismatch(&self) -> bool {
        matches!(self, Error::RateMismatch { .. })
    }
    /// No such semaphore or lease.
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::NotFound(_))
    }
    /// `tessera::Store::connect_existing` found no store to open.
    pub fn is_no_store(&self) -> bool {
        matches!(self, Error::NoStore { .. })
    }
}

/// A duration in the largest unit that shows it exactly, the way `--ttl` takes it: `100ms`,
/// `30s`, `5min`, `24h`. One unit style for every message that names a range.
struct DurationText(std::time::Duration);

impl fmt::Display for DurationText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        let ms = d.as_millis();
        if d.is_zero() {
            f.write_str("0s")
        } else if !d.subsec_nanos().is_multiple_of(1_000_000) {
            write!(f, "{d:?}")
        } else if ms.is_multiple_of(3_600_000) {
            write!(f, "{}h", ms / 3_600_000)
        } else if ms.is_multiple_of(60_000) {
            write!(f, "{}min", ms / 60_000)
        } else if ms.is_multiple_of(1_000) {
            write!(f, "{}s", ms / 1_000)
        } else {
            write!(f, "{ms}ms")
        }
    }
}

/// Below this length a password is masked only where it stands as a whole token: a short one
/// ("a", "pw") is also a piece of ordinary words, which masking every occurrence would garble.
#[cfg(any(feature = "redis", feature = "etcd", test))]
const SECRET_EVERYWHERE_LEN: usize = 8;

/// `message` with the password `secret` replaced by `***`: every occurrence of a password of 8
/// or more characters; for a shorter one, each occurrence that no letter or digit adjoins (as
/// in `u:a@host`, `password 'ab'`), so a one-letter password does not mask that letter in
/// every word.
#[cfg(any(feature = "redis", feature = "etcd", test))]
pub fn mask_secret(message: &str, secret: Option<&str>) -> String {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return message.to_string();
    };
    if secret.chars().count() >= SECRET_EVERYWHERE_LEN {
        return message.replace(secret, "***");
    }
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    let mut before: Option<char> = None;
    while let Some(at) = rest.find(secret) {
        let head = &rest[..at];
        let prev = head.chars().next_back().or(before);
        let tail = &rest[at + secret.len()..];
        let next = tail.chars().next();
        let token = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
        out.push_str(head);
        if token(prev) || token(next) {
            out.push_str(secret);
        } else {
            out.push_str("***");
        }
        before = secret.chars().next_back();
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The hint of a first connection that nothing accepted: every server store words it alike,
/// as `<store>: <cause> (<hint>)`, naming the URL (password masked).
#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql"
))]
pub fn refused_hint(redacted_url: &str) -> String {
    format!(
        "nothing accepts connections at {redacted_url}: is the server running, on this host and \
         port?"
    )
}

/// The hint of a first connection whose credentials the server refused ([`StoreErrorKind::Auth`]),
/// in the shape of [`refused_hint`].
#[cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "postgres",
    feature = "mysql"
))]
pub fn auth_hint(redacted_url: &str) -> String {
    format!("the server refused the credentials: check the user and password of {redacted_url}")
}

/// A first connection that nothing accepted, worded as every server store words it:
/// `<store>: <cause> (<refused_hint>)`.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub fn refused_connection(store: &str, cause: &dyn fmt::Display, redacted_url: &str) -> Error {
    Error::store(
        StoreErrorKind::Connection,
        format!("{store}: {cause} ({})", refused_hint(redacted_url)),
    )
}

/// A first connection's error with [`auth_hint`] added when the server refused the
/// credentials; any other error as it is.
#[cfg(any(feature = "redis", feature = "postgres"))]
pub fn with_auth_hint(e: Error, redacted_url: &str) -> Error {
    match e {
        Error::Store {
            kind: StoreErrorKind::Auth,
            message,
        } => Error::store(
            StoreErrorKind::Auth,
            format!("{message} ({})", auth_hint(redacted_url)),
        ),
        other => other,
    }
}

/// Whether `e` or one of its sources is an I/O error of a refused connection (nothing
/// listens on that host and port).
#[cfg(any(feature = "etcd", feature = "postgres", feature = "mysql"))]
pub fn is_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Replaces the passwords of a URL-like string with `***`, for messages and logs: the one
/// in the user info, and the value of every query option whose name ends in `password`
/// (e.g. Redis Sentinel's `sentinel_password`).
pub fn redact_url(raw: &str) -> String {
    let shown = match url::Url::parse(raw) {
        Ok(mut u) => {
            if u.password().is_some() {
                let _ = u.set_password(Some("***"));
            }
            u.to_string()
        }
        Err(_) => {
            // Not parseable: hide everything between "://" and the last '@', if any.
            match (raw.find("://"), raw.rfind('@')) {
                (Some(s), Some(at)) if at > s + 3 => {
                    format!("{}://***@{}", &raw[..s], &raw[at + 1..])
                }
                _ => raw.to_string(),
            }
        }
    };
    redact_query_passwords(&shown)
}

/// `url` with the value of each query option named `…password` (any case, percent-encoded
/// or not) replaced by `***`; the rest untouched.
fn redact_query_passwords(url: &str) -> String {
    let Some(q) = url.find('?') else {
        return url.to_string();
    };
    let (head, query) = url.split_at(q + 1);
    let (query, fragment) = match query.find('#') {
        Some(h) => query.split_at(h),
        None => (query, ""),
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if percent_decoded_lowercase(k).ends_with("password") => {
                format!("{k}=***")
            }
            _ => pair.to_string(),
        })
        .collect();
    format!("{head}{}{fragment}", pairs.join("&"))
}

/// A query option's name, percent-decoded (lossily) and lowercased, to be compared.
fn percent_decoded_lowercase(k: &str) -> String {
    url::form_urlencoded::parse(format!("{k}=").as_bytes())
        .next()
        .map(|(k, _)| k.to_lowercase())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_password_is_masked_where_it_stands_alone_and_a_long_one_everywhere() {
        let msg = "auth failed at redis://app:a@host:6379 (a wrong password)";
        assert_eq!(
            mask_secret(msg, Some("a")),
            "auth failed at redis://app:***@host:6379 (*** wrong password)"
        );
        assert_eq!(
            mask_secret("user 'pw' refused: pw", Some("pw")),
            "user '***' refused: ***"
        );
        // Inside a word a short password stays; a long one goes wherever it is.
        assert_eq!(mask_secret("pwned", Some("pw")), "pwned");
        assert_eq!(
            mask_secret("xhunter2-pass hunter2-pass", Some("hunter2-pass")),
            "x*** ***"
        );
        assert_eq!(mask_secret("no secret here", None), "no secret here");
        assert_eq!(mask_secret("aa", Some("a")), "aa");
        assert_eq!(mask_secret("a:a", Some("a")), "***:***");
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(redact_url("redis://u:hunter2@h:1/0"), "redis://u:***@h:1/0");
        assert!(!redact_url("bad://x:hunter2@@h").contains("hunter2"));
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        // Query options named …password, however written, in parseable URLs or not.
        assert_eq!(
            redact_url("redis+sentinel://h:1,h:2/m?sentinel_password=hunter2&prefix=p"),
            "redis+sentinel://h:1,h:2/m?sentinel_password=***&prefix=p"
        );
        assert_eq!(
            redact_url("redis://u:a@h/0?wait=1&Sentinel_%50assword=hunter2#x"),
            "redis://u:***@h/0?wait=1&Sentinel_%50assword=***#x"
        );
        assert!(!redact_url("bad://x:y@@h?sentinel_password=hunter2").contains("hunter2"));
        assert_eq!(
            redact_url("redis://h?password_hint=x"),
            "redis://h?password_hint=x"
        );
    }

    #[test]
    fn ttl_range_is_named_in_one_unit_style() {
        let err = InvalidInput::Ttl {
            ttl: std::time::Duration::from_secs(30 * 86_400),
            min: crate::limits::MIN_TTL,
            max: crate::limits::MAX_TTL,
        };
        assert_eq!(
            err.to_string(),
            "invalid lease TTL 720h: must be between 100ms and 24h"
        );
        let text = |d| DurationText(d).to_string();
        use std::time::Duration;
        assert_eq!(text(Duration::from_millis(10)), "10ms");
        assert_eq!(text(Duration::from_millis(1500)), "1500ms");
        assert_eq!(text(Duration::from_secs(90)), "90s");
        assert_eq!(text(Duration::from_secs(300)), "5min");
        assert_eq!(text(Duration::from_micros(1500)), "1.5ms");
    }
}
