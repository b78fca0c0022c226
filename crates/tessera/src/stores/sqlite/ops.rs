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

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;

use super::map_err;
use crate::error::{Error, Result};
use crate::model::StoreTime;
#[cfg(any(test, feature = "fuzzing"))]
pub(crate) use crate::stores::sql::{decode_seats, encode_seats};
use crate::stores::sql::{
    Freed, HeadRow, HolderRow, Loaded, NewHolder, NewWaiter, SemRow, SemRows, WaiterRow,
};

/// The fence high-water mark, and the semaphore's row if it has one (NULLs if not).
const LOAD_SEM: &str = "SELECT m.value, s.capacity, s.used, s.queued, s.last_fence, \
     s.next_seq, s.seat_high FROM tessera_meta m \
     LEFT JOIN tessera_semaphores s ON s.name = ?1 WHERE m.key = 'fence_hwm'";
const SAVE_SEM: &str = "INSERT INTO tessera_semaphores \
     (name, capacity, used, queued, last_fence, next_seq, seat_high) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) \
     ON CONFLICT (name) DO UPDATE SET capacity = ?2, used = ?3, queued = ?4, \
     last_fence = ?5, next_seq = ?6, seat_high = ?7";
const DROP_SEM: &str = "DELETE FROM tessera_semaphores WHERE name = ?1";
const DROP_FREE_SEATS: &str = "DELETE FROM tessera_free_seats WHERE name = ?1";
const SAVE_HWM: &str = "UPDATE tessera_meta SET value = ?1 WHERE key = 'fence_hwm'";

const PURGE_HOLDERS: &str = "DELETE FROM tessera_holders WHERE name = ?1 AND expires_at <= ?2 \
     RETURNING weight, seats";
const PURGE_WAITERS: &str = "DELETE FROM tessera_waiters WHERE name = ?1 AND expires_at <= ?2";

const GET_HOLDER: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ?1 AND lease_id = ?2";
const ALL_HOLDERS: &str = "SELECT lease_id, weight, seats, fence, holder, acquired_at, expires_at \
     FROM tessera_holders WHERE name = ?1 ORDER BY acquired_at, fence";
const INSERT_HOLDER: &str = "INSERT INTO tessera_holders \
     (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const REMOVE_HOLDER: &str = "DELETE FROM tessera_holders WHERE name = ?1 AND lease_id = ?2 \
     RETURNING weight, seats";
const RENEW_HOLDER: &str = "UPDATE tessera_holders SET expires_at = max(expires_at, ?3) \
     WHERE name = ?1 AND lease_id = ?2 RETURNING expires_at";

/// Pops the queue head if its weight is at most `?2` (the free permits).
const POP_HEAD_IF_FITS: &str = "DELETE FROM tessera_waiters WHERE name = ?1 \
     AND seq = (SELECT seq FROM tessera_waiters WHERE name = ?1 ORDER BY seq LIMIT 1) \
     AND weight <= ?2 RETURNING lease_id, weight, holder, ttl";
const INSERT_WAITER: &str = "INSERT INTO tessera_waiters \
     (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)";
const REMOVE_WAITER: &str = "DELETE FROM tessera_waiters WHERE name = ?1 AND lease_id = ?2";
const REFRESH_WAITER: &str = "UPDATE tessera_waiters SET expires_at = max(expires_at, ?3) \
     WHERE name = ?1 AND lease_id = ?2";
const WAITER_POSITION: &str = "SELECT count(*) FROM tessera_waiters WHERE name = ?1 AND seq < \
     (SELECT seq FROM tessera_waiters WHERE name = ?1 AND lease_id = ?2)";
const ALL_WAITERS: &str = "SELECT lease_id, weight, holder, enqueued_at, expires_at \
     FROM tessera_waiters WHERE name = ?1 ORDER BY seq";

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
pub(crate) struct SqliteRows<'c> {
    conn: &'c mut SqliteConnection,
    name: &'c str,
    now: StoreTime,
    wall: StoreTime,
}

impl<'c> SqliteRows<'c> {
    /// `now` is the store's clock, read once the write lock is held; the fences' wall-clock
    /// floor is `now` too unless set by [`SqliteRows::wall`].
    pub(crate) fn new(conn: &'c mut SqliteConnection, name: &'c str, now: StoreTime) -> Self {
        SqliteRows {
            conn,
            name,
            now,
            wall: now,
        }
    }

    /// The wall clock read beside `now`, the fences' floor.
    pub(crate) fn wall(mut self, wall: StoreTime) -> Self {
        self.wall = wall;
        self
    }

    /// Runs `sql` with the name, then `lease` if given, then `args`; how many rows it changed.
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

    /// The rows of `sql` with the name and `args`.
    async fn fetch(&mut self, sql: &'static str, args: &[i64]) -> Result<Vec<SqliteRow>> {
        let mut q = sqlx::query(sql).bind(self.name);
        for &a in args {
            q = q.bind(a);
        }
        q.fetch_all(&mut *self.conn).await.map_err(map_err)
    }

    /// The row of `sql` with the name and `lease`, if any.
    async fn fetch_lease(&mut self, sql: &'static str, lease: &str) -> Result<Option<SqliteRow>> {
        sqlx::query(sql)
            .bind(self.name)
            .bind(lease)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)
    }
}

