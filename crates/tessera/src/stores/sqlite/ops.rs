//! The SQLite dialect of the shared SQL step (`stores/sql`): its statements over the tables
//! of `schema.sql`, and the row operations ([`SemRows`]) that run them.
//!
//! Every step runs inside one `BEGIN IMMEDIATE` transaction opened by the caller (`mod.rs`),
//! so it holds SQLite's write lock before its first read: no other connection, in this
//! process or another, can interleave between the purge, the decision and the hand-off, and
//! [`SemRows::load`] needs no lock of its own. The clock is the host's, read by the caller
//! once the write lock is held and handed to [`SqliteRows::new`]. SQLite has `RETURNING`
//! and a two-argument scalar `max()`; placeholders are `?1`, `?2`, … and `?1` is always the
//! semaphore's name.

use sqlx::sqlite::{LockedSqliteHandle, SqliteConnection};
use sqlx::Row;

use super::error::map_err;
use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::StoreTime;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use tessera_core::stores::sql::{decode_seats, encode_seats};
use tessera_core::stores::sql::{
    Dirty, Freed, HeadKey, HeadRow, HolderRow, LimitRow, Loaded, NewHolder, NewWaiter, Place,
    QueueRow, SemRow, SemRows, Snapshot, WaiterRow,
};

/// The fence high-water mark, the semaphore's row if it has one (NULLs if not), and how
/// many tenants have limits on the name (an index probe in the same statement).
/// The semaphore's two rows (`docs/sql-queue.md`) in one statement: a tail row missing beside
/// a semaphore row reads as an empty tail. The file's write lock (`BEGIN IMMEDIATE`) covers
/// both, so the step sees them as one.
const LOAD_SEM: &str = "SELECT m.value, s.capacity, s.used, coalesce(t.enqueued, 0), \
     s.dequeued, s.last_fence, coalesce(t.next_seq, 0), s.seat_high, s.vtime, \
     coalesce(t.finish, 0), s.tenants, \
     (SELECT count(*) FROM tessera_tenant_limits WHERE name = ?1) FROM tessera_meta m \
     LEFT JOIN tessera_semaphores s ON s.name = ?1 \
     LEFT JOIN tessera_tails t ON t.name = ?1 WHERE m.key = 'fence_hwm'";
const SAVE_SEM: &str = "INSERT INTO tessera_semaphores \
     (name, capacity, used, dequeued, last_fence, seat_high, vtime, tenants) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
     ON CONFLICT (name) DO UPDATE SET capacity = ?2, used = ?3, dequeued = ?4, \
     last_fence = ?5, seat_high = ?6, vtime = ?7, tenants = ?8";
const SAVE_TAIL: &str = "INSERT INTO tessera_tails (name, next_seq, enqueued, finish) \
     VALUES (?1, ?2, ?3, ?4) \
     ON CONFLICT (name) DO UPDATE SET next_seq = ?2, enqueued = ?3, finish = ?4";
const DROP_SEM: &str = "DELETE FROM tessera_semaphores WHERE name = ?1";
const DROP_TAIL: &str = "DELETE FROM tessera_tails WHERE name = ?1";
const DROP_FREE_SEATS: &str = "DELETE FROM tessera_free_seats WHERE name = ?1";
const SAVE_HWM: &str = "UPDATE tessera_meta SET value = ?1 WHERE key = 'fence_hwm'";

const PURGE_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ?1 AND expires_at <= ?2 \
     RETURNING weight, seats";
const PURGE_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ?1 AND expires_at <= ?2";

const GET_HOLDER: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at, \
     tenant FROM tessera_holders WHERE name = ?1 AND lease_id = ?2";
const ALL_HOLDERS: &str =
    "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at, \
     tenant FROM tessera_holders WHERE name = ?1 ORDER BY acquired_at, fence";
const INSERT_HOLDER: &str = "INSERT INTO tessera_holders \
     (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at, tenant) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
const REMOVE_HOLDER: &str = "DELETE FROM tessera_holders WHERE name = ?1 AND lease_id = ?2 \
     RETURNING weight, seats";
const RENEW_HOLDER: &str = "UPDATE tessera_holders SET expires_at = max(expires_at, ?3) \
     WHERE name = ?1 AND lease_id = ?2 RETURNING expires_at";

/// Pops the queue head (order `tag, seq`) if its weight is at most `?2` (the free permits)
/// and it is not an admission waiter.
const POP_HEAD_IF_FITS: &str = "DELETE FROM tessera_waiters WHERE name = ?1 \
     AND seq = (SELECT seq FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq LIMIT 1) \
     AND weight <= ?2 AND gate IS NULL \
     RETURNING lease_id, weight, holder, ttl, wake, expires_at, tag, tenant";
