//! Rate limiters in the MySQL / MariaDB store: [`crate::RateBackend`] over the tables of
//! `rate_schema.sql`, one short transaction per step. The step is the SQL stores' shared
//! one (`stores/sql/rate.rs`, deciding with the same pure functions as the memory store);
//! this file holds MySQL's statements for it.
//!
//! A step first locks the limiter's row, creating a placeholder if it has none (`INSERT …
//! ON DUPLICATE KEY UPDATE`, which locks an existing row too, so two first requests of a new
//! limiter queue on one row lock instead of deadlocking on a gap lock, the failure FIELD-NOTES
//! describes for `INSERT … SELECT … WHERE NOT EXISTS`). The placeholder has expired at birth
//! (`expires_at = 0`), so it reads as "no state". The same statement that reads the row reads
//! the server's clock, after the lock. Then, as on SQLite: prune log entries older than the
//! longest window, look up the binding entry of each limit with one index seek on
//! `(name, p)`, decide, and write the row and at most one log entry. A limited request
//! writes nothing but what pruning changed. Each step also deletes up to 16 other limiters
//! whose state has expired (and their logs), skipping rows that another step holds
//! (`SKIP LOCKED`, MariaDB 10.6+ and MySQL 8), so idle limiters leave the database.
//!
//! A status is no step: it reads the row and its whole log in one consistent-snapshot
//! read-only transaction, without a lock, and computes the step's answer from them
//! (`stores/sql/rate_snapshot.rs`).

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::conns::{is_retryable, retry_pause};
use super::error::map_err;
use super::ops::{batch, int_at, now_us, render, text_at, time_at, Lit, MysqlRows, READ_BEGIN};
use super::MysqlBackend;
use tessera_core::error::{Error, Result};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::engine::RateState;
use tessera_core::rate::seam::RateStatus;
use tessera_core::seam::{RateBackend, RateConfig, RateReply, RateRequest};
use tessera_core::stores::sql::rate::{
    self as shared, corrupt, db, encode_tat, non_negative, RateRow, RateRows, SettleRows,
    TenantLimiterRows,
};
use tessera_core::stores::sql::{read_rate_status, RateRead, RateSnapshot};

const LOCK: &str = "INSERT INTO tessera_rate_limiters \
     (name, config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at) \
     VALUES (?, '', 0, 0, 0, 0, 0, 0, '', '', 0) ON DUPLICATE KEY UPDATE name = name";
const LOAD: &str = concat!(
    "SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at, ",
    now_us!(),
    " FROM tessera_rate_limiters WHERE name = ? FOR UPDATE"
);
const SAVE: &str = "UPDATE tessera_rate_limiters SET config = ?, seq = ?, tail = ?, last = ?, \
     prev_last = ?, p = ?, base = ?, tat = ?, prev_tat = ?, expires_at = ? WHERE name = ?";
const INSERT: &str = "INSERT INTO tessera_rate_limiters \
     (config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at, name) \
     VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const EXPIRED: &str = "SELECT name FROM tessera_rate_limiters \
     WHERE expires_at <= ? AND name <> ? ORDER BY expires_at LIMIT 16 FOR UPDATE SKIP LOCKED";
const PRUNED_TOTAL: &str = "SELECT MAX(p) FROM tessera_rate_log WHERE name = ? AND t <= ?";
const PRUNE: &str = "DELETE FROM tessera_rate_log WHERE name = ? AND t <= ?";
const WHOLE_LOG: &str = "SELECT t, p FROM tessera_rate_log WHERE name = ? ORDER BY p";
/// `rate_status` without the row lock (`stores/sql/rate_snapshot.rs`), inside a
/// consistent-snapshot read-only transaction ([`READ_BEGIN`], as a semaphore's status): the
/// row with the clock, read after the snapshot was taken (the columns of [`LOAD`]), and with
/// the count of expired admissions where the row has it; then [`WHOLE_LOG`].
const READ_ROW: &str = concat!(
    "SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at, ",
    now_us!(),
    " FROM tessera_rate_limiters WHERE name = ?"
);
const READ_ROW_COUNTED: &str = concat!(
    "SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at, ",
    now_us!(),
    ", expired FROM tessera_rate_limiters WHERE name = ?"
);
const LIST: &str = concat!(
    "SELECT name FROM tessera_rate_limiters WHERE expires_at > ",
    now_us!(),
    " ORDER BY name"
);

/// [`RateRows`] in MySQL's statements.
struct MysqlRateRows<'c> {
    conn: &'c mut MySqlConnection,
    name: &'c str,
}

impl<'c> MysqlRateRows<'c> {
    fn new(conn: &'c mut MySqlConnection, name: &'c Name) -> Self {
        MysqlRateRows {
            conn,
            name: name.as_str(),
        }
    }
}

fn u64_at(row: &MySqlRow, i: usize, what: &str) -> Result<u64> {
    let v = int_at(row, i).map_err(|e| corrupt(format!("rate {what}: {e}")))?;
    non_negative(v, what)
}

