//! # tessera — distributed semaphores, locks and rate limits
//!
//! `tokio::sync::Semaphore` carried over the network: a fixed number of permits shared by
//! processes on many hosts, with leases that outlive a crashed holder only by their TTL,
//! fence tokens and seats for the protected resource, a fair weighted FIFO queue served by the
//! store, and a [`Permit::lost`] notice that fires before a lease could expire. Rate limits
//! ("50 per second AND 1,000 per minute") on the same stores.
//!
//! | you want | use |
//! |---|---|
//! | at most `C` jobs at once, and which of the `C` slots is yours | [`Semaphore`] → [`Permit`] |
//! | one holder at a time | [`Lock`] |
//! | at most `N` calls in any window of `L`, several limits at once | [`RateLimiter`] |
//! | both in one atomic step: `C` in flight and `N` per window, queued in order | [`Admission`] → [`Admitted`] |
//! | holders, queue, capacity; resize, revoke, delete | [`Store`] |
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! use tessera::{Semaphore, SemaphoreOptions, Store};
//!
//! let store = Store::connect("memory://").await?;
//! let gpus = Semaphore::new(&store, "gpus", 8, SemaphoreOptions::default().ttl(Duration::from_secs(10)))?;
//! let permit = gpus.acquire_many(2).await?;           // waits in FIFO order
//! let seats = permit.seats();                          // e.g. [0, 1]: which GPUs are ours
//! assert_eq!(seats.len(), 2);
//! tokio::select! {
//!     _ = tokio::time::sleep(Duration::from_millis(10)) => {}   // the work
//!     reason = permit.lost() => panic!("lost the GPUs: {reason}"),
//! }
//! permit.release().await?;
//! store.close().await?;                                // at the end of the program
//! # Ok::<(), tessera::Error>(()) }).unwrap();
//! ```
//!
//! ## Stores
//!
//! One URL chooses the store ([`Store::connect`]); the same code runs on each. Each store is a
//! cargo feature of this crate:
//!
//! | store | URL | feature |
//! |---|---|---|
//! | in-process, the reference model | `memory://` or `memory://NAME` | `memory` (default) |
//! | SQLite, the embedded store: many processes on one host | `sqlite:///absolute/path/file.db` | `sqlite` (default) |
//! | Redis, the distributed store | `redis://[user[:password]@]host[:port][/db][?prefix=P]`, `rediss://…` (TLS) | `redis` |
//! | PostgreSQL, for teams without Redis | `postgres://[user[:password]@]host[:port][/database][?schema=S]`, `postgresql://…` | `postgres` |
//! | MySQL / MariaDB, for teams without Redis | `mysql://[user[:password]@]host[:port]/database[?ssl-mode=…&ssl-ca=…]`, `mariadb://…` | `mysql` |
//! | etcd, consensus-backed (whole-second leases of at least 2 s; building needs `protoc`) | `etcd://[user:password@]host:port[,host:port…][/prefix]`, `etcds://…` (TLS) | `etcd` |
//!
//! A URL whose store this build lacks is refused with a message naming the feature.
//!
//! ## The end of a program
//!
//! A [`Permit`] is released when dropped, in the background. Call [`Store::close`] before a
//! program ends: it releases what is still held and waits for those background clean-ups. A
//! process that exits normally without it still waits up to [`EXIT_GRACE`] for them, so a
//! permit dropped as `main` returns is released; only a process killed outright leaves its
//! leases to expire by their TTL.
//!
//! ## Metrics and traces
//!
//! tessera reports through the [`metrics`](https://docs.rs/metrics) facade, so any exporter
//! the program installs receives them (without one they cost next to nothing):
//! `tessera_grants_total`, `tessera_acquire_wait_seconds`, `tessera_acquire_outcomes_total`
//! (`granted`, `no_permit`, `timed_out`, `error`), `tessera_waits_total`,
//! `tessera_queue_length`, `tessera_renewals_total` (`ok`, `gone`, `error`),
//! `tessera_losses_total` (by reason), `tessera_store_call_seconds` and
//! `tessera_store_errors_total` (by store operation), `tessera_rate_decisions_total`
//! (`admitted`, `limited`), `tessera_admissions_expired_total` (admissions given back past
//! their use-by instant); semaphore and limiter names are the `name` label. Every call to a
//! store opened with [`Store::connect`] runs in a `debug` [`tracing`](https://docs.rs/tracing)
//! span `store_call` with the fields `op` and `name`.
//!
//! ## Store authors
//!
//! The seam every store implements, and the types that cross it, are in [`backend`]. See
//! `docs/contract.md` in the repository for the guarantees every store keeps, and the
//! `examples/` folder for whole programs.