/// Marks woken the queue head if it is an admission waiter that fits in `?2` and whose gate
/// is at most `?3` (see `SemRows::wake_gated_head`).
const WAKE_GATED_HEAD: &str = "UPDATE tessera_waiters SET gate = 9223372036854775807 \
     WHERE name = ?1 \
     AND seq = (SELECT seq FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq LIMIT 1) \
     AND weight <= ?2 AND gate <= ?3 RETURNING lease_id, wake";
const SET_GATE: &str = "UPDATE tessera_waiters SET gate = ?3 WHERE name = ?1 AND lease_id = ?2";
/// The head's key and the queue's lowest seq.
const HEAD_KEY: &str = "SELECT tag, seq, (SELECT min(seq) FROM tessera_waiters WHERE name = ?1) \
     FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq LIMIT 1";
const INSERT_WAITER: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, wake, gate, tag, tenant) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)";
const REMOVE_WAITER: &str = "DELETE FROM tessera_waiters WHERE name = ?1 AND lease_id = ?2";
const REFRESH_WAITER: &str = "UPDATE tessera_waiters SET expires_at = max(expires_at, ?3) \
     WHERE name = ?1 AND lease_id = ?2";
/// A queued waiter's place: the waiters before its `(tag, seq)`, and its tag.
const WAITER_PLACE: &str = "SELECT (SELECT count(*) FROM tessera_waiters o WHERE o.name = ?1 \
     AND (o.tag, o.seq) < (w.tag, w.seq)), w.tag \
     FROM tessera_waiters w WHERE w.name = ?1 AND w.lease_id = ?2";
const WAITERS_AHEAD: &str = "SELECT count(*) FROM tessera_waiters \
     WHERE name = ?1 AND (tag, seq) < (?2, ?3)";
const ALL_WAITERS: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at, tenant \
     FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq";

/// `status` without the write lock (`stores/sql/snapshot.rs`, [`SqliteRows::read_snapshot`]):
/// the row's counters, then the queue with each waiter's gate, in the order of
/// [`ALL_WAITERS`] (the holders are [`ALL_HOLDERS`]).
const READ_SEM: &str = "SELECT s.capacity, s.used, coalesce(t.enqueued, 0) - s.dequeued \
     FROM tessera_semaphores s LEFT JOIN tessera_tails t ON t.name = s.name WHERE s.name = ?1";
const READ_WAITERS: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at, tenant, \
     gate FROM tessera_waiters WHERE name = ?1 ORDER BY tag, seq";

const TENANT_FINISH: &str = "SELECT finish FROM tessera_tenants WHERE name = ?1 AND tenant = ?2";
const SAVE_TENANT: &str = "INSERT INTO tessera_tenants (name, tenant, finish) \
     VALUES (?1, ?2, ?3) ON CONFLICT (name, tenant) DO UPDATE SET finish = ?3";
const PRUNE_TENANTS: &str = "DELETE FROM tessera_tenants WHERE name = ?1 AND finish <= ?2";
const DROP_TENANTS: &str = "DELETE FROM tessera_tenants WHERE name = ?1";

/// Tenants' ceilings and floors (`docs/fair-shares.md`, "Ceilings and floors"), and what
/// the step with limits reads: the permits per tenant and the queue.
/// With the window ceilings (`docs/fair-shares.md`, "A ceiling on a share of the windows")
/// and the window-capped-until instants, which a save leaves as they are and
/// [`CAP_WINDOW`] sets.
pub(super) const TENANT_LIMITS: &str = "SELECT tenant, ceiling, floor, window_ceiling, \
     window_capped_until FROM tessera_tenant_limits WHERE name = ?1 ORDER BY tenant";
const SAVE_TENANT_LIMITS: &str =
    "INSERT INTO tessera_tenant_limits (name, tenant, ceiling, floor, window_ceiling) \
     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (name, tenant) \
     DO UPDATE SET ceiling = ?3, floor = ?4, window_ceiling = ?5";
const CAP_WINDOW: &str = "UPDATE tessera_tenant_limits SET window_capped_until = ?3 \
     WHERE name = ?1 AND tenant = ?2";
const DROP_TENANT_LIMITS: &str =
    "DELETE FROM tessera_tenant_limits WHERE name = ?1 AND tenant = ?2";
const DROP_ALL_TENANT_LIMITS: &str = "DELETE FROM tessera_tenant_limits WHERE name = ?1";
const HELD_BY_TENANT: &str = "SELECT tenant, sum(weight) FROM tessera_holders \
     WHERE name = ?1 AND tenant IS NOT NULL GROUP BY tenant";
const QUEUE: &str = "SELECT lease_id, weight, tenant, gate, tag, seq FROM tessera_waiters \
     WHERE name = ?1 ORDER BY tag, seq";
/// [`POP_HEAD_IF_FITS`] for a waiter the hand-off with limits chose.
const POP_WAITER: &str = "DELETE FROM tessera_waiters WHERE name = ?1 AND lease_id = ?2 \
     RETURNING lease_id, weight, holder, ttl, wake, expires_at, tag, tenant";