impl RateRows for MysqlRateRows<'_> {
    tessera_core::shared_rate_rows!();

    /// Locks the row (creating the placeholder, expired at birth) and reads it with the
    /// server's clock in the statement after the lock.
    async fn load(&mut self) -> Result<(StoreTime, Option<RateRow>)> {
        sqlx::query(LOCK)
            .bind(self.name)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        let row = sqlx::query(LOAD)
            .bind(self.name)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)?;
        let now = time_at(&row, 10)?;
        let row = RateRow::from_columns(|i| text_at(&row, i), |i, what| u64_at(&row, i, what))?;
        Ok((now, Some(row)))
    }

    async fn expired(&mut self, now: StoreTime) -> Result<Vec<String>> {
        sqlx::query_scalar(EXPIRED)
            .bind(db(now.0))
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)
    }

    /// The row exists (locked by `load`, or deleted by the step as expired and then
    /// written again here).
    async fn save(&mut self, state: &RateState, expires_at: u64) -> Result<()> {
        // SAVE and INSERT take the same values in the same order.
        let row = |sql| {
            sqlx::query(sql)
                .bind(&state.config)
                .bind(db(state.seq))
                .bind(db(state.tail))
                .bind(db(state.last))
                .bind(db(state.prev_last))
                .bind(db(state.p))
                .bind(db(state.base))
                .bind(encode_tat(&state.tat))
                .bind(encode_tat(&state.prev_tat))
                .bind(db(expires_at))
                .bind(self.name)
        };
        let matched = row(SAVE)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?
            .rows_affected();
        if matched == 0 {
            row(INSERT)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        Ok(())
    }

    async fn prune(&mut self, cutoff: u64) -> Result<Option<i64>> {
        let cutoff = db(cutoff);
        let gone: Option<i64> = sqlx::query_scalar(PRUNED_TOTAL)
            .bind(self.name)
            .bind(cutoff)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)?;
        if gone.is_some() {
            sqlx::query(PRUNE)
                .bind(self.name)
                .bind(cutoff)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        Ok(gone)
    }

    async fn whole_log(&mut self) -> Result<Vec<(i64, i64)>> {
        let rows = sqlx::query(WHOLE_LOG)
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)?;
        rows.iter()
            .map(|row| Ok((int_at(row, 0)?, int_at(row, 1)?)))
            .collect()
    }
}

impl MysqlRateRows<'_> {
    async fn last_at_or_before(&mut self, t: u64) -> Result<Option<(i64, i64)>> {
        let row = sqlx::query(tessera_core::stores::sql::rate::LAST_AT_OR_BEFORE)
            .bind(self.name)
            .bind(db(t))
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?;
        row.map(|r| Ok((int_at(&r, 0)?, int_at(&r, 1)?)))
            .transpose()
    }

    async fn total_before(&mut self, t: u64) -> Result<Option<i64>> {
        sqlx::query_scalar(tessera_core::stores::sql::rate::TOTAL_BEFORE)
            .bind(self.name)
            .bind(db(t))
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)
    }

    async fn lower(&mut self, t: u64, d: u64, keep: Option<u64>) -> Result<()> {
        let [delete, shift, flip] = tessera_core::stores::sql::rate::LOWER;
        sqlx::query(delete)
            .bind(self.name)
            .bind(db(t))
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        sqlx::query(shift)
            .bind(db(d))
            .bind(self.name)
            .bind(db(t))
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        sqlx::query(flip)
            .bind(self.name)
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        if let Some(p) = keep {
            self.append(p, t).await?;
        }
        Ok(())
    }
}

impl SettleRows for MysqlRows<'_> {
    async fn last_at_or_before(&mut self, t: u64) -> Result<Option<(i64, i64)>> {
        self.rate_rows().last_at_or_before(t).await
    }
    async fn total_before(&mut self, t: u64) -> Result<Option<i64>> {
        self.rate_rows().total_before(t).await
    }
    async fn lower(&mut self, t: u64, d: u64, keep: Option<u64>) -> Result<()> {
        self.rate_rows().lower(t, d, keep).await
    }
}

