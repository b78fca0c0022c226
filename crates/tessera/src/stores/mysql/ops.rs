//! The MySQL / MariaDB dialect of the shared SQL step (`stores/sql`): its statements over the
//! tables of `schema.sql`, and the row operations ([`SemRows`]) that run them.
//!
//! Every step runs inside one `READ COMMITTED` transaction opened by the caller (`mod.rs`).
//! [`SemRows::load`] locks the semaphore's row first (`SELECT … FOR UPDATE`; an acquire
//! creates it first with `INSERT … ON DUPLICATE KEY UPDATE`, which locks an existing row as
//! well), and reads the server's clock in the same statement, which MariaDB and MySQL
//! evaluate once the row lock is granted (`SYSDATE(6)` is read when the row is produced; a
//! lock wait comes before). Every other row of the semaphore is then changed only by this
//! transaction, which is what lets this dialect, which has no `RETURNING` (MySQL 8 has none;
//! MariaDB has `DELETE … RETURNING` but no `UPDATE … RETURNING`), read rows with a `SELECT`
//! and then delete or update the same rows with a second statement (the shape of
//! `NoReturning` in `stores/sql/tests.rs`). Under `READ COMMITTED` each plain `SELECT` sees
//! the latest committed rows plus this transaction's own changes, and InnoDB takes no gap
//! locks, so steps on different semaphores do not block each other except on the meta row
//! that holds the fence high-water mark, updated by every grant just before the commit.
//!
//! # Round trips
//!
//! Statements are sent as text with their values inlined ([`render`]: integers as digits,
//! text as hexadecimal literals, so no value is ever parsed as SQL whatever the session's
//! `sql_mode`), several per round trip: a write whose result the step does not read (an
//! insert, a save, a delete after the `SELECT` that read its rows) is held back
//! ([`MysqlRows::pending`]) and sent in front of the next statement whose result the step
//! needs, or with the `COMMIT`; `START TRANSACTION` goes with the first statement. Reads
//! are also made ahead, in the round trip of an earlier statement, where the row lock keeps
//! them current: the lock-and-read statement also reads the holders and the waiters that
//! may have expired (so their purge is a held-back delete), and a release reads the queue
//! head with the releasing holder's row (what a hand-off reads next); a read made ahead is
//! dropped as soon as this step changes a waiter row ([`MysqlRows::waiters_changed`]). An
//! acquire of a free permit is then two round trips (lock and read; insert, save, commit),
//! a release, also one that hands the permit to a waiter, three (lock and read; the
//! holder's row and the head; delete, grant, save, commit), where one statement per round
//! trip took seven and eleven. A statement that fails stops the rest of its batch (the
//! server runs none after it), so a failed batch never commits.
//!
//! `FOUND_ROWS` is on (sqlx sets it), so an `UPDATE` reports the rows it matched, not only
//! those it changed.

use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::Row;

use super::error::map_err;
use tessera_core::error::{Error, Result};
use tessera_core::model::{Grant, Lease, StoreTime};
use tessera_core::stores::sql::{
    Dirty, Freed, HeadKey, HeadRow, HolderRow, LimitRow, Loaded, NewHolder, NewWaiter, Place,
    QueueRow, SemRow, SemRows, Snapshot, WaiterRow,
};

/// The server's clock in µs since the Unix epoch: `SYSDATE(6)` is read when evaluated (not at
/// the statement's start, and not settable with `SET timestamp` as `NOW()` and
/// `UTC_TIMESTAMP()` are); the session's time zone is UTC (set at connect).
macro_rules! now_us {
    () => {
        "TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))"
    };
}
pub(crate) use now_us;

/// Creates the semaphore's row if missing (a placeholder: nothing used, fences from the
/// high-water mark), and locks it either way.
const CREATE_SEM: &str = "INSERT INTO tessera_semaphores \
     (name, capacity, used, queued, last_fence, next_seq, seat_high) \
     SELECT ?, ?, 0, 0, meta_value, 0, 0 FROM tessera_meta WHERE meta_key = 'fence_hwm' \
     ON DUPLICATE KEY UPDATE name = name";
/// Locks and reads the row, the high-water mark and the clock (read after the lock).
const LOAD_SEM: &str = concat!(
    "SELECT capacity, used, queued, last_fence, next_seq, seat_high, \
     (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'), ",
    now_us!(),
    " FROM tessera_semaphores WHERE name = ? FOR UPDATE"
);
/// The high-water mark and the clock, when the semaphore has no row.
const LOAD_NONE: &str = concat!(
    "SELECT meta_value, ",
    now_us!(),
    " FROM tessera_meta WHERE meta_key = 'fence_hwm'"
);
const SAVE_SEM: &str = "UPDATE tessera_semaphores SET capacity = ?, used = ?, queued = ?, \
     last_fence = ?, next_seq = ?, seat_high = ? WHERE name = ?";
/// [`LOAD_SEM`] with fair shares' columns (schema version 6), after the clock.
const LOAD_SEM_FAIR: &str = concat!(
    "SELECT capacity, used, queued, last_fence, next_seq, seat_high, \
     (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'), ",
    now_us!(),
    ", vtime, finish, tenants FROM tessera_semaphores WHERE name = ? FOR UPDATE"
);
/// [`LOAD_SEM_FAIR`] with how many tenants have limits on the name (schema version 8): a
/// subquery of the same statement, read after the row lock (a plain read, under `READ
/// COMMITTED` the latest committed rows; `set_tenant_limits` changes them under this lock).
const LOAD_SEM_LIMITS: &str = concat!(
    "SELECT capacity, used, queued, last_fence, next_seq, seat_high, \
     (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'), ",
    now_us!(),
    ", vtime, finish, tenants, (SELECT COUNT(*) FROM tessera_tenant_limits l \
     WHERE l.name = tessera_semaphores.name) FROM tessera_semaphores WHERE name = ? FOR UPDATE"
);
/// [`SAVE_SEM`] with fair shares' columns (schema version 6).
const SAVE_SEM_FAIR: &str = "UPDATE tessera_semaphores SET capacity = ?, used = ?, queued = ?, \
     last_fence = ?, next_seq = ?, seat_high = ?, vtime = ?, finish = ?, tenants = ? \
     WHERE name = ?";
const DROP_SEM: &str = "DELETE FROM tessera_semaphores WHERE name = ?";
/// The semaphore's two rows (schema version 10, `docs/sql-queue.md`): [`CREATE_SEM`] and
/// [`LOAD_SEM_LIMITS`] on the semaphore row, whose queue count is `dequeued` (the same
/// columns, in the same places, `next_seq` and `finish` read as 0 there)…
const CREATE_SEM_TAILS: &str = "INSERT INTO tessera_semaphores \
     (name, capacity, used, dequeued, last_fence, seat_high) \
     SELECT ?, ?, 0, 0, meta_value, 0 FROM tessera_meta WHERE meta_key = 'fence_hwm' \
     ON DUPLICATE KEY UPDATE name = name";
const LOAD_SEM_TAILS: &str = concat!(
    "SELECT capacity, used, dequeued, last_fence, 0, seat_high, \
     (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'), ",
    now_us!(),
    ", vtime, 0, tenants, (SELECT COUNT(*) FROM tessera_tenant_limits l \
     WHERE l.name = tessera_semaphores.name) FROM tessera_semaphores WHERE name = ? FOR UPDATE"
);
/// … then the tail row, locked after it (the one lock order), created with the semaphore
/// row's placeholder if missing…
const CREATE_TAIL: &str = "INSERT INTO tessera_tails (name, next_seq, enqueued, finish) \
     VALUES (?, 0, 0, 0) ON DUPLICATE KEY UPDATE name = name";
const LOCK_TAIL: &str = "SELECT next_seq, enqueued, finish FROM tessera_tails \
     WHERE name = ? FOR UPDATE";
/// … written back each if it changed, and deleted with the semaphore row.
const SAVE_SEM_TAILS: &str = "UPDATE tessera_semaphores SET capacity = ?, used = ?, \
     dequeued = ?, last_fence = ?, seat_high = ?, vtime = ?, tenants = ? WHERE name = ?";
const SAVE_TAIL: &str = "INSERT INTO tessera_tails (name, next_seq, enqueued, finish) \
     VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE next_seq = ?, enqueued = ?, finish = ?";
const DROP_TAIL: &str = "DELETE FROM tessera_tails WHERE name = ?";
/// Delete's lock: the semaphore row, then the tail row.
const LOCK_FOR_DELETE_TAILS: &str =
    "SELECT capacity FROM tessera_semaphores WHERE name = ? FOR UPDATE";
