//! The atomic operations of the SQLite store: the reference model of
//! `stores/memory/ops.rs`, operation by operation, over the tables of `schema.sql`.
//!
//! Every operation runs inside one `BEGIN IMMEDIATE` transaction opened by the caller
//! (`mod.rs`), so it holds SQLite's write lock from its first read: no other connection, in
//! this process or another, can interleave between the purge, the decision and the hand-off.
//! The shape is the model's: load the semaphore row → purge expired holders and waiters
//! (indexed by `(name, expires_at)`) → hand off to the queue head while it fits → decide →
//! hand off again → write the semaphore row back, or delete it when it has neither holders
//! nor waiters. The caller commits, then wakes the lease ids collected in [`Step::wakes`].
//!
//! The semaphore row carries running counters (`used`, `queued`), so no operation sums or
//! counts rows; each statement touches O(log n) index entries plus the rows it changes.
//! Seats follow the model exactly: every seat at or above `seat_high` is free, and
//! `tessera_free_seats` holds the returned seats below it; a lease takes the lowest free seats
//! below the capacity.
//!
//! Nothing read from the file is trusted: a value of the wrong range or shape is
//! [`Error::Corrupt`], never a panic.

use std::time::Duration;

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;

use super::map_err;
use crate::error::{Error, InvalidInput, Result};
use crate::model::*;

/// Lease ids to wake after the commit (granted waiters, revoked or deleted holders).
pub(crate) type Wakes = Vec<LeaseId>;

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
/// Batch size when shrinking `seat_high` over free seats.
const SHRINK_BATCH: usize = 256;

/// The counters of one semaphore row.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sem {
    capacity: u32,
    used: u32,
    queued: u64,
    last_fence: u64,
    next_seq: u64,
    seat_high: u32,
}

/// One atomic step on one semaphore, inside the caller's `BEGIN IMMEDIATE` transaction.
pub(crate) struct Step<'c> {
    conn: &'c mut SqliteConnection,
    name: &'c str,
    now: StoreTime,
    sem: Sem,
    /// The row as loaded (`None`: not in the file yet), to skip writing an unchanged row.
    loaded: Option<Sem>,
    /// The store-wide fence high-water mark.
    hwm: u64,
    hwm_dirty: bool,
    wakes: Wakes,
}

impl<'c> Step<'c> {
    /// Loads the semaphore and runs purge → hand off. Without a row, creates one with
    /// `create` as capacity (acquire), or returns `None`.
    async fn load(
        conn: &'c mut SqliteConnection,
        name: &'c Name,
        now: StoreTime,
        create: Option<u32>,
    ) -> Result<Option<Step<'c>>> {
        let row = sqlx::query(LOAD_SEM)
            .bind(name.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?
            .ok_or_else(|| corrupt("tessera_meta has no fence_hwm row"))?;
        let hwm = u64_at(&row, 0, "fence_hwm")?;
        let exists = row
            .try_get::<Option<i64>, _>(1)
            .map_err(|e| corrupt(format!("capacity: {e}")))?
            .is_some();
        let loaded = match exists {
            true => Some(Sem {
                capacity: capacity_at(&row, 1)?,
                used: u32_at(&row, 2, "used")?,
                queued: u64_at(&row, 3, "queued")?,
                last_fence: u64_at(&row, 4, "last_fence")?,
                next_seq: u64_at(&row, 5, "next_seq")?,
                seat_high: u32_at(&row, 6, "seat_high")?,
            }),
            false => None,
        };
        let mut step = Step {
            conn,
            name: name.as_str(),
            now,
            sem: Sem {
                capacity: 0,
                used: 0,
                queued: 0,
                last_fence: 0,
                next_seq: 0,
                seat_high: 0,
            },
            loaded: loaded.clone(),
            hwm,
            hwm_dirty: false,
            wakes: Vec::new(),
        };
        match (loaded, create) {
            (Some(sem), _) => step.sem = sem,
            (None, Some(capacity)) => {
                // A new semaphore starts at the store-wide high-water mark.
                step.sem.capacity = capacity;
                step.sem.last_fence = hwm;
                return Ok(Some(step));
            }
            (None, None) => return Ok(None),
        }
        step.purge_and_hand_off().await?;
        Ok(Some(step))
    }

