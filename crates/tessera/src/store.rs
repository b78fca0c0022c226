//! The store seam: a handful of atomic operations every store implements, and [`Store`], the
//! handle users connect with.
//!
//! # The model every backend implements
//!
//! A semaphore in a store is: a capacity `C`; a running count `used` of the permits held by
//! unexpired leases; the holders (lease id → weight, seats, fence, holder label, expiry); a
//! FIFO queue of waiters (lease id, weight, lease TTL to grant with, heartbeat expiry); and the
//! last fence issued. Every operation runs as **one atomic step on the store's clock** and
//! follows one shape:
//!
//! 1. **purge**: drop holders whose lease expired and waiters whose heartbeat expired;
//! 2. **hand off**: while the queue head's weight fits in `C - used`, grant it (lowest free
//!    seats, next fence, expiry = now + its TTL) and pop it. Strict FIFO: a head that does not
//!    fit blocks everyone behind it, so a large request is never starved by small ones;
//! 3. **decide** the operation itself;
//! 4. hand off again if the operation freed permits or removed the head;
//! 5. **notify**: push a wake-up to exactly the waiters granted in this step and to holders
//!    whose lease was revoked or deleted (see [`crate::wake`]).
//!
//! Invariants kept by every step: `used` equals the sum of holder weights and never exceeds
//! `C` (except transiently after a shrinking resize, when no grant happens until it does);
//! the seats of all holders are distinct; a fence is `max(last_fence + 1, now in µs, hwm + 1)`
//! where `hwm` is a store-wide high-water mark of issued fences, so `last_fence` never
//! decreases, even across deletion of the semaphore (the high-water mark) and loss of the
//! store's state (the time floor); a retried acquire with a granted or queued lease id returns
//! that state. The client never reuses a lease id for a new acquire, so a lease id is granted
//! at most once.
//!
//! Policy — waiting, heartbeats, keep-alive, cancellation, loss detection — lives once, above
//! this seam, in [`crate::Semaphore`] and [`crate::Permit`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::error::{redact_url, Error, InvalidInput, Result};
use crate::model::*;

/// How waiters learn about grants on this store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waking {
    /// The store pushes a wake-up to the granted waiter ([`crate::wake::notify`]); waiters
    /// only heartbeat as a safety net.
    Push,
    /// Waiters in other processes are not pushed to; they poll with exponential backoff
    /// between `min` and `max` (SQLite across processes).
    Poll { min: Duration, max: Duration },
}

/// The store seam. Every method is one atomic step on the store (see the module docs).
///
/// Implementations validate nothing that the client already validated (names, weights,
/// TTLs), but must never panic on data they find in the store: unreadable data is
/// [`Error::Corrupt`].
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Grants, queues (when `req.wait` is set) or refuses. Retrying with the same lease id
    /// returns the grant or queue place it already has. Fails with
    /// [`Error::CapacityMismatch`] if the stored capacity differs from `capacity`, and with
    /// [`Error::QueueFull`] if the queue is at its cap. `try` (no `wait`) never jumps the
    /// queue: it is refused while anyone waits.
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply>;

    /// A waiter's heartbeat: renews its queue entry for `waiter_ttl`, or returns the grant the
    /// hand-off gave it, or `Gone`.
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply>;

    /// Gives up a wait: removes the waiter, or releases the lease if it was already granted.
    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply>;

    /// Releases a lease; `true` if it was still held. Idempotent.
    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool>;

    /// Extends a held lease to `now + ttl`.
    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply>;

    /// A snapshot, or `None` if the store holds nothing for this name.
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>>;

    /// Names of the semaphores the store currently holds state for.
    async fn list(&self) -> Result<Vec<String>>;

    /// Changes the capacity; returns the old one. [`Error::NotFound`] if the semaphore does
    /// not exist. Shrinking never revokes: holders keep their permits and no grant happens
    /// until `used` fits the new capacity.
    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32>;

    /// Removes another holder's lease (admin). The victim learns it through `lost()`.
    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool>;

    /// Removes the semaphore with its holders and waiters; `true` if it existed. Fences stay
    /// monotonic afterwards.
    async fn delete(&self, name: &Name) -> Result<bool>;

    /// How waiters learn about grants.
    fn waking(&self) -> Waking;

    /// The rate-limit operations of this store, if it has them (see [`crate::RateBackend`]).
    /// Wrappers (fault injection) forward this.
    fn rate(&self) -> Option<&dyn crate::rate::RateBackend> {
        None
    }
}

/// A connection to one store, chosen by URL. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn Backend>,
    url: String,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("url", &self.url).finish()
    }
}

