//! The embedded SQLite store (`sqlite:///path/to/file.db`): many processes on one host share
//! one database file, nothing to install.
//!
//! # URL
//!
//! `sqlite:///abs/path/file.db` names an absolute path (three slashes: the scheme's two and
//! the path's own). A relative path (`sqlite://file.db`, `sqlite://./file.db`,
//! `sqlite://~/file.db`) is refused with [`InvalidInput::StoreUrl`], whose message shows the
//! absolute URL to write instead: relative to the current directory, processes started in
//! different directories would silently use different files and share nothing. The path is
//! taken literally (no percent-decoding, no `~`). [`SqliteBackend::connect`] creates the file
//! and its parent folders if missing; [`SqliteBackend::connect_existing`] creates nothing
//! and answers [`Error::NoStore`] for a missing file. The URL takes no query parameters and
//! no fragment; a missing path, a path that names a folder, `:memory:` (not shared between
//! connections) or any `?…` is [`InvalidInput::StoreUrl`], and nothing is created.
//!
//! Beside `file.db` live SQLite's `file.db-wal` and `file.db-shm`, and tessera's wake-up
//! folder `file.db.wake/` (one Unix socket per connected process, see `notify.rs`) and
//! write gate `file.db.lock` (an empty file that processes `flock`, see `gate.rs`).
//!
//! # How it runs
//!
//! - **One transaction per operation.** Every operation is one short `BEGIN IMMEDIATE`
//!   transaction running the shared SQL step (`stores/sql`) over this store's statements
//!   (`ops.rs`): it takes SQLite's write lock before its first read, so two
//!   processes never both read a state and then both fail to upgrade (a deferred `BEGIN`
//!   gave hundreds of "database is locked" errors under contention even with a busy timeout).
//!   Inside one process the write transactions are also serialized by a mutex, so local
//!   tasks queue in FIFO order instead of sleeping in SQLite's busy handler. The semaphore
//!   steps run on the backend's own connection ([`Writer`]), whose prepared statements are
//!   kept from step to step; its `BEGIN IMMEDIATE` first asks for the write lock without
//!   waiting, on the caller's thread, and only waits (in the busy handler, on a blocking
//!   thread) while another process holds it. Processes wait for each other's write
//!   transactions on the write gate (`gate.rs`), a `flock` that the kernel hands on the
//!   moment the holder commits, rather than in SQLite's busy handler, which can only sleep
//!   and try again.
//! - **WAL**, set once: when a connection finds the file in another journal mode (a new
//!   file), it switches it to WAL, which is then a property of the file. Readers never block
//!   the writer. `synchronous=NORMAL`: a commit is durable against a process crash, and only
//!   the last transactions may be lost on power failure — a lost grant then looks like an
//!   expired lease, which holders already survive, and fences stay monotonic through the
//!   time floor (`fence >= now in µs`). The steps' connection checkpoints the WAL at
//!   SQLite's usual threshold, right after the step's wake-ups are sent rather than inside
//!   its COMMIT (see `wal_hook`); durability is unchanged.
//! - **Busy timeout** 10 s: how long a transaction waits for another process's write lock
//!   before failing with [`StoreErrorKind::Busy`]. A process stopped inside its write
//!   transaction (SIGSTOP, a debugger) therefore holds every other process's steps, expiries
//!   included, until it runs again or their busy timeout passes: SQLite has one writer.
//! - **Clock**: the host's boot clock ([`BootClock`], `CLOCK_BOOTTIME` in µs), or an injected
//!   [`Clock`] for tests. All processes on the host share it, so it is the store's clock, and
//!   it never jumps with the wall clock (NTP steps, `date -s`, a restored snapshot), so a
//!   wall-clock jump can neither expire a held lease early nor keep a dead one: every expiry,
//!   heartbeat and rate window is on it. The wall clock is read beside it for two things
//!   only: the fences' floor (`fence >= wall µs`, so fences never repeat even across
//!   reboots), and what leaves the store: every [`StoreTime`] in a reply (grants, renewals,
//!   `status`, rate admissions) is converted to wall time at the moment of the reply
//!   (`t + (wall now - boot now)`), so users see wall time as before. The offset is measured
//!   at every reply but kept while it moves by less than 10 ms (the two clocks run at one
//!   rate; only a wall-clock step moves it), so differences of converted times are exact,
//!   within one reply and between replies of one process. A measurement taken while the
//!   thread was held up between the clock reads is replaced by the next good one. Two
//!   processes each measure theirs: a wall-clock step of less than 10 ms between their first
//!   replies leaves their reported times that far apart.
//! - **Boot identity**: the file's `tessera_meta` holds the boot id
//!   (`/proc/sys/kernel/random/boot_id`) its boot-clock times belong to. The first connect of
//!   a new boot (or to a file written before the boot clock) drops every holder, waiter and
//!   rate-limiter state — no process of an older boot can still hold anything — and keeps
//!   the fence high-water mark, with a warning in the log.
//! - **Waking**: a grant made in this process wakes the waiting task at once through
//!   [`tessera_core::wake::notify`]; a waiter in another process gets a datagram on its process's
//!   Unix socket in `<file>.wake/`, which its queue row names (see `notify.rs`). Their poll stays as the safety net (see
//!   [`SqliteBackend::waking`]); it is a [`Backend::heartbeat`], which first tries a
//!   read-only probe that takes no write lock (see [`SqliteBackend::heartbeat`]).