    /// Writes the semaphore row back, or deletes it if nothing is left in it, and the fence
    /// high-water mark; returns the lease ids to wake after the commit.
    async fn finish(self) -> Result<Wakes> {
        if self.is_empty() {
            // With every seat returned, `seat_high` fell to 0 over the free seats, so there
            // are none left to drop unless it did not.
            let drops: &[&'static str] = if self.sem.seat_high == 0 {
                &[DROP_SEM]
            } else {
                &[DROP_SEM, DROP_FREE_SEATS]
            };
            for &q in drops {
                sqlx::query(q)
                    .bind(self.name)
                    .execute(&mut *self.conn)
                    .await
                    .map_err(map_err)?;
            }
        } else if self.loaded.as_ref() != Some(&self.sem) {
            let s = &self.sem;
            sqlx::query(SAVE_SEM)
                .bind(self.name)
                .bind(s.capacity)
                .bind(s.used)
                .bind(db_int(s.queued)?)
                .bind(db_int(s.last_fence)?)
                .bind(db_int(s.next_seq)?)
                .bind(s.seat_high)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        if self.hwm_dirty {
            sqlx::query(SAVE_HWM)
                .bind(db_int(self.hwm)?)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        Ok(self.wakes)
    }

    /// No holders and no waiters. Every holder has a weight of at least 1 (the schema
    /// checks it), so `used == 0` means no holders.
    fn is_empty(&self) -> bool {
        self.sem.used == 0 && self.sem.queued == 0
    }

    fn available(&self) -> u32 {
        self.sem.capacity.saturating_sub(self.sem.used)
    }
}

/// `value` as an SQLite integer.
fn db_int(value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| {
        Error::from(InvalidInput::Other(format!(
            "{value} does not fit an SQLite integer"
        )))
    })
}

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

fn int_at(row: &SqliteRow, i: usize) -> Result<i64> {
    row.try_get::<i64, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

fn u32_at(row: &SqliteRow, i: usize, what: &str) -> Result<u32> {
    let v = int_at(row, i)?;
    u32::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is out of range")))
}

fn u64_at(row: &SqliteRow, i: usize, what: &str) -> Result<u64> {
    let v = int_at(row, i)?;
    u64::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is negative")))
}

fn capacity_at(row: &SqliteRow, i: usize) -> Result<u32> {
    let c = u32_at(row, i, "capacity")?;
    if c == 0 || c > MAX_CAPACITY {
        return Err(corrupt(format!("capacity = {c} is out of range")));
    }
    Ok(c)
}

fn text_at(row: &SqliteRow, i: usize) -> Result<String> {
    row.try_get::<String, _>(i)
        .map_err(|e| corrupt(format!("column {i}: {e}")))
}

fn lease_at(row: &SqliteRow, i: usize) -> Result<LeaseId> {
    let s = text_at(row, i)?;
    s.parse()
        .map_err(|_| corrupt(format!("lease id {:?} is not 32 hex digits", truncate(&s))))
}

fn time_at(row: &SqliteRow, i: usize, what: &str) -> Result<StoreTime> {
    u64_at(row, i, what).map(StoreTime)
}

fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}

/// Encodes ascending seats as ranges: `[0, 1, 2, 3, 7]` → `"0-3,7"`.
pub(crate) fn encode_seats(seats: &[u32]) -> String {
    let mut out = String::new();
    for (lo, hi) in runs(seats) {
        if !out.is_empty() {
            out.push(',');
        }
        if lo == hi {
            out.push_str(&lo.to_string());
        } else {
            out.push_str(&format!("{lo}-{hi}"));
        }
    }
    out
}

/// Decodes [`encode_seats`]; the seats must be strictly ascending and number `weight`.
pub(crate) fn decode_seats(text: &str, weight: u32) -> Result<Vec<u32>> {
    let bad = || corrupt(format!("seats {:?} for weight {weight}", truncate(text)));
    if weight > MAX_CAPACITY {
        return Err(bad());
    }
    let mut seats: Vec<u32> = Vec::new();
    if !text.is_empty() {
        for part in text.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let lo: u32 = lo.parse().map_err(|_| bad())?;
            let hi: u32 = hi.parse().map_err(|_| bad())?;
            if lo > hi || seats.last().is_some_and(|&l| l >= lo) {
                return Err(bad());
            }
            if seats.len() as u64 + (hi - lo) as u64 + 1 > weight as u64 {
                return Err(bad());
            }
            seats.extend(lo..=hi);
        }
    }
    if seats.len() as u64 != weight as u64 {
        return Err(bad());
    }
    Ok(seats)
}