/// [`WAKE_GATED_HEAD`] for the head the hand-off with limits chose.
const WAKE_GATED: &str = "UPDATE tessera_waiters SET gate = 9223372036854775807 \
     WHERE name = ?1 AND lease_id = ?2 AND gate <= ?3 RETURNING lease_id, wake";

const TAKE_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ?1 AND seat < ?2 ORDER BY seat LIMIT ?3";
const DROP_FREE_SEATS_UP_TO: &str = "DELETE FROM tessera_free_seats WHERE name = ?1 AND seat <= ?2";
const DROP_FREE_SEATS_FROM: &str = "DELETE FROM tessera_free_seats WHERE name = ?1 AND seat >= ?2";
const INSERT_FREE_SEAT_RANGE: &str = "WITH RECURSIVE r(s) AS \
     (SELECT ?2 UNION ALL SELECT s + 1 FROM r WHERE s < ?3) \
     INSERT INTO tessera_free_seats (name, seat) SELECT ?1, s FROM r";
const TOP_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ?1 AND seat < ?2 ORDER BY seat DESC LIMIT ?3";

const DROP_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ?1 RETURNING lease_id";
const DROP_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ?1 RETURNING lease_id";
const LIST: &str = "SELECT name FROM tessera_semaphores ORDER BY name";

/// The row operations of one semaphore inside the caller's `BEGIN IMMEDIATE` transaction.
///
/// The statements run on this task's thread, straight on an SQLite handle through
/// `rusqlite`, not one by one through sqlx's worker thread: sqlx hands every statement and
/// every row to the connection's own thread and back, and under contention between
/// processes those thread switches, not SQLite, were most of a step's time.
///
/// The handle is the backend's own connection ([`SqliteRows::on`], see `Writer` in
/// `mod.rs`), whose prepared statements are kept from step to step: compiling the step's
/// dozen statements again at every step was half of the instructions a grant cost (SQLite's
/// parser, under callgrind). Tests and the fallback reads use a pooled sqlx connection's
/// handle instead ([`SqliteRows::new`]), taken from sqlx's worker for the life of this
/// value ([`LockedSqliteHandle`]); its statements are compiled per value. Either way the
/// handle is used only inside a transaction that already holds SQLite's write lock, or for
/// reads: no statement here waits for a lock, so none blocks the thread for longer than its
/// own work.
pub(crate) struct SqliteRows<'c> {
    db: Db<'c>,
    name: &'c str,
    now: StoreTime,
    wall: StoreTime,
    /// This backend's wake-up socket, recorded with the waiters it queues (see `notify.rs`).
    wake: Option<&'c str>,
    /// The waiters granted by this step whose row named their process's wake-up socket:
    /// `(lease id, socket)`.
    woken: Vec<(String, String)>,
    /// The limiter the rate statements of an admission are about: `None`, the name's own;
    /// else a tenant's own limiter's key (`TenantLimiterRows::point_at`).
    limiter: Option<String>,
}

/// The connection a [`SqliteRows`] runs its statements on.
enum Db<'c> {
    /// The backend's own connection, with its statement cache.
    Own(&'c mut rusqlite::Connection),
    /// A pooled sqlx connection's handle seen through rusqlite; the connection is declared
    /// first, so it is dropped (and its statements finalized) while the handle is still
    /// locked.
    Pooled {
        db: rusqlite::Connection,
        _handle: LockedSqliteHandle<'c>,
    },
}

