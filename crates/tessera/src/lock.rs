//! A distributed mutex: a semaphore of capacity 1 with the same leases, fences and queue.

use std::time::Duration;

use tokio::time::Instant;

use crate::lease::permit::Permit;
use crate::semaphore::{Semaphore, SemaphoreOptions};
use crate::store::Store;
use tessera_core::error::Result;
use tessera_core::model::SemaphoreStatus;

/// A lock shared by every process that opens the same name on the same store.
///
/// Fairness and cancel safety are those of [`Semaphore`]: FIFO in store arrival order;
/// dropping a `lock()` future never leaves the lock held.
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// // Exactly one worker handles record 42 at a time.
/// let store = tessera::Store::connect("memory://").await?;
/// let record = store.lock("record-42")?;
/// let guard = record.lock().await?;
/// assert!(record.try_lock().await?.is_none());
/// // Hand `guard.fence()` to the storage layer so a stale holder is refused.
/// drop(guard);
/// # Ok::<(), tessera::Error>(()) }).unwrap();
/// ```
#[derive(Debug, Clone)]
pub struct Lock {
    sem: Semaphore,
}

impl Store {
    /// A lock (a semaphore of capacity 1) with default options.
    pub fn lock(&self, name: &str) -> Result<Lock> {
        Lock::new(self, name, SemaphoreOptions::default())
    }
}

impl Lock {
    /// Opens a lock. Errors as [`Semaphore::new`].
    pub fn new(store: &Store, name: &str, opts: SemaphoreOptions) -> Result<Self> {
        Ok(Lock {
            sem: Semaphore::new(store, name, 1, opts)?,
        })
    }
    /// The name.
    pub fn name(&self) -> &str {
        self.sem.name()
    }
    /// Waits for the lock. See [`Semaphore::acquire_many`].
    pub async fn lock(&self) -> Result<Permit> {
        self.sem.acquire().await
    }
    /// Takes the lock if it is free and nobody waits; `Ok(None)` otherwise.
    pub async fn try_lock(&self) -> Result<Option<Permit>> {
        self.sem.try_acquire().await
    }
    /// Waits for the lock for at most `timeout`; `Ok(None)` if it did not come.
    pub async fn lock_timeout(&self, timeout: Duration) -> Result<Option<Permit>> {
        self.sem.acquire_many_timeout(1, timeout).await
    }
    /// Waits for the lock until `deadline`; `Ok(None)` if it did not come.
    pub async fn lock_until(&self, deadline: Instant) -> Result<Option<Permit>> {
        self.sem.acquire_many_until(1, deadline).await
    }
    /// Holder and queue.
    pub async fn status(&self) -> Result<SemaphoreStatus> {
        self.sem.status().await
    }
    /// The semaphore behind the lock.
    pub fn as_semaphore(&self) -> &Semaphore {
        &self.sem
    }
}