/// Maximal runs of consecutive values in an ascending slice, as `(first, last)`.
fn runs(seats: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &s in seats {
        match out.last_mut() {
            Some((_, hi)) if hi.checked_add(1) == Some(s) => *hi = s,
            _ => out.push((s, s)),
        }
    }
    out
}

impl Step<'_> {
    fn now_db(&self) -> Result<i64> {
        db_int(self.now.0)
    }

    /// Drops expired holders and waiters, then hands freed permits to the queue.
    async fn purge_and_hand_off(&mut self) -> Result<()> {
        if self.sem.used > 0 {
            self.purge_holders().await?;
        }
        if self.sem.queued > 0 {
            let gone = sqlx::query(PURGE_WAITERS)
                .bind(self.name)
                .bind(self.now_db()?)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?
                .rows_affected();
            self.take_queued(gone)?;
        }
        self.hand_off().await
    }

    async fn purge_holders(&mut self) -> Result<()> {
        let rows = sqlx::query(PURGE_HOLDERS)
            .bind(self.name)
            .bind(self.now_db()?)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)?;
        let mut freed = Vec::new();
        for row in &rows {
            let weight = u32_at(row, 0, "weight")?;
            freed.extend(decode_seats(&text_at(row, 1)?, weight)?);
            self.take_used(weight)?;
        }
        freed.sort_unstable();
        self.return_seats(freed).await
    }

    fn take_used(&mut self, weight: u32) -> Result<()> {
        self.sem.used = self.sem.used.checked_sub(weight).ok_or_else(|| {
            corrupt(format!(
                "used {} < a holder's weight {weight}",
                self.sem.used
            ))
        })?;
        Ok(())
    }

    fn take_queued(&mut self, n: u64) -> Result<()> {
        self.sem.queued =
            self.sem.queued.checked_sub(n).ok_or_else(|| {
                corrupt(format!("queued {} < {n} waiters removed", self.sem.queued))
            })?;
        Ok(())
    }

    /// Strict FIFO: grant the head while it fits; a head that does not fit blocks the rest.
    async fn hand_off(&mut self) -> Result<()> {
        while self.sem.queued > 0 && self.sem.used < self.sem.capacity {
            let Some(row) = sqlx::query(POP_HEAD_IF_FITS)
                .bind(self.name)
                .bind(self.available())
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(map_err)?
            else {
                break;
            };
            self.take_queued(1)?;
            let lease_id = lease_at(&row, 0)?;
            let weight = u32_at(&row, 1, "weight")?;
            let holder = text_at(&row, 2)?;
            let ttl = Duration::from_micros(u64_at(&row, 3, "ttl")?);
            self.grant(lease_id, weight, ttl, holder).await?;
            self.wakes.push(lease_id);
        }
        Ok(())
    }

    async fn grant(
        &mut self,
        lease_id: LeaseId,
        weight: u32,
        ttl: Duration,
        holder: String,
    ) -> Result<Lease> {
        let seats = self.take_seats(weight).await?;
        let hwm = self.hwm;
        let fence = self
            .sem
            .last_fence
            .saturating_add(1)
            .max(self.now.0)
            .max(hwm.saturating_add(1));
        self.sem.last_fence = fence;
        self.hwm = fence;
        self.hwm_dirty = true;
        self.sem.used += weight;
        let lease = Lease {
            lease_id,
            weight,
            seats,
            fence,
            holder,
            acquired_at: self.now,
            expires_at: self.now.plus(ttl),
        };
        sqlx::query(INSERT_HOLDER)
            .bind(self.name)
            .bind(lease_id.to_string())
            .bind(weight)
            .bind(encode_seats(&lease.seats))
            .bind(db_int(fence)?)
            .bind(&lease.holder)
            .bind(db_int(lease.acquired_at.0)?)
            .bind(db_int(lease.expires_at.0)?)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        Ok(lease)
    }

    /// The `n` lowest free seats below the capacity: returned seats first, then from
    /// `seat_high` up. There are always enough while `used + n <= capacity`.
    async fn take_seats(&mut self, n: u32) -> Result<Vec<u32>> {
        let mut seats = Vec::with_capacity(n as usize);
        if self.sem.seat_high > 0 {
            let rows = sqlx::query(TAKE_FREE_SEATS)
                .bind(self.name)
                .bind(self.sem.capacity)
                .bind(n)
                .fetch_all(&mut *self.conn)
                .await
                .map_err(map_err)?;
            for row in &rows {
                seats.push(u32_at(row, 0, "seat")?);
            }
            if let Some(&last) = seats.last() {
                // Every free seat up to `last` is one just taken (they are the lowest).
                sqlx::query(DROP_FREE_SEATS_UP_TO)
                    .bind(self.name)
                    .bind(last)
                    .execute(&mut *self.conn)
                    .await
                    .map_err(map_err)?;
            }
        }
        let rest = n - seats.len() as u32;
        if rest == 0 {
            // After a shrinking resize `seat_high` may exceed the capacity; that is fine as
            // long as the returned seats below the capacity sufficed.
            return Ok(seats);
        }
        let high = self.sem.seat_high;
        if high as u64 + rest as u64 > self.sem.capacity as u64 {
            return Err(corrupt(format!(
                "no {n} free seats below capacity {} (seat_high {high})",
                self.sem.capacity
            )));
        }
        seats.extend(high..high + rest);
        self.sem.seat_high = high + rest;
        Ok(seats)
    }

    /// Returns ascending `seats` to the free set, lowering `seat_high` over free seats at
    /// its top so the free set stays small.
    async fn return_seats(&mut self, mut seats: Vec<u32>) -> Result<()> {
        let old_high = self.sem.seat_high;
        if seats.last().is_some_and(|&s| s >= old_high) {
            return Err(corrupt(format!(
                "seat {:?} >= seat_high {old_high}",
                seats.last()
            )));
        }
        // Seats right below `seat_high` need no row: they just lower it.
        let mut high = old_high;
        while seats.last().is_some_and(|&s| s + 1 == high) {
            seats.pop();
            high -= 1;
        }
        for (lo, hi) in runs(&seats) {
            sqlx::query(INSERT_FREE_SEAT_RANGE)
                .bind(self.name)
                .bind(lo)
                .bind(hi)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        if high < old_high {
            // `old_high - 1` was returned; keep lowering over free seats already in the table.
            loop {
                if high == 0 {
                    break;
                }
                let rows = sqlx::query(TOP_FREE_SEATS)
                    .bind(self.name)
                    .bind(high)
                    .bind(SHRINK_BATCH as i64)
                    .fetch_all(&mut *self.conn)
                    .await
                    .map_err(map_err)?;
                let mut lowered = 0;
                for row in &rows {
                    if u32_at(row, 0, "seat")? + 1 != high {
                        break;
                    }
                    high -= 1;
                    lowered += 1;
                }
                if lowered > 0 {
                    sqlx::query(DROP_FREE_SEATS_FROM)
                        .bind(self.name)
                        .bind(high)
                        .execute(&mut *self.conn)
                        .await
                        .map_err(map_err)?;
                }
                if lowered < SHRINK_BATCH {
                    break;
                }
            }
        }
        self.sem.seat_high = high;
        Ok(())
    }

    async fn remove_holder(&mut self, lease: LeaseId) -> Result<bool> {
        let Some(row) = sqlx::query(REMOVE_HOLDER)
            .bind(self.name)
            .bind(lease.to_string())
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?
        else {
            return Ok(false);
        };
        let weight = u32_at(&row, 0, "weight")?;
        let seats = decode_seats(&text_at(&row, 1)?, weight)?;
        self.take_used(weight)?;
        self.return_seats(seats).await?;
        Ok(true)
    }

    async fn remove_waiter(&mut self, lease: LeaseId) -> Result<bool> {
        let n = sqlx::query(REMOVE_WAITER)
            .bind(self.name)
            .bind(lease.to_string())
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?
            .rows_affected();
        self.take_queued(n)?;
        Ok(n > 0)
    }

    async fn refresh_waiter(&mut self, lease: LeaseId, expires_at: StoreTime) -> Result<bool> {
        if self.sem.queued == 0 {
            return Ok(false);
        }
        let n = sqlx::query(REFRESH_WAITER)
            .bind(self.name)
            .bind(lease.to_string())
            .bind(db_int(expires_at.0)?)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?
            .rows_affected();
        Ok(n > 0)
    }

    async fn position(&mut self, lease: LeaseId) -> Result<u64> {
        let row = sqlx::query(WAITER_POSITION)
            .bind(self.name)
            .bind(lease.to_string())
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)?;
        u64_at(&row, 0, "position")
    }

    async fn holder(&mut self, lease: LeaseId) -> Result<Option<Lease>> {
        if self.sem.used == 0 {
            return Ok(None);
        }
        let row = sqlx::query(GET_HOLDER)
            .bind(self.name)
            .bind(lease.to_string())
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?;
        row.as_ref().map(lease_from_row).transpose()
    }

    async fn snapshot(&mut self) -> Result<SemaphoreStatus> {
        let holders = sqlx::query(ALL_HOLDERS)
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)?
            .iter()
            .map(lease_from_row)
            .collect::<Result<Vec<_>>>()?;
        let queue = sqlx::query(ALL_WAITERS)
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)?
            .iter()
            .map(|row| {
                Ok(Waiter {
                    lease_id: lease_at(row, 0)?,
                    weight: u32_at(row, 1, "weight")?,
                    holder: text_at(row, 2)?,
                    enqueued_at: time_at(row, 3, "enqueued_at")?,
                    expires_at: time_at(row, 4, "expires_at")?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(SemaphoreStatus {
            name: self.name.to_string(),
            capacity: self.sem.capacity,
            used: self.sem.used,
            available: self.available(),
            now: self.now,
            holders,
            queue,
        })
    }
}

/// A holder row: lease_id, weight, seats, fence, holder, acquired_at, expires_at.
fn lease_from_row(row: &SqliteRow) -> Result<Lease> {
    let weight = u32_at(row, 1, "weight")?;
    Ok(Lease {
        lease_id: lease_at(row, 0)?,
        weight,
        seats: decode_seats(&text_at(row, 2)?, weight)?,
        fence: u64_at(row, 3, "fence")?,
        holder: text_at(row, 4)?,
        acquired_at: time_at(row, 5, "acquired_at")?,
        expires_at: time_at(row, 6, "expires_at")?,
    })
}

/// The outcome of one operation and the lease ids to wake once it is committed. The outcome
/// may itself be an error (capacity mismatch, full queue) that still commits the purge.
pub(crate) type Done<R> = (R, Wakes);

pub(crate) async fn acquire(
    conn: &mut SqliteConnection,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
    now: StoreTime,
) -> Result<Done<Result<AcquireReply>>> {
    let mut st = Step::load(conn, name, now, Some(capacity))
        .await?
        .ok_or_else(|| corrupt("internal: semaphore not created"))?;
    let reply = decide_acquire(&mut st, name, capacity, req).await?;
    Ok((reply, st.finish().await?))
}

async fn decide_acquire(
    st: &mut Step<'_>,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<Result<AcquireReply>> {
    let now = st.now;
    if st.sem.capacity != capacity {
        return Ok(Err(Error::CapacityMismatch {
            name: name.to_string(),
            stored: st.sem.capacity,
            declared: capacity,
        }));
    }
    // A retry of an acquire whose reply was lost: report what it already has.
    if let Some(lease) = st.holder(req.lease_id).await? {
        return Ok(Ok(AcquireReply::Granted(Grant { lease, now })));
    }
    if let Some(wait) = req.wait {
        if st
            .refresh_waiter(req.lease_id, now.plus(wait.waiter_ttl))
            .await?
        {
            let position = st.position(req.lease_id).await?;
            return Ok(Ok(AcquireReply::Queued { position }));
        }
    }
    // Only a request that finds nobody waiting may take free permits: neither a try nor a
    // newcomer jumps the queue.
    if st.sem.queued == 0 && st.sem.used as u64 + req.weight as u64 <= st.sem.capacity as u64 {
        let lease = st
            .grant(req.lease_id, req.weight, req.ttl, req.holder.clone())
            .await?;
        return Ok(Ok(AcquireReply::Granted(Grant { lease, now })));
    }
    let Some(wait) = req.wait else {
        return Ok(Ok(AcquireReply::NoPermit {
            available: st.available(),
            queued: st.sem.queued,
        }));
    };
    if st.sem.queued >= wait.queue_cap as u64 {
        return Ok(Err(Error::QueueFull {
            name: name.to_string(),
            cap: wait.queue_cap,
        }));
    }
    let seq = st.sem.next_seq;
    sqlx::query(INSERT_WAITER)
        .bind(st.name)
        .bind(db_int(seq)?)
        .bind(req.lease_id.to_string())
        .bind(req.weight)
        .bind(&req.holder)
        .bind(db_int(req.ttl.as_micros().min(u64::MAX as u128) as u64)?)
        .bind(db_int(now.0)?)
        .bind(db_int(now.plus(wait.waiter_ttl).0)?)
        .execute(&mut *st.conn)
        .await
        .map_err(map_err)?;
    st.sem.next_seq = seq.saturating_add(1);
    st.sem.queued += 1;
    Ok(Ok(AcquireReply::Queued {
        position: st.sem.queued - 1,
    }))
}

pub(crate) async fn heartbeat(
    conn: &mut SqliteConnection,
    name: &Name,
    lease: LeaseId,
    waiter_ttl: Duration,
    now: StoreTime,
) -> Result<Done<WaitReply>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((WaitReply::Gone, Vec::new()));
    };
    let reply = if let Some(l) = st.holder(lease).await? {
        WaitReply::Granted(Grant { lease: l, now })
    } else if st.refresh_waiter(lease, now.plus(waiter_ttl)).await? {
        WaitReply::Waiting
    } else {
        WaitReply::Gone
    };
    Ok((reply, st.finish().await?))
}

