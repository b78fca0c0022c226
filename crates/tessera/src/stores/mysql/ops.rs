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
//! Placeholders are `?`, positional; `?` number one is always the semaphore's name.
//! `FOUND_ROWS` is on (sqlx sets it), so an `UPDATE` reports the rows it matched, not only
//! those it changed.

use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::Row;

use super::map_err;
use crate::error::{Error, Result};
use crate::model::StoreTime;
use crate::stores::sql::{
    Freed, HeadRow, HolderRow, Loaded, NewHolder, NewWaiter, SemRow, SemRows, WaiterRow,
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
const DROP_SEM: &str = "DELETE FROM tessera_semaphores WHERE name = ?";
const RAISE_HWM: &str = "UPDATE tessera_meta SET meta_value = GREATEST(meta_value, ?) \
     WHERE meta_key = 'fence_hwm'";

const EXPIRED_HOLDERS: &str = "SELECT weight, seats FROM tessera_holders \
     WHERE name = ? AND expires_at <= ?";
const PURGE_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ? AND expires_at <= ?";
const PURGE_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ? AND expires_at <= ?";

const GET_HOLDER: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ? AND lease_id = ?";
const ALL_HOLDERS: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ? ORDER BY acquired_at, fence";
const INSERT_HOLDER: &str = "INSERT INTO tessera_holders \
     (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?)";
const HOLDER_FREES: &str = "SELECT weight, seats FROM tessera_holders \
     WHERE name = ? AND lease_id = ?";
const REMOVE_HOLDER: &str = "DELETE FROM tessera_holders WHERE name = ? AND lease_id = ?";
const RENEW_HOLDER: &str = "UPDATE tessera_holders SET expires_at = GREATEST(expires_at, ?) \
     WHERE name = ? AND lease_id = ?";
const HOLDER_EXPIRY: &str = "SELECT expires_at FROM tessera_holders \
     WHERE name = ? AND lease_id = ?";

const HEAD: &str = "SELECT seq, lease_id, weight, holder, ttl, doorbell FROM tessera_waiters \
     WHERE name = ? ORDER BY seq LIMIT 1";
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

const TAKE_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ? AND seat < ? ORDER BY seat LIMIT ?";
const DROP_FREE_SEATS_UP_TO: &str = "DELETE FROM tessera_free_seats WHERE name = ? AND seat <= ?";
const DROP_FREE_SEATS_FROM: &str = "DELETE FROM tessera_free_seats WHERE name = ? AND seat >= ?";
const DROP_FREE_SEATS: &str = "DELETE FROM tessera_free_seats WHERE name = ?";
const TOP_FREE_SEATS: &str = "SELECT seat FROM tessera_free_seats \
     WHERE name = ? AND seat < ? ORDER BY seat DESC LIMIT ?";
/// Free seats inserted per statement.
const SEAT_BATCH: i64 = 500;

const HOLDER_IDS: &str = "SELECT lease_id FROM tessera_holders WHERE name = ?";
const DROP_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ?";
const WAITER_IDS: &str = "SELECT lease_id FROM tessera_waiters WHERE name = ?";
const DROP_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ?";
const LIST: &str = "SELECT name FROM tessera_semaphores ORDER BY name";

/// The row operations of one semaphore inside the caller's transaction.
pub(crate) struct MysqlRows<'c> {
    conn: &'c mut MySqlConnection,
    name: &'c str,
    /// This client's doorbell address, written into its waiter rows (`""`: none).
    doorbell: &'c str,
    /// The doorbells of the waiters this step granted, to ring after the commit.
    rung: Vec<String>,
}

impl<'c> MysqlRows<'c> {
    pub(crate) fn new(conn: &'c mut MySqlConnection, name: &'c str, doorbell: &'c str) -> Self {
        MysqlRows {
            conn,
            name,
            doorbell,
            rung: Vec::new(),
        }
    }

    /// The doorbells of the waiters granted so far (see [`MysqlRows::rung`]).
    pub(crate) fn take_rung(&mut self) -> Vec<String> {
        std::mem::take(&mut self.rung)
    }

    /// Runs `sql` with the name, then `lease` if given, then `args`; how many rows it matched.
    async fn exec(&mut self, sql: &'static str, lease: Option<&str>, args: &[i64]) -> Result<u64> {
        let mut q = sqlx::query(sql).bind(self.name);
        if let Some(lease) = lease {
            q = q.bind(lease);
        }
        for &a in args {
            q = q.bind(a);
        }
        Ok(q.execute(&mut *self.conn)
            .await
            .map_err(map_err)?
            .rows_affected())
    }

    /// The rows of `sql` with the name, then `lease` if given, then `args`.
    async fn fetch(
        &mut self,
        sql: &'static str,
        lease: Option<&str>,
        args: &[i64],
    ) -> Result<Vec<MySqlRow>> {
        let mut q = sqlx::query(sql).bind(self.name);
        if let Some(lease) = lease {
            q = q.bind(lease);
        }
        for &a in args {
            q = q.bind(a);
        }
        q.fetch_all(&mut *self.conn).await.map_err(map_err)
    }

