//! [`Store`], the handle users connect with: the URL registry lives in `crate::stores`, the
//! seam every store implements in `crate::seam`.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;

use crate::error::{redact_url, Error, LossReason, Result, StoreErrorKind};
use crate::keeper::Held;
use crate::model::*;
use crate::seam::{Backend, RateBackend};

/// A connection to one store, chosen by URL. Cheap to clone; clones share the connection.
///
/// **At the end of a program** call [`Store::close`]: it releases every permit still held
/// through this store and waits for the background clean-ups (releases of dropped permits,
/// cancels of abandoned waits, returned rate reservations). Without it, a process that exits
/// normally still waits up to [`crate::EXIT_GRACE`] for those clean-ups, on a connection of
/// their own, so permits dropped when `main` returns are released; only a process killed
/// outright leaves its leases to expire by their TTL.
#[derive(Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// The URL with any password replaced by `***`: the only form ever shown.
    url: String,
    /// The URL as given (password included) for the clean-up thread to reconnect with;
    /// `None` for a store built from a backend. Never printed.
    reconnect: Option<String>,
    /// The permits held through this store, for [`Store::close`].
    permits: Mutex<Tracked>,
    /// Background clean-ups under way for this store (see `crate::cleanup`).
    cleanups: watch::Sender<usize>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("url", &self.shared.url)
            .finish()
    }
}

/// The permits of a store: a list of weak references, pushed at grant and never searched. A
/// released permit stays until the list is compacted (when it has doubled since the last
/// time), and is skipped at [`Store::close`] because its release was already claimed; so a
/// release costs nothing here.
#[derive(Default)]
struct Tracked {
    held: Vec<Weak<Held>>,
    limit: usize,
}

/// The length below which [`Tracked`] is never compacted.
const TRACKED_MIN: usize = 64;

impl Tracked {
    fn push(&mut self, held: &Arc<Held>) {
        if self.held.len() >= self.limit.max(TRACKED_MIN) {
            self.held.retain(|h| h.strong_count() > 0);
            self.limit = 2 * self.held.len();
        }
        self.held.push(Arc::downgrade(held));
    }

    /// Every permit still alive, emptying the list.
    fn drain(&mut self) -> Vec<Arc<Held>> {
        self.limit = 0;
        self.held.drain(..).filter_map(|h| h.upgrade()).collect()
    }
}

/// How long [`Store::close`] gives each release, and the clean-ups under way, to finish.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Every store of the process, for the exit handler.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// At a normal process exit: hands every permit still held, in every store, to the clean-up
/// thread as a release (see `crate::cleanup`).
pub(crate) fn release_all_at_exit() {
    let stores: Vec<Store> = match LIVE.lock() {
        Ok(live) => live
            .iter()
            .filter_map(Weak::upgrade)
            .map(|shared| Store { shared })
            .collect(),
        Err(_) => return,
    };
    for store in stores {
        let held: Vec<Arc<Held>> = match store.shared.permits.lock() {
            Ok(mut permits) => permits.drain(),
            Err(_) => continue,
        };
        for h in held.iter().filter(|h| h.claim_release()) {
            h.stop();
            crate::cleanup::reap(
                &store,
                crate::cleanup::Job::Release {
                    name: h.config.name.clone(),
                    lease: h.lease.lease_id,
                },
            );
        }
    }
}

