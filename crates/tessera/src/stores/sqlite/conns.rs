//! The backend's own write connection: opened with its statement cache, busy handler and
//! WAL hook, and the write transaction run on it.

use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use tessera_core::error::Result;

use super::error::BUSY_TIMEOUT;
use super::{gate, ops};

/// One of the backend's own SQLite connections, opened by rusqlite beside sqlx's pool, with
/// the prepared statements of every step kept from one step to the next (`None`: not open,
/// or lost with a step cancelled while it waited for the write lock; the next user opens a
/// new one).
///
/// Compiling the dozen statements of a step again at every step was half of the
/// instructions a grant cost; on its own connection a statement is compiled once. Its
/// transactions start on the calling task's thread without waiting
/// ([`SqliteBackend::begin`]), and only wait for another process's write lock on a blocking
/// thread: a tokio worker never sleeps in the busy handler.
pub(super) type Writer = Option<rusqlite::Connection>;

/// Prepared statements kept per connection: every statement of `ops.rs` (with those of
/// tenants' limits) and the probe.
pub(super) const STATEMENT_CACHE: usize = 80;

/// Opens one of the backend's own connections ([`Writer`]) on the existing file.
pub(super) fn open_own(path: &Path) -> Result<rusqlite::Connection> {
    use rusqlite::OpenFlags;
    let db = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(ops::rq_err)?;
    db.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // As on the pooled connections: durable against a process crash (see the module docs).
    db.execute_batch("PRAGMA synchronous = NORMAL")
        .map_err(ops::rq_err)?;
    // SAFETY: the handle is this open connection's own.
    install_busy_handler(unsafe { db.handle() });
    // SAFETY: as above; the hook is a plain function without user data.
    unsafe {
        libsqlite3_sys::sqlite3_wal_hook(db.handle(), Some(wal_hook), std::ptr::null_mut());
    }
    Ok(db)
}

/// WAL pages after which a step asks for a checkpoint: SQLite's own automatic threshold.
pub(super) const CHECKPOINT_PAGES: i32 = 1000;

/// Whether a commit that left the WAL `pages` long should checkpoint it, `last` being the WAL's
/// length when this backend last did (updated when due).
///
/// SQLite's own rule (and ours before) checkpoints after every commit while the WAL is past
/// [`CHECKPOINT_PAGES`]. But a PASSIVE checkpoint copies back only the frames no reader still
/// needs, and the WAL starts over from its beginning only once every frame is copied back and
/// no reader is in it, which with several processes committing and polling often takes many
/// commits. Meanwhile each of those commits ran a checkpoint of its last few pages, each two
/// fsyncs: with 8 processes on one semaphore, about one checkpoint per grant (measured with
/// strace: 1,012 database and 2,366 WAL fsyncs for 2,400 grants). So a backend checkpoints
/// again only when the WAL has grown by another [`CHECKPOINT_PAGES`] since its last one, or
/// has started over meanwhile (it is shorter than then).
pub(super) fn checkpoint_due(last: &AtomicI32, pages: i32) -> bool {
    if pages < CHECKPOINT_PAGES {
        return false;
    }
    let at = last.load(Ordering::Relaxed);
    if pages < at || pages - at >= CHECKPOINT_PAGES {
        last.store(pages, Ordering::Relaxed);
        true
    } else {
        false
    }
}

