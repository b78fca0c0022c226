//! The data model shared by every store: names, lease ids, leases, waiters, status, and the
//! requests and replies that cross the store seam ([`crate::seam::Backend`]).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{InvalidInput, Result};
pub use crate::limits::*;

/// A validated semaphore, lock or limiter name: 1–128 bytes of `A-Z a-z 0-9 . _ - : / @`,
/// starting with a letter or digit. Names never contain braces, so they are safe inside a
/// Redis Cluster hash tag, and never whitespace, so they are safe in logs and shells.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Name(String);

impl Name {
    /// Validates a name.
    pub fn new(name: impl Into<String>) -> Result<Self, InvalidInput> {
        let name = name.into();
        let bad = |reason| InvalidInput::Name {
            name: name.chars().take(MAX_NAME_LEN + 8).collect(),
            reason,
        };
        if name.is_empty() {
            return Err(bad("empty"));
        }
        if name.len() > MAX_NAME_LEN {
            return Err(bad("longer than 128 bytes"));
        }
        if !name.as_bytes()[0].is_ascii_alphanumeric() {
            return Err(bad("must start with an ASCII letter or digit"));
        }
        if !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:/@".contains(&b))
        {
            return Err(bad("only A-Z a-z 0-9 . _ - : / @ are allowed"));
        }
        Ok(Name(name))
    }

    /// The name as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for Name {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        Name::new(s)
    }
}

/// The id of one lease (and of the wait that precedes it). Chosen by the client at random
/// before the first request, so a retried or cancelled request names the same lease.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(u128);

/// A map keyed by lease id, hashed by folding the id's 128 random bits instead of running
/// SipHash over them. Only for maps whose lease ids this process chose itself (at random):
/// ids pushed by someone else cost no more than any other unknown id.
pub type LeaseIdMap<V> =
    std::collections::HashMap<LeaseId, V, std::hash::BuildHasherDefault<LeaseIdHasher>>;

/// The hasher of [`LeaseIdMap`].
#[derive(Default)]
pub struct LeaseIdHasher(u64);

impl std::hash::Hasher for LeaseIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = ((v as u64) ^ ((v >> 64) as u64)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

impl LeaseId {
    /// A fresh random id.
    pub fn random() -> Self {
        LeaseId(rand::random::<u128>())
    }
    /// The raw value.
    pub fn as_u128(&self) -> u128 {
        self.0
    }
    /// From a raw value.
    pub fn from_u128(v: u128) -> Self {
        LeaseId(v)
    }
}

impl fmt::Display for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LeaseId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseId({self})")
    }
}

impl FromStr for LeaseId {
    type Err = InvalidInput;
    fn from_str(s: &str) -> Result<Self, InvalidInput> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(InvalidInput::LeaseId(s.chars().take(64).collect()));
        }
        u128::from_str_radix(s, 16)
            .map(LeaseId)
            .map_err(|_| InvalidInput::LeaseId(s.to_string()))
    }
}

impl Serialize for LeaseId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for LeaseId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A point in time on the **store's** clock, in microseconds since the Unix epoch. Only ever
/// compared with other store times; never with the client's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StoreTime(pub u64);

impl StoreTime {
    /// Microseconds since the Unix epoch.
    pub fn as_micros(&self) -> u64 {
        self.0
    }
    /// This time plus a duration (saturating).
    pub fn plus(self, d: Duration) -> StoreTime {
        StoreTime(
            self.0
                .saturating_add(d.as_micros().min(u64::MAX as u128) as u64),
        )
    }
    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn since(self, earlier: StoreTime) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
    /// The host's wall clock (used by the stores whose clock is the host's: memory, SQLite).
    pub fn host_now() -> StoreTime {
        let d = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        StoreTime(d.as_micros() as u64)
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = std::time::UNIX_EPOCH + Duration::from_micros(self.0);
        let secs = t
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        // ISO-8601 UTC with millisecond precision, without pulling in a date crate.
        let (days, rem) = (secs / 86_400, secs % 86_400);
        let (y, m, d) = civil_from_days(days as i64);
        write!(
            f,
            "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
            rem / 3600,
            (rem / 60) % 60,
            rem % 60,
            (self.0 / 1000) % 1000
        )
    }
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A granted lease as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The lease id.
    pub lease_id: LeaseId,
    /// Permits held.
    pub weight: u32,
    /// The seats (distinct, in `0..capacity` at grant time) this lease occupies, ascending.
    pub seats: Vec<u32>,
    /// Fence token: strictly increasing per semaphore, never reused.
    pub fence: u64,
    /// Holder label, e.g. `host/pid`.
    pub holder: String,
    /// When the store granted it.
    pub acquired_at: StoreTime,
    /// When it expires unless renewed.
    pub expires_at: StoreTime,
    /// The tenant the lease was granted to (`docs/fair-shares.md`); `None`: the request named
    /// none (the tenant `""`), or the store keeps no tenant on its holders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A lease handed to its holder, with the store's time at that moment, so the holder can tell
/// how long the lease certainly has left without comparing clocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The lease.
    pub lease: Lease,
    /// The store's time when it answered.
    pub now: StoreTime,
}