// How the library is layered, bottom first (`tests/layers.rs` enforces it inside each crate:
// no file names a file above it, and no code path goes through the crate root):
//
// - the core, the crate `tessera-core`, which depends on no store and no façade, so the
//   compiler keeps it below them: `limits`, `error`, `model`, `clock`, `wake`, the rate spec
//   and seam, the admission seam, the store seam (`seam`), the rate engine, and the shared
//   store parts (`stores::batch`, `expiries`, `url`, and the SQL step `stores::sql`);
// - the stores, one folder each under `stores/`, which import the core and their own folder
//   only; then `stores/mod.rs`, which picks a store by URL scheme;
// - the façade: `telemetry` (wraps a backend), `conn` (the connection engine: one opened
//   backend, its URL, the leases held through it), `cleanup` (background releases and
//   cancels), `lease/` (the permit and its keeper), `store` (the `Store` handle users
//   connect with), then the handles built on it, each adding its constructor to `Store` in
//   an `impl Store` block of its own file: `semaphore/`, `rate/limiter.rs`, `lock`, and
//   `admission/`.

mod admission;
mod arrivals;
mod cleanup;
mod conn;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
mod lease;
mod lock;
mod rate;
mod semaphore;
mod store;
mod stores;
mod telemetry;

pub use admission::{Admission, AdmissionBuilder, Admitted};
pub use cleanup::EXIT_GRACE;
pub use lease::permit::{Permit, RELEASE_RETRY};
pub use lock::Lock;
pub use rate::{
    LimitUsage, RateDecision, RateLimiter, RateMode, RateOptions, RateSpec, RateStatus,
    DEFAULT_ADMISSION_MARGIN, DEFAULT_RATE_MARGIN, MAX_LIMITS, MAX_RATE_COUNT, MAX_RATE_MARGIN,
    MAX_RATE_PERIOD, MAX_RATE_WAIT, MIN_RATE_PERIOD,
};
pub use semaphore::place::{windows_floor, PACE_WINDOW, READ_EVERY};
pub use semaphore::{QueuePace, QueuePlace, Semaphore, SemaphoreOptions};
pub use store::Store;
pub use tessera_core::error::{Error, InvalidInput, LossReason, Result, StoreErrorKind};
pub use tessera_core::limits::{
    MAX_CAPACITY, MAX_HOLDER_LEN, MAX_NAME_LEN, MAX_QUEUE_CAP, MAX_TTL, MIN_TTL,
};
pub use tessera_core::model::{
    Lease, LeaseId, SemaphoreStatus, StoreTime, Tenant, TenantLimits, TenantUsage, Waiter,
    MAX_SHARE, MAX_TENANT_LEN,
};

pub mod backend {
    //! For store authors and test tools: the store seam and what crosses it. A program that
    //! uses semaphores, locks and rate limiters needs nothing from here.
    //!
    //! A store implements [`Backend`] (and, for rate limits, [`RateBackend`]): a handful of
    //! operations, each one atomic step on the store's clock, whose shape and invariants are
    //! documented on [`Backend`]. Waiting, keep-alive, cancellation and loss detection live
    //! once above the seam. [`Store::from_backend`](crate::Store::from_backend) wraps a
    //! backend, e.g. one that injects faults around a real store.

    pub use tessera_core::clock::{Clock, ManualClock, SystemClock};
    pub use tessera_core::error::redact_url;
    pub use tessera_core::model::{
        default_holder, AcquireReply, AcquireRequest, CancelReply, Grant, Name, RenewReply,
        WaitReply, WaitSpec,
    };
    pub use tessera_core::seam::{
        AdmissionBackend, AdmitReply, AdmitRequest, Backend, Capabilities, FenceSource, GiveBack,
        HandOff, RateBackend, RateConfig, RateReply, RateRequest, Settlement, Waking, PING_NAME,
    };
    pub use tessera_core::wake::{notify, notify_grant};

    /// The stores of this build, for tests that drive a backend directly.
    pub mod stores {
        #[cfg(feature = "etcd")]
        pub use crate::stores::etcd::EtcdBackend;
        #[cfg(feature = "memory")]
        pub use crate::stores::memory::MemoryBackend;
        #[cfg(feature = "mysql")]
        pub use crate::stores::mysql::MysqlBackend;
        #[cfg(feature = "postgres")]
        pub use crate::stores::postgres::PostgresBackend;
        #[cfg(feature = "redis")]
        pub use crate::stores::redis::RedisBackend;
        #[cfg(feature = "sqlite")]
        pub use crate::stores::sqlite::SqliteBackend;
    }
}