impl<'c> SqliteRows<'c> {
    /// On a pooled sqlx connection (see [`Db::Pooled`]). `now` is the store's clock, read
    /// once the write lock is held; the fences' wall-clock floor is `now` too unless set by
    /// [`SqliteRows::wall`].
    pub(crate) async fn new(
        conn: &'c mut SqliteConnection,
        name: &'c str,
        now: StoreTime,
    ) -> Result<SqliteRows<'c>> {
        let mut handle = conn.lock_handle().await.map_err(map_err)?;
        // SAFETY: the handle is live and locked away from sqlx's worker thread until the
        // handle guard is dropped, after the rusqlite value; `from_handle` never closes it.
        let db = unsafe { rusqlite::Connection::from_handle(handle.as_raw_handle().as_ptr()) }
            .map_err(rq_err)?;
        Ok(SqliteRows {
            db: Db::Pooled {
                db,
                _handle: handle,
            },
            name,
            now,
            wall: now,
            wake: None,
            woken: Vec::new(),
            limiter: None,
        })
    }

    /// On the backend's own connection `db` (see [`Db::Own`]); otherwise as
    /// [`SqliteRows::new`].
    pub(crate) fn on(db: &'c mut rusqlite::Connection, name: &'c str, now: StoreTime) -> Self {
        SqliteRows {
            db: Db::Own(db),
            name,
            now,
            wall: now,
            wake: None,
            woken: Vec::new(),
            limiter: None,
        }
    }

    /// The wall clock read beside `now`, the fences' floor.
    pub(crate) fn wall(mut self, wall: StoreTime) -> Self {
        self.wall = wall;
        self
    }

    /// This backend's wake-up socket (its name in the wake-up folder), recorded with every
    /// waiter this value queues, so that whoever grants it wakes only this process.
    pub(crate) fn wake(mut self, socket: Option<&'c str>) -> Self {
        self.wake = socket;
        self
    }

    /// The `(lease id, wake-up socket)` of the waiters granted so far that recorded one.
    pub(crate) fn take_woken(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.woken)
    }

    /// The semaphore's (and, for an admission, the limiter's) name.
    pub(super) fn name(&self) -> &str {
        self.name
    }

    /// The key of the limiter an admission's rate statements are about: the name, or a
    /// tenant's own limiter's key while pointed at it.
    pub(super) fn limiter(&self) -> &str {
        self.limiter.as_deref().unwrap_or(self.name)
    }

    /// Points the rate statements at limiter `key` (`None`: the name's own).
    pub(super) fn point_at(&mut self, key: Option<String>) {
        self.limiter = key;
    }

    /// The store's time of this step.
    pub(super) fn now(&self) -> StoreTime {
        self.now
    }

    /// The connection the statements run on.
    pub(crate) fn db(&self) -> &rusqlite::Connection {
        match &self.db {
            Db::Own(db) => db,
            Db::Pooled { db, .. } => db,
        }
    }

    /// `sql` prepared, with the name as `?1`, then `lease` if given, then `args`.
    fn bound(
        &self,
        sql: &'static str,
        lease: Option<&str>,
        args: &[i64],
    ) -> Result<rusqlite::CachedStatement<'_>> {
        let mut st = self.db().prepare_cached(sql).map_err(rq_err)?;
        st.raw_bind_parameter(1, self.name).map_err(rq_err)?;
        let mut i = 2;
        if let Some(lease) = lease {
            st.raw_bind_parameter(i, lease).map_err(rq_err)?;
            i += 1;
        }
        for &a in args {
            st.raw_bind_parameter(i, a).map_err(rq_err)?;
            i += 1;
        }
        Ok(st)
    }

    /// Runs `sql` (see [`SqliteRows::bound`]); how many rows it changed.
    fn exec(&self, sql: &'static str, lease: Option<&str>, args: &[i64]) -> Result<u64> {
        let mut st = self.bound(sql, lease, args)?;
        Ok(st.raw_execute().map_err(rq_err)? as u64)
    }

    /// Every row of `sql` (see [`SqliteRows::bound`]), each read by `read`. A statement with
    /// `RETURNING` runs to its end.
    fn fetch<T>(
        &self,
        sql: &'static str,
        lease: Option<&str>,
        args: &[i64],
        read: impl Fn(&rusqlite::Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut st = self.bound(sql, lease, args)?;
        let mut rows = st.raw_query();
        let mut out = Vec::new();
        while let Some(row) = rows.next().map_err(rq_err)? {
            out.push(read(row)?);
        }
        Ok(out)
    }

    /// The first row of `sql` with the name and `lease`, if any.
    fn fetch_lease<T>(
        &self,
        sql: &'static str,
        lease: &str,
        read: impl Fn(&rusqlite::Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        Ok(self.fetch(sql, Some(lease), &[], read)?.into_iter().next())
    }
}

impl SqliteRows<'_> {
    /// Reads the semaphore in one deferred read transaction, which takes no write lock and,
    /// in WAL mode, waits for no writer: its snapshot is taken by the first read (the row),
    /// and `clock` is read after it, then the holders and the queue. `None` without a
    /// semaphore row. The transaction ends here (committed, or rolled back after an error);
    /// the caller drops a connection still in one ([`SqliteRows::in_transaction`]). Meant to run under `no_wait`: a lock it would wait for is `Busy` at once.
    pub(crate) fn read_snapshot(&self, clock: impl Fn() -> StoreTime) -> Result<Option<Snapshot>> {
        self.in_read_transaction(|rows| rows.read_in_snapshot(clock))
    }

    /// Runs `read` inside one deferred read transaction (see [`SqliteRows::read_snapshot`]),
    /// which ends here: committed, or rolled back after an error.
    pub(crate) fn in_read_transaction<T>(
        &self,
        read: impl FnOnce(&Self) -> Result<T>,
    ) -> Result<T> {
        self.db()
            .prepare_cached("BEGIN")
            .and_then(|mut b| b.execute([]))
            .map_err(rq_err)?;
        let read = read(self);
        let end = if read.is_ok() { "COMMIT" } else { "ROLLBACK" };
        let ended = self
            .db()
            .prepare_cached(end)
            .and_then(|mut e| e.execute([]));
        if !self.db().is_autocommit() {
            // A commit that failed leaves the read transaction open: never hand the
            // connection on inside an old snapshot.
            let _ = self.db().execute_batch("ROLLBACK");
        }
        let read = read?;
        ended.map_err(rq_err)?;
        Ok(read)
    }

    /// Whether the connection is still inside a transaction (after
    /// [`SqliteRows::read_snapshot`], only if even its rollback failed).
    pub(crate) fn in_transaction(&self) -> bool {
        !self.db().is_autocommit()
    }

    fn read_in_snapshot(&self, clock: impl Fn() -> StoreTime) -> Result<Option<Snapshot>> {
        let sem = self.fetch(READ_SEM, None, &[], |r| {
            Ok((int_at(r, 0)?, int_at(r, 1)?, int_at(r, 2)?))
        })?;
        let Some(&(capacity, used, queued)) = sem.first() else {
            return Ok(None);
        };
        let now = clock();
        let holders = self.fetch(ALL_HOLDERS, None, &[], holder_at)?;
        let waiters = self.fetch(READ_WAITERS, None, &[], |row| {
            let gate = row
                .get::<_, Option<i64>>(6)
                .map_err(|e| corrupt(format!("waiter gate: {e}")))?;
            Ok((waiter_at(row)?, gate))
        })?;
        let head_gate = waiters.first().and_then(|(_, gate)| *gate);
        let rows: Vec<WaiterRow> = waiters.into_iter().map(|(w, _)| w).collect();
        let (holders, queue) = Snapshot::rows(&holders, &rows)?;
        Ok(Some(Snapshot {
            now,
            capacity,
            used,
            queued,
            holders,
            queue,
            head_gate,
        }))
    }
}