/// Runs one operation in its own `BEGIN IMMEDIATE` transaction, commits, then wakes the
/// lease ids it granted or revoked (after the commit, so a woken task sees the grant).
///
/// `step!(self, name, |rows| op)` runs a semaphore step of the shared SQL layer
/// (`stores/sql`) with `rows` the SQLite row operations (`ops.rs`) of semaphore `name`, on
/// the backend's own connection ([`Writer`]); `step!(self, |conn, now| op)` runs a rate step
/// of `rate.rs` on a pooled sqlx connection. Both hold the writer's mutex, so this
/// process's write transactions never meet each other in SQLite's busy handler, and the
/// write gate (`gate.rs`), so other processes' ones meet there only with connections
/// without it.
macro_rules! step {
    ($self:ident, $name:expr, |$rows:ident| $op:expr) => {{
        let mut tx = $self.begin().await?;
        // Read the clock once the write lock is held: steps are then ordered by time too.
        let now = $self.clock.now();
        let wall = $self.wall.as_ref().map_or(now, |w| w.now());
        let socket = $self.notifier.as_ref().map(|n| n.name());
        let outcome = {
            let mut sqlite_rows = ops::SqliteRows::on(tx.db(), $name.as_str(), now)
                .wall(wall)
                .wake(socket);
            let $rows = &mut sqlite_rows;
            let done = $op.await;
            done.map(|(reply, wakes)| (reply, wakes, sqlite_rows.take_woken()))
        };
        // On an error the transaction rolls back as `tx` drops.
        let (reply, wakes, woken) = outcome?;
        let wal_pages = tx.commit()?;
        for &id in &wakes {
            tessera_core::wake::notify(id);
        }
        if let Some(n) = &$self.notifier {
            n.wake(&wakes, &woken);
        }
        // The checkpoint SQLite would have run inside COMMIT, now that the waiters are told.
        if checkpoint_due(&$self.checkpointed_at, wal_pages) {
            tx.checkpoint();
        }
        drop(tx);
        reply
    }};
    ($self:ident, |$conn:ident, $now:ident| $op:expr) => {{
        let serial = $self.write.lock().await;
        let gate = $self.take_gate().await?;
        let mut tx = $self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(map_err)?;
        // Read the clock once the write lock is held: steps are then ordered by time too.
        let $now = $self.clock.now();
        let $conn: &mut SqliteConnection = &mut tx;
        let (reply, wakes) = $op.await?;
        tx.commit().await.map_err(map_err)?;
        drop(gate);
        drop(serial);
        for &id in &wakes {
            tessera_core::wake::notify(id);
        }
        if let Some(n) = &$self.notifier {
            n.broadcast(&wakes);
        }
        reply
    }};
}

mod conns;
mod error;
mod gate;
mod migrate;
mod notify;
pub(crate) mod ops;
pub(crate) mod rate;
pub(crate) mod url;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI32;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, Row};

use tessera_core::clock::{boot_id, BootClock, Clock, SystemClock};
use tessera_core::error::{redact_url, Error, InvalidInput, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, Backend, Capabilities, GiveBack, RateConfig,
    Settlement, Waking, LOCKED_STEP_ARRIVALS,
};
use tessera_core::stores::sql;

use conns::{
    checkpoint_due, exec_cached, install_busy_handler, no_wait, open_own, WriteTx, Writer,
};
use error::{busy_past_timeout, is_busy, map_err, BUSY_TIMEOUT};
use migrate::{ensure_schema, ensure_wal};
// The rate limiter's unit tests create the schema through this path.
#[cfg(test)]
use migrate::SCHEMA;
use url::parse_url;

