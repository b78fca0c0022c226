//! Entry points for the fuzz targets in `fuzz/` (cargo feature `fuzzing`; not part of the
//! public API and not semver-covered).
//!
//! Each function here runs the code a store runs on text or replies it did not write: the URL
//! parsing `Store::connect` does before it touches the network or the disk, and the decoding
//! of replies and rows read back from a store. They are thin wrappers, so a fuzz target
//! exercises the very functions the stores call, and a finding reproduces as a unit test in
//! the store's own module.

use tessera_core::error::Result;
#[cfg(feature = "redis")]
use tessera_core::model::*;
#[cfg(feature = "redis")]
use tessera_core::rate::seam::RateStatus;
#[cfg(feature = "redis")]
use tessera_core::seam::{RateConfig, RateReply};

/// What `Store::connect` and `Store::connect_existing` read from a store URL before they
/// open anything.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory://[NAME]`.
    Memory {
        /// The instance name (empty: the process-wide instance).
        instance: String,
    },
    /// `sqlite:///absolute/path.db`.
    Sqlite {
        /// The database file.
        path: std::path::PathBuf,
    },
    /// `redis://` or `rediss://`.
    Redis {
        /// The URL for messages, password replaced.
        redacted: String,
        /// The key prefix.
        prefix: String,
        /// `eviction=refuse`.
        refuse_eviction: bool,
        /// `rediss://`.
        tls: bool,
        /// redis-rs's `Debug` of the connection it would open (it hides the password).
        connection: String,
    },
}

/// Parses `url` as `Store::connect` does up to its first I/O: the scheme check, then the
/// store's own URL parser (and, for Redis, redis-rs's). Opens no connection and creates no
/// file; the SQLite parser only asks whether the path names an existing folder.
pub fn store_url(url: &str) -> Result<StoreUrl> {
    let scheme = crate::stores::scheme_of(url)?;
    match scheme {
        #[cfg(feature = "memory")]
        "memory" => Ok(StoreUrl::Memory {
            instance: crate::stores::memory::parse_url(url)?.to_string(),
        }),
        #[cfg(feature = "sqlite")]
        "sqlite" => Ok(StoreUrl::Sqlite {
            path: crate::stores::sqlite::url::parse_url(url)?,
        }),
        #[cfg(feature = "redis")]
        "redis" | "rediss" => {
            let (config, _secret, client) = crate::stores::redis::open_client(url)?;
            Ok(StoreUrl::Redis {
                redacted: config.redacted,
                prefix: config.prefix,
                refuse_eviction: config.eviction
                    == crate::stores::redis::url::EvictionPolicy::Refuse,
                tls: config.tls,
                connection: format!("{:?}", client.get_connection_info()),
            })
        }
        _ => unreachable!("scheme {scheme:?} passed the check but has no store"),
    }
}

/// The Redis reply type the parsers below take.
#[cfg(feature = "redis")]
pub use redis::Value as RedisValue;

/// The Redis store's reply parsers, one per script, and its record decoders.
#[cfg(feature = "redis")]
pub mod redis_replies {
    use super::*;
    use crate::stores::redis::{ops, rate};

    /// `acquire.lua`.
    pub fn acquire(
        v: RedisValue,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        ops::parse_acquire(v, name, capacity, req)
    }
    /// `heartbeat.lua`.
    pub fn heartbeat(v: RedisValue, lease: LeaseId) -> Result<WaitReply> {
        ops::parse_heartbeat(v, lease)
    }
    /// `cancel.lua`.
    pub fn cancel(v: RedisValue) -> Result<CancelReply> {
        ops::parse_cancel(v)
    }
    /// `release.lua`, `revoke.lua`, `delete.lua`.
    pub fn boolean(v: RedisValue) -> Result<bool> {
        ops::parse_bool(v, "release")
    }
    /// `renew.lua`.
    pub fn renew(v: RedisValue) -> Result<RenewReply> {
        ops::parse_renew(v)
    }
    /// `status.lua`.
    pub fn status(v: RedisValue, name: &Name) -> Result<Option<SemaphoreStatus>> {
        ops::parse_status(v, name)
    }
    /// `resize.lua`.
    pub fn resize(v: RedisValue, name: &Name) -> Result<u32> {
        ops::parse_resize(v, name)
    }
    /// A wake-up payload published to a client's channel.
    pub fn wake(payload: &str) -> Option<(LeaseId, Option<Grant>)> {
        ops::parse_wake(payload)
    }
    /// A lease record of the `leases` hash.
    pub fn lease_record(id: LeaseId, record: &str) -> Result<Lease> {
        ops::decode_lease(id, record)
    }
    /// A waiter record of the `waiters` hash.
    pub fn waiter_record(id: LeaseId, record: &str) -> Result<Waiter> {
        ops::decode_waiter(id, record)
    }
    /// `rate_acquire.lua`.
    pub fn rate_acquire(v: RedisValue, name: &Name, config: &RateConfig) -> Result<RateReply> {
        rate::parse_acquire(v, name, config)
    }
    /// `rate_status.lua`, with the snapshot the shared rate engine computes from it.
    pub fn rate_status(v: RedisValue, name: &Name) -> Result<Option<RateStatus>> {
        rate::parse_status(v, name)
    }
}

/// The SQLite store's decoders of column text.
#[cfg(feature = "sqlite")]
pub mod sqlite_rows {
    use super::*;
    use crate::stores::sqlite::{ops, rate};

    /// A holder's `seats` column (`"0-3,7"`) for its `weight`.
    pub fn decode_seats(text: &str, weight: u32) -> Result<Vec<u32>> {
        ops::decode_seats(text, weight)
    }
    /// The `seats` column text of ascending seats.
    pub fn encode_seats(seats: &[u32]) -> String {
        ops::encode_seats(seats)
    }
    /// A rate limiter's `tat` or `prev_tat` column.
    pub fn decode_tat(text: &str) -> Result<Vec<u64>> {
        rate::decode_tat(text)
    }
}