impl SemRows for SqliteRows<'_> {
    async fn load(&mut self, _create: Option<u32>) -> Result<Loaded> {
        let (hwm, sem, limits) = self
            .fetch(LOAD_SEM, None, &[], |row| {
                let exists = row
                    .get::<_, Option<i64>>(1)
                    .map_err(|e| corrupt(format!("capacity: {e}")))?
                    .is_some();
                let sem = match exists {
                    true => Some(SemRow {
                        capacity: int_at(row, 1)?,
                        used: int_at(row, 2)?,
                        enqueued: int_at(row, 3)?,
                        dequeued: int_at(row, 4)?,
                        last_fence: int_at(row, 5)?,
                        next_seq: int_at(row, 6)?,
                        seat_high: int_at(row, 7)?,
                        vtime: int_at(row, 8)?,
                        finish: int_at(row, 9)?,
                        tenants: int_at(row, 10)?,
                    }),
                    false => None,
                };
                Ok((int_at(row, 0)?, sem, int_at(row, 11)?))
            })?
            .into_iter()
            .next()
            .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
        Ok(Loaded {
            now: self.now,
            wall: self.wall,
            hwm,
            sem,
            limits,
        })
    }

    async fn save(&mut self, s: &SemRow, dirty: Dirty) -> Result<()> {
        if dirty.sem {
            let args = [
                s.capacity,
                s.used,
                s.dequeued,
                s.last_fence,
                s.seat_high,
                s.vtime,
                s.tenants,
            ];
            self.exec(SAVE_SEM, None, &args)?;
        }
        if dirty.tail {
            self.exec(SAVE_TAIL, None, &[s.next_seq, s.enqueued, s.finish])?;
        }
        Ok(())
    }

    async fn drop_semaphore(&mut self) -> Result<bool> {
        self.exec(DROP_TAIL, None, &[])?;
        Ok(self.exec(DROP_SEM, None, &[])? > 0)
    }

    async fn raise_hwm(&mut self, hwm: i64) -> Result<()> {
        // The meta row is under the same write lock: a plain write cannot lower it.
        let mut st = self.db().prepare_cached(SAVE_HWM).map_err(rq_err)?;
        st.execute([hwm]).map_err(rq_err).map(drop)
    }

    async fn purge_holders(&mut self, now: i64) -> Result<Vec<Freed>> {
        self.fetch(PURGE_HOLDERS, None, &[now], freed_at)
    }

    async fn purge_waiters(&mut self, now: i64) -> Result<u64> {
        self.exec(PURGE_WAITERS, None, &[now])
    }

    async fn holder(&mut self, lease: &str) -> Result<Option<HolderRow>> {
        self.fetch_lease(GET_HOLDER, lease, holder_at)
    }

    async fn holders(&mut self) -> Result<Vec<HolderRow>> {
        self.fetch(ALL_HOLDERS, None, &[], holder_at)
    }

    async fn insert_holder(&mut self, h: &NewHolder<'_>) -> Result<()> {
        let mut st = self.db().prepare_cached(INSERT_HOLDER).map_err(rq_err)?;
        st.execute(rusqlite::params![
            self.name,
            h.lease_id,
            h.weight,
            h.seats,
            h.fence,
            h.holder,
            h.acquired_at,
            h.expires_at,
            h.tenant
        ])
        .map_err(rq_err)
        .map(drop)
    }

    async fn remove_holder(&mut self, lease: &str) -> Result<Option<Freed>> {
        self.fetch_lease(REMOVE_HOLDER, lease, freed_at)
    }

    async fn renew_holder(&mut self, lease: &str, at: i64) -> Result<Option<i64>> {
        let renewed = self.fetch(RENEW_HOLDER, Some(lease), &[at], |r| int_at(r, 0))?;
        Ok(renewed.into_iter().next())
    }

    async fn pop_head_if_fits(&mut self, available: i64) -> Result<Option<HeadRow>> {
        let head = self.fetch(POP_HEAD_IF_FITS, None, &[available], head_at)?;
        Ok(self.popped(head))
    }

    async fn insert_waiter(&mut self, w: &NewWaiter<'_>) -> Result<()> {
        let mut st = self.db().prepare_cached(INSERT_WAITER).map_err(rq_err)?;
        st.execute(rusqlite::params![
            self.name,
            w.seq,
            w.lease_id,
            w.weight,
            w.holder,
            w.ttl,
            w.enqueued_at,
            w.expires_at,
            self.wake,
            w.gate,
            w.tag,
            w.tenant
        ])
        .map_err(rq_err)
        .map(drop)
    }

    async fn wake_gated_head(&mut self, available: i64, now: i64) -> Result<Option<String>> {
        let woken = self.fetch(WAKE_GATED_HEAD, None, &[available, now], woken_at)?;
        Ok(self.woke(woken))
    }

    async fn set_gate(&mut self, lease: &str, gate: i64) -> Result<()> {
        self.exec(SET_GATE, Some(lease), &[gate]).map(drop)
    }

    async fn head_key(&mut self) -> Result<Option<HeadKey>> {
        let head = self.fetch(HEAD_KEY, None, &[], |row| {
            Ok(HeadKey {
                tag: int_at(row, 0)?,
                seq: int_at(row, 1)?,
                min_seq: int_at(row, 2)?,
            })
        })?;
        Ok(head.into_iter().next())
    }

    async fn tenant_finish(&mut self, tenant: &str) -> Result<Option<i64>> {
        self.fetch_lease(TENANT_FINISH, tenant, |r| int_at(r, 0))
    }

    async fn save_tenant(&mut self, tenant: &str, finish: i64) -> Result<()> {
        self.exec(SAVE_TENANT, Some(tenant), &[finish]).map(drop)
    }

    async fn prune_tenants(&mut self, vtime: i64) -> Result<u64> {
        self.exec(PRUNE_TENANTS, None, &[vtime])
    }

    async fn drop_tenants(&mut self) -> Result<()> {
        self.exec(DROP_TENANTS, None, &[]).map(drop)
    }

    async fn remove_waiter(&mut self, lease: &str) -> Result<u64> {
        self.exec(REMOVE_WAITER, Some(lease), &[])
    }

    async fn refresh_waiter(&mut self, lease: &str, at: i64) -> Result<u64> {
        self.exec(REFRESH_WAITER, Some(lease), &[at])
    }

    async fn waiter_place(&mut self, lease: &str) -> Result<Option<Place>> {
        self.fetch_lease(WAITER_PLACE, lease, |r| {
            Ok(Place {
                ahead: int_at(r, 0)?,
                tag: int_at(r, 1)?,
            })
        })
    }

    async fn waiters_ahead(&mut self, tag: i64, seq: i64) -> Result<i64> {
        let n = self.fetch(WAITERS_AHEAD, None, &[tag, seq], |r| int_at(r, 0))?;
        n.into_iter()
            .next()
            .ok_or_else(|| corrupt("no waiter count"))
    }

    async fn waiters(&mut self) -> Result<Vec<WaiterRow>> {
        self.fetch(ALL_WAITERS, None, &[], waiter_at)
    }

    async fn take_free_seats(&mut self, below: i64, n: i64) -> Result<Vec<i64>> {
        let seats = self.fetch(TAKE_FREE_SEATS, None, &[below, n], |r| int_at(r, 0))?;
        if let Some(&last) = seats.last() {
            // Every free seat up to `last` is one just taken (they are the lowest).
            self.exec(DROP_FREE_SEATS_UP_TO, None, &[last])?;
        }
        Ok(seats)
    }

    async fn insert_free_seats(&mut self, lo: i64, hi: i64) -> Result<()> {
        self.exec(INSERT_FREE_SEAT_RANGE, None, &[lo, hi]).map(drop)
    }

    async fn top_free_seats(&mut self, below: i64, limit: i64) -> Result<Vec<i64>> {
        self.fetch(TOP_FREE_SEATS, None, &[below, limit], |r| int_at(r, 0))
    }

    async fn drop_free_seats_from(&mut self, seat: i64) -> Result<()> {
        self.exec(DROP_FREE_SEATS_FROM, None, &[seat]).map(drop)
    }

    async fn drop_free_seats(&mut self) -> Result<()> {
        self.exec(DROP_FREE_SEATS, None, &[]).map(drop)
    }

    async fn drop_holders(&mut self) -> Result<Vec<String>> {
        self.fetch(DROP_HOLDERS, None, &[], |r| text_at(r, 0))
    }

    async fn drop_waiters(&mut self) -> Result<Vec<String>> {
        self.fetch(DROP_WAITERS, None, &[], |r| text_at(r, 0))
    }

    async fn tenant_limits(&mut self) -> Result<Vec<LimitRow>> {
        self.fetch(TENANT_LIMITS, None, &[], limit_at)
    }

    async fn save_tenant_limits(&mut self, row: &LimitRow) -> Result<()> {
        let mut st = self
            .db()
            .prepare_cached(SAVE_TENANT_LIMITS)
            .map_err(rq_err)?;
        st.execute(rusqlite::params![
            self.name,
            row.tenant,
            row.ceiling,
            row.floor,
            row.window_ceiling
        ])
        .map_err(rq_err)
        .map(drop)
    }

    async fn cap_window(&mut self, tenant: &str, until: Option<i64>) -> Result<()> {
        let mut st = self.db().prepare_cached(CAP_WINDOW).map_err(rq_err)?;
        st.execute(rusqlite::params![self.name, tenant, until])
            .map_err(rq_err)
            .map(drop)
    }

    async fn drop_tenant_limits(&mut self, tenant: &str) -> Result<()> {
        self.exec(DROP_TENANT_LIMITS, Some(tenant), &[]).map(drop)
    }

    async fn drop_all_tenant_limits(&mut self) -> Result<u64> {
        self.exec(DROP_ALL_TENANT_LIMITS, None, &[])
    }

    async fn held_by_tenant(&mut self) -> Result<Vec<(String, i64)>> {
        self.fetch(HELD_BY_TENANT, None, &[], |r| {
            Ok((text_at(r, 0)?, int_at(r, 1)?))
        })
    }

    async fn queue(&mut self) -> Result<Vec<QueueRow>> {
        self.fetch(QUEUE, None, &[], |row| {
            Ok(QueueRow {
                lease_id: text_at(row, 0)?,
                weight: int_at(row, 1)?,
                tenant: opt_text_at(row, 2)?,
                gate: row
                    .get::<_, Option<i64>>(3)
                    .map_err(|e| corrupt(format!("waiter gate: {e}")))?,
                tag: int_at(row, 4)?,
                seq: int_at(row, 5)?,
            })
        })
    }

    async fn pop_waiter(&mut self, lease: &str) -> Result<Option<HeadRow>> {
        let head = self.fetch(POP_WAITER, Some(lease), &[], head_at)?;
        Ok(self.popped(head))
    }

    async fn wake_gated(&mut self, lease: &str, now: i64) -> Result<Option<String>> {
        let woken = self.fetch(WAKE_GATED, Some(lease), &[now], woken_at)?;
        Ok(self.woke(woken))
    }
}