/// A queued acquire, as the store records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Waiter {
    /// The lease id the grant will carry.
    pub lease_id: LeaseId,
    /// Permits wanted.
    pub weight: u32,
    /// Holder label.
    pub holder: String,
    /// When it joined the queue.
    pub enqueued_at: StoreTime,
    /// When it leaves the queue unless its heartbeat renews it.
    pub expires_at: StoreTime,
    /// The tenant the waiter asks for (`docs/fair-shares.md`); `None`: it named none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A snapshot of one semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SemaphoreStatus {
    /// Name.
    pub name: String,
    /// Capacity.
    pub capacity: u32,
    /// Permits held by unexpired leases.
    pub used: u32,
    /// `capacity - used` (zero while over capacity after a shrinking resize).
    pub available: u32,
    /// The store's time of the snapshot.
    pub now: StoreTime,
    /// Holders, oldest grant first.
    pub holders: Vec<Lease>,
    /// Waiters in service order (head first).
    pub queue: Vec<Waiter>,
}

impl SemaphoreStatus {
    /// The snapshot of `name` with `used` of `capacity` permits held at `now`; `available`
    /// follows from them (zero while over capacity after a shrinking resize).
    pub fn new(
        name: &Name,
        capacity: u32,
        used: u32,
        now: StoreTime,
        holders: Vec<Lease>,
        queue: Vec<Waiter>,
    ) -> Self {
        SemaphoreStatus {
            name: name.to_string(),
            capacity,
            used,
            available: capacity.saturating_sub(used),
            now,
            holders,
            queue,
        }
    }

    /// Holders, waiters and permits per tenant, derived from [`Self::holders`] and
    /// [`Self::queue`]: the tenant `""` (requests that named none) first if present, then
    /// by name. Empty when nobody holds or waits.
    pub fn tenants(&self) -> Vec<TenantUsage> {
        self.tenants_with(&Default::default())
    }

    /// [`Self::tenants`] with each tenant's ceiling and floor from `limits` (as
    /// `Store::tenant_limits` gives them); a tenant with limits that neither holds nor waits
    /// is listed too.
    pub fn tenants_with(
        &self,
        limits: &std::collections::BTreeMap<String, TenantLimits>,
    ) -> Vec<TenantUsage> {
        let mut by: std::collections::BTreeMap<&str, TenantUsage> = Default::default();
        for (t, l) in limits {
            by.insert(
                t,
                TenantUsage {
                    tenant: t.clone(),
                    ceiling: l.ceiling,
                    floor: l.floor,
                    window_ceiling: l.window_ceiling,
                    ..TenantUsage::default()
                },
            );
        }
        let held = self.holders.iter().map(|l| (&l.tenant, true, l.weight));
        let queued = self.queue.iter().map(|w| (&w.tenant, false, w.weight));
        for (tenant, holding, weight) in held.chain(queued) {
            let t = tenant.as_deref().unwrap_or("");
            let u = by.entry(t).or_insert_with(|| TenantUsage {
                tenant: t.to_string(),
                ..TenantUsage::default()
            });
            if holding {
                u.holders += 1;
                u.used += weight;
            } else {
                u.waiters += 1;
                u.waiting += weight;
            }
        }
        by.into_values().collect()
    }
}

