//! Rate limiters in the PostgreSQL store: [`crate::RateBackend`] over the tables of
//! `sql/rate_schema.sql` (migration 2), one short transaction per step. The step is the SQL
//! stores' shared one (`stores/sql/rate.rs`, deciding with the same pure functions as the
//! memory store); this file holds PostgreSQL's statements for it.
//!
//! A step first locks the limiter's row: it inserts a placeholder if the name has none
//! (`ON CONFLICT DO NOTHING`; the placeholder has expired at birth, `expires_at = 0`, so it
//! reads as "no state"), then locks it with `SELECT … FOR UPDATE`. The server's clock
//! (`clock_timestamp()`) is read by the same statement *above* the locking subquery, so it
//! is evaluated only once the lock is granted — in the select list of the locking `SELECT`
//! itself it could be read before the wait for the lock ends. If a concurrent step deleted
//! the row between the insert and the lock (it swept it as expired), the step inserts it
//! again. Other limiters whose state expired are swept with `FOR UPDATE SKIP LOCKED`, so two
//! steps never wait on each other's rows.
//!
//! Unlike the semaphore operations (one PL/pgSQL call each) a rate step is a client-side
//! transaction of a few statements, with the limiter's row locked across them; the decision
//! code is then the one the other SQL stores run, checked against the memory model.

use async_trait::async_trait;
use sqlx::postgres::{PgConnection, PgRow};
use sqlx::Row;

use super::{map_err, PostgresBackend, RESPONSE_TIMEOUT};
use crate::error::{Error, Result, StoreErrorKind};
use crate::model::{Name, StoreTime};
use crate::rate::engine::RateState;
use crate::rate::RateStatus;
use crate::seam::{RateBackend, RateConfig, RateReply, RateRequest};
use crate::stores::sql::rate::{
    self as shared, corrupt, db, encode_tat, non_negative, RateRow, RateRows,
};

/// Migration 2: the rate-limiter tables.
pub(crate) const MIGRATION_2: &[&str] = &[include_str!("sql/rate_schema.sql")];

/// The server's clock in µs since the Unix epoch.
macro_rules! now_us {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000000)::bigint"
    };
}

const PLACEHOLDER: &str = "INSERT INTO tessera_rate_limiters \
     (name, config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at) \
     VALUES ($1, '', 0, 0, 0, 0, 0, 0, '', '', 0) ON CONFLICT (name) DO NOTHING";
const LOCK_AND_LOAD: &str = concat!(
    "SELECT r.*, ",
    now_us!(),
    " AS now_us FROM (SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, \
     expires_at FROM tessera_rate_limiters WHERE name = $1 FOR UPDATE) r"
);
const SAVE: &str = "INSERT INTO tessera_rate_limiters \
     (name, config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
     ON CONFLICT (name) DO UPDATE SET config = $2, seq = $3, tail = $4, last = $5, \
     prev_last = $6, p = $7, base = $8, tat = $9, prev_tat = $10, expires_at = $11";
const DROP_LIMITER: &str = "DELETE FROM tessera_rate_limiters WHERE name = $1";
const DROP_LOG: &str = "DELETE FROM tessera_rate_log WHERE name = $1";
const EXPIRED: &str = "SELECT name FROM tessera_rate_limiters \
     WHERE expires_at <= $1 AND name <> $2 ORDER BY expires_at LIMIT 16 FOR UPDATE SKIP LOCKED";
const PRUNE: &str = "WITH gone AS (DELETE FROM tessera_rate_log WHERE name = $1 AND t <= $2 \
     RETURNING p) SELECT max(p) FROM gone";
const FIRST_AT_LEAST: &str = "SELECT t FROM tessera_rate_log WHERE name = $1 AND p >= $2 \
     ORDER BY p LIMIT 1";
const APPEND: &str = "INSERT INTO tessera_rate_log (name, p, t) VALUES ($1, $2, $3)";
const REMOVE_ENTRY: &str = "DELETE FROM tessera_rate_log WHERE name = $1 AND p = $2";
const LAST_TOTAL: &str = "SELECT max(p) FROM tessera_rate_log WHERE name = $1";
const WHOLE_LOG: &str = "SELECT t, p FROM tessera_rate_log WHERE name = $1 ORDER BY p";
const LIST: &str = concat!(
    "SELECT name FROM tessera_rate_limiters WHERE expires_at > ",
    now_us!(),
    " ORDER BY name"
);

/// How many times a step that a concurrent delete outran inserts its placeholder again.
const LOCK_ATTEMPTS: u32 = 8;
/// How many times a step that met a lock conflict (before its commit) runs again.
const STEP_RETRIES: u32 = 3;

/// [`RateRows`] in PostgreSQL's statements.
struct PgRateRows<'c> {
    conn: &'c mut PgConnection,
    name: &'c str,
}

fn u64_at(row: &PgRow, i: usize, what: &str) -> Result<u64> {
    let v: i64 = row
        .try_get(i)
        .map_err(|e| corrupt(format!("rate {what}: {e}")))?;
    non_negative(v, what)
}

fn text_at(row: &PgRow, i: usize) -> Result<String> {
    row.try_get::<String, _>(i)
        .map_err(|e| corrupt(format!("rate column {i}: {e}")))
}