    /// Lease ids found by `select`, then `delete` (the shape without `RETURNING`).
    async fn select_then_delete(
        &mut self,
        select: &'static str,
        delete: &'static str,
    ) -> Result<Vec<String>> {
        let ids: Vec<String> = self
            .fetch(select, None, &[])
            .await?
            .iter()
            .filter_map(|r| text_at(r, 0).ok())
            .collect();
        if !ids.is_empty() {
            self.exec(delete, None, &[]).await?;
        }
        Ok(ids)
    }
}

impl SemRows for MysqlRows<'_> {
    async fn load(&mut self, create: Option<u32>) -> Result<Loaded> {
        if let Some(capacity) = create {
            sqlx::query(CREATE_SEM)
                .bind(self.name)
                .bind(i64::from(capacity))
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        let rows = self.fetch(LOAD_SEM, None, &[]).await?;
        let Some(row) = rows.first() else {
            if create.is_some() {
                // The insert above either created the row or locked the existing one, and
                // nobody can delete a row this transaction holds.
                return Err(corrupt(
                    "internal: the semaphore row vanished under its lock",
                ));
            }
            let row = sqlx::query(LOAD_NONE)
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(map_err)?
                .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
            let now = time_at(&row, 1)?;
            return Ok(Loaded {
                now,
                wall: now,
                hwm: int_at(&row, 0)?,
                sem: None,
            });
        };
        let hwm = row
            .try_get::<Option<i64>, _>(6)
            .map_err(|e| corrupt(format!("fence_hwm: {e}")))?
            .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
        let now = time_at(row, 7)?;
        Ok(Loaded {
            now,
            wall: now,
            hwm,
            sem: Some(SemRow {
                capacity: int_at(row, 0)?,
                used: int_at(row, 1)?,
                queued: int_at(row, 2)?,
                last_fence: int_at(row, 3)?,
                next_seq: int_at(row, 4)?,
                seat_high: int_at(row, 5)?,
            }),
        })
    }

    async fn lock_for_delete(&mut self) -> Result<()> {
        self.fetch(LOAD_SEM, None, &[]).await.map(drop)
    }

    async fn save(&mut self, s: &SemRow) -> Result<()> {
        sqlx::query(SAVE_SEM)
            .bind(s.capacity)
            .bind(s.used)
            .bind(s.queued)
            .bind(s.last_fence)
            .bind(s.next_seq)
            .bind(s.seat_high)
            .bind(self.name)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn drop_semaphore(&mut self) -> Result<bool> {
        Ok(self.exec(DROP_SEM, None, &[]).await? > 0)
    }

    async fn raise_hwm(&mut self, hwm: i64) -> Result<()> {
        // Steps on other semaphores raise it too, concurrently: never lower it.
        sqlx::query(RAISE_HWM)
            .bind(hwm)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn purge_holders(&mut self, now: i64) -> Result<Vec<Freed>> {
        let rows = self.fetch(EXPIRED_HOLDERS, None, &[now]).await?;
        let freed = rows.iter().map(freed_at).collect::<Result<Vec<_>>>()?;
        if !freed.is_empty() {
            self.exec(PURGE_HOLDERS, None, &[now]).await?;
        }
        Ok(freed)
    }

    async fn purge_waiters(&mut self, now: i64) -> Result<u64> {
        self.exec(PURGE_WAITERS, None, &[now]).await
    }

    async fn holder(&mut self, lease: &str) -> Result<Option<HolderRow>> {
        let rows = self.fetch(GET_HOLDER, Some(lease), &[]).await?;
        rows.first().map(holder_at).transpose()
    }

    async fn holders(&mut self) -> Result<Vec<HolderRow>> {
        let rows = self.fetch(ALL_HOLDERS, None, &[]).await?;
        rows.iter().map(holder_at).collect()
    }

    async fn insert_holder(&mut self, h: &NewHolder<'_>) -> Result<()> {
        sqlx::query(INSERT_HOLDER)
            .bind(self.name)
            .bind(h.lease_id)
            .bind(h.weight)
            .bind(h.seats)
            .bind(h.fence)
            .bind(h.holder)
            .bind(h.acquired_at)
            .bind(h.expires_at)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn remove_holder(&mut self, lease: &str) -> Result<Option<Freed>> {
        let rows = self.fetch(HOLDER_FREES, Some(lease), &[]).await?;
        let Some(freed) = rows.first().map(freed_at).transpose()? else {
            return Ok(None);
        };
        self.exec(REMOVE_HOLDER, Some(lease), &[]).await?;
        Ok(Some(freed))
    }

    async fn renew_holder(&mut self, lease: &str, at: i64) -> Result<Option<i64>> {
        let matched = sqlx::query(RENEW_HOLDER)
            .bind(at)
            .bind(self.name)
            .bind(lease)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?
            .rows_affected();
        if matched == 0 {
            return Ok(None);
        }
        let rows = self.fetch(HOLDER_EXPIRY, Some(lease), &[]).await?;
        rows.first().map(|r| int_at(r, 0)).transpose()
    }

    async fn pop_head_if_fits(&mut self, available: i64) -> Result<Option<HeadRow>> {
        let rows = self.fetch(HEAD, None, &[]).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let head = HeadRow {
            lease_id: text_at(row, 1)?,
            weight: int_at(row, 2)?,
            holder: text_at(row, 3)?,
            ttl: int_at(row, 4)?,
        };
        if head.weight > available {
            return Ok(None);
        }
        let seq = int_at(row, 0)?;
        let doorbell = text_at(row, 5)?;
        self.exec(POP_HEAD, None, &[seq]).await?;
        if !doorbell.is_empty() && !self.rung.contains(&doorbell) {
            self.rung.push(doorbell);
        }
        Ok(Some(head))
    }

    async fn insert_waiter(&mut self, w: &NewWaiter<'_>) -> Result<()> {
        sqlx::query(INSERT_WAITER)
            .bind(self.name)
            .bind(w.seq)
            .bind(w.lease_id)
            .bind(w.weight)
            .bind(w.holder)
            .bind(w.ttl)
            .bind(w.enqueued_at)
            .bind(w.expires_at)
            .bind(self.doorbell)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn remove_waiter(&mut self, lease: &str) -> Result<u64> {
        self.exec(REMOVE_WAITER, Some(lease), &[]).await
    }

    async fn refresh_waiter(&mut self, lease: &str, at: i64) -> Result<u64> {
        sqlx::query(REFRESH_WAITER)
            .bind(at)
            .bind(self.doorbell)
            .bind(self.name)
            .bind(lease)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(|r| r.rows_affected())
    }

    async fn waiter_position(&mut self, lease: &str) -> Result<i64> {
        let row = sqlx::query(WAITER_POSITION)
            .bind(self.name)
            .bind(self.name)
            .bind(lease)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?
            .ok_or_else(|| corrupt("no waiter position"))?;
        int_at(&row, 0)
    }

    async fn waiters(&mut self) -> Result<Vec<WaiterRow>> {
        let rows = self.fetch(ALL_WAITERS, None, &[]).await?;
        rows.iter()
            .map(|row| {
                Ok(WaiterRow {
                    lease_id: text_at(row, 0)?,
                    weight: int_at(row, 1)?,
                    holder: text_at(row, 2)?,
                    enqueued_at: int_at(row, 3)?,
                    expires_at: int_at(row, 4)?,
                })
            })
            .collect()
    }

    async fn take_free_seats(&mut self, below: i64, n: i64) -> Result<Vec<i64>> {
        let rows = self.fetch(TAKE_FREE_SEATS, None, &[below, n]).await?;
        let seats = rows
            .iter()
            .map(|r| int_at(r, 0))
            .collect::<Result<Vec<_>>>()?;
        if let Some(&last) = seats.last() {
            // Every free seat up to `last` is one just taken (they are the lowest).
            self.exec(DROP_FREE_SEATS_UP_TO, None, &[last]).await?;
        }
        Ok(seats)
    }

    async fn insert_free_seats(&mut self, lo: i64, hi: i64) -> Result<()> {
        let mut from = lo;
        while from <= hi {
            let to = hi.min(from + SEAT_BATCH - 1);
            let values = vec!["(?, ?)"; (to - from + 1) as usize].join(", ");
            let sql = format!("INSERT INTO tessera_free_seats (name, seat) VALUES {values}");
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for seat in from..=to {
                q = q.bind(self.name).bind(seat);
            }
            q.execute(&mut *self.conn).await.map_err(map_err)?;
            from = to + 1;
        }
        Ok(())
    }

    async fn top_free_seats(&mut self, below: i64, limit: i64) -> Result<Vec<i64>> {
        let rows = self.fetch(TOP_FREE_SEATS, None, &[below, limit]).await?;
        rows.iter().map(|r| int_at(r, 0)).collect()
    }

    async fn drop_free_seats_from(&mut self, seat: i64) -> Result<()> {
        self.exec(DROP_FREE_SEATS_FROM, None, &[seat])
            .await
            .map(drop)
    }

    async fn drop_free_seats(&mut self) -> Result<()> {
        self.exec(DROP_FREE_SEATS, None, &[]).await.map(drop)
    }

    async fn drop_holders(&mut self) -> Result<Vec<String>> {
        self.select_then_delete(HOLDER_IDS, DROP_HOLDERS).await
    }

    async fn drop_waiters(&mut self) -> Result<Vec<String>> {
        self.select_then_delete(WAITER_IDS, DROP_WAITERS).await
    }
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

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
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

/// A holder row: lease_id, weight, seats, fence, holder, acquired_at, expires_at.
fn holder_at(row: &MySqlRow) -> Result<HolderRow> {
    Ok(HolderRow {
        lease_id: text_at(row, 0)?,
        weight: int_at(row, 1)?,
        seats: text_at(row, 2)?,
        fence: int_at(row, 3)?,
        holder: text_at(row, 4)?,
        acquired_at: int_at(row, 5)?,
        expires_at: int_at(row, 6)?,
    })
}