impl SemRows for SqliteRows<'_> {
    async fn load(&mut self, _create: Option<u32>) -> Result<Loaded> {
        let row = sqlx::query(LOAD_SEM)
            .bind(self.name)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?
            .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
        let exists = row
            .try_get::<Option<i64>, _>(1)
            .map_err(|e| corrupt(format!("capacity: {e}")))?
            .is_some();
        let sem = match exists {
            true => Some(SemRow {
                capacity: int_at(&row, 1)?,
                used: int_at(&row, 2)?,
                queued: int_at(&row, 3)?,
                last_fence: int_at(&row, 4)?,
                next_seq: int_at(&row, 5)?,
                seat_high: int_at(&row, 6)?,
            }),
            false => None,
        };
        Ok(Loaded {
            now: self.now,
            wall: self.wall,
            hwm: int_at(&row, 0)?,
            sem,
        })
    }

    async fn save(&mut self, s: &SemRow) -> Result<()> {
        let args = [
            s.capacity,
            s.used,
            s.queued,
            s.last_fence,
            s.next_seq,
            s.seat_high,
        ];
        self.exec(SAVE_SEM, None, &args).await.map(drop)
    }

    async fn drop_semaphore(&mut self) -> Result<bool> {
        Ok(self.exec(DROP_SEM, None, &[]).await? > 0)
    }

    async fn raise_hwm(&mut self, hwm: i64) -> Result<()> {
        // The meta row is under the same write lock: a plain write cannot lower it.
        sqlx::query(SAVE_HWM)
            .bind(hwm)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn purge_holders(&mut self, now: i64) -> Result<Vec<Freed>> {
        let rows = self.fetch(PURGE_HOLDERS, &[now]).await?;
        rows.iter().map(freed_at).collect()
    }

    async fn purge_waiters(&mut self, now: i64) -> Result<u64> {
        self.exec(PURGE_WAITERS, None, &[now]).await
    }

    async fn holder(&mut self, lease: &str) -> Result<Option<HolderRow>> {
        let row = self.fetch_lease(GET_HOLDER, lease).await?;
        row.as_ref().map(holder_at).transpose()
    }

    async fn holders(&mut self) -> Result<Vec<HolderRow>> {
        let rows = self.fetch(ALL_HOLDERS, &[]).await?;
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
        let row = self.fetch_lease(REMOVE_HOLDER, lease).await?;
        row.as_ref().map(freed_at).transpose()
    }

    async fn renew_holder(&mut self, lease: &str, at: i64) -> Result<Option<i64>> {
        let row = sqlx::query(RENEW_HOLDER)
            .bind(self.name)
            .bind(lease)
            .bind(at)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?;
        row.map(|row| int_at(&row, 0)).transpose()
    }

    async fn pop_head_if_fits(&mut self, available: i64) -> Result<Option<HeadRow>> {
        let Some(row) = sqlx::query(POP_HEAD_IF_FITS)
            .bind(self.name)
            .bind(available)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?
        else {
            return Ok(None);
        };
        Ok(Some(HeadRow {
            lease_id: text_at(&row, 0)?,
            weight: int_at(&row, 1)?,
            holder: text_at(&row, 2)?,
            ttl: int_at(&row, 3)?,
        }))
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
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)
            .map(drop)
    }

    async fn remove_waiter(&mut self, lease: &str) -> Result<u64> {
        self.exec(REMOVE_WAITER, Some(lease), &[]).await
    }

    async fn refresh_waiter(&mut self, lease: &str, at: i64) -> Result<u64> {
        self.exec(REFRESH_WAITER, Some(lease), &[at]).await
    }

    async fn waiter_position(&mut self, lease: &str) -> Result<i64> {
        let row = self.fetch_lease(WAITER_POSITION, lease).await?;
        let row = row.ok_or_else(|| corrupt("no waiter position"))?;
        int_at(&row, 0)
    }

    async fn waiters(&mut self) -> Result<Vec<WaiterRow>> {
        let rows = self.fetch(ALL_WAITERS, &[]).await?;
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
        let rows = self.fetch(TAKE_FREE_SEATS, &[below, n]).await?;
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
        self.exec(INSERT_FREE_SEAT_RANGE, None, &[lo, hi])
            .await
            .map(drop)
    }

    async fn top_free_seats(&mut self, below: i64, limit: i64) -> Result<Vec<i64>> {
        let rows = self.fetch(TOP_FREE_SEATS, &[below, limit]).await?;
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
        let rows = self.fetch(DROP_HOLDERS, &[]).await?;
        Ok(rows.iter().filter_map(|r| text_at(r, 0).ok()).collect())
    }

    async fn drop_waiters(&mut self) -> Result<Vec<String>> {
        let rows = self.fetch(DROP_WAITERS, &[]).await?;
        Ok(rows.iter().filter_map(|r| text_at(r, 0).ok()).collect())
    }
}

/// The names of the semaphores the file holds state for (no transaction needed).
pub(crate) async fn list(conn: &mut SqliteConnection) -> Result<Vec<String>> {
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

fn int_at(row: &SqliteRow, i: usize) -> Result<i64> {
    row.try_get::<i64, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

fn text_at(row: &SqliteRow, i: usize) -> Result<String> {
    row.try_get::<String, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

/// `weight, seats` of a removed holder.
fn freed_at(row: &SqliteRow) -> Result<Freed> {
    Ok(Freed {
        weight: int_at(row, 0)?,
        seats: text_at(row, 1)?,
    })
}

/// A holder row: lease_id, weight, seats, fence, holder, acquired_at, expires_at.
fn holder_at(row: &SqliteRow) -> Result<HolderRow> {
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