/// How far (µs) a fresh measurement of `wall now - boot now` may be from the kept one before
/// it replaces it (a wall-clock step; see [`SqliteBackend::offset`]).
const REANCHOR_US: i128 = 10_000;
/// The offset of [`SqliteBackend::offset`] and the error bound of its measurement (µs), one
/// for the whole process (`None`: not measured yet): every backend whose clock is the boot
/// clock converts with it, so the times that two connections of one process report are
/// comparable to the µs (a reservation one client made at exactly the end of another's
/// window does not appear a few µs inside it).
static PROCESS_OFFSET: std::sync::Mutex<Option<(i128, i128)>> = std::sync::Mutex::new(None);
/// A measurement of the offset whose two boot-clock reads are at most this far apart (µs) is
/// good: the thread was not held up between them.
const GOOD_BRACKET_US: i128 = 100;
/// Connections per backend: one writer at a time (the write mutex) plus readers for the
/// heartbeat probe, `list` and the schema check.
const POOL_SIZE: u32 = 4;
/// Probes whether a waiter's heartbeat can be answered without a write (see
/// [`SqliteBackend::heartbeat`]).
const HEARTBEAT_PROBE: &str = include_str!("heartbeat_probe.sql");

/// The SQLite backend. Cheap to share behind an `Arc`; holds a small connection pool.
pub struct SqliteBackend {
    pool: SqlitePool,
    /// The store's clock: the boot clock, or an injected one.
    clock: Arc<dyn Clock>,
    /// The wall clock read beside `clock` (fence floor, times in replies); `None` when the
    /// store's clock is itself the wall clock (injected clocks): nothing is converted.
    wall: Option<Arc<dyn Clock>>,
    path: PathBuf,
    /// The connection of the semaphore steps ([`Writer`]). Its mutex serializes this
    /// process's write transactions (FIFO), so they never meet each other in SQLite's
    /// sleeping busy handler; other processes are kept out by SQLite's lock.
    write: tokio::sync::Mutex<Writer>,
    /// The connection of the heartbeat probes, with its prepared statements (`None`: not
    /// open, or lost). A probe that finds it in use by another task of this process takes
    /// a pooled connection instead.
    reader: std::sync::Mutex<Writer>,
    /// Wake-ups to waiters in other processes (`None`: they poll only).
    notifier: Option<notify::Notifier>,
    /// Disables the read-only heartbeat probe, so every heartbeat refreshes the waiter
    /// exactly as the reference model does (for the differential test).
    exact_heartbeats: bool,
    /// The WAL's length in pages when this backend last checkpointed it ([`checkpoint_due`]).
    checkpointed_at: AtomicI32,
    /// The write gate every step takes (`None`: its file could not be opened).
    gate: Option<gate::Gate>,
}