const RAISE_HWM: &str = "UPDATE tessera_meta SET meta_value = GREATEST(meta_value, ?) \
     WHERE meta_key = 'fence_hwm'";

const EXPIRED_HOLDERS: &str = "SELECT weight, seats FROM tessera_holders \
     WHERE name = ? AND expires_at <= ?";
/// The holders that may have expired, read in the same round trip as the lock (their
/// `expires_at` is checked against the step's clock reading afterwards).
const EXPIRED_HOLDERS_AT_LOCK: &str = concat!(
    "SELECT weight, seats, expires_at FROM tessera_holders WHERE name = ? AND expires_at <= ",
    now_us!()
);
const PURGE_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ? AND expires_at <= ?";
const PURGE_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ? AND expires_at <= ?";
/// The expiries of the waiters that may have expired, read in the same round trip as the
/// lock (checked against the step's clock reading afterwards, as the holders'), so the purge
/// of expired waiters needs no round trip of its own.
const EXPIRED_WAITERS_AT_LOCK: &str = concat!(
    "SELECT expires_at FROM tessera_waiters WHERE name = ? AND expires_at <= ",
    now_us!()
);

const GET_HOLDER: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ? AND lease_id = ?";
const ALL_HOLDERS: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ? ORDER BY acquired_at, fence";
const INSERT_HOLDER: &str = "INSERT INTO tessera_holders \
     (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
/// [`GET_HOLDER`], [`ALL_HOLDERS`] and [`INSERT_HOLDER`] with the tenant (schema version 7;
/// NULL: none).
const GET_HOLDER_TENANT: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, \
     expires_at, tenant FROM tessera_holders WHERE name = ? AND lease_id = ?";
const ALL_HOLDERS_TENANT: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, \
     expires_at, tenant FROM tessera_holders WHERE name = ? ORDER BY acquired_at, fence";
const INSERT_HOLDER_TENANT: &str = "INSERT INTO tessera_holders \
     (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at, tenant) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// Also the holder's doorbell, read with a lock: a claim (`mod.rs`) that writes it
/// concurrently comes either before (and is read here) or after this step (and finds the
/// row gone).
const HOLDER_FREES: &str = "SELECT weight, seats, doorbell FROM tessera_holders \
     WHERE name = ? AND lease_id = ? FOR UPDATE";
/// [`HOLDER_FREES`] on a schema below version 3 (no `doorbell` column).
const HOLDER_FREES_V2: &str = "SELECT weight, seats, '' FROM tessera_holders \
     WHERE name = ? AND lease_id = ?";
const REMOVE_HOLDER: &str = "DELETE FROM tessera_holders WHERE name = ? AND lease_id = ?";
const RENEW_HOLDER: &str = "UPDATE tessera_holders SET expires_at = GREATEST(expires_at, ?) \
     WHERE name = ? AND lease_id = ?";
const HOLDER_EXPIRY: &str = "SELECT expires_at FROM tessera_holders \
     WHERE name = ? AND lease_id = ?";

const HEAD: &str =
    "SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at FROM tessera_waiters \
     WHERE name = ? ORDER BY seq LIMIT 1";
/// [`HEAD`] with the gate (schema version 4; NULL for a plain waiter).
const HEAD_GATED: &str =
    "SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at, gate FROM tessera_waiters \
     WHERE name = ? ORDER BY seq LIMIT 1";
/// [`HEAD_GATED`] in the order of fair shares, with the tag (schema version 6).
const HEAD_FAIR: &str =
    "SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at, gate, tag \
     FROM tessera_waiters WHERE name = ? ORDER BY tag, seq LIMIT 1";
/// [`HEAD_FAIR`] with the tenant (schema version 7).
const HEAD_TENANT: &str =
    "SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at, gate, tag, tenant \
     FROM tessera_waiters WHERE name = ? ORDER BY tag, seq LIMIT 1";
/// The head's key and the queue's lowest seq (schema version 6).
const HEAD_KEY: &str = "SELECT tag, seq, (SELECT MIN(seq) FROM tessera_waiters WHERE name = ?) \
     FROM tessera_waiters WHERE name = ? ORDER BY tag, seq LIMIT 1";
/// A woken admission waiter's gate (see `waiters_gate.sql`).
const WOKEN: i64 = i64::MAX;
const SET_GATE: &str = "UPDATE tessera_waiters SET gate = ? WHERE name = ? AND lease_id = ?";
const HEAD_SEQ: &str = "SELECT MIN(seq) FROM tessera_waiters WHERE name = ?";
const INSERT_GATED_WAITER: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell, gate) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// [`INSERT_GATED_WAITER`] with the tag (schema version 6).
const INSERT_WAITER_FAIR: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell, gate, tag) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// [`INSERT_WAITER_FAIR`] for a plain waiter (no gate).
const INSERT_PLAIN_WAITER_FAIR: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell, gate, tag) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?)";
/// [`INSERT_WAITER_FAIR`] with the tenant (schema version 7; NULL: none); a plain waiter's
/// gate is NULL.
const INSERT_WAITER_TENANT: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell, gate, tag, \
     tenant) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const POP_HEAD: &str = "DELETE FROM tessera_waiters WHERE name = ? AND seq = ?";
const INSERT_WAITER: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)";
const REMOVE_WAITER: &str = "DELETE FROM tessera_waiters WHERE name = ? AND lease_id = ?";
/// Also moves the waiter's doorbell to this client's current one (a doorbell that
/// reconnected has a new address).
const REFRESH_WAITER: &str = "UPDATE tessera_waiters SET expires_at = GREATEST(expires_at, ?), \
     doorbell = ? WHERE name = ? AND lease_id = ?";
const WAITER_POSITION: &str = "SELECT COUNT(*) FROM tessera_waiters WHERE name = ? AND seq < \
     (SELECT seq FROM tessera_waiters WHERE name = ? AND lease_id = ?)";
const ALL_WAITERS: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at \
     FROM tessera_waiters WHERE name = ? ORDER BY seq";
/// A queued waiter's place in the order of fair shares: the waiters before its
/// `(tag, seq)`, and its tag (schema version 6).
const WAITER_PLACE: &str = "SELECT (SELECT COUNT(*) FROM tessera_waiters o WHERE o.name = ? \
     AND (o.tag < w.tag OR (o.tag = w.tag AND o.seq < w.seq))), w.tag \
     FROM tessera_waiters w WHERE w.name = ? AND w.lease_id = ?";
const WAITERS_AHEAD: &str = "SELECT COUNT(*) FROM tessera_waiters \
     WHERE name = ? AND (tag < ? OR (tag = ? AND seq < ?))";
/// [`ALL_WAITERS`] in the order of fair shares (schema version 6).
const ALL_WAITERS_FAIR: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at \
     FROM tessera_waiters WHERE name = ? ORDER BY tag, seq";

/// `status` without the row lock (`stores/sql/snapshot.rs`): a read-only transaction whose
/// consistent snapshot is taken at its start (InnoDB's non-locking consistent read; the
/// session's `READ COMMITTED` would take a new one per statement, so this transaction is
/// `REPEATABLE READ`), then the row with the clock (read after the snapshot was taken), the
/// holders and the waiters, and the commit: one round trip, no lock taken or waited for.
pub(crate) const READ_BEGIN: &str = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; \
     START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY";
const READ_SEM: &str = concat!(
    "SELECT capacity, used, queued, ",
    now_us!(),
    " FROM tessera_semaphores WHERE name = ?"
);
/// [`READ_SEM`] on the two rows of schema version 10 (one snapshot holds both).
const READ_SEM_TAILS: &str = concat!(
    "SELECT s.capacity, s.used, COALESCE(t.enqueued, 0) - s.dequeued, ",
    now_us!(),
    " FROM tessera_semaphores s LEFT JOIN tessera_tails t ON t.name = s.name WHERE s.name = ?"
);
/// The queue with each waiter's gate, in the order of [`ALL_WAITERS`].
const READ_WAITERS_GATED: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at, gate \
     FROM tessera_waiters WHERE name = ? ORDER BY seq";
/// [`READ_WAITERS_GATED`] in the order of fair shares, as [`ALL_WAITERS_FAIR`].
const READ_WAITERS_FAIR: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at, gate \
     FROM tessera_waiters WHERE name = ? ORDER BY tag, seq";
/// [`READ_WAITERS_FAIR`] with the tenant (schema version 7): the status read's queue and
/// [`SemRows::waiters`]'.
const WAITERS_TENANT: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at, gate, \
     tenant FROM tessera_waiters WHERE name = ? ORDER BY tag, seq";

