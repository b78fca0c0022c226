//! Rate limiters in the PostgreSQL store: [`crate::RateBackend`] over the tables of
//! `sql/rate_schema.sql` (migration 2), one PL/pgSQL function call per step (migration 3):
//! `tessera_rate_acquire`, `tessera_rate_cancel`, `tessera_rate_status` and
//! `tessera_rate_delete` (`sql/rate_*.sql`, helpers in `sql/rate_common.sql`), each called as
//! one statement in its own implicit transaction, like the semaphore operations: one round
//! trip per step.
//!
//! Each function locks the limiter's row first (`SELECT … FOR UPDATE`; an acquire inserts a
//! placeholder that reads as "no state" when the name has none, and inserts it again if a
//! concurrent sweep deleted it before the lock), reads the server's clock
//! (`clock_timestamp()`) once the lock is held, sweeps at most 16 other expired limiters
//! (`FOR UPDATE SKIP LOCKED`), prunes the log, and decides as `rate/engine.rs` does, line by
//! line, as the Redis scripts do. The client sends the declared limits with an acquire (N, the
//! enforced window and the emission interval of each, computed by the engine) and checks every
//! value that comes back; a status comes back as the row and its log, and the snapshot is
//! computed here by the engine, as for Redis. The function is checked against the memory
//! store's rate model step by step (`tests/postgres_store.rs`).
//!
//! A status is no step: one plain statement reads the row and its log in one snapshot
//! without a lock, and the engine computes the step's answer from it, prune and expiry
//! included (`stores/sql/rate_snapshot.rs`); `tessera_rate_status` runs only for a snapshot
//! that reads wrong (and stays for processes of older builds, which still call it).
//!
//! An admission commits durably (with the session's `synchronous_commit`, on by default), and
//! so do cancel and delete; an acquire that admits nothing (limited, mismatch) commits
//! asynchronously, since all it may lose in a server crash is pruning, sweeping or an
//! `update` of the limits, which the next step does again.
//!
//! Before migration 3 a step was a client-side transaction of about nine statements (the
//! SQL stores' shared step, `stores/sql/rate.rs`, which SQLite and MySQL still run). Measured
//! from one process with 8 clients on one limiter (release build, local PostgreSQL 15 with
//! fsync on, medians of 3 runs alternating the two builds: `tessera --store
//! 'postgres://…?schema=…' bench --workload rate --rates 1000000/s --rate-run 5s --duration
//! 15s`): 394 admissions/s, against 282/s before; with `synchronous_commit=off` 1,117/s against
//! 490/s. Durable admissions on one limiter queue behind the disk's flushes, since each holds
//! the limiter's row until its commit is flushed.

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::Row;

use super::conns::RESPONSE_TIMEOUT;
use super::error::{map_err, reusable_after};
use super::ops::micros;
use super::PostgresBackend;
use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::engine::{self, RateState, VecLog};
use tessera_core::rate::seam::RateStatus;
use tessera_core::seam::{RateBackend, RateConfig, RateReply, RateRequest};
use tessera_core::stores::sql::rate::{corrupt, db, decode_tat, non_negative, RateRow};
use tessera_core::stores::sql::{read_rate_status, RateRead, RateSnapshot};

/// Migration 2: the rate-limiter tables.
pub(crate) const MIGRATION_2: &[&[&str]] = &[&[include_str!("sql/rate_schema.sql")]];

/// The rate step as functions, helpers first (the decision and the undo in them are shared
/// with the admission's functions): created by migration 3 and again by migration 6 and every
/// newer step revision (`ops::STEP_AGAIN`).
pub(crate) const FUNCTIONS: &[&str] = &[
    include_str!("sql/rate_common.sql"),
    include_str!("sql/rate_acquire.sql"),
    include_str!("sql/rate_cancel.sql"),
    include_str!("sql/rate_status.sql"),
    include_str!("sql/rate_delete.sql"),
];