impl RateRows for PgRateRows<'_> {
    async fn load(&mut self) -> Result<(StoreTime, Option<RateRow>)> {
        let mut attempt = 0;
        let row = loop {
            sqlx::query(PLACEHOLDER)
                .bind(self.name)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
            // A concurrent step may have deleted the row (swept as expired) between the
            // insert and the lock: then the locking select finds nothing; insert again.
            if let Some(row) = sqlx::query(LOCK_AND_LOAD)
                .bind(self.name)
                .fetch_optional(&mut *self.conn)
                .await
                .map_err(map_err)?
            {
                break row;
            }
            attempt += 1;
            if attempt >= LOCK_ATTEMPTS {
                return Err(Error::store(
                    StoreErrorKind::Busy,
                    format!("rate limiter {:?}: its row kept vanishing", self.name),
                ));
            }
        };
        let now_us: i64 = row
            .try_get(10)
            .map_err(|e| corrupt(format!("server clock: {e}")))?;
        let now = u64::try_from(now_us)
            .map(StoreTime)
            .map_err(|_| corrupt(format!("the server's clock reads {now_us} µs before 1970")))?;
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

    async fn drop_state(&mut self, name: &str) -> Result<()> {
        for q in [DROP_LOG, DROP_LIMITER] {
            sqlx::query(q)
                .bind(name)
                .execute(&mut *self.conn)
                .await
                .map_err(map_err)?;
        }
        Ok(())
    }

    async fn save(&mut self, state: &RateState, expires_at: u64) -> Result<()> {
        sqlx::query(SAVE)
            .bind(self.name)
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
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn prune(&mut self, cutoff: u64) -> Result<Option<i64>> {
        sqlx::query_scalar(PRUNE)
            .bind(self.name)
            .bind(db(cutoff))
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)
    }

    async fn first_at_least(&mut self, p: u64) -> Result<Option<i64>> {
        sqlx::query_scalar(FIRST_AT_LEAST)
            .bind(self.name)
            .bind(db(p))
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)
    }

    async fn append(&mut self, p: u64, t: u64) -> Result<()> {
        sqlx::query(APPEND)
            .bind(self.name)
            .bind(db(p))
            .bind(db(t))
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn remove_entry(&mut self, p: u64) -> Result<()> {
        sqlx::query(REMOVE_ENTRY)
            .bind(self.name)
            .bind(db(p))
            .execute(&mut *self.conn)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn last_total(&mut self) -> Result<Option<i64>> {
        sqlx::query_scalar(LAST_TOTAL)
            .bind(self.name)
            .fetch_one(&mut *self.conn)
            .await
            .map_err(map_err)
    }

    async fn whole_log(&mut self) -> Result<Vec<(i64, i64)>> {
        sqlx::query_as(WHOLE_LOG)
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)
    }
}

/// Runs one rate step in its own transaction within [`RESPONSE_TIMEOUT`]: `|rows| op` with
/// `rows` a [`PgRateRows`] of `name`. A lock conflict before the commit runs the step again
/// (nothing of it was committed); a timed-out connection is closed, not reused.
macro_rules! rate_step {
    ($self:ident, $name:expr, |$rows:ident| $op:expr) => {{
        let mut attempt = 0u32;
        loop {
            let mut conn = $self.pool.acquire().await.map_err(map_err)?;
            let mut committing = false;
            let outcome = tokio::time::timeout(RESPONSE_TIMEOUT, async {
                let mut tx = sqlx::Connection::begin(&mut *conn).await.map_err(map_err)?;
                let reply = {
                    let $rows = &mut PgRateRows {
                        conn: &mut *tx,
                        name: $name.as_str(),
                    };
                    $op.await?
                };
                committing = true;
                tx.commit().await.map_err(map_err)?;
                Ok::<_, Error>(reply)
            })
            .await;
            match outcome {
                Ok(Ok(reply)) => break Ok::<_, Error>(reply),
                Ok(Err(e)) => {
                    // A session that met a fault (read-only by its database's default, a
                    // broken connection) is not reused: a session keeps the defaults it
                    // started with.
                    if e.is_transient() {
                        conn.close_on_drop();
                    }
                    match e {
                        Error::Store {
                            kind: StoreErrorKind::Busy,
                            ..
                        } if !committing && attempt < STEP_RETRIES => attempt += 1,
                        e => break Err(e),
                    }
                }
                Err(_) => {
                    conn.close_on_drop();
                    break Err(Error::store(
                        StoreErrorKind::Timeout,
                        format!(
                            "{} did not answer a rate step within {RESPONSE_TIMEOUT:?}",
                            $self.url
                        ),
                    ));
                }
            }
        }
    }};
}

#[async_trait]
impl RateBackend for PostgresBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        rate_step!(self, name, |rows| shared::acquire(rows, name, config, req))
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        // Times leave and come back as the server's µs, unchanged: no slack.
        rate_step!(self, name, |rows| shared::cancel(
            rows,
            name,
            reservation,
            at,
            0
        ))
    }

    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        rate_step!(self, name, |rows| shared::status(rows, name))
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        rate_step!(self, name, |rows| shared::delete(rows, name))
    }

    async fn rate_list(&self) -> Result<Vec<String>> {
        tokio::time::timeout(
            RESPONSE_TIMEOUT,
            sqlx::query_scalar::<_, String>(LIST).fetch_all(&self.pool),
        )
        .await
        .map_err(|_| Error::store(StoreErrorKind::Timeout, "rate list timed out"))?
        .map_err(map_err)
    }
}