const TENANT_FINISH: &str = "SELECT finish FROM tessera_tenants WHERE name = ? AND tenant = ?";
const SAVE_TENANT: &str = "INSERT INTO tessera_tenants (name, tenant, finish) VALUES (?, ?, ?) \
     ON DUPLICATE KEY UPDATE finish = ?";
const PRUNE_TENANTS: &str = "DELETE FROM tessera_tenants WHERE name = ? AND finish <= ?";
const DROP_TENANTS: &str = "DELETE FROM tessera_tenants WHERE name = ?";

/// Tenants' ceilings and floors (schema version 8, `tenant_limits.sql`), and what the step
/// with limits reads: the permits per tenant, the queue, a chosen waiter.
pub(crate) const TENANT_LIMITS: &str = "SELECT tenant, ceiling, floor FROM tessera_tenant_limits \
     WHERE name = ? ORDER BY tenant";
const SAVE_TENANT_LIMITS: &str =
    "INSERT INTO tessera_tenant_limits (name, tenant, ceiling, floor) \
     VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE ceiling = VALUES(ceiling), floor = VALUES(floor)";
/// The same with tenants' window ceilings and window-capped-until instants (schema version
/// 9, `window_ceilings.sql`), which a save leaves as they are and [`CAP_WINDOW`] sets.
pub(crate) const TENANT_LIMITS_WINDOWS: &str = "SELECT tenant, ceiling, floor, window_ceiling, \
     window_capped_until FROM tessera_tenant_limits WHERE name = ? ORDER BY tenant";
const SAVE_TENANT_LIMITS_WINDOWS: &str =
    "INSERT INTO tessera_tenant_limits (name, tenant, ceiling, floor, window_ceiling) \
     VALUES (?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE ceiling = VALUES(ceiling), \
     floor = VALUES(floor), window_ceiling = VALUES(window_ceiling)";
const CAP_WINDOW: &str =
    "UPDATE tessera_tenant_limits SET window_capped_until = ? WHERE name = ? AND tenant = ?";
const DROP_TENANT_LIMITS: &str = "DELETE FROM tessera_tenant_limits WHERE name = ? AND tenant = ?";
const DROP_ALL_TENANT_LIMITS: &str = "DELETE FROM tessera_tenant_limits WHERE name = ?";
const HELD_BY_TENANT: &str = "SELECT tenant, CAST(SUM(weight) AS SIGNED) FROM tessera_holders \
     WHERE name = ? AND tenant IS NOT NULL GROUP BY tenant";
const QUEUE: &str = "SELECT lease_id, weight, tenant, gate, tag, seq FROM tessera_waiters \
     WHERE name = ? ORDER BY tag, seq";
/// [`HEAD_TENANT`]'s columns for one waiter.
const WAITER_AS_HEAD: &str =
    "SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at, gate, tag, tenant \
     FROM tessera_waiters WHERE name = ? AND lease_id = ?";

const TAKE_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ? AND seat < ? ORDER BY seat LIMIT ?";
const DROP_FREE_SEATS_UP_TO: &str = "DELETE FROM tessera_free_seats WHERE name = ? AND seat <= ?";
const DROP_FREE_SEATS_FROM: &str = "DELETE FROM tessera_free_seats WHERE name = ? AND seat >= ?";
const DROP_FREE_SEATS: &str = "DELETE FROM tessera_free_seats WHERE name = ?";
const TOP_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ? AND seat < ? ORDER BY seat DESC LIMIT ?";
/// Free seats inserted per statement.
const SEAT_BATCH: i64 = 500;

/// Locking, as [`HOLDER_FREES`].
const HOLDER_IDS: &str = "SELECT lease_id, doorbell FROM tessera_holders WHERE name = ? FOR UPDATE";
/// [`HOLDER_IDS`] on a schema below version 3 (no `doorbell` column).
const HOLDER_IDS_V2: &str = "SELECT lease_id, '' FROM tessera_holders WHERE name = ?";
const DROP_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ?";
const WAITER_IDS: &str = "SELECT lease_id, doorbell FROM tessera_waiters WHERE name = ?";
const DROP_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ?";
const LIST: &str = "SELECT name FROM tessera_semaphores ORDER BY name";

/// A value inlined into a statement by [`render`].
#[derive(Debug, Clone, Copy)]
pub(crate) enum Lit<'a> {
    Int(i64),
    /// Rendered as a hexadecimal literal (`X'…'`): never parsed as SQL, whatever the text.
    Text(&'a str),
    /// `NULL`.
    Null,
}

/// `sql` with each `?` replaced by the next of `args` (the statements of this file hold no
/// other `?`).
pub(crate) fn render(sql: &str, args: &[Lit<'_>]) -> String {
    let mut out = String::with_capacity(sql.len() + 16 * args.len());
    let mut args = args.iter();
    for c in sql.chars() {
        if c != '?' {
            out.push(c);
            continue;
        }
        match args.next() {
            Some(Lit::Int(v)) => out.push_str(&v.to_string()),
            Some(Lit::Null) => out.push_str("NULL"),
            Some(Lit::Text("")) => out.push_str("''"),
            Some(Lit::Text(t)) => {
                out.push_str("X'");
                for b in t.bytes() {
                    out.push_str(&format!("{b:02x}"));
                }
                out.push('\'');
            }
            None => out.push('?'),
        }
    }
    out
}

/// The rows and the rows-affected count of each statement of one round trip, in order.
pub(crate) type Results = Vec<(Vec<MySqlRow>, u64)>;

/// Sends `sql` (statements separated by `;`) in one round trip.
pub(crate) async fn batch(conn: &mut MySqlConnection, sql: String) -> Result<Results> {
    use futures::TryStreamExt;
    let mut out: Results = Vec::new();
    let mut rows = Vec::new();
    let mut stream = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_many(&mut *conn);
    while let Some(item) = stream.try_next().await.map_err(map_err)? {
        match item {
            sqlx::Either::Left(done) => out.push((std::mem::take(&mut rows), done.rows_affected())),
            sqlx::Either::Right(row) => rows.push(row),
        }
    }
    if !rows.is_empty() {
        out.push((rows, 0));
    }
    Ok(out)
}

/// The row operations of one semaphore inside the caller's transaction.
pub(crate) struct MysqlRows<'c> {
    conn: &'c mut MySqlConnection,
    name: &'c str,
    /// This client's doorbell address, written into its waiter rows (`""`: none).
    doorbell: &'c str,
    /// The doorbells of the waiters this step granted, to ring after the commit.
    rung: Vec<String>,
    /// The lease ids of the holders and waiters this step removed, with their doorbells
    /// (`""`: none): those the step wakes (a revoke, a delete) are rung after the commit.
    removed: Vec<(String, String)>,
    /// Whether holder rows have a `doorbell` column (schema version 3); off by default.
    holder_doorbells: bool,
    /// Whether waiter rows have a `gate` column (schema version 4); off by default.
    gates: bool,
    /// Whether the tables have fair shares' tags (schema version 6, which implies 4); off by
    /// default.
    fair: bool,
    /// Whether holder and waiter rows have a `tenant` column (schema version 7, which implies
    /// 6); off by default.
    tenant_rows: bool,
    /// Whether names may carry tenants' limits (schema version 8, which implies 7); off by
    /// default.
    limits: bool,
    /// Whether tenants' limits carry window ceilings (schema version 9, which implies 8);
    /// off by default.
    windows: bool,
    /// Whether the semaphore's row is split in two, its queue's tail in `tessera_tails`
    /// (schema version 10, which implies 9); off by default.
    tails: bool,
    /// The limiter an admission's rate statements are about (`rate.rs`): `None`, the name's
    /// own; else a tenant's own limiter's key (`TenantLimiterRows::point_at`).
    limiter: Option<String>,
    /// The step's clock reading, from [`SemRows::load`] (the limiter's rows of an
    /// admission are decided on it).
    now: StoreTime,
    /// Statements not sent yet (see the module docs), each ending with `;`.
    pending: String,
    /// The holders that had expired when the lock was taken, read with it: `(now, rows)`.
    expired: Option<(i64, Vec<(Freed, i64)>)>,
    /// The expiries of the waiters that had expired when the lock was taken, read with it:
    /// `(now, expiries)`; dropped once any waiter row changes.
    expired_waiters: Option<(i64, Vec<i64>)>,
    /// The queue head's row(s) (`HEAD`), read in the round trip of an earlier statement of
    /// this step; dropped once any waiter row changes. Nobody else changes the waiters of
    /// the semaphore while this transaction holds its row, so the read stays current.
    head: Option<Vec<MySqlRow>>,
    /// Whether the semaphore's row existed when locked.
    exists: bool,
    /// The leases this step granted, to push to waiters of this process with their wake-up.
    granted: Vec<Grant>,
}