pub(crate) async fn cancel(
    conn: &mut SqliteConnection,
    name: &Name,
    lease: LeaseId,
    now: StoreTime,
) -> Result<Done<CancelReply>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((CancelReply::NotFound, Vec::new()));
    };
    let reply = if st.remove_waiter(lease).await? {
        CancelReply::Dequeued
    } else if st.remove_holder(lease).await? {
        CancelReply::Released
    } else {
        CancelReply::NotFound
    };
    if reply != CancelReply::NotFound {
        // Removing the head of the queue, or freeing permits, may let the next in.
        st.hand_off().await?;
    }
    Ok((reply, st.finish().await?))
}

pub(crate) async fn release(
    conn: &mut SqliteConnection,
    name: &Name,
    lease: LeaseId,
    now: StoreTime,
) -> Result<Done<bool>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((false, Vec::new()));
    };
    let held = st.remove_holder(lease).await?;
    st.hand_off().await?;
    Ok((held, st.finish().await?))
}

pub(crate) async fn renew(
    conn: &mut SqliteConnection,
    name: &Name,
    lease: LeaseId,
    ttl: Duration,
    now: StoreTime,
) -> Result<Done<RenewReply>> {
    let Some(st) = Step::load(conn, name, now, None).await? else {
        return Ok((RenewReply::Gone, Vec::new()));
    };
    let row = sqlx::query(RENEW_HOLDER)
        .bind(st.name)
        .bind(lease.to_string())
        .bind(db_int(now.plus(ttl).0)?)
        .fetch_optional(&mut *st.conn)
        .await
        .map_err(map_err)?;
    let reply = match row {
        Some(row) => RenewReply::Renewed {
            expires_at: time_at(&row, 0, "expires_at")?,
            now,
        },
        None => RenewReply::Gone,
    };
    Ok((reply, st.finish().await?))
}