/// One tenant's part of a semaphore at a snapshot ([`SemaphoreStatus::tenants`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantUsage {
    /// The tenant; `""` for requests that named none.
    pub tenant: String,
    /// Leases it holds.
    pub holders: u32,
    /// Permits those leases hold.
    pub used: u32,
    /// Its queued requests.
    pub waiters: u32,
    /// Permits those requests ask for.
    pub waiting: u32,
    /// Its ceiling, if one is set (`Store::set_tenant_limits`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<u32>,
    /// Its floor (0: none).
    #[serde(default)]
    pub floor: u32,
    /// Its window ceiling, a percentage of each rate window, if one is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ceiling: Option<u8>,
}

/// What the client asks of the store when acquiring.
#[derive(Debug, Clone)]
pub struct AcquireRequest {
    /// Chosen by the client; retries reuse it.
    pub lease_id: LeaseId,
    /// Permits wanted (1..=capacity, checked by the client).
    pub weight: u32,
    /// Lease TTL.
    pub ttl: Duration,
    /// Holder label.
    pub holder: String,
    /// `None`: answer at once (try-acquire, never queues). `Some`: join the queue if needed.
    pub wait: Option<WaitSpec>,
    /// The tenant whose share this request counts against (`docs/fair-shares.md`); `None`:
    /// the tenant `""` with share 1, today's FIFO. Only a store whose
    /// [`crate::seam::Capabilities::fair_shares`] is true is sent one.
    pub tenant: Option<Tenant>,
    /// True only on the first send of a request whose lease id was made for it: nothing can
    /// hold that id yet, so a store may skip looking it up as a retry (`false`, the safe
    /// value, whenever the request may have reached the store before). A store whose
    /// connection may send a request again by itself ignores it.
    pub first_send: bool,
}

/// A tenant and its share (`docs/fair-shares.md`): under contention, permits and window
/// slots go to the waiting tenants in proportion to their shares.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant {
    name: String,
    share: u32,
}

/// The largest share a tenant may have.
pub const MAX_SHARE: u32 = 1_000;
/// The longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 64;

impl Tenant {
    /// A tenant named `name` (1 to [`MAX_TENANT_LEN`] bytes, no control characters) with
    /// `share` (1 to [`MAX_SHARE`]).
    pub fn new(name: &str, share: u32) -> Result<Tenant, InvalidInput> {
        if name.is_empty() || name.len() > MAX_TENANT_LEN || name.chars().any(char::is_control) {
            return Err(InvalidInput::Other(format!(
                "invalid tenant {name:?}: 1 to {MAX_TENANT_LEN} bytes, no control characters"
            )));
        }
        if share == 0 || share > MAX_SHARE {
            return Err(InvalidInput::Other(format!(
                "invalid share {share}: must be between 1 and {MAX_SHARE}"
            )));
        }
        Ok(Tenant {
            name: name.to_string(),
            share,
        })
    }
    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The share.
    pub fn share(&self) -> u32 {
        self.share
    }
}

/// One tenant's ceiling and floor on a semaphore (`docs/fair-shares.md`): it never holds
/// more than `ceiling` permits, and `floor` permits are kept for it (others are not granted
/// the permits it would need to reach its floor). Set by an administrator
/// (`Store::set_tenant_limits`), kept by the store for the name until changed or until the
/// semaphore is deleted, also while nobody holds or waits.
///
/// `window_ceiling` caps the tenant's admissions through the name's rate windows
/// (`docs/fair-shares.md`, "A ceiling on a share of the windows"): at most that percentage
/// of each window, whatever the other tenants leave unused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// At most this many permits held at once; `None`: no ceiling.
    pub ceiling: Option<u32>,
    /// Permits kept for this tenant while it holds fewer; 0: none.
    pub floor: u32,
    /// At most this percentage (1 to 100) of each rate window of the name's admissions;
    /// `None`: no window ceiling. See [`crate::rate::spec::RateConfig::scaled`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ceiling: Option<u8>,
}

impl TenantLimits {
    /// Limits with this ceiling and floor: a ceiling of 1 to [`MAX_CAPACITY`], a floor of at
    /// most the ceiling (and at most [`MAX_CAPACITY`]).
    pub fn new(ceiling: Option<u32>, floor: u32) -> Result<TenantLimits, InvalidInput> {
        let max = crate::limits::MAX_CAPACITY;
        if let Some(c) = ceiling {
            if c == 0 || c > max {
                return Err(InvalidInput::Other(format!(
                    "invalid ceiling {c}: must be between 1 and {max}"
                )));
            }
        }
        if floor > ceiling.unwrap_or(max) {
            return Err(InvalidInput::Other(format!(
                "invalid floor {floor}: at most the ceiling ({})",
                ceiling.unwrap_or(max)
            )));
        }
        Ok(TenantLimits {
            ceiling,
            floor,
            window_ceiling: None,
        })
    }