/// Migration 3: the rate step as functions.
pub(crate) const MIGRATION_3: &[&[&str]] = &[FUNCTIONS];

const ACQUIRE: &str = "SELECT outcome, at_us, now_us, reservation, stored \
     FROM tessera_rate_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9)";
const CANCEL: &str = "SELECT tessera_rate_cancel($1, $2, $3)";
const STATUS: &str = "SELECT now_us, st_config, st_seq, st_tail, st_last, st_prev_last, st_p, \
     st_base, st_tat, st_prev_tat, log_t, log_p, st_expired FROM tessera_rate_status($1)";
/// `rate_status` without the row lock (`stores/sql/rate_snapshot.rs`): the limiter's row and
/// its whole log in one statement, so in one snapshot, and the clock read while the
/// statement runs, after its snapshot was taken. A plain query, not a function: one row,
/// whose row columns are NULL without a row for the name; the log as two arrays in order of
/// the running total (NULL when empty), as [`STATUS`] returns them.
const READ_STATUS: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
     l.config, l.seq, l.tail, l.last, l.prev_last, l.p, l.base, l.tat, l.prev_tat, \
     l.expires_at, l.expired, g.ts, g.ps \
     FROM (SELECT $1::text AS name) k \
     LEFT JOIN tessera_rate_limiters l ON l.name = k.name \
     LEFT JOIN LATERAL (SELECT array_agg(e.t ORDER BY e.p) AS ts, array_agg(e.p ORDER BY e.p) AS ps \
         FROM tessera_rate_log e WHERE e.name = l.name) g ON true";
const DELETE: &str = "SELECT tessera_rate_delete($1)";
/// The limiters with state, by name: not tenants' own limiters under window ceilings, kept
/// in the same table under keys with a `#`, which no name has (`tessera__rate_tenant_key`).
const LIST: &str = "SELECT name FROM tessera_rate_limiters \
     WHERE expires_at > (extract(epoch FROM clock_timestamp()) * 1000000)::bigint \
     AND strpos(name, '#') = 0 ORDER BY name";

/// How many times a step that met a lock conflict runs again (nothing of it was committed).
const STEP_RETRIES: u32 = 3;

/// A lock conflict (serialization failure, deadlock): the statement rolled back and may run
/// again.
fn is_conflict(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db)
        if matches!(db.code().as_deref(), Some("40001" | "40P01")))
}

impl PostgresBackend {
    /// Runs one rate statement and returns its one row within [`RESPONSE_TIMEOUT`]. A lock
    /// conflict runs it again; a session that met a fault (read-only by its database's
    /// default, a broken connection) or timed out is closed, not reused: a session keeps
    /// the defaults it started with.
    async fn rate_row<'q>(
        &self,
        query: impl Fn() -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<PgRow> {
        let mut attempt = 0;
        loop {
            let mut conn = self.conns.take().await?;
            match tokio::time::timeout(RESPONSE_TIMEOUT, query().fetch_one(conn.conn())).await {
                Ok(Ok(row)) => {
                    conn.put_back();
                    return Ok(row);
                }
                Ok(Err(e)) => {
                    let retry = is_conflict(&e) && attempt < STEP_RETRIES;
                    if reusable_after(&e) {
                        conn.put_back();
                    }
                    let e = map_err(e);
                    if !retry {
                        return Err(e);
                    }
                    attempt += 1;
                }
                Err(_) => {
                    return Err(Error::store(
                        StoreErrorKind::Timeout,
                        format!(
                            "{} did not answer a rate step within {RESPONSE_TIMEOUT:?}",
                            self.url
                        ),
                    ));
                }
            }
        }
    }
}

/// A column that may be NULL.
fn opt<'r, T>(row: &'r PgRow, i: usize, what: &str) -> Result<Option<T>>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<Option<T>, _>(i)
        .map_err(|e| corrupt(format!("rate {what}: {e}")))
}