impl<'c> MysqlRows<'c> {
    /// Row operations in a transaction that the caller opened, or, with `begin`, that the
    /// first batch opens (`START TRANSACTION` goes with it).
    pub(crate) fn new(
        conn: &'c mut MySqlConnection,
        name: &'c str,
        doorbell: &'c str,
        begin: bool,
    ) -> Self {
        MysqlRows {
            conn,
            name,
            doorbell,
            rung: Vec::new(),
            removed: Vec::new(),
            holder_doorbells: false,
            gates: false,
            fair: false,
            tenant_rows: false,
            limits: false,
            windows: false,
            tails: false,
            limiter: None,
            now: StoreTime(0),
            pending: if begin {
                "START TRANSACTION;".to_string()
            } else {
                String::new()
            },
            expired: None,
            expired_waiters: None,
            head: None,
            exists: false,
            granted: Vec::new(),
        }
    }

    /// Reads the holders' doorbells (schema version 3 and above).
    pub(crate) fn with_holder_doorbells(mut self, on: bool) -> Self {
        self.holder_doorbells = on;
        self
    }

    /// Reads and writes admission waiters' gates (schema version 4).
    pub(crate) fn with_gates(mut self, on: bool) -> Self {
        self.gates = on;
        self
    }

    /// A tenant's row on a schema without fair shares: no request names a tenant there (the
    /// store's capabilities say so).
    fn require_fair(&self) -> Result<()> {
        match self.fair {
            true => Ok(()),
            false => Err(corrupt(
                "internal: a tenant on a schema without fair shares",
            )),
        }
    }

    /// Limits' rows on a schema without them: no name has limits there (the store's
    /// capabilities say so, and the row's count reads 0).
    fn require_limits(&self) -> Result<()> {
        match self.limits {
            true => Ok(()),
            false => Err(corrupt("internal: tenant limits on a schema without them")),
        }
    }

    /// Reads and writes fair shares' tags (schema version 6, with its gates).
    pub(crate) fn with_fair_shares(mut self, on: bool) -> Self {
        self.fair = on;
        self.gates |= on;
        self
    }

    /// Reads and writes the tenant on holder and waiter rows (schema version 7, with fair
    /// shares' tags).
    pub(crate) fn with_tenant_rows(mut self, on: bool) -> Self {
        self.tenant_rows = on;
        if on {
            self = self.with_fair_shares(true);
        }
        self
    }

    /// Reads and writes tenants' limits (schema version 8, with the tenant on the rows).
    pub(crate) fn with_tenant_limits(mut self, on: bool) -> Self {
        self.limits = on;
        if on {
            self = self.with_tenant_rows(true);
        }
        self
    }

    /// Reads and writes the two rows of schema version 10 (with window ceilings).
    pub(crate) fn with_tails(mut self, on: bool) -> Self {
        self.tails = on;
        self
    }

    /// Reads and writes tenants' window ceilings (schema version 9, with tenants' limits).
    pub(crate) fn with_window_ceilings(mut self, on: bool) -> Self {
        self.windows = on;
        if on {
            self = self.with_tenant_limits(true);
        }
        self
    }

    /// Points an admission's rate statements at limiter `key` (`None`: the name's own).
    pub(crate) fn point_at(&mut self, key: Option<String>) {
        self.limiter = key;
    }

    /// The step's clock reading (see [`MysqlRows::now`]).
    pub(crate) fn now(&self) -> StoreTime {
        self.now
    }

    /// The connection and the key of the limiter an admission's rate statements are about:
    /// the semaphore's name, or a tenant's own limiter's key while pointed at it.
    pub(crate) fn conn_and_limiter(&mut self) -> (&mut MySqlConnection, &str) {
        let key = self.limiter.as_deref().unwrap_or(self.name);
        (&mut *self.conn, key)
    }