/// [`RateRows`] on a semaphore step's transaction, for an admission: the limiter's rows
/// change in the same transaction as the semaphore's (locked after it, as every admission
/// does, so it cannot deadlock with a plain rate step, which locks the limiter's row alone),
/// with the statements of [`MysqlRateRows`] and decided on the step's own clock reading, so
/// the windows are charged at the instant the lease is granted.
impl RateRows for MysqlRows<'_> {
    async fn load(&mut self) -> Result<(StoreTime, Option<RateRow>)> {
        let now = self.now();
        let (_, row) = self.rate_rows().load().await?;
        Ok((now, row))
    }

    async fn expired(&mut self, now: StoreTime) -> Result<Vec<String>> {
        self.rate_rows().expired(now).await
    }

    async fn drop_state(&mut self, name: &str) -> Result<()> {
        self.rate_rows().drop_state(name).await
    }

    async fn save(&mut self, state: &RateState, expires_at: u64) -> Result<()> {
        self.rate_rows().save(state, expires_at).await
    }

    async fn prune(&mut self, cutoff: u64) -> Result<Option<i64>> {
        self.rate_rows().prune(cutoff).await
    }

    async fn first_at_least(&mut self, p: u64) -> Result<Option<i64>> {
        self.rate_rows().first_at_least(p).await
    }

    async fn append(&mut self, p: u64, t: u64) -> Result<()> {
        self.rate_rows().append(p, t).await
    }

    async fn remove_entry(&mut self, p: u64) -> Result<()> {
        self.rate_rows().remove_entry(p).await
    }

    async fn last_total(&mut self) -> Result<Option<i64>> {
        self.rate_rows().last_total().await
    }

    async fn whole_log(&mut self) -> Result<Vec<(i64, i64)>> {
        self.rate_rows().whole_log().await
    }

    async fn count_expired(&mut self, until: u64) -> Result<()> {
        self.rate_rows().count_expired(until).await
    }

    async fn expired_unused(&mut self) -> Result<u64> {
        self.rate_rows().expired_unused().await
    }

    async fn drop_tenant_limiters(&mut self, name: &str) -> Result<()> {
        self.rate_rows().drop_tenant_limiters(name).await
    }
}

/// An admission's rows reach the tenants' own limiters too (window ceilings): the rate
/// statements above are about the limiter [`MysqlRows::point_at`] names.
impl TenantLimiterRows for MysqlRows<'_> {
    fn point_at(&mut self, key: Option<String>) {
        MysqlRows::point_at(self, key);
    }
}

impl<'c> MysqlRows<'c> {
    /// The limiter of the same name (or the tenant's own it is pointed at), on this step's
    /// connection.
    fn rate_rows(&mut self) -> MysqlRateRows<'_> {
        let (conn, name) = self.conn_and_limiter();
        MysqlRateRows { conn, name }
    }
}

/// Reads limiter `name` in one snapshot without a lock (see [`READ_ROW`]), in one round trip
/// ending with the commit; on an error the caller rolls back (the transaction may still be
/// open). `counted`: the row has the count of expired admissions.
async fn read_snapshot(
    conn: &mut MySqlConnection,
    name: &str,
    counted: bool,
) -> Result<RateSnapshot> {
    let lit = [Lit::Text(name)];
    let read_row = if counted { READ_ROW_COUNTED } else { READ_ROW };
    let sql = format!(
        "{READ_BEGIN};{};{};COMMIT",
        render(read_row, &lit),
        render(WHOLE_LOG, &lit)
    );
    let mut results = batch(conn, sql).await?.into_iter().map(|(rows, _)| rows);
    // SET, START TRANSACTION, then the two reads.
    let (Some(row), Some(log)) = (results.nth(2), results.next()) else {
        return Err(corrupt("rate status: fewer results than statements"));
    };
    let Some(row) = row.first() else {
        return Ok(RateSnapshot {
            now: StoreTime(0),
            row: None,
            log: Vec::new(),
            expired: None,
        });
    };
    let log = log
        .iter()
        .map(|e| Ok((int_at(e, 0)?, int_at(e, 1)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok(RateSnapshot {
        now: time_at(row, 10)?,
        row: Some(RateRow::from_columns(
            |i| text_at(row, i),
            |i, what| u64_at(row, i, what),
        )?),
        log,
        expired: counted.then(|| int_at(row, 11)).transpose()?,
    })
}

#[async_trait]
impl RateBackend for MysqlBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        step!(self, |conn| shared::acquire(
            &mut MysqlRateRows::new(conn, name),
            name,
            config,
            req
        ))
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        step!(self, |conn| shared::cancel(
            &mut MysqlRateRows::new(conn, name),
            name,
            reservation,
            at,
            0
        ))
    }

    /// From one snapshot without the row lock (`stores/sql/rate_snapshot.rs`); the step only
    /// for a snapshot that reads wrong, or whose read lost its connection (the step then
    /// runs again on another).
    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        let mut tx = self.transaction().await?;
        let read = read_snapshot(&mut tx.conn, name.as_str(), self.counts_expired).await;
        match &read {
            Ok(_) => tx.open = false,
            Err(_) => tx.rollback().await,
        }
        drop(tx);
        let read = match read {
            Err(e) if is_retryable(&e, false, 0) => RateRead::Step,
            read => read_rate_status(name, read)?,
        };
        if let RateRead::Settled(answer) = read {
            return Ok(answer);
        }
        step!(self, |conn| shared::status(
            &mut MysqlRateRows::new(conn, name),
            name,
            self.counts_expired
        ))
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        step!(self, |conn| shared::delete(
            &mut MysqlRateRows::new(conn, name),
            name
        ))
    }

    /// The tenants' own limiters (window ceilings) are left out: they are their names'.
    async fn rate_list(&self) -> Result<Vec<String>> {
        let mut conn = self.conns.ops().await?;
        let mut names: Vec<String> = sqlx::query_scalar(LIST)
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        names.retain(|n| !shared::is_tenant_key(n));
        Ok(names)
    }
}