/// A column that must be a non-negative integer.
fn u64_at(row: &PgRow, i: usize, what: &str) -> Result<u64> {
    let v: i64 = opt(row, i, what)?.ok_or_else(|| corrupt(format!("rate {what} is NULL")))?;
    non_negative(v, what)
}

/// The arguments describing the declared limits: N, enforced window and emission interval
/// of each limit, and the burst (0 in exact mode).
pub(super) fn limit_args(config: &RateConfig) -> (Vec<i64>, Vec<i64>, Vec<i64>, i64) {
    let n = config
        .limits()
        .iter()
        .map(|l| i64::from(l.count()))
        .collect();
    let l = config
        .limits()
        .iter()
        .map(|l| db(config.window_us(l)))
        .collect();
    let t = engine::emission_intervals(config)
        .into_iter()
        .map(db)
        .collect();
    let burst = i64::from(config.mode().burst());
    (n, l, t, burst)
}

fn parse_acquire(row: &PgRow, name: &Name, config: &RateConfig) -> Result<RateReply> {
    let outcome: String = opt(row, 0, "outcome")?.ok_or_else(|| corrupt("rate outcome NULL"))?;
    match outcome.as_str() {
        "admitted" => {
            let reservation = u64_at(row, 3, "reservation")?;
            if reservation == 0 {
                return Err(corrupt("rate reservation 0 for an admission"));
            }
            Ok(RateReply::Admitted {
                at: StoreTime(u64_at(row, 1, "at")?),
                now: StoreTime(u64_at(row, 2, "now")?),
                reservation,
            })
        }
        "limited" => Ok(RateReply::Limited {
            retry_at: StoreTime(u64_at(row, 1, "retry_at")?),
            now: StoreTime(u64_at(row, 2, "now")?),
        }),
        "mismatch" => Err(Error::RateMismatch {
            name: name.to_string(),
            stored: opt(row, 4, "stored limits")?
                .ok_or_else(|| corrupt("rate mismatch without the stored limits"))?,
            declared: config.encode(),
        }),
        other => Err(corrupt(format!(
            "rate outcome {:?}",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

fn parse_status(row: &PgRow, name: &Name) -> Result<Option<RateStatus>> {
    let now = StoreTime(u64_at(row, 0, "now")?);
    let Some(config_text) = opt::<String>(row, 1, "config")? else {
        return Ok(None);
    };
    let text = |i: usize, what: &str| -> Result<String> {
        opt(row, i, what)?.ok_or_else(|| corrupt(format!("rate {what} is NULL")))
    };
    let state = RateState {
        config: config_text,
        seq: u64_at(row, 2, "seq")?,
        tail: u64_at(row, 3, "tail")?,
        last: u64_at(row, 4, "last")?,
        prev_last: u64_at(row, 5, "prev_last")?,
        p: u64_at(row, 6, "p")?,
        base: u64_at(row, 7, "base")?,
        tat: decode_tat(&text(8, "tat")?)?,
        prev_tat: decode_tat(&text(9, "prev_tat")?)?,
        kept_until: 0,
    };
    let config = RateConfig::decode(&state.config).ok_or_else(|| {
        corrupt(format!(
            "rate limiter {name}: unreadable limits {:?}",
            state.config
        ))
    })?;
    let ts: Vec<i64> = opt(row, 10, "log times")?.unwrap_or_default();
    let ps: Vec<i64> = opt(row, 11, "log totals")?.unwrap_or_default();
    if ts.len() != ps.len() {
        return Err(corrupt(format!(
            "rate log of {name}: {} times for {} totals",
            ts.len(),
            ps.len()
        )));
    }
    let mut log = VecLog::default();
    for (t, p) in ts.into_iter().zip(ps) {
        log.0
            .push_back((non_negative(t, "t")?, non_negative(p, "p")?));
    }
    let mut status = engine::status(name, &state, &config, &log, now)?;
    status.expired_unused = Some(u64_at(row, 12, "expired")?);
    Ok(Some(status))
}

/// The row of [`READ_STATUS`] as the snapshot `stores/sql/rate_snapshot.rs` decides on.
fn parse_snapshot(row: &PgRow) -> Result<RateSnapshot> {
    let now = StoreTime(u64_at(row, 0, "now")?);
    if opt::<String>(row, 1, "config")?.is_none() {
        return Ok(RateSnapshot {
            now,
            row: None,
            log: Vec::new(),
            expired: None,
        });
    }
    // `RateRow::from_columns` counts from the config, column 1 here.
    let text = |i: usize| -> Result<String> {
        opt(row, i + 1, "text")?.ok_or_else(|| corrupt(format!("rate column {} is NULL", i + 1)))
    };
    let state = RateRow::from_columns(text, |i, what| u64_at(row, i + 1, what))?;
    let ts: Vec<i64> = opt(row, 12, "log times")?.unwrap_or_default();
    let ps: Vec<i64> = opt(row, 13, "log totals")?.unwrap_or_default();
    if ts.len() != ps.len() {
        return Err(corrupt(format!(
            "rate log: {} times for {} totals",
            ts.len(),
            ps.len()
        )));
    }
    Ok(RateSnapshot {
        now,
        row: Some(state),
        log: ts.into_iter().zip(ps).collect(),
        expired: Some(
            opt::<i64>(row, 11, "expired")?.ok_or_else(|| corrupt("rate expired is NULL"))?,
        ),
    })
}

#[async_trait]
impl RateBackend for PostgresBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        let encoded = config.encode();
        let (n, l, t, burst) = limit_args(config);
        let max_wait = req.max_wait.map(micros);
        let row = self
            .rate_row(|| {
                sqlx::query(ACQUIRE)
                    .bind(name.as_str())
                    .bind(encoded.as_str())
                    .bind(&n)
                    .bind(&l)
                    .bind(&t)
                    .bind(burst)
                    .bind(i64::from(req.cost))
                    .bind(max_wait)
                    .bind(req.update)
            })
            .await?;
        parse_acquire(&row, name, config)
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        // Times leave and come back as the server's µs, unchanged: compared exactly.
        let row = self
            .rate_row(|| {
                sqlx::query(CANCEL)
                    .bind(name.as_str())
                    .bind(db(reservation))
                    .bind(db(at.0))
            })
            .await?;
        opt(&row, 0, "cancel")?.ok_or_else(|| corrupt("rate cancel returned NULL"))
    }

    /// From one snapshot without the row lock (`stores/sql/rate_snapshot.rs`); the step
    /// (`tessera_rate_status`) only for a snapshot that reads wrong.
    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        let row = self
            .rate_row(|| sqlx::query(READ_STATUS).bind(name.as_str()))
            .await?;
        if let RateRead::Settled(answer) = read_rate_status(name, parse_snapshot(&row))? {
            return Ok(answer);
        }
        let row = self
            .rate_row(|| sqlx::query(STATUS).bind(name.as_str()))
            .await?;
        parse_status(&row, name)
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        let row = self
            .rate_row(|| sqlx::query(DELETE).bind(name.as_str()))
            .await?;
        opt(&row, 0, "delete")?.ok_or_else(|| corrupt("rate delete returned NULL"))
    }

    async fn rate_list(&self) -> Result<Vec<String>> {
        tokio::time::timeout(RESPONSE_TIMEOUT, async {
            let mut conn = self.conns.take().await?;
            let names = sqlx::query_scalar::<_, String>(LIST)
                .fetch_all(conn.conn())
                .await
                .map_err(map_err)?;
            conn.put_back();
            Ok(names)
        })
        .await
        .map_err(|_| Error::store(StoreErrorKind::Timeout, "rate list timed out"))?
    }
}
