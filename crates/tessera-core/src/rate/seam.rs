//! The rate-limit seam: what a store implements ([`RateBackend`]) and what crosses it. Imports
//! no façade and no store.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::spec::{RateConfig, RateMode, RateSpec};
use crate::error::Result;
use crate::model::{Name, StoreTime};

/// What a client asks of the store in one rate step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRequest {
    /// The cost `k` (1 ..= [`RateConfig::max_cost`], checked by the client).
    pub cost: u32,
    /// `None`: admit now or answer limited (try). `Some(w)`: reserve the earliest admissible
    /// time if it is at most `w` from now.
    pub max_wait: Option<Duration>,
    /// Replace stored limits that differ from the declared ones instead of failing with
    /// [`Error::RateMismatch`](crate::error::Error::RateMismatch).
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
    /// Admissions of this limiter given back unused because they were past their use-by
    /// instant (`crate::Admitted::is_fresh`), counted by the store in the give-back's step
    /// since the limiter's state began: a limiter idle past its longest window forgets its
    /// state and starts again at 0. `None` where the store does not count them (a MySQL
    /// schema whose user may not add the column, `docs/admission.md`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_unused: Option<u64>,
}

/// The rate-limit seam: one atomic step per method, on the store's clock. A store offers it
/// through [`crate::seam::Backend::rate`]: the memory, SQLite and MySQL stores run the
/// decision of `rate/engine.rs` inside their own step, the Redis and PostgreSQL stores a
/// function on the server (Lua, PL/pgSQL) that follows it line by line.
#[async_trait]
pub trait RateBackend: Send + Sync + fmt::Debug {
    /// Prunes, checks the stored configuration (creating or, with `req.update`, replacing
    /// it), then admits, reserves or answers limited — all limits at once, all or nothing.
    /// Fails with [`Error::RateMismatch`](crate::error::Error::RateMismatch) if the stored limits differ and `update` is off.
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
