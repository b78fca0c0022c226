//! # tessera — distributed semaphores and locks
//!
//! `tokio::sync::Semaphore` carried over the network: a fixed number of permits shared by
//! processes on many hosts, with leases that outlive a crashed holder only by their TTL,
//! fence tokens and seats for the protected resource, a fair weighted FIFO queue served by the
//! store, and a [`Permit::lost`] notice that fires before a lease could expire.
//!
//! One URL chooses the store ([`Store::connect`]): `memory://` (in-process, the reference
//! model) and `sqlite:///path/file.db` (the embedded default: many processes on one host).
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use std::time::Duration;
//! use tessera::{SemaphoreOptions, Store};
//!
//! let store = Store::connect("memory://").await?;
//! let gpus = tessera::Semaphore::new(&store, "gpus", 8, SemaphoreOptions::default().ttl(Duration::from_secs(10)))?;
//! let permit = gpus.acquire_many(2).await?;           // waits in FIFO order
//! let seats = permit.seats();                          // e.g. [0, 1]: which GPUs are ours
//! assert_eq!(seats.len(), 2);
//! tokio::select! {
//!     _ = tokio::time::sleep(Duration::from_millis(10)) => {}   // the work
//!     reason = permit.lost() => panic!("lost the GPUs: {reason}"),
//! }
//! permit.release().await?;
//! # Ok::<(), tessera::Error>(()) }).unwrap();
//! ```
//!
//! A [`RateLimiter`] enforces several limits at once ("50 per second AND 1,000 per minute",
//! never more than N in any window of length L), charged atomically on the store's clock;
//! being limited is an answer with a retry time, and waiting is a reservation, not polling.
//!
//! See `docs/contract.md` in the repository for the guarantees every store keeps.

pub mod clock;
pub mod error;
mod keeper;
mod lock;
mod model;
mod permit;
pub mod rate;
mod semaphore;
pub mod store;
pub mod stores;
pub mod wake;

pub use error::{Error, InvalidInput, LossReason, Result, StoreErrorKind};
pub use lock::Lock;
pub use model::*;
pub use permit::Permit;
pub use rate::{
    LimitUsage, RateBackend, RateConfig, RateDecision, RateLimiter, RateMode, RateOptions,
    RateReply, RateRequest, RateSpec, RateStatus, DEFAULT_RATE_MARGIN, MAX_RATE_MARGIN,
    MAX_RATE_WAIT,
};
pub use semaphore::{Semaphore, SemaphoreOptions};
pub use store::{Backend, Store, Waking};