impl fmt::Debug for SqliteBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteBackend")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteBackend {
    /// Connects to (and creates if needed) the database named by a `sqlite://` URL, on the
    /// host's clock. See the module docs for the URL forms.
    pub async fn connect(url: &str) -> Result<Self> {
        Self::open(
            url,
            Arc::new(BootClock),
            Some(Arc::new(SystemClock)),
            boot_id(),
            true,
        )
        .await
    }

    /// Like [`SqliteBackend::connect`], with an injected clock (tests use
    /// [`tessera_core::clock::ManualClock`]). Every process sharing a file must use the same clock.
    pub async fn connect_with_clock(url: &str, clock: Arc<dyn Clock>) -> Result<Self> {
        Self::open(url, clock, None, boot_id(), true).await
    }

    /// Like [`SqliteBackend::connect_with_clock`], as if the host's boot id were `boot` (tests
    /// of the state of another boot).
    #[doc(hidden)]
    pub async fn connect_with_boot(url: &str, clock: Arc<dyn Clock>, boot: u128) -> Result<Self> {
        Self::open(url, clock, None, Some(boot), true).await
    }

    /// Opens the database of a `sqlite://` URL only if its file exists, creating nothing: a
    /// missing file is [`Error::NoStore`] and neither it nor its folder is made. An existing
    /// file is opened as by [`SqliteBackend::connect`].
    pub async fn connect_existing(url: &str) -> Result<Self> {
        Self::open(
            url,
            Arc::new(BootClock),
            Some(Arc::new(SystemClock)),
            boot_id(),
            false,
        )
        .await
    }

    async fn open(
        url: &str,
        clock: Arc<dyn Clock>,
        wall: Option<Arc<dyn Clock>>,
        boot: Option<u128>,
        create: bool,
    ) -> Result<Self> {
        let path = parse_url(url)?;
        let missing = || Error::NoStore {
            url: redact_url(url),
            reason: format!("the SQLite file {} does not exist", path.display()),
        };
        if !create && !path.is_file() {
            return Err(missing());
        }
        if let Some(parent) = path.parent().filter(|_| create) {
            std::fs::create_dir_all(parent).map_err(|e| {
                Error::store(
                    StoreErrorKind::Connection,
                    format!("cannot create folder {}: {e}", parent.display()),
                )
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(create)
            .busy_timeout(BUSY_TIMEOUT)
            .synchronous(SqliteSynchronous::Normal)
            .foreign_keys(false);
        let mut conn = match options.connect().await {
            Ok(conn) => conn,
            // Removed between the check above and the open: still no store.
            Err(_) if !create && !path.exists() => return Err(missing()),
            Err(e) => return Err(map_err(e)),
        };
        let setup = async {
            ensure_wal(&mut conn).await?;
            ensure_schema(&mut conn, boot).await
        }
        .await;
        let _ = conn.close().await;
        setup?;
        let pool = SqlitePoolOptions::new()
            .max_connections(POOL_SIZE)
            .test_before_acquire(false)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    let mut handle = conn.lock_handle().await?;
                    install_busy_handler(handle.as_raw_handle().as_ptr());
                    Ok(())
                })
            })
            .connect_with(options)
            .await
            .map_err(map_err)?;
        Ok(SqliteBackend {
            pool,
            clock,
            wall,
            notifier: notify::Notifier::start(&path),
            write: tokio::sync::Mutex::new(Some(open_own(&path)?)),
            reader: std::sync::Mutex::new(None),
            gate: gate::Gate::open(&path),
            path,
            exact_heartbeats: false,
            checkpointed_at: AtomicI32::new(0),
        })
    }

    /// Converts the store's times of one reply to wall time: `t + (wall now - store now)`.
    /// The identity when the store's clock is the wall clock. See [`SqliteBackend::offset`].
    fn to_wall(&self) -> impl Fn(StoreTime) -> StoreTime {
        let offset = self.offset();
        move |t| StoreTime((t.0 as i128 + offset).clamp(0, u64::MAX as i128) as u64)
    }

    /// The inverse of [`SqliteBackend::to_wall`].
    fn wall_to_store(&self, t: StoreTime) -> StoreTime {
        StoreTime((t.0 as i128 - self.offset()).clamp(0, u64::MAX as i128) as u64)
    }

    /// `wall now - store now`, µs. The wall and boot clocks run at the same rate (NTP slews
    /// both), so the offset changes only when the wall clock is stepped; this process keeps
    /// the offset it measured ([`PROCESS_OFFSET`], shared by all its backends) until a fresh
    /// measurement differs by more than
    /// [`REANCHOR_US`]. Times of different replies then convert with one offset, and their
    /// differences stay exact (a reservation's `at` is exactly the previous one's plus the
    /// window, as on every store).
    fn offset(&self) -> i128 {
        let Some(wall) = &self.wall else { return 0 };
        let fresh = measure_offset(self.clock.as_ref(), wall.as_ref());
        let mut kept = PROCESS_OFFSET.lock().unwrap_or_else(|e| e.into_inner());
        let (offset, error) = adopt_offset(*kept, fresh);
        *kept = Some((offset, error));
        offset
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens a `BEGIN IMMEDIATE` transaction on the writer connection, under the writer's
    /// mutex and the write gate ([`gate`]). When the gate is free it asks for SQLite's write
    /// lock without waiting, on this thread. Otherwise it waits for the gate on a blocking
    /// thread and begins there; and when SQLite's lock is taken by a connection without the
    /// gate, it waits on a blocking thread in the busy handler. Either wait ends after
    /// [`BUSY_TIMEOUT`] with [`StoreErrorKind::Busy`].
    ///
    /// Cancelled during a wait, or past its bound, the connection and the gate go with the
    /// blocking thread, which closes the one (rolling back) and releases the other once its
    /// wait ends; the next step opens a new connection.
    async fn begin(&self) -> Result<WriteTx<'_>> {
        let mut slot = self.write.lock().await;
        let db = match slot.take() {
            Some(db) => db,
            None => open_own(&self.path)?,
        };
        let held = match &self.gate {
            Some(gate) => match gate.try_take() {
                Some(held) => Some(held),
                None => return self.begin_waiting(slot, db, Some(gate.clone())).await,
            },
            None => None,
        };
        match no_wait(|| exec_cached(&db, "BEGIN IMMEDIATE")) {
            Ok(()) => Ok(WriteTx {
                slot,
                db: Some(db),
                gate: held,
            }),
            Err(e) if is_busy(&e) => {
                drop(held);
                self.begin_waiting(slot, db, self.gate.clone()).await
            }
            Err(e) => {
                *slot = Some(db);
                Err(ops::rq_err(e))
            }
        }
    }

    /// The waiting half of [`SqliteBackend::begin`], on a blocking thread: takes `gate` (if
    /// any), then `BEGIN IMMEDIATE` in the busy handler, within [`BUSY_TIMEOUT`] in all.
    async fn begin_waiting<'a>(
        &'a self,
        mut slot: tokio::sync::MutexGuard<'a, Writer>,
        db: rusqlite::Connection,
        gate: Option<gate::Gate>,
    ) -> Result<WriteTx<'a>> {
        let waited = tokio::task::spawn_blocking(move || {
            let held = gate.as_ref().and_then(gate::Gate::take);
            let began = exec_cached(&db, "BEGIN IMMEDIATE");
            (db, held, began)
        });
        match tokio::time::timeout(BUSY_TIMEOUT, waited).await {
            Ok(Ok((db, held, Ok(())))) => Ok(WriteTx {
                slot,
                db: Some(db),
                gate: held,
            }),
            Ok(Ok((db, held, Err(e)))) => {
                drop(held);
                *slot = Some(db);
                Err(ops::rq_err(e))
            }
            Ok(Err(e)) => Err(Error::store(
                StoreErrorKind::Other,
                format!("waiting for the SQLite write lock failed: {e}"),
            )),
            Err(_) => Err(busy_past_timeout()),
        }
    }

    /// The write gate for a step on a pooled connection (the rate steps): taken at once if
    /// free, else waited for on a blocking thread, up to [`BUSY_TIMEOUT`]. `None` without a
    /// gate file.
    async fn take_gate(&self) -> Result<Option<gate::GateHeld>> {
        let Some(gate) = &self.gate else {
            return Ok(None);
        };
        if let Some(held) = gate.try_take() {
            return Ok(Some(held));
        }
        let gate = gate.clone();
        match tokio::time::timeout(
            BUSY_TIMEOUT,
            tokio::task::spawn_blocking(move || gate.take()),
        )
        .await
        {
            Ok(Ok(held)) => Ok(held),
            Ok(Err(e)) => Err(Error::store(
                StoreErrorKind::Other,
                format!("waiting for the SQLite write gate failed: {e}"),
            )),
            Err(_) => Err(busy_past_timeout()),
        }
    }

    /// [`SqliteBackend::probe_heartbeat`] on the backend's own reader connection, without
    /// waiting for any lock. `None` when that connection is in use by another task of this
    /// process, cannot be opened, or a lock would have to be waited for: the caller then
    /// probes on a pooled connection.
    fn probe_on_reader(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
        now: StoreTime,
    ) -> Option<Result<Option<WaitReply>>> {
        let mut slot = self.reader.try_lock().ok()?;
        if slot.is_none() {
            *slot = open_own(&self.path).ok();
        }
        let db = slot.as_mut()?;
        let lease_text = lease.to_string();
        let probed = no_wait(|| {
            let mut st = db.prepare_cached(HEARTBEAT_PROBE)?;
            let mut rows = st.query(rusqlite::params![name.as_str(), lease_text, now.0 as i64])?;
            let Some(row) = rows.next()? else {
                return Ok(None);
            };
            let int = |i| row.get::<_, Option<i64>>(i).ok().flatten();
            Ok(Some([int(0), int(1), int(2), int(3)]))
        });
        let row = match probed {
            Ok(row) => row,
            Err(e) if is_busy(&e) => return None,
            Err(e) => return Some(Err(ops::rq_err(e))),
        };
        Some(match row {
            // Not queued: granted meanwhile, or gone (two reads, see `sql::read_grant`).
            None => {
                let rows = &mut ops::SqliteRows::on(db, name.as_str(), now);
                // The row operations run their statements at once; they never wait.
                let read = no_wait(|| sql::read_grant(rows, lease, now).now_or_never())?;
                match read {
                    Err(Error::Store {
                        kind: StoreErrorKind::Busy,
                        ..
                    }) => return None,
                    read => read.map(|grant| grant.map(WaitReply::Granted)),
                }
            }
            Some(row) => Ok(probe_answer(row, now, waiter_ttl)),
        })
    }

    /// The semaphore `name` read in one snapshot without the write lock
    /// ([`ops::SqliteRows::read_snapshot`]), on the reader connection of the heartbeat
    /// probes if it is free, else on a pooled one; never waiting for a lock (`Busy`
    /// instead).
    async fn read_status(&self, name: &Name) -> Result<Option<sql::Snapshot>> {
        let clock = || self.clock.now();
        self.read_unlocked(name, |rows| rows.read_snapshot(clock))
            .await
    }

    /// Runs `read` (one deferred read transaction, which ends inside it) on the reader
    /// connection of the heartbeat probes if it is free, else on a pooled one, under
    /// `no_wait`: a lock it would wait for is `Busy` at once. A connection left inside a
    /// transaction is closed.
    async fn read_unlocked<T>(
        &self,
        name: &Name,
        read: impl Fn(&ops::SqliteRows<'_>) -> Result<T>,
    ) -> Result<T> {
        if let Ok(mut slot) = self.reader.try_lock() {
            if slot.is_none() {
                *slot = open_own(&self.path).ok();
            }
            if let Some(db) = slot.as_mut() {
                let rows = ops::SqliteRows::on(db, name.as_str(), StoreTime(0));
                let read = no_wait(|| read(&rows));
                if rows.in_transaction() {
                    drop(rows);
                    *slot = None;
                }
                return read;
            }
        }
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let rows = ops::SqliteRows::new(&mut conn, name.as_str(), StoreTime(0)).await?;
        let read = no_wait(|| read(&rows));
        let stuck = rows.in_transaction();
        drop(rows);
        if stuck {
            conn.close_on_drop();
        }
        read
    }

    /// Every heartbeat runs the full step, never the read-only probe, so a waiter's expiry
    /// moves exactly as the reference model's does (for the differential test; the probe
    /// only saves writes).
    #[doc(hidden)]
    pub fn with_exact_heartbeats(mut self) -> Self {
        self.exact_heartbeats = true;
        self
    }

    /// The read-only part of a heartbeat: `Some(Waiting)` when a full step would change
    /// nothing but this waiter's expiry and that expiry still has at least half of
    /// `waiter_ttl` to run; `Some(Granted)` when the lease is no longer queued because it
    /// holds unexpired permits (a waiter woken by its grant learns it with two reads, not a
    /// write transaction: see [`sql::read_grant`]). Otherwise `None`: run the full step.
    ///
    /// "Nothing would change" means: the waiter is queued, no holder or waiter of the
    /// semaphore has expired, and the queue head does not fit (so no hand-off is due). The
    /// probe reads one committed snapshot without the write lock; a grant committed just
    /// after it is seen at the next poll, exactly as if this heartbeat had run just before
    /// that grant.
    async fn probe_heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<Option<WaitReply>> {
        let now = self.clock.now();
        if let Some(answer) = self.probe_on_reader(name, lease, waiter_ttl, now) {
            return answer;
        }
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let Some(row) = sqlx::query(HEARTBEAT_PROBE)
            .bind(name.as_str())
            .bind(lease.to_string())
            .bind(now.0 as i64)
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?
        else {
            let rows = &mut ops::SqliteRows::new(&mut conn, name.as_str(), now).await?;
            let grant = sql::read_grant(rows, lease, now).await?;
            return Ok(grant.map(WaitReply::Granted));
        };
        let int = |i| row.try_get::<Option<i64>, _>(i).ok().flatten();
        Ok(probe_answer(
            [int(0), int(1), int(2), int(3)],
            now,
            waiter_ttl,
        ))
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        if req.weight == 0 {
            // The client checks 1 <= weight <= capacity; the schema relies on weight >= 1.
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let reply = step!(self, name, |rows| sql::acquire(rows, name, capacity, req))?;
        Ok(match reply {
            AcquireReply::Granted(grant) => {
                AcquireReply::Granted(grant_to_wall(grant, self.to_wall()))
            }
            other => other,
        })
    }

    /// Answered by a read-only probe when nothing but the waiter's own expiry would change
    /// and that expiry has at least `waiter_ttl / 2` left: waiters in other processes poll
    /// every few milliseconds, and most polls then cost a read, not the write lock. The
    /// queue entry therefore lives at least `waiter_ttl / 2` after the last heartbeat
    /// (instead of `waiter_ttl`); waiters heartbeat at least every `waiter_ttl / 3`.
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        let probed = match self.exact_heartbeats {
            true => None,
            false => self.probe_heartbeat(name, lease, waiter_ttl).await?,
        };
        let reply = match probed {
            Some(reply) => reply,
            None => step!(self, name, |rows| sql::heartbeat(rows, lease, waiter_ttl)),
        };
        Ok(match reply {
            WaitReply::Granted(grant) => WaitReply::Granted(grant_to_wall(grant, self.to_wall())),
            other => other,
        })
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        Ok(step!(self, name, |rows| sql::cancel(rows, lease)))
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        Ok(step!(self, name, |rows| sql::release(rows, lease)))
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let reply = step!(self, name, |rows| sql::renew(rows, lease, ttl));
        Ok(match reply {
            RenewReply::Renewed { expires_at, now } => {
                let wall = self.to_wall();
                RenewReply::Renewed {
                    expires_at: wall(expires_at),
                    now: wall(now),
                }
            }
            other => other,
        })
    }

    /// Read from one snapshot without the write lock when the step would change nothing
    /// (`stores/sql/snapshot.rs`, `SqliteBackend::read_status`), else the step.
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let read = match self.read_status(name).await {
            // A lock to wait for (not in WAL mode, or WAL recovery): the step waits.
            Err(Error::Store {
                kind: StoreErrorKind::Busy,
                ..
            }) => sql::Read::Step,
            read => sql::read_status(name, read)?,
        };
        let status = match read {
            sql::Read::Settled(status) => status,
            sql::Read::Step => step!(self, name, |rows| sql::status(rows, name)),
        };
        let wall = self.to_wall();
        Ok(status.map(|mut s| {
            s.now = wall(s.now);
            for h in &mut s.holders {
                h.acquired_at = wall(h.acquired_at);
                h.expires_at = wall(h.expires_at);
            }
            for w in &mut s.queue {
                w.enqueued_at = wall(w.enqueued_at);
                w.expires_at = wall(w.expires_at);
            }
            s
        }))
    }

    async fn list(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        ops::list(&mut conn).await
    }

    /// A read of the file's schema version on a pooled connection: no write transaction, no
    /// write gate, and in WAL mode no wait for a writer.
    async fn ping(&self) -> Result<()> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        ops::ping(&mut conn).await
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        step!(self, name, |rows| sql::resize(rows, name, capacity))
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        Ok(step!(self, name, |rows| sql::revoke(rows, lease)))
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        Ok(step!(self, name, |rows| sql::delete(rows)))
    }

    /// One step under the write lock: the limits' row written, then the hand-off of what
    /// they let in (`stores/sql/step.rs`).
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        step!(self, name, |rows| sql::set_tenant_limits(
            rows, name, tenant, limits
        ))
    }

    /// A read on a pooled connection: no write lock.
    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        ops::tenant_limits(&mut conn, name.as_str()).await
    }

    /// Grants reach waiters in other processes as a datagram (`notify.rs`); polling is the
    /// safety net for a datagram that was dropped or a process that joined a moment ago. It
    /// starts at 5 ms and backs off to 250 ms: a lost wake-up then costs at most a quarter
    /// of a second, and an idle waiter costs four read-only probes a second.
    fn capabilities(&self) -> Capabilities {
        // A grant is pushed through the waiter's wake socket, which may be missing (see
        // notify.rs): waiters also poll.
        Capabilities::push()
            .with_waking(Waking::PushWithPoll {
                min: Duration::from_millis(5),
                max: Duration::from_millis(250),
            })
            .with_fair_shares()
            .with_tenant_limits()
            .with_window_ceilings()
            .with_arrivals_in_flight(LOCKED_STEP_ARRIVALS)
    }

    fn rate(&self) -> Option<&dyn tessera_core::seam::RateBackend> {
        Some(self)
    }

    fn admission(&self) -> Option<&dyn AdmissionBackend> {
        Some(self)
    }
}