    /// The statement that reads the queue head.
    fn head_sql(&self) -> &'static str {
        if self.tenant_rows {
            HEAD_TENANT
        } else if self.fair {
            HEAD_FAIR
        } else if self.gates {
            HEAD_GATED
        } else {
            HEAD
        }
    }

    /// The leases granted by this step (see [`MysqlRows::granted`]).
    pub(crate) fn take_granted(&mut self) -> Vec<Grant> {
        std::mem::take(&mut self.granted)
    }

    /// The doorbells of the waiters granted so far (see [`MysqlRows::rung`]).
    pub(crate) fn take_rung(&mut self) -> Vec<String> {
        std::mem::take(&mut self.rung)
    }

    /// The holders and waiters removed so far, with their doorbells (see
    /// [`MysqlRows::removed`]).
    pub(crate) fn take_removed(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.removed)
    }

    /// The statements still held back, for the caller to send with its `COMMIT`.
    pub(crate) fn take_pending(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }

    fn name(&self) -> Lit<'c> {
        Lit::Text(self.name)
    }

    /// Holds a write back until the next read or the commit.
    /// Forgets what was read ahead about the waiters: called by every change to them.
    fn waiters_changed(&mut self) {
        self.expired_waiters = None;
        self.head = None;
    }

    fn defer(&mut self, sql: &str, args: &[Lit<'_>]) {
        self.pending.push_str(&render(sql, args));
        self.pending.push(';');
    }

    /// Sends what is held back, then `stmts`; the results of `stmts` only.
    async fn send(&mut self, stmts: &[String]) -> Result<Results> {
        let mut sql = std::mem::take(&mut self.pending);
        sql.push_str(&stmts.join(";"));
        let mut results = batch(self.conn, sql).await?;
        let first = results.len().saturating_sub(stmts.len());
        Ok(results.split_off(first))
    }

    /// The rows of one statement (after what is held back).
    async fn fetch(&mut self, sql: &str, args: &[Lit<'_>]) -> Result<Vec<MySqlRow>> {
        let mut r = self.send(&[render(sql, args)]).await?;
        Ok(r.pop().map(|(rows, _)| rows).unwrap_or_default())
    }

    /// The rows one statement matched (after what is held back).
    async fn count(&mut self, sql: &str, args: &[Lit<'_>]) -> Result<u64> {
        let mut r = self.send(&[render(sql, args)]).await?;
        Ok(r.pop().map(|(_, n)| n).unwrap_or(0))
    }

    /// Lease ids found by `select` (with their doorbells, kept in [`MysqlRows::removed`]),
    /// then `delete` (the shape without `RETURNING`).
    async fn select_then_delete(&mut self, select: &str, delete: &str) -> Result<Vec<String>> {
        let name = self.name();
        let rows = self.fetch(select, &[name]).await?;
        let ids: Vec<String> = rows.iter().filter_map(|r| text_at(r, 0).ok()).collect();
        for row in &rows {
            if let (Ok(id), Ok(doorbell)) = (text_at(row, 0), text_at(row, 1)) {
                self.removed.push((id, doorbell));
            }
        }
        if !ids.is_empty() {
            self.defer(delete, &[name]);
        }
        Ok(ids)
    }
}

impl SemRows for MysqlRows<'_> {
    async fn load(&mut self, create: Option<u32>) -> Result<Loaded> {
        let name = self.name();
        if let Some(capacity) = create {
            let create_sem = match self.tails {
                true => CREATE_SEM_TAILS,
                false => CREATE_SEM,
            };
            self.defer(create_sem, &[name, Lit::Int(capacity.into())]);
        }
        let load = match (self.tails, self.limits, self.fair) {
            (true, _, _) => LOAD_SEM_TAILS,
            (false, true, _) => LOAD_SEM_LIMITS,
            (false, false, true) => LOAD_SEM_FAIR,
            (false, false, false) => LOAD_SEM,
        };
        let mut stmts = vec![render(load, &[name])];
        if self.tails {
            // The tail row after the semaphore row (`docs/sql-queue.md`), before the reads
            // of the queue, so that they see every committed enqueue and none is in flight.
            if create.is_some() {
                stmts.push(render(CREATE_TAIL, &[name]));
            }
            stmts.push(render(LOCK_TAIL, &[name]));
        }
        stmts.push(render(EXPIRED_HOLDERS_AT_LOCK, &[name]));
        stmts.push(render(EXPIRED_WAITERS_AT_LOCK, &[name]));
        let mut results = self.send(&stmts).await?;
        let expired_waiters = results.pop().map(|(rows, _)| rows).unwrap_or_default();
        let expired = results.pop().map(|(rows, _)| rows).unwrap_or_default();
        let tail = match self.tails {
            true => results.pop().map(|(rows, _)| rows).unwrap_or_default(),
            false => Vec::new(),
        };
        let loaded = results.swap_remove(0).0;
        let Some(row) = loaded.first() else {
            if create.is_some() {
                // The insert above either created the row or locked the existing one, and
                // nobody can delete a row this transaction holds.
                return Err(corrupt(
                    "internal: the semaphore row vanished under its lock",
                ));
            }
            let row = self
                .fetch(LOAD_NONE, &[])
                .await?
                .into_iter()
                .next()
                .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
            let now = time_at(&row, 1)?;
            self.now = now;
            return Ok(Loaded {
                now,
                wall: now,
                hwm: int_at(&row, 0)?,
                sem: None,
                limits: 0,
            });
        };
        self.exists = true;
        let hwm = row
            .try_get::<Option<i64>, _>(6)
            .map_err(|e| corrupt(format!("fence_hwm: {e}")))?
            .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
        let now = time_at(row, 7)?;
        self.now = now;
        let expired = expired
            .iter()
            .map(|r| Ok((freed_at(r)?, int_at(r, 2)?)))
            .collect::<Result<Vec<_>>>()?;
        self.expired = Some((now.0 as i64, expired));
        let expired_waiters = expired_waiters
            .iter()
            .map(|r| int_at(r, 0))
            .collect::<Result<Vec<_>>>()?;
        self.expired_waiters = Some((now.0 as i64, expired_waiters));
        // One row: its `queued` is the queue (nothing dequeued); two: the tail row's counters
        // (a missing tail reads as an empty one), and the semaphore row's `dequeued`.
        let (enqueued, dequeued, next_seq, finish) = match (self.tails, tail.first()) {
            (false, _) => (int_at(row, 2)?, 0, int_at(row, 4)?, None),
            (true, None) => (0, int_at(row, 2)?, 0, Some(0)),
            (true, Some(t)) => (
                int_at(t, 1)?,
                int_at(row, 2)?,
                int_at(t, 0)?,
                Some(int_at(t, 2)?),
            ),
        };
        Ok(Loaded {
            now,
            wall: now,
            hwm,
            sem: Some(SemRow {
                capacity: int_at(row, 0)?,
                used: int_at(row, 1)?,
                enqueued,
                dequeued,
                last_fence: int_at(row, 3)?,
                next_seq,
                seat_high: int_at(row, 5)?,
                // Below schema version 6 no request names a tenant, and the queue's order
                // by seq is the order of the tags.
                vtime: if self.fair { int_at(row, 8)? } else { 0 },
                finish: match finish {
                    Some(f) => f,
                    None if self.fair => int_at(row, 9)?,
                    None => 0,
                },
                tenants: if self.fair { int_at(row, 10)? } else { 0 },
            }),
            limits: if self.limits { int_at(row, 11)? } else { 0 },
        })
    }

    async fn lock_for_delete(&mut self) -> Result<()> {
        let name = self.name();
        if self.tails {
            let mut results = self
                .send(&[
                    render(LOCK_FOR_DELETE_TAILS, &[name]),
                    render(LOCK_TAIL, &[name]),
                ])
                .await?;
            self.exists = !results.swap_remove(0).0.is_empty();
            return Ok(());
        }
        self.exists = !self.fetch(LOAD_SEM, &[name]).await?.is_empty();
        Ok(())
    }

    async fn save(&mut self, s: &SemRow, dirty: Dirty) -> Result<()> {
        let name = self.name();
        if self.tails {
            if dirty.sem {
                let args = [
                    Lit::Int(s.capacity),
                    Lit::Int(s.used),
                    Lit::Int(s.dequeued),
                    Lit::Int(s.last_fence),
                    Lit::Int(s.seat_high),
                    Lit::Int(s.vtime),
                    Lit::Int(s.tenants),
                    name,
                ];
                self.defer(SAVE_SEM_TAILS, &args);
            }
            if dirty.tail {
                let (n, e, f) = (
                    Lit::Int(s.next_seq),
                    Lit::Int(s.enqueued),
                    Lit::Int(s.finish),
                );
                self.defer(SAVE_TAIL, &[name, n, e, f, n, e, f]);
            }
            return Ok(());
        }
        let args = [
            Lit::Int(s.capacity),
            Lit::Int(s.used),
            Lit::Int(s.enqueued - s.dequeued),
            Lit::Int(s.last_fence),
            Lit::Int(s.next_seq),
            Lit::Int(s.seat_high),
            name,
        ];
        if self.fair {
            let mut fair = args[..6].to_vec();
            fair.extend([
                Lit::Int(s.vtime),
                Lit::Int(s.finish),
                Lit::Int(s.tenants),
                name,
            ]);
            self.defer(SAVE_SEM_FAIR, &fair);
            return Ok(());
        }
        self.defer(SAVE_SEM, &args);
        Ok(())
    }

    async fn drop_semaphore(&mut self) -> Result<bool> {
        // Called once the row is locked (by `load` or `lock_for_delete`), which saw whether
        // it exists: the delete itself need not be waited for.
        let name = self.name();
        self.defer(DROP_SEM, &[name]);
        if self.tails {
            self.defer(DROP_TAIL, &[name]);
        }
        Ok(std::mem::take(&mut self.exists))
    }

    async fn raise_hwm(&mut self, hwm: i64) -> Result<()> {
        // Steps on other semaphores raise it too, concurrently: never lower it.
        self.defer(RAISE_HWM, &[Lit::Int(hwm)]);
        Ok(())
    }

    async fn purge_holders(&mut self, now: i64) -> Result<Vec<Freed>> {
        let name = self.name();
        let freed: Vec<Freed> = match self.expired.take() {
            // Read with the lock, on the same clock reading or a later one: keep those
            // expired at `now`.
            Some((at, rows)) if at == now => rows
                .into_iter()
                .filter(|(_, expires_at)| *expires_at <= now)
                .map(|(f, _)| f)
                .collect(),
            _ => {
                let rows = self.fetch(EXPIRED_HOLDERS, &[name, Lit::Int(now)]).await?;
                rows.iter().map(freed_at).collect::<Result<Vec<_>>>()?
            }
        };
        if !freed.is_empty() {
            self.defer(PURGE_HOLDERS, &[name, Lit::Int(now)]);
        }
        Ok(freed)
    }

    async fn purge_waiters(&mut self, now: i64) -> Result<u64> {
        let name = self.name();
        match self.expired_waiters.take() {
            // Read with the lock, on the same clock reading: the delete can ride with the
            // next statement.
            Some((at, expiries)) if at == now => {
                let n = expiries.iter().filter(|&&e| e <= now).count() as u64;
                if n > 0 {
                    self.waiters_changed();
                    self.defer(PURGE_WAITERS, &[name, Lit::Int(now)]);
                }
                Ok(n)
            }
            _ => {
                self.waiters_changed();
                self.count(PURGE_WAITERS, &[name, Lit::Int(now)]).await
            }
        }
    }

    async fn holder(&mut self, lease: &str) -> Result<Option<HolderRow>> {
        let name = self.name();
        let sql = match self.tenant_rows {
            true => GET_HOLDER_TENANT,
            false => GET_HOLDER,
        };
        let rows = self.fetch(sql, &[name, Lit::Text(lease)]).await?;
        rows.first().map(holder_at).transpose()
    }

    async fn holders(&mut self) -> Result<Vec<HolderRow>> {
        let name = self.name();
        let sql = match self.tenant_rows {
            true => ALL_HOLDERS_TENANT,
            false => ALL_HOLDERS,
        };
        let rows = self.fetch(sql, &[name]).await?;
        rows.iter().map(holder_at).collect()
    }

    async fn insert_holder(&mut self, h: &NewHolder<'_>) -> Result<()> {
        // Kept for the wake-up (a waiter of this process then needs no round trip to learn
        // its grant); a row the step could not have written is simply not pushed.
        if let (Ok(lease_id), Ok(weight), Ok(fence)) = (
            h.lease_id.parse(),
            u32::try_from(h.weight),
            u64::try_from(h.fence),
        ) {
            if let Ok(seats) = tessera_core::stores::sql::decode_seats(h.seats, weight) {
                let at = |t: i64| StoreTime(t.max(0) as u64);
                self.granted.push(Grant {
                    lease: Lease {
                        lease_id,
                        weight,
                        seats,
                        fence,
                        holder: h.holder.to_string(),
                        acquired_at: at(h.acquired_at),
                        expires_at: at(h.expires_at),
                        tenant: h.tenant.map(String::from),
                    },
                    now: at(h.acquired_at),
                });
            }
        }
        let name = self.name();
        let mut args = vec![
            name,
            Lit::Text(h.lease_id),
            Lit::Int(h.weight),
            Lit::Text(h.seats),
            Lit::Int(h.fence),
            Lit::Text(h.holder),
            Lit::Int(h.acquired_at),
            Lit::Int(h.expires_at),
        ];
        if self.tenant_rows {
            args.push(h.tenant.map_or(Lit::Null, Lit::Text));
            self.defer(INSERT_HOLDER_TENANT, &args);
            return Ok(());
        }
        self.defer(INSERT_HOLDER, &args);
        Ok(())
    }

    async fn remove_holder(&mut self, lease: &str) -> Result<Option<Freed>> {
        let name = self.name();
        // The queue head is read in the same round trip: a release that frees permits
        // hands them to it next (see `pop_head_if_fits`).
        let mut r = self
            .send(&[
                render(
                    if self.holder_doorbells {
                        HOLDER_FREES
                    } else {
                        HOLDER_FREES_V2
                    },
                    &[name, Lit::Text(lease)],
                ),
                render(self.head_sql(), &[name]),
            ])
            .await?;
        self.head = Some(r.pop().map(|(rows, _)| rows).unwrap_or_default());
        let rows = r.pop().map(|(rows, _)| rows).unwrap_or_default();
        let Some(freed) = rows.first().map(freed_at).transpose()? else {
            return Ok(None);
        };
        if let Ok(doorbell) = text_at(&rows[0], 2) {
            self.removed.push((lease.to_string(), doorbell));
        }
        self.defer(REMOVE_HOLDER, &[name, Lit::Text(lease)]);
        Ok(Some(freed))
    }

    async fn renew_holder(&mut self, lease: &str, at: i64) -> Result<Option<i64>> {
        let name = self.name();
        let mut r = self
            .send(&[
                render(RENEW_HOLDER, &[Lit::Int(at), name, Lit::Text(lease)]),
                render(HOLDER_EXPIRY, &[name, Lit::Text(lease)]),
            ])
            .await?;
        let rows = r.pop().map(|(rows, _)| rows).unwrap_or_default();
        rows.first().map(|r| int_at(r, 0)).transpose()
    }

    async fn pop_head_if_fits(&mut self, available: i64) -> Result<Option<HeadRow>> {
        let name = self.name();
        let rows = match self.head.take() {
            Some(rows) => rows,
            None => self.fetch(self.head_sql(), &[name]).await?,
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        if self.gates && gate_at(row)?.is_some() {
            // An admission waiter: only its own step grants it (`wake_gated_head`).
            self.head = Some(rows);
            return Ok(None);
        }
        let head = HeadRow {
            tag: if self.fair { int_at(row, 8)? } else { 0 },
            lease_id: text_at(row, 1)?,
            weight: int_at(row, 2)?,
            holder: text_at(row, 3)?,
            ttl: int_at(row, 4)?,
            expires_at: int_at(row, 6)?,
            tenant: match self.tenant_rows {
                true => opt_text_at(row, 9)?,
                false => None,
            },
        };
        if head.weight > available {
            // Kept for `wake_gated_head`, which then needs no round trip.
            self.head = Some(rows);
            return Ok(None);
        }
        let seq = int_at(row, 0)?;
        let doorbell = text_at(row, 5)?;
        self.waiters_changed();
        self.defer(POP_HEAD, &[name, Lit::Int(seq)]);
        if !doorbell.is_empty() && !self.rung.contains(&doorbell) {
            self.rung.push(doorbell);
        }
        Ok(Some(head))
    }

    async fn wake_gated_head(&mut self, available: i64, now: i64) -> Result<Option<String>> {
        if !self.gates {
            return Ok(None);
        }
        let name = self.name();
        let rows = match self.head.take() {
            Some(rows) => rows,
            None => self.fetch(self.head_sql(), &[name]).await?,
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let Some(gate) = gate_at(row)? else {
            self.head = Some(rows);
            return Ok(None);
        };
        if int_at(row, 2)? > available || gate > now {
            self.head = Some(rows);
            return Ok(None);
        }
        let lease = text_at(row, 1)?;
        let doorbell = text_at(row, 5)?;
        self.waiters_changed();
        self.defer(SET_GATE, &[Lit::Int(WOKEN), name, Lit::Text(&lease)]);
        if !doorbell.is_empty() && !self.rung.contains(&doorbell) {
            self.rung.push(doorbell);
        }
        Ok(Some(lease))
    }

    async fn set_gate(&mut self, lease: &str, gate: i64) -> Result<()> {
        let name = self.name();
        self.waiters_changed();
        self.defer(SET_GATE, &[Lit::Int(gate), name, Lit::Text(lease)]);
        Ok(())
    }

    async fn head_key(&mut self) -> Result<Option<HeadKey>> {
        let name = self.name();
        if self.fair {
            let rows = self.fetch(HEAD_KEY, &[name, name]).await?;
            return rows
                .first()
                .map(|r| {
                    Ok(HeadKey {
                        tag: int_at(r, 0)?,
                        seq: int_at(r, 1)?,
                        min_seq: int_at(r, 2)?,
                    })
                })
                .transpose();
        }
        let rows = self.fetch(HEAD_SEQ, &[name]).await?;
        let seq = rows
            .first()
            .map(|r| {
                r.try_get::<Option<i64>, _>(0)
                    .map_err(|e| corrupt(format!("head seq: {e}")))
            })
            .transpose()?
            .flatten();
        Ok(seq.map(|seq| HeadKey {
            tag: 0,
            seq,
            min_seq: seq,
        }))
    }

    async fn tenant_finish(&mut self, tenant: &str) -> Result<Option<i64>> {
        self.require_fair()?;
        let name = self.name();
        let rows = self
            .fetch(TENANT_FINISH, &[name, Lit::Text(tenant)])
            .await?;
        rows.first().map(|r| int_at(r, 0)).transpose()
    }

    async fn save_tenant(&mut self, tenant: &str, finish: i64) -> Result<()> {
        self.require_fair()?;
        let name = self.name();
        let args = [name, Lit::Text(tenant), Lit::Int(finish), Lit::Int(finish)];
        self.defer(SAVE_TENANT, &args);
        Ok(())
    }

    async fn prune_tenants(&mut self, vtime: i64) -> Result<u64> {
        self.require_fair()?;
        let name = self.name();
        self.count(PRUNE_TENANTS, &[name, Lit::Int(vtime)]).await
    }

    async fn drop_tenants(&mut self) -> Result<()> {
        // Below schema version 6 there is no table (and no tenant ever named).
        if self.fair {
            let name = self.name();
            self.defer(DROP_TENANTS, &[name]);
        }
        Ok(())
    }

    async fn insert_waiter(&mut self, w: &NewWaiter<'_>) -> Result<()> {
        let name = self.name();
        let mut args = vec![
            name,
            Lit::Int(w.seq),
            Lit::Text(w.lease_id),
            Lit::Int(w.weight),
            Lit::Text(w.holder),
            Lit::Int(w.ttl),
            Lit::Int(w.enqueued_at),
            Lit::Int(w.expires_at),
            Lit::Text(self.doorbell),
        ];
        self.waiters_changed();
        if self.tenant_rows {
            // An admission waiter's ttl is stored as -ttl - 1 (see below).
            let (ttl, gate) = match w.gate {
                Some(gate) => (-w.ttl - 1, Lit::Int(gate)),
                None => (w.ttl, Lit::Null),
            };
            args[5] = Lit::Int(ttl);
            args.extend([gate, Lit::Int(w.tag), w.tenant.map_or(Lit::Null, Lit::Text)]);
            self.defer(INSERT_WAITER_TENANT, &args);
            return Ok(());
        }
        match w.gate {
            None if self.fair => {
                args.push(Lit::Int(w.tag));
                self.defer(INSERT_PLAIN_WAITER_FAIR, &args);
            }
            None => self.defer(INSERT_WAITER, &args),
            Some(gate) => {
                if !self.gates {
                    return Err(corrupt(
                        "internal: an admission waiter on a schema without gates",
                    ));
                }
                // Stored as -ttl - 1, so the procedures never hand it a permit (see
                // `waiters_gate.sql`); only its own step grants it, with its own ttl.
                args[5] = Lit::Int(-w.ttl - 1);
                args.push(Lit::Int(gate));
                if self.fair {
                    args.push(Lit::Int(w.tag));
                    self.defer(INSERT_WAITER_FAIR, &args);
                } else {
                    self.defer(INSERT_GATED_WAITER, &args);
                }
            }
        }
        Ok(())
    }

    async fn remove_waiter(&mut self, lease: &str) -> Result<u64> {
        let name = self.name();
        self.waiters_changed();
        self.count(REMOVE_WAITER, &[name, Lit::Text(lease)]).await
    }

    async fn refresh_waiter(&mut self, lease: &str, at: i64) -> Result<u64> {
        let name = self.name();
        let args = [
            Lit::Int(at),
            Lit::Text(self.doorbell),
            name,
            Lit::Text(lease),
        ];
        self.waiters_changed();
        self.count(REFRESH_WAITER, &args).await
    }

    async fn waiter_place(&mut self, lease: &str) -> Result<Option<Place>> {
        let name = self.name();
        if self.fair {
            let rows = self
                .fetch(WAITER_PLACE, &[name, name, Lit::Text(lease)])
                .await?;
            return rows
                .first()
                .map(|r| {
                    Ok(Place {
                        ahead: int_at(r, 0)?,
                        tag: int_at(r, 1)?,
                    })
                })
                .transpose();
        }
        let rows = self
            .fetch(WAITER_POSITION, &[name, name, Lit::Text(lease)])
            .await?;
        let row = rows.first().ok_or_else(|| corrupt("no waiter position"))?;
        Ok(Some(Place {
            ahead: int_at(row, 0)?,
            tag: 0,
        }))
    }

    async fn waiters_ahead(&mut self, tag: i64, seq: i64) -> Result<i64> {
        self.require_fair()?;
        let name = self.name();
        let args = [name, Lit::Int(tag), Lit::Int(tag), Lit::Int(seq)];
        let rows = self.fetch(WAITERS_AHEAD, &args).await?;
        let row = rows.first().ok_or_else(|| corrupt("no waiter count"))?;
        int_at(row, 0)
    }

    async fn waiters(&mut self) -> Result<Vec<WaiterRow>> {
        let name = self.name();
        let sql = if self.tenant_rows {
            WAITERS_TENANT
        } else if self.fair {
            ALL_WAITERS_FAIR
        } else {
            ALL_WAITERS
        };
        let rows = self.fetch(sql, &[name]).await?;
        rows.iter().map(waiter_at).collect()
    }

    async fn take_free_seats(&mut self, below: i64, n: i64) -> Result<Vec<i64>> {
        let name = self.name();
        let rows = self
            .fetch(TAKE_FREE_SEATS, &[name, Lit::Int(below), Lit::Int(n)])
            .await?;
        let seats = rows
            .iter()
            .map(|r| int_at(r, 0))
            .collect::<Result<Vec<_>>>()?;
        if let Some(&last) = seats.last() {
            // Every free seat up to `last` is one just taken (they are the lowest).
            self.defer(DROP_FREE_SEATS_UP_TO, &[name, Lit::Int(last)]);
        }
        Ok(seats)
    }

    async fn insert_free_seats(&mut self, lo: i64, hi: i64) -> Result<()> {
        let mut from = lo;
        while from <= hi {
            let to = hi.min(from + SEAT_BATCH - 1);
            let name = render("?", &[self.name()]);
            let values: Vec<String> = (from..=to)
                .map(|seat| format!("({name}, {seat})"))
                .collect();
            self.pending
                .push_str("INSERT INTO tessera_free_seats (name, seat) VALUES ");
            self.pending.push_str(&values.join(", "));
            self.pending.push(';');
            from = to + 1;
        }
        Ok(())
    }

    async fn top_free_seats(&mut self, below: i64, limit: i64) -> Result<Vec<i64>> {
        let name = self.name();
        let rows = self
            .fetch(TOP_FREE_SEATS, &[name, Lit::Int(below), Lit::Int(limit)])
            .await?;
        rows.iter().map(|r| int_at(r, 0)).collect()
    }

    async fn drop_free_seats_from(&mut self, seat: i64) -> Result<()> {
        let name = self.name();
        self.defer(DROP_FREE_SEATS_FROM, &[name, Lit::Int(seat)]);
        Ok(())
    }

    async fn drop_free_seats(&mut self) -> Result<()> {
        let name = self.name();
        self.defer(DROP_FREE_SEATS, &[name]);
        Ok(())
    }

    async fn drop_holders(&mut self) -> Result<Vec<String>> {
        let select = if self.holder_doorbells {
            HOLDER_IDS
        } else {
            HOLDER_IDS_V2
        };
        self.select_then_delete(select, DROP_HOLDERS).await
    }

    async fn drop_waiters(&mut self) -> Result<Vec<String>> {
        self.waiters_changed();
        self.select_then_delete(WAITER_IDS, DROP_WAITERS).await
    }

    async fn tenant_limits(&mut self) -> Result<Vec<LimitRow>> {
        self.require_limits()?;
        let name = self.name();
        let sql = match self.windows {
            true => TENANT_LIMITS_WINDOWS,
            false => TENANT_LIMITS,
        };
        let rows = self.fetch(sql, &[name]).await?;
        rows.iter().map(limit_at).collect()
    }

    async fn save_tenant_limits(&mut self, row: &LimitRow) -> Result<()> {
        self.require_limits()?;
        let name = self.name();
        let ceiling = row.ceiling.map_or(Lit::Null, Lit::Int);
        let window = row.window_ceiling.map_or(Lit::Null, Lit::Int);
        let args = [name, Lit::Text(&row.tenant), ceiling, Lit::Int(row.floor)];
        match (self.windows, row.window_ceiling) {
            (true, _) => self.defer(SAVE_TENANT_LIMITS_WINDOWS, &[&args[..], &[window]].concat()),
            (false, None) => self.defer(SAVE_TENANT_LIMITS, &args),
            (false, Some(_)) => {
                return Err(corrupt(
                    "internal: a window ceiling on a schema without them",
                ))
            }
        }
        Ok(())
    }

    async fn cap_window(&mut self, tenant: &str, until: Option<i64>) -> Result<()> {
        if !self.windows {
            return Err(corrupt("internal: a window cap on a schema without them"));
        }
        let name = self.name();
        let until = until.map_or(Lit::Null, Lit::Int);
        self.defer(CAP_WINDOW, &[until, name, Lit::Text(tenant)]);
        Ok(())
    }

    async fn drop_tenant_limits(&mut self, tenant: &str) -> Result<()> {
        self.require_limits()?;
        let name = self.name();
        self.defer(DROP_TENANT_LIMITS, &[name, Lit::Text(tenant)]);
        Ok(())
    }

    async fn drop_all_tenant_limits(&mut self) -> Result<u64> {
        // Below schema version 8 there is no table (and no limits ever set).
        if !self.limits {
            return Ok(0);
        }
        let name = self.name();
        self.count(DROP_ALL_TENANT_LIMITS, &[name]).await
    }

    async fn held_by_tenant(&mut self) -> Result<Vec<(String, i64)>> {
        self.require_limits()?;
        let name = self.name();
        let rows = self.fetch(HELD_BY_TENANT, &[name]).await?;
        rows.iter()
            .map(|r| Ok((text_at(r, 0)?, int_at(r, 1)?)))
            .collect()
    }

    async fn queue(&mut self) -> Result<Vec<QueueRow>> {
        self.require_limits()?;
        let name = self.name();
        let rows = self.fetch(QUEUE, &[name]).await?;
        rows.iter()
            .map(|r| {
                Ok(QueueRow {
                    lease_id: text_at(r, 0)?,
                    weight: int_at(r, 1)?,
                    tenant: opt_text_at(r, 2)?,
                    gate: gate_at_column(r, 3)?,
                    tag: int_at(r, 4)?,
                    seq: int_at(r, 5)?,
                })
            })
            .collect()
    }

    async fn pop_waiter(&mut self, lease: &str) -> Result<Option<HeadRow>> {
        self.require_limits()?;
        let name = self.name();
        let rows = self
            .fetch(WAITER_AS_HEAD, &[name, Lit::Text(lease)])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let head = HeadRow {
            tag: int_at(row, 8)?,
            lease_id: text_at(row, 1)?,
            weight: int_at(row, 2)?,
            holder: text_at(row, 3)?,
            ttl: int_at(row, 4)?,
            expires_at: int_at(row, 6)?,
            tenant: opt_text_at(row, 9)?,
        };
        let seq = int_at(row, 0)?;
        let doorbell = text_at(row, 5)?;
        self.waiters_changed();
        self.defer(POP_HEAD, &[name, Lit::Int(seq)]);
        if !doorbell.is_empty() && !self.rung.contains(&doorbell) {
            self.rung.push(doorbell);
        }
        Ok(Some(head))
    }

    async fn wake_gated(&mut self, lease: &str, now: i64) -> Result<Option<String>> {
        self.require_limits()?;
        let name = self.name();
        let rows = self
            .fetch(WAITER_AS_HEAD, &[name, Lit::Text(lease)])
            .await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        match gate_at_column(row, 7)? {
            Some(gate) if gate <= now => {}
            _ => return Ok(None),
        }
        let doorbell = text_at(row, 5)?;
        self.waiters_changed();
        self.defer(SET_GATE, &[Lit::Int(WOKEN), name, Lit::Text(lease)]);
        if !doorbell.is_empty() && !self.rung.contains(&doorbell) {
            self.rung.push(doorbell);
        }
        Ok(Some(lease.to_string()))
    }
}

/// The tenants' limits kept for `name` (one statement, no transaction).
/// `windows`: the rows have window ceilings (schema version 9).
pub(crate) async fn tenant_limits(
    conn: &mut MySqlConnection,
    name: &str,
    windows: bool,
) -> Result<std::collections::BTreeMap<String, tessera_core::model::TenantLimits>> {
    let sql = match windows {
        true => TENANT_LIMITS_WINDOWS,
        false => TENANT_LIMITS,
    };
    let mut results = batch(conn, render(sql, &[Lit::Text(name)])).await?;
    let rows = results.pop().map(|(rows, _)| rows).unwrap_or_default();
    let rows = rows.iter().map(limit_at).collect::<Result<Vec<_>>>()?;
    tessera_core::stores::sql::tenant_limits_of(rows)
}

/// The names of the semaphores the database holds state for (no transaction needed).
pub(crate) async fn list(conn: &mut MySqlConnection) -> Result<Vec<String>> {
    sqlx::query(LIST)
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| text_at(row, 0))
        .collect()
}

/// [`crate::Store::ping`]: `SELECT 1`, touching no table.
pub(crate) async fn ping(conn: &mut MySqlConnection) -> Result<()> {
    sqlx::query("SELECT 1")
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)
        .map(drop)
}

/// Reads the semaphore `name` in one snapshot without a lock (see [`READ_BEGIN`]); `None`
/// without a semaphore row. `gates`, `fair` and `tenant_rows` as in [`MysqlRows`]. Ends
/// with the commit: on an error the caller rolls back (the transaction may still be open).
pub(crate) async fn read_snapshot(
    conn: &mut MySqlConnection,
    name: &str,
    gates: bool,
    fair: bool,
    tenant_rows: bool,
    tails: bool,
) -> Result<Option<Snapshot>> {
    let name = Lit::Text(name);
    let (holders, waiters) = match (tenant_rows, fair, gates) {
        (true, _, _) => (ALL_HOLDERS_TENANT, WAITERS_TENANT),
        (false, true, _) => (ALL_HOLDERS, READ_WAITERS_FAIR),
        (false, false, true) => (ALL_HOLDERS, READ_WAITERS_GATED),
        (false, false, false) => (ALL_HOLDERS, ALL_WAITERS),
    };
    let sql = format!(
        "{READ_BEGIN};{};{};{};COMMIT",
        render(if tails { READ_SEM_TAILS } else { READ_SEM }, &[name]),
        render(holders, &[name]),
        render(waiters, &[name]),
    );
    let mut results = batch(conn, sql).await?.into_iter().map(|(rows, _)| rows);
    // SET, START TRANSACTION, then the three reads.
    let (Some(sem), Some(holders), Some(waiters)) =
        (results.nth(2), results.next(), results.next())
    else {
        return Err(corrupt("status: fewer results than statements"));
    };
    let Some(sem) = sem.first() else {
        return Ok(None);
    };
    let holders = holders.iter().map(holder_at).collect::<Result<Vec<_>>>()?;
    let rows = waiters.iter().map(waiter_at).collect::<Result<Vec<_>>>()?;
    let head_gate = match (gates, waiters.first()) {
        (true, Some(head)) => head
            .try_get::<Option<i64>, _>(5)
            .map_err(|e| corrupt(format!("waiter gate: {e}")))?,
        _ => None,
    };
    let (holders, queue) = Snapshot::rows(&holders, &rows)?;
    Ok(Some(Snapshot {
        now: time_at(sem, 3)?,
        capacity: int_at(sem, 0)?,
        used: int_at(sem, 1)?,
        queued: int_at(sem, 2)?,
        holders,
        queue,
        head_gate,
    }))
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

/// The gate of a [`HEAD_GATED`] row (column 7).
/// A tenant's limits: tenant, ceiling (NULL: none), floor, and where the row has them
/// ([`TENANT_LIMITS_WINDOWS`]) window ceiling (NULL: none) and window-capped-until (NULL:
/// not capped).
fn limit_at(row: &MySqlRow) -> Result<LimitRow> {
    let opt = |i: usize, what: &str| -> Result<Option<i64>> {
        if i >= row.columns().len() {
            return Ok(None);
        }
        row.try_get::<Option<i64>, _>(i)
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

/// A nullable gate in column `i`.
fn gate_at_column(row: &MySqlRow, i: usize) -> Result<Option<i64>> {
    row.try_get::<Option<i64>, _>(i)
        .map_err(|e| corrupt(format!("waiter gate: {e}")))
}

fn gate_at(row: &MySqlRow) -> Result<Option<i64>> {
    gate_at_column(row, 7)
}

pub(crate) fn int_at(row: &MySqlRow, i: usize) -> Result<i64> {
    row.try_get::<i64, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

pub(crate) fn text_at(row: &MySqlRow, i: usize) -> Result<String> {
    row.try_get::<String, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

/// The server's time read by `now_us!()`: before 1970 is not a time tessera can use.
pub(crate) fn time_at(row: &MySqlRow, i: usize) -> Result<StoreTime> {
    let v = int_at(row, i)?;
    u64::try_from(v)
        .map(StoreTime)
        .map_err(|_| corrupt(format!("the server's clock reads {v} µs before 1970")))
}

/// `weight, seats` of a removed holder.
fn freed_at(row: &MySqlRow) -> Result<Freed> {
    Ok(Freed {
        weight: int_at(row, 0)?,
        seats: text_at(row, 1)?,
    })
}

/// Column `i`, NULL or text (a tenant).
fn opt_text_at(row: &MySqlRow, i: usize) -> Result<Option<String>> {
    row.try_get::<Option<String>, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

/// A holder row: lease_id, weight, seats, fence, holder, acquired_at, expires_at, and the
/// tenant if the row has an eighth column ([`ALL_HOLDERS_TENANT`]).
fn holder_at(row: &MySqlRow) -> Result<HolderRow> {
    let mut holder = holder_from(row, 0)?;
    if row.len() > 7 {
        holder.tenant = opt_text_at(row, 7)?;
    }
    Ok(holder)
}

/// A waiter row's five columns (`ALL_WAITERS`' and the status read's order), and the tenant
/// if the row has a seventh column ([`WAITERS_TENANT`], the gate being the sixth).
fn waiter_at(row: &MySqlRow) -> Result<WaiterRow> {
    Ok(WaiterRow {
        lease_id: text_at(row, 0)?,
        weight: int_at(row, 1)?,
        holder: text_at(row, 2)?,
        enqueued_at: int_at(row, 3)?,
        expires_at: int_at(row, 4)?,
        tenant: match row.len() > 6 {
            true => opt_text_at(row, 6)?,
            false => None,
        },
    })
}

/// A holder row's seven columns, from column `first` on (in a row that holds more); no
/// tenant (the caller reads it where its row has one).
pub(crate) fn holder_from(row: &MySqlRow, first: usize) -> Result<HolderRow> {
    Ok(HolderRow {
        lease_id: text_at(row, first)?,
        weight: int_at(row, first + 1)?,
        seats: text_at(row, first + 2)?,
        fence: int_at(row, first + 3)?,
        holder: text_at(row, first + 4)?,
        acquired_at: int_at(row, first + 5)?,
        expires_at: int_at(row, first + 6)?,
        tenant: None,
    })
}