pub(crate) async fn status(
    conn: &mut SqliteConnection,
    name: &Name,
    now: StoreTime,
) -> Result<Done<Option<SemaphoreStatus>>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((None, Vec::new()));
    };
    let snap = st.snapshot().await?;
    let wakes = st.finish().await?;
    let snap = Some(snap).filter(|s| !(s.holders.is_empty() && s.queue.is_empty()));
    Ok((snap, wakes))
}

pub(crate) async fn list(conn: &mut SqliteConnection) -> Result<Vec<String>> {
    sqlx::query("SELECT name FROM tessera_semaphores ORDER BY name")
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?
        .iter()
        .map(|row| text_at(row, 0))
        .collect()
}

pub(crate) async fn resize(
    conn: &mut SqliteConnection,
    name: &Name,
    capacity: u32,
    now: StoreTime,
) -> Result<Done<Result<u32>>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((Err(not_found(name)), Vec::new()));
    };
    if st.is_empty() {
        // Everything in it had expired: the purge is committed and the row deleted.
        return Ok((Err(not_found(name)), st.finish().await?));
    }
    let old = std::mem::replace(&mut st.sem.capacity, capacity);
    st.hand_off().await?;
    Ok((Ok(old), st.finish().await?))
}

pub(crate) async fn revoke(
    conn: &mut SqliteConnection,
    name: &Name,
    lease: LeaseId,
    now: StoreTime,
) -> Result<Done<bool>> {
    let Some(mut st) = Step::load(conn, name, now, None).await? else {
        return Ok((false, Vec::new()));
    };
    let held = st.remove_holder(lease).await?;
    if held {
        st.wakes.push(lease);
        st.hand_off().await?;
    }
    Ok((held, st.finish().await?))
}

/// Removes the semaphore with its holders and waiters, without purging first (as the
/// model). Unreadable lease ids are skipped rather than failing: deleting is how an admin
/// clears a semaphore whose rows are damaged.
pub(crate) async fn delete(conn: &mut SqliteConnection, name: &Name) -> Result<Done<bool>> {
    let mut wakes = Vec::new();
    for q in [
        "DELETE FROM tessera_holders WHERE name = ?1 RETURNING lease_id",
        "DELETE FROM tessera_waiters WHERE name = ?1 RETURNING lease_id",
    ] {
        let rows = sqlx::query(q)
            .bind(name.as_str())
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        wakes.extend(rows.iter().filter_map(|r| lease_at(r, 0).ok()));
    }
    sqlx::query(DROP_FREE_SEATS)
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    let existed = sqlx::query(DROP_SEM)
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected()
        > 0;
    Ok((existed, wakes))
}

fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore {name:?} has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}