/// Admission: the shared SQL step's `admit` with the limiter's rows on the same connection,
/// in one `BEGIN IMMEDIATE` transaction (see `rate.rs`). Times leave the store as wall time.
#[async_trait]
impl AdmissionBackend for SqliteBackend {
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply> {
        if req.acquire.weight == 0 {
            // The client checks 1 <= weight <= capacity; the schema relies on weight >= 1.
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let reply = step!(self, name, |rows| sql::admit(
            rows, name, capacity, config, req
        ))?;
        let wall = self.to_wall();
        Ok(match reply {
            AdmitReply::Granted { grant, reservation } => AdmitReply::Granted {
                grant: grant_to_wall(grant, wall),
                reservation,
            },
            AdmitReply::Queued {
                position,
                window_at,
                now,
            } => AdmitReply::Queued {
                position,
                window_at: window_at.map(&wall),
                now: wall(now),
            },
            AdmitReply::Refused {
                available,
                queued,
                window_at,
                now,
            } => AdmitReply::Refused {
                available,
                queued,
                window_at: window_at.map(&wall),
                now: wall(now),
            },
        })
    }

    /// The release and the return of the charge in one transaction (to the lease's tenant's
    /// own limiter too under a window ceiling, `stores/sql/step.rs`). `at` comes back in wall
    /// time, as for `rate_cancel`.
    async fn give_back(&self, name: &Name, lease: LeaseId, mut g: GiveBack) -> Result<bool> {
        g.at = self.wall_to_store(g.at);
        let slack = match self.wall.is_some() {
            true => rate::CANCEL_SLACK_US,
            false => 0,
        };
        Ok(step!(self, name, |rows| sql::give_back(
            rows, name, lease, &g, slack, true
        )))
    }

    /// The release and the settle in one transaction. `at` comes back in wall time; a
    /// process converts with its own offset, which another process's differs from by less
    /// than `REANCHOR_US` unless the wall clock was stepped, so that is the slack.
    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        let mut s = *settlement;
        s.at = self.wall_to_store(s.at);
        let slack = match self.wall.is_some() {
            true => REANCHOR_US as u64,
            false => 0,
        };
        Ok(step!(self, name, |rows| sql::settle(
            rows, name, lease, &s, slack
        )))
    }
}