impl SqliteRows<'_> {
    /// The waiter a hand-off popped, its wake-up socket (if its row named one) kept to wake.
    fn popped(&mut self, head: Vec<(HeadRow, Option<String>)>) -> Option<HeadRow> {
        let (head, wake) = head.into_iter().next()?;
        if let Some(wake) = wake {
            self.woken.push((head.lease_id.clone(), wake));
        }
        Some(head)
    }

    /// The admission waiter a hand-off marked woken, as [`SqliteRows::popped`].
    fn woke(&mut self, woken: Vec<(String, Option<String>)>) -> Option<String> {
        let (lease, wake) = woken.into_iter().next()?;
        if let Some(wake) = wake {
            self.woken.push((lease.clone(), wake));
        }
        Some(lease)
    }
}

/// The names of the semaphores the file holds state for (no transaction needed).
pub(crate) async fn list(conn: &mut SqliteConnection) -> Result<Vec<String>> {
    sqlx::query(LIST)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| {
            row.try_get::<String, _>(0)
                .map_err(|e| corrupt(format!("column 0: {e}")))
        })
        .collect()
}

/// The tenants' limits kept for `name` (no transaction needed: one statement).
pub(crate) async fn tenant_limits(
    conn: &mut SqliteConnection,
    name: &str,
) -> Result<std::collections::BTreeMap<String, tessera_core::model::TenantLimits>> {
    let rows = sqlx::query(TENANT_LIMITS)
        .bind(name)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| {
            let get = |e: sqlx::Error| corrupt(format!("tenant limits: {e}"));
            Ok(LimitRow {
                tenant: row.try_get::<String, _>(0).map_err(get)?,
                ceiling: row.try_get::<Option<i64>, _>(1).map_err(get)?,
                floor: row.try_get::<i64, _>(2).map_err(get)?,
                window_ceiling: row.try_get::<Option<i64>, _>(3).map_err(get)?,
                window_capped_until: row.try_get::<Option<i64>, _>(4).map_err(get)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    tessera_core::stores::sql::tenant_limits_of(rows)
}

/// [`crate::Store::ping`]: reads the schema version (the database header), writing nothing.
pub(crate) async fn ping(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::query("PRAGMA schema_version")
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)
        .map(drop)
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

/// A rusqlite error as the store's error, classified as [`map_err`] classifies sqlx's.
pub(crate) fn rq_err(e: rusqlite::Error) -> Error {
    use rusqlite::Error as E;
    let kind = match &e {
        E::SqliteFailure(f, _) => match f.extended_code & 0xff {
            5 | 6 => StoreErrorKind::Busy,         // SQLITE_BUSY, SQLITE_LOCKED
            10 | 14 => StoreErrorKind::Connection, // SQLITE_IOERR, SQLITE_CANTOPEN
            11 | 26 => return corrupt(format!("SQLite: {e}")), // CORRUPT, NOTADB
            _ => StoreErrorKind::Other,
        },
        E::FromSqlConversionFailure(..)
        | E::IntegralValueOutOfRange(..)
        | E::InvalidColumnIndex(_)
        | E::InvalidColumnType(..)
        | E::Utf8Error(..) => return corrupt(e.to_string()),
        _ => StoreErrorKind::Other,
    };
    Error::store(kind, e.to_string())
}

pub(super) fn int_at(row: &rusqlite::Row<'_>, i: usize) -> Result<i64> {
    row.get::<_, i64>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

pub(super) fn text_at(row: &rusqlite::Row<'_>, i: usize) -> Result<String> {
    row.get::<_, String>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

/// `weight, seats` of a removed holder.
fn freed_at(row: &rusqlite::Row<'_>) -> Result<Freed> {
    Ok(Freed {
        weight: int_at(row, 0)?,
        seats: text_at(row, 1)?,
    })
}

/// A popped waiter ([`POP_HEAD_IF_FITS`], [`POP_WAITER`]) and its wake-up socket.
fn head_at(row: &rusqlite::Row<'_>) -> Result<(HeadRow, Option<String>)> {
    let wake = row
        .get::<_, Option<String>>(4)
        .map_err(|e| corrupt(format!("column 4: {e}")))?;
    let head = HeadRow {
        tag: int_at(row, 6)?,
        lease_id: text_at(row, 0)?,
        weight: int_at(row, 1)?,
        holder: text_at(row, 2)?,
        ttl: int_at(row, 3)?,
        expires_at: int_at(row, 5)?,
        tenant: opt_text_at(row, 7)?,
    };
    Ok((head, wake))
}

/// A woken admission waiter ([`WAKE_GATED_HEAD`], [`WAKE_GATED`]) and its wake-up socket.
fn woken_at(row: &rusqlite::Row<'_>) -> Result<(String, Option<String>)> {
    let wake = row
        .get::<_, Option<String>>(1)
        .map_err(|e| corrupt(format!("column 1: {e}")))?;
    Ok((text_at(row, 0)?, wake))
}

/// A tenant's limits: tenant, ceiling (NULL: none), floor, window ceiling (NULL: none),
/// window-capped-until (NULL: not capped).
fn limit_at(row: &rusqlite::Row<'_>) -> Result<LimitRow> {
    let opt = |i: usize, what: &str| {
        row.get::<_, Option<i64>>(i)
            .map_err(|e| corrupt(format!("{what}: {e}")))
    };
    Ok(LimitRow {
        tenant: text_at(row, 0)?,
        ceiling: opt(1, "ceiling")?,
        floor: int_at(row, 2)?,
        window_ceiling: opt(3, "window_ceiling")?,
        window_capped_until: opt(4, "window_capped_until")?,
    })
}

/// A nullable text column (a tenant).
pub(super) fn opt_text_at(row: &rusqlite::Row<'_>, i: usize) -> Result<Option<String>> {
    row.get::<_, Option<String>>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

/// A waiter row: lease_id, weight, holder, enqueued_at, expires_at, tenant.
fn waiter_at(row: &rusqlite::Row<'_>) -> Result<WaiterRow> {
    Ok(WaiterRow {
        lease_id: text_at(row, 0)?,
        weight: int_at(row, 1)?,
        holder: text_at(row, 2)?,
        enqueued_at: int_at(row, 3)?,
        expires_at: int_at(row, 4)?,
        tenant: opt_text_at(row, 5)?,
    })
}

/// A holder row: lease_id, weight, seats, fence, holder, acquired_at, expires_at, tenant.
fn holder_at(row: &rusqlite::Row<'_>) -> Result<HolderRow> {
    Ok(HolderRow {
        lease_id: text_at(row, 0)?,
        weight: int_at(row, 1)?,
        seats: text_at(row, 2)?,
        fence: int_at(row, 3)?,
        holder: text_at(row, 4)?,
        acquired_at: int_at(row, 5)?,
        expires_at: int_at(row, 6)?,
        tenant: opt_text_at(row, 7)?,
    })
}