thread_local! {
    /// The WAL's length in pages after the last commit on this thread's own connection.
    static WAL_PAGES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// Replaces SQLite's automatic checkpoint on the backend's own connections: it only
/// records the WAL's length, and the step runs the same checkpoint on the same connection
/// once its wake-ups are sent ([`WriteTx::checkpoint`]). SQLite's own ran inside COMMIT,
/// two fsyncs long, before the waiter granted by that commit could be told.
extern "C" fn wal_hook(
    _: *mut std::ffi::c_void,
    _: *mut libsqlite3_sys::sqlite3,
    _: *const std::ffi::c_char,
    pages: std::ffi::c_int,
) -> std::ffi::c_int {
    WAL_PAGES.set(pages);
    0
}

/// Runs `sql` (no parameters, no rows) through the connection's statement cache.
pub(super) fn exec_cached(db: &rusqlite::Connection, sql: &str) -> rusqlite::Result<()> {
    db.prepare_cached(sql)?.execute([]).map(drop)
}

thread_local! {
    /// Set while [`no_wait`] runs: the busy handler then gives up at once (SQLITE_BUSY).
    static NO_WAIT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` with this thread's busy handler giving up at once: on a tokio worker a
/// statement that would wait for another process's lock answers SQLITE_BUSY instead.
pub(super) fn no_wait<T>(f: impl FnOnce() -> T) -> T {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            NO_WAIT.set(false);
        }
    }
    NO_WAIT.set(true);
    let _reset = Reset;
    f()
}

/// An open `BEGIN IMMEDIATE` transaction on the backend's writer connection, holding the
/// writer's mutex. Dropped without [`WriteTx::commit`] (an error, or a step that failed), it
/// rolls back; a connection that cannot roll back is closed, which rolls back too.
pub(super) struct WriteTx<'a> {
    pub(super) slot: tokio::sync::MutexGuard<'a, Writer>,
    pub(super) db: Writer,
    /// The write gate, released right after COMMIT, or after the rollback of a dropped one.
    pub(super) gate: Option<gate::GateHeld>,
}

impl WriteTx<'_> {
    pub(super) fn db(&mut self) -> &mut rusqlite::Connection {
        self.db
            .as_mut()
            .expect("the connection stays until the transaction is dropped")
    }

    /// Commits; the WAL's length in pages after it. With the write lock held in WAL mode,
    /// COMMIT waits for no lock: it runs without waiting, on the caller's thread.
    pub(super) fn commit(&mut self) -> Result<i32> {
        let db = self.db();
        WAL_PAGES.set(0);
        no_wait(|| exec_cached(db, "COMMIT")).map_err(ops::rq_err)?;
        self.gate = None;
        Ok(WAL_PAGES.get())
    }
}

impl WriteTx<'_> {
    /// After the commit, checkpoints the WAL as SQLite's automatic checkpoint does (PASSIVE:
    /// it waits for no lock and blocks no writer), on this connection before its next
    /// transaction, so the WAL restarts from its beginning as often as it did. Failures are
    /// left to the next commit past [`CHECKPOINT_PAGES`].
    pub(super) fn checkpoint(&mut self) {
        let db = self.db();
        let done = no_wait(|| db.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())));
        if let Err(e) = done {
            tracing::debug!(error = %e, "SQLite checkpoint failed; the next commit asks again");
        }
    }
}

impl Drop for WriteTx<'_> {
    fn drop(&mut self) {
        let Some(db) = self.db.take() else { return };
        if !db.is_autocommit() && no_wait(|| exec_cached(&db, "ROLLBACK")).is_err() {
            // Closing the connection rolls its transaction back.
            return;
        }
        *self.slot = Some(db);
    }
}

/// Replaces SQLite's default busy handler, whose sleeps grow to 100 ms, with short ones.
///
/// Under contention between processes the write lock changes hands every few hundred
/// microseconds; the default handler (1, 2, 5, 10, … 100 ms) left a waiting process asleep
/// long after the lock was free, which made the tail of the wait, not the work, dominate.
/// This one sleeps 50 µs doubling up to 1 ms, and gives up after [`BUSY_TIMEOUT`] in total;
/// inside [`no_wait`] it gives up at once.
pub(super) fn install_busy_handler(db: *mut libsqlite3_sys::sqlite3) {
    extern "C" fn busy(_: *mut std::ffi::c_void, tries: std::ffi::c_int) -> std::ffi::c_int {
        if NO_WAIT.get() {
            return 0;
        }
        // 50, 100, 200, 400, 800 µs, then 1 ms per try.
        let sleep_us: u64 = if tries < 5 { 50 << tries } else { 1_000 };
        let slept_us: u64 = (0..tries.min(5) as u64).map(|t| 50 << t).sum::<u64>()
            + (tries.max(5) as u64 - 5) * 1_000;
        if slept_us >= BUSY_TIMEOUT.as_micros() as u64 {
            return 0;
        }
        std::thread::sleep(Duration::from_micros(sleep_us));
        1
    }
    // SAFETY: `db` is a live connection handle locked for this thread by sqlx's
    // `lock_handle`; the callback has no user data and is a plain function.
    unsafe {
        libsqlite3_sys::sqlite3_busy_handler(db, Some(busy), std::ptr::null_mut());
    }
}