/// The heartbeat probe's answer from its row (see `heartbeat_probe.sql`): `Waiting` when the
/// waiter is queued, nothing of the semaphore has expired, the head does not fit and the
/// waiter's own expiry has at least half of `waiter_ttl` left; otherwise `None` (run the
/// full step).
fn probe_answer(row: [Option<i64>; 4], now: StoreTime, waiter_ttl: Duration) -> Option<WaitReply> {
    let [Some(expires_at), Some(0), Some(0), Some(1)] = row else {
        return None;
    };
    let fresh_until = now.plus(waiter_ttl / 2).0;
    (expires_at >= 0 && expires_at as u64 >= fresh_until).then_some(WaitReply::Waiting)
}

/// A grant's times in wall time (see [`SqliteBackend::to_wall`]).
fn grant_to_wall(mut grant: Grant, wall: impl Fn(StoreTime) -> StoreTime) -> Grant {
    grant.now = wall(grant.now);
    grant.lease.acquired_at = wall(grant.lease.acquired_at);
    grant.lease.expires_at = wall(grant.lease.expires_at);
    grant
}

#[cfg(test)]
mod step_tests;
/// `wall - boot` (µs) and the error bound of that measurement. Reading the two clocks is three
/// calls: the boot clock before and after the wall clock brackets it, and the offset's error
/// is at most the bracket. The tightest of a few tries is kept, so a thread held up between
/// two reads (a loaded host) does not leave its delay in the offset.
fn measure_offset(boot: &dyn Clock, wall: &dyn Clock) -> (i128, i128) {
    let (mut fresh, mut error) = (0, i128::MAX);
    for _ in 0..8 {
        let before = boot.now().0 as i128;
        let w = wall.now().0 as i128;
        let after = boot.now().0 as i128;
        if after - before < error {
            error = after - before;
            fresh = w - (before + after) / 2;
        }
        if error <= GOOD_BRACKET_US {
            break;
        }
    }
    (fresh, error)
}

/// The offset (and its error) to convert with, from the kept one and a fresh measurement: the
/// kept one stays unless the wall clock was stepped (a fresh measurement `REANCHOR_US` or more
/// away that cannot be that far off) or it was a poor measurement and the fresh one is better.
fn adopt_offset(kept: Option<(i128, i128)>, fresh: (i128, i128)) -> (i128, i128) {
    let Some((offset, kept_error)) = kept else {
        return fresh;
    };
    let replace = match (fresh.0 - offset).abs() >= REANCHOR_US {
        true => fresh.1 < REANCHOR_US,
        false => kept_error > GOOD_BRACKET_US && fresh.1 < kept_error,
    };
    match replace {
        true => fresh,
        false => (offset, kept_error),
    }
}

#[cfg(test)]
mod tests;