impl Store {
    /// Connects to the store named by `url`:
    ///
    /// - `memory://` — the process-wide in-memory store; `memory://NAME` a separate named one.
    /// - `sqlite:///path/to/file.db` — the embedded store; the file and its folder are created.
    ///
    /// A malformed URL or an unknown scheme is [`InvalidInput::StoreUrl`]; nothing is created.
    ///
    /// ```
    /// # tokio_test_block(async {
    /// let store = tessera::Store::connect("memory://").await?;
    /// let jobs = store.semaphore("heavy-jobs", 4)?;
    /// let permit = jobs.acquire().await?;
    /// assert!(permit.seats()[0] < 4);
    /// # Ok::<(), tessera::Error>(()) });
    /// # fn tokio_test_block<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Runtime::new().unwrap().block_on(f) }
    /// ```
    pub async fn connect(url: &str) -> Result<Store> {
        let bad = |reason: &str| {
            Error::from(InvalidInput::StoreUrl {
                url: redact_url(url),
                reason: reason.to_string(),
            })
        };
        let scheme = url
            .split_once("://")
            .map(|(s, _)| s)
            .ok_or_else(|| bad("expected SCHEME://…, e.g. sqlite:///var/lib/app/tessera.db"))?;
        let backend: Arc<dyn Backend> = match scheme {
            #[cfg(feature = "memory")]
            "memory" => Arc::new(crate::stores::memory::MemoryBackend::connect(url)?),
            #[cfg(feature = "sqlite")]
            "sqlite" => Arc::new(crate::stores::sqlite::SqliteBackend::connect(url).await?),
            #[cfg(feature = "redis")]
            "redis" | "rediss" => Arc::new(crate::stores::redis::RedisBackend::connect(url).await?),
            #[cfg(not(feature = "redis"))]
            "redis" | "rediss" => return Err(bad("this build of tessera lacks the redis feature")),
            "redis+sentinel" | "redis+cluster" | "postgres" | "postgresql" | "mysql" | "etcd" => {
                return Err(bad(
                    "this store is not available in this build of tessera yet",
                ))
            }
            _ => {
                return Err(bad(
                    "unknown scheme; expected memory://, sqlite:// or redis://",
                ))
            }
        };
        Ok(Store::from_backend(backend, url))
    }

    /// Wraps a backend (for tests and fault injection).
    pub fn from_backend(backend: Arc<dyn Backend>, url: &str) -> Store {
        Store {
            backend,
            url: redact_url(url),
        }
    }

    /// The store's URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The backend behind this store.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// A semaphore of `capacity` permits with default options.
    pub fn semaphore(&self, name: &str, capacity: u64) -> Result<crate::Semaphore> {
        crate::Semaphore::new(self, name, capacity, crate::SemaphoreOptions::default())
    }

    /// A lock (a semaphore of capacity 1) with default options.
    pub fn lock(&self, name: &str) -> Result<crate::Lock> {
        crate::Lock::new(self, name, crate::SemaphoreOptions::default())
    }

    /// A snapshot of a semaphore, or `None` if the store holds nothing for it.
    pub async fn status(&self, name: &str) -> Result<Option<SemaphoreStatus>> {
        self.backend.status(&Name::new(name)?).await
    }

    /// Names of the semaphores that currently have holders or waiters.
    pub async fn list(&self) -> Result<Vec<String>> {
        self.backend.list().await
    }

    /// A rate limiter with `limits` in exact mode (at most N in any window of L) and default
    /// options; see [`crate::RateLimiter`].
    pub fn rate_limiter(
        &self,
        name: &str,
        limits: &[crate::RateSpec],
    ) -> Result<crate::RateLimiter> {
        crate::RateLimiter::new(self, name, limits, crate::RateOptions::default())
    }

    /// A snapshot of a rate limiter (usage per limit, next free time), or `None` if the store
    /// holds no state for it. [`Error::Unsupported`] on a store without rate limiting.
    pub async fn rate_status(&self, name: &str) -> Result<Option<crate::RateStatus>> {
        let name = Name::new(name)?;
        self.rate_backend()?.rate_status(&name).await
    }

    /// Names of the rate limiters the store holds state for.
    pub async fn rate_list(&self) -> Result<Vec<String>> {
        self.rate_backend()?.rate_list().await
    }

    /// Deletes a rate limiter's state (admin): its limits, history and reservations; `true`
    /// if the store held state for it. [`Error::Unsupported`] on a store without rate
    /// limiting.
    pub async fn delete_rate_limiter(&self, name: &str) -> Result<bool> {
        let name = Name::new(name)?;
        self.rate_backend()?.rate_delete(&name).await
    }

    fn rate_backend(&self) -> Result<&dyn crate::rate::RateBackend> {
        self.backend.rate().ok_or_else(|| {
            Error::Unsupported(format!("rate limiting is not available on {}", self.url))
        })
    }

    /// Changes a semaphore's capacity (admin); returns the old capacity. Growing hands the
    /// new permits to the queue at once; shrinking never revokes, it only stops grants until
    /// the holders fit. Clients that declared the old capacity get
    /// [`Error::CapacityMismatch`] from then on.
    pub async fn resize(&self, name: &str, capacity: u64) -> Result<u32> {
        let name = Name::new(name)?;
        let capacity = validate_capacity(capacity)?;
        self.backend.resize(&name, capacity).await
    }

    /// Revokes a holder's lease (admin); `true` if it was held. The holder's
    /// [`crate::Permit::lost`] fires.
    pub async fn revoke(&self, name: &str, lease_id: &str) -> Result<bool> {
        let name = Name::new(name)?;
        let lease: LeaseId = lease_id.parse()?;
        self.backend.revoke(&name, lease).await
    }

    /// Deletes a semaphore with its holders and waiters (admin); `true` if it existed.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        self.backend.delete(&Name::new(name)?).await
    }
}