    /// The same limits with a ceiling on the tenant's share of each rate window, a
    /// percentage from 1 to 100 (`None`: none).
    pub fn with_window_ceiling(
        mut self,
        percent: Option<u8>,
    ) -> Result<TenantLimits, InvalidInput> {
        if let Some(p) = percent {
            if p == 0 || p > 100 {
                return Err(InvalidInput::Other(format!(
                    "invalid window ceiling {p}%: must be between 1% and 100%"
                )));
            }
        }
        self.window_ceiling = percent;
        Ok(self)
    }

    /// No ceiling, no floor and no window ceiling: the same as no limits (setting it removes
    /// them).
    pub fn is_none(&self) -> bool {
        self.ceiling.is_none() && self.floor == 0 && self.window_ceiling.is_none()
    }
}

/// How a queued acquire waits.
#[derive(Debug, Clone, Copy)]
pub struct WaitSpec {
    /// The queue entry expires unless renewed within this time (the waiter's heartbeat TTL).
    pub waiter_ttl: Duration,
    /// Largest queue length this client accepts joining.
    pub queue_cap: u32,
}

/// The store's answer to an acquire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireReply {
    /// Granted at once (or this lease id was already granted).
    Granted(Grant),
    /// Queued at this 0-based position.
    Queued { position: u64 },
    /// Try-acquire only: no permit free right now (or waiters are ahead), nothing changed.
    NoPermit { available: u32, queued: u64 },
}

/// The store's answer to a waiter's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WaitReply {
    /// The hand-off granted this waiter.
    Granted(Grant),
    /// Still waiting; the heartbeat was renewed.
    Waiting,
    /// Neither queued nor holding (the queue entry expired or was removed).
    Gone,
}

/// The store's answer to cancelling a wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReply {
    /// Removed from the queue.
    Dequeued,
    /// The grant had already happened; the lease was released.
    Released,
    /// Nothing by that id.
    NotFound,
}

/// The store's answer to a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewReply {
    /// Renewed until `expires_at`; `now` is the store's time when it renewed.
    Renewed {
        expires_at: StoreTime,
        now: StoreTime,
    },
    /// The lease is gone.
    Gone,
}

/// The default holder label: `hostname/pid`.
pub fn default_holder() -> String {
    let host = hostname();
    format!("{host}/{}", std::process::id())
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is valid for buf.len() bytes; gethostname NUL-terminates on success.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        if let Ok(s) = std::str::from_utf8(&buf[..end]) {
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    "localhost".to_string()
}

pub fn validate_holder(h: &str) -> Result<(), InvalidInput> {
    if h.len() > MAX_HOLDER_LEN {
        return Err(InvalidInput::Holder("longer than 256 bytes"));
    }
    if h.chars().any(char::is_control) {
        return Err(InvalidInput::Holder("contains control characters"));
    }
    Ok(())
}

pub fn validate_capacity(c: u32) -> Result<u32, InvalidInput> {
    if c == 0 || c > MAX_CAPACITY {
        return Err(InvalidInput::Capacity(c));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_validated() {
        for ok in [
            "a",
            "demo",
            "api:send",
            "jobs/record-42",
            "x.y_z@1",
            &"n".repeat(128),
        ] {
            assert!(Name::new(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            " a",
            "-a",
            "a b",
            "a{b}",
            "a\n",
            "ä",
            &"n".repeat(129),
            "a*",
        ] {
            assert!(Name::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lease_ids_round_trip() {
        let id = LeaseId::random();
        assert_eq!(id.to_string().parse::<LeaseId>().unwrap(), id);
        assert!("xyz".parse::<LeaseId>().is_err());
        assert!("0123456789abcdef0123456789abcdeg"
            .parse::<LeaseId>()
            .is_err());
    }

    #[test]
    fn store_time_displays_as_utc() {
        assert_eq!(StoreTime(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            StoreTime(1_700_000_000_123_000).to_string(),
            "2023-11-14T22:13:20.123Z"
        );
    }
}
