//! [`Store`], the handle users connect with: the URL registry lives in `crate::stores`, the
//! seam every store implements in `tessera_core::seam`.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::Conn;
use crate::lease::permit::release_retried;
use crate::stores::Open;
use tessera_core::error::{Error, LossReason, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::rate::seam::{RateBackend, RateStatus};
use tessera_core::seam::{unsupported_rate as unsupported, Backend};

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
    conn: Conn,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store").field("url", &self.url()).finish()
    }
}

/// How long [`Store::close`] gives each release, and the clean-ups under way, to finish.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

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
        Ok(Store::wrap(Conn::open(url, Open::CreateIfMissing).await?))
    }

    /// Opens a store that already exists, creating nothing: for tools that only read or
    /// change existing state (inspection, revoke, resize, delete), so a mistyped path is
    /// reported instead of becoming a new, empty store.
    ///
    /// The URL forms are those of [`Store::connect`]. A SQLite file that does not exist is
    /// [`Error::NoStore`] (see [`Error::is_no_store`]) and neither the file nor its folder is
    /// created; an existing file is opened as by `connect`. A PostgreSQL schema or a
    /// MySQL / MariaDB database that holds no tessera tables is [`Error::NoStore`] too, and
    /// nothing is created in it. `memory://` and Redis create nothing on connect, so for
    /// them this is the same as `connect`.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let dir = tempfile::tempdir().unwrap();
    /// let url = format!("sqlite://{}/typo.db", dir.path().display());
    /// let err = tessera::Store::connect_existing(&url).await.unwrap_err();
    /// assert!(err.is_no_store());
    /// assert!(!dir.path().join("typo.db").exists());
    /// # });
    /// ```
    pub async fn connect_existing(url: &str) -> Result<Store> {
        Ok(Store::wrap(Conn::open(url, Open::ExistingOnly).await?))
    }

    /// Wraps a backend (for tests and fault injection).
    pub fn from_backend(backend: Arc<dyn Backend>, url: &str) -> Store {
        Store::wrap(Conn::build(backend, url, None))
    }

    fn wrap(conn: Conn) -> Store {
        Store { conn }
    }

    /// The connection engine under this handle, for what the façade builds on it.
    pub(crate) fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The store's URL with any password replaced by `***`.
    pub fn url(&self) -> &str {
        self.conn.url()
    }

    /// The backend behind this store.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        self.conn.backend()
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
        let releases = self
            .conn
            .drain_held()
            .into_iter()
            .filter_map(|h| h.take_for_release(Some(LossReason::Closed)))
            .map(|(name, lease)| async move {
                let release = async {
                    match self.backend().release(&name, lease).await {
                        Err(e) if e.is_transient() => {
                            release_retried(&**self.backend(), &name, lease, e).await
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
        let mut under_way = self.conn.cleanups().subscribe();
        if tokio::time::timeout(CLOSE_TIMEOUT, under_way.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(store = %self.url(), "clean-ups still under way after {CLOSE_TIMEOUT:?}");
        }
        outcomes.into_iter().collect::<Result<Vec<()>>>().map(drop)
    }

    /// A snapshot of a semaphore, or `None` if the store holds nothing for it.
    pub async fn status(&self, name: &str) -> Result<Option<SemaphoreStatus>> {
        self.backend().status(&Name::new(name)?).await
    }

    /// Whether the store answers: one round trip that writes nothing and waits for no lock a
    /// grant or release takes, so it can run often (a server's health probe runs it twice a
    /// second). `Ok` once the store answered; on error, the store's error (a connection error,
    /// a timeout, a refused login), and nothing was changed either way.
    ///
    /// What each store does: Redis `PING` on the connection the steps use (on Sentinel, the
    /// master's; on a cluster, the cluster connection's); PostgreSQL and MySQL / MariaDB `SELECT 1` on a
    /// pooled connection; etcd a count-only read of one key, which goes through the leader
    /// like every step (a member cut from its quorum does not answer it); SQLite a read of the
    /// schema version on a pooled connection (a read in WAL mode: it never waits for a writer
    /// and never takes the write gate); memory nothing at all, as there is nothing to reach.
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let store = tessera::Store::connect("memory://").await?;
    /// store.ping().await?;
    /// # Ok::<(), tessera::Error>(()) }).unwrap();
    /// ```
    pub async fn ping(&self) -> Result<()> {
        self.backend().ping().await
    }

    /// Names of the semaphores that currently have holders or waiters.
    pub async fn list(&self) -> Result<Vec<String>> {
        self.backend().list().await
    }

    /// A snapshot of a rate limiter (usage per limit, next free time), or `None` if the store
    /// holds no state for it. [`Error::Unsupported`] on a store without rate limiting.
    pub async fn rate_status(&self, name: &str) -> Result<Option<RateStatus>> {
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
            .ok_or_else(|| unsupported(self.url(), &**self.backend()))
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

    /// Sets `tenant`'s ceiling and floor on the semaphore `name` (admin,
    /// `docs/fair-shares.md`): the tenant never holds more than the ceiling, and the floor's
    /// permits are kept for it while it holds fewer. [`TenantLimits::default`] removes them.
    /// The store keeps them for the name, also while nobody holds or waits, until changed or
    /// until [`Store::delete`]. A tenant name follows [`Tenant::new`]'s rules. A floor that
    /// would bring the floors above the capacity of the semaphore as it is is
    /// [`Error::InvalidInput`]; [`Error::Unsupported`] on a store that keeps no tenant
    /// limits ([`Capabilities::tenant_limits`](crate::backend::Capabilities)).
    ///
    /// ```
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use tessera::{SemaphoreOptions, Store, Tenant, TenantLimits};
    /// let store = Store::connect("memory://").await?;
    /// // "bulk" never holds more than 2 of the 4 permits; 1 is kept for "alerts".
    /// store.set_tenant_limits("provider", "bulk", TenantLimits::new(Some(2), 0)?).await?;
    /// store.set_tenant_limits("provider", "alerts", TenantLimits::new(None, 1)?).await?;
    /// let bulk = tessera::Semaphore::new(&store, "provider", 4,
    ///     SemaphoreOptions::default().tenant(Tenant::new("bulk", 1)?))?;
    /// let a = bulk.acquire().await?;
    /// let b = bulk.acquire().await?;
    /// assert!(bulk.try_acquire().await?.is_none(), "at its ceiling");
    /// # drop((a, b));
    /// # Ok::<(), tessera::Error>(()) }).unwrap();
    /// ```
    pub async fn set_tenant_limits(
        &self,
        name: &str,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        let name = Name::new(name)?;
        let tenant = Tenant::new(tenant, 1)?;
        if !self.backend().capabilities().tenant_limits {
            return Err(Error::Unsupported(format!(
                "{} keeps no tenant ceilings or floors",
                self.url()
            )));
        }
        if limits.window_ceiling.is_some() && !self.backend().capabilities().window_ceilings {
            return Err(Error::Unsupported(format!(
                "{} keeps no tenant window ceilings",
                self.url()
            )));
        }
        self.backend()
            .set_tenant_limits(&name, tenant.name(), limits)
            .await
    }

    /// The tenants' ceilings and floors set on `name`, by tenant (none on a store that keeps
    /// none).
    pub async fn tenant_limits(&self, name: &str) -> Result<BTreeMap<String, TenantLimits>> {
        self.backend().tenant_limits(&Name::new(name)?).await
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