impl Store {
    /// Connects to the store named by `url`, creating it if it does not exist yet:
    ///
    /// - `memory://` — the process-wide in-memory store; `memory://NAME` a separate named
    ///   one. Nothing is shared with other processes. Cargo feature `memory` (default).
    /// - `sqlite:///absolute/path/file.db` — the embedded store: every process on the host
    ///   that names the same file shares its semaphores and rate limits. The path must be
    ///   absolute (three slashes): a relative `sqlite://file.db` would name a different file
    ///   in each working directory, so it is refused with a hint. The path is taken literally
    ///   (no `~`, no percent-decoding); the URL takes no `?query` or `#fragment`. The file
    ///   and its folder are created if missing. Beside the file SQLite keeps `file.db-wal`
    ///   and `file.db-shm`, and tessera a folder `file.db.wake/` holding one Unix socket per
    ///   connected process, through which a grant wakes a waiter in another process at once;
    ///   it may be deleted while no process uses the store. Cargo feature `sqlite` (default).
    /// - `redis://[user[:password]@]host[:port][/db][?prefix=…&eviction=warn|refuse]`, or
    ///   `rediss://…` for TLS — the distributed store, on the server's clock. Cargo feature
    ///   `redis`.
    /// - `etcd://[user:password@]host:port[,host:port…][/prefix]`, or `etcds://…` for TLS
    ///   (`?ca=FILE&cert=FILE&key=FILE&domain=NAME`) — the consensus-backed store; leases
    ///   are whole seconds, at least 2 s. Cargo feature `etcd` (building it needs `protoc`).
    ///
    /// A malformed URL, an unknown scheme or a scheme whose store this build lacks (the
    /// message names the cargo feature to enable) is [`crate::InvalidInput::StoreUrl`]; nothing is
    /// created. To open only a store that already exists, use [`Store::connect_existing`].
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
        let backend = crate::stores::open(url, crate::stores::Open::CreateIfMissing).await?;
        Ok(Store::build(backend, url, Some(url.to_string())))
    }

    /// Wraps a backend (for tests and fault injection).
    pub fn from_backend(backend: Arc<dyn Backend>, url: &str) -> Store {
        Store::build(backend, url, None)
    }

    pub(crate) fn build(backend: Arc<dyn Backend>, url: &str, reconnect: Option<String>) -> Store {
        // A store opened from a URL reports its calls (see `crate::telemetry`); one built from
        // a backend is the caller's, who may wrap it (tests wrap a URL-opened one in faults).
        let backend: Arc<dyn Backend> = match reconnect {
            Some(_) => Arc::new(crate::telemetry::Instrumented::new(backend)),
            None => backend,
        };
        let shared = Arc::new(Shared {
            backend,
            url: redact_url(url),
            reconnect,
            permits: Mutex::new(Tracked::default()),
            cleanups: watch::Sender::new(0),
        });
        let mut live = LIVE.lock().unwrap();
        live.retain(|s| s.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        Store { shared }
    }

    /// The store's URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        &self.shared.url
    }

    /// The backend behind this store.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    pub(crate) fn reconnect_url(&self) -> Option<&str> {
        self.shared.reconnect.as_deref()
    }

    pub(crate) fn cleanups(&self) -> &watch::Sender<usize> {
        &self.shared.cleanups
    }

    /// Notes a permit held through this store, for [`Store::close`] and the exit handler.
    pub(crate) fn track(&self, held: &Arc<Held>) {
        crate::cleanup::arm_exit();
        self.shared.permits.lock().unwrap().push(held);
    }

    /// Releases every permit still held through this store (clones included) and waits for
    /// the background clean-ups under way (releases of dropped permits, cancels of abandoned
    /// waits, returned rate reservations). Call it before a program ends.
    ///
    /// Each permit still held first fires its [`crate::Permit::lost`] with
    /// [`LossReason::Closed`] (its holder must stop), then is released. Each release and the
    /// wait for clean-ups are bounded by 5 s; a lease whose release fails or times out expires
    /// by its TTL. On error (the first failed release) every other permit was still released.
    /// The store stays usable afterwards.
    pub async fn close(&self) -> Result<()> {
        let held: Vec<Arc<Held>> = { self.shared.permits.lock().unwrap().drain() };
        let releases = held
            .iter()
            .filter(|h| h.claim_release())
            .map(|h| async move {
                h.lose(LossReason::Closed);
                h.stop();
                let (name, lease) = (&h.config.name, h.lease.lease_id);
                let release = async {
                    match self.backend().release(name, lease).await {
                        Err(e) if e.is_transient() => {
                            crate::permit::release_retried(&**self.backend(), name, lease, e).await
                        }
                        other => other,
                    }
                };
                match tokio::time::timeout(CLOSE_TIMEOUT, release).await {
                    Ok(r) => r.map(drop),
                    Err(_) => Err(Error::store(
                        StoreErrorKind::Timeout,
                        format!(
                            "releasing lease {lease} on {name} took longer than {CLOSE_TIMEOUT:?}"
                        ),
                    )),
                }
            });
        let outcomes = futures::future::join_all(releases).await;
        let mut under_way = self.shared.cleanups.subscribe();
        if tokio::time::timeout(CLOSE_TIMEOUT, under_way.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(store = %self.url(), "clean-ups still under way after {CLOSE_TIMEOUT:?}");
        }
        outcomes.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }

    /// A semaphore of `capacity` permits with default options.
    pub fn semaphore(&self, name: &str, capacity: u32) -> Result<crate::Semaphore> {
        crate::Semaphore::new(self, name, capacity, crate::SemaphoreOptions::default())
    }

    /// A lock (a semaphore of capacity 1) with default options.
    pub fn lock(&self, name: &str) -> Result<crate::Lock> {
        crate::Lock::new(self, name, crate::SemaphoreOptions::default())
    }

    /// A snapshot of a semaphore, or `None` if the store holds nothing for it.
    pub async fn status(&self, name: &str) -> Result<Option<SemaphoreStatus>> {
        self.backend().status(&Name::new(name)?).await
    }

    /// Names of the semaphores that currently have holders or waiters.
    pub async fn list(&self) -> Result<Vec<String>> {
        self.backend().list().await
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

    fn rate_backend(&self) -> Result<&dyn RateBackend> {
        self.backend()
            .rate()
            .ok_or_else(|| crate::rate::unsupported(self))
    }

    /// Changes a semaphore's capacity (admin); returns the old capacity. Growing hands the
    /// new permits to the queue at once; shrinking never revokes, it only stops grants until
    /// the holders fit. Clients that declared the old capacity get
    /// [`Error::CapacityMismatch`] from then on.
    pub async fn resize(&self, name: &str, capacity: u32) -> Result<u32> {
        let name = Name::new(name)?;
        let capacity = validate_capacity(capacity)?;
        self.backend().resize(&name, capacity).await
    }

    /// Revokes a holder's lease (admin); `true` if it was held. The holder's
    /// [`crate::Permit::lost`] fires.
    pub async fn revoke(&self, name: &str, lease_id: &str) -> Result<bool> {
        let name = Name::new(name)?;
        let lease: LeaseId = lease_id.parse()?;
        self.backend().revoke(&name, lease).await
    }

    /// Deletes a semaphore with its holders and waiters (admin); `true` if it existed.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        self.backend().delete(&Name::new(name)?).await
    }
}
