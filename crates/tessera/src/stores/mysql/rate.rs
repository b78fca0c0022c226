//! Rate limiters in the MySQL / MariaDB store: [`crate::RateBackend`] over the tables of
//! `rate_schema.sql`, one short transaction per step, deciding with the same pure functions
//! as the memory and SQLite stores (`rate/engine.rs`).
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

use async_trait::async_trait;
use sqlx::mysql::{MySqlConnection, MySqlRow};

use super::ops::{int_at, now_us, text_at, time_at};
use super::{is_retryable, map_err, retry_pause, MysqlBackend};
use crate::error::{Error, Result};
use crate::model::{Name, StoreTime};
use crate::rate::engine::{self, RateState, VecLog};
use crate::rate::RateMode;
use crate::rate::RateStatus;
use crate::seam::{RateBackend, RateConfig, RateReply, RateRequest};

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
const DROP_LIMITER: &str = "DELETE FROM tessera_rate_limiters WHERE name = ?";
const DROP_LOG: &str = "DELETE FROM tessera_rate_log WHERE name = ?";
const EXPIRED: &str = "SELECT name FROM tessera_rate_limiters \
     WHERE expires_at <= ? AND name <> ? ORDER BY expires_at LIMIT 16 FOR UPDATE SKIP LOCKED";
const PRUNED_TOTAL: &str = "SELECT MAX(p) FROM tessera_rate_log WHERE name = ? AND t <= ?";
const PRUNE: &str = "DELETE FROM tessera_rate_log WHERE name = ? AND t <= ?";
const FIRST_AT_LEAST: &str = "SELECT t FROM tessera_rate_log WHERE name = ? AND p >= ? \
     ORDER BY p LIMIT 1";
const APPEND: &str = "INSERT INTO tessera_rate_log (name, p, t) VALUES (?, ?, ?)";
const REMOVE_ENTRY: &str = "DELETE FROM tessera_rate_log WHERE name = ? AND p = ?";
const LAST_TOTAL: &str = "SELECT MAX(p) FROM tessera_rate_log WHERE name = ?";
const WHOLE_LOG: &str = "SELECT t, p FROM tessera_rate_log WHERE name = ? ORDER BY p";
const LIST: &str = concat!(
    "SELECT name FROM tessera_rate_limiters WHERE expires_at > ",
    now_us!(),
    " ORDER BY name"
);

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

fn u64_at(row: &MySqlRow, i: usize, what: &str) -> Result<u64> {
    let v = int_at(row, i).map_err(|e| corrupt(format!("rate {what}: {e}")))?;
    u64::try_from(v).map_err(|_| corrupt(format!("rate {what} = {v} is negative")))
}

fn db(v: u64) -> i64 {
    // Times and totals stay far below 2^63 (µs since the epoch; running totals of costs).
    v.min(i64::MAX as u64) as i64
}

fn encode_tat(tat: &[u64]) -> String {
    tat.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
}

fn decode_tat(s: &str) -> Result<Vec<u64>> {
    if s.is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|v| v.parse().map_err(|_| corrupt(format!("rate tat {s:?}"))))
        .collect()
}

/// Locks the limiter's row (creating a placeholder), sweeps a few expired limiters, and
/// returns the server's time with the state, if it has one that has not expired (an
/// expired one is deleted).
async fn load(conn: &mut MySqlConnection, name: &Name) -> Result<(StoreTime, Option<RateState>)> {
    sqlx::query(LOCK)
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    let row = sqlx::query(LOAD)
        .bind(name.as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let now = time_at(&row, 10)?;
    let expired: Vec<String> = sqlx::query_scalar(EXPIRED)
        .bind(db(now.0))
        .bind(name.as_str())
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
    for n in expired {
        drop_state(conn, &n).await?;
    }
    if u64_at(&row, 9, "expires_at")? <= now.0 {
        drop_state(conn, name.as_str()).await?;
        return Ok((now, None));
    }
    Ok((
        now,
        Some(RateState {
            config: text_at(&row, 0)?,
            seq: u64_at(&row, 1, "seq")?,
            tail: u64_at(&row, 2, "tail")?,
            last: u64_at(&row, 3, "last")?,
            prev_last: u64_at(&row, 4, "prev_last")?,
            p: u64_at(&row, 5, "p")?,
            base: u64_at(&row, 6, "base")?,
            tat: decode_tat(&text_at(&row, 7)?)?,
            prev_tat: decode_tat(&text_at(&row, 8)?)?,
        }),
    ))
}

async fn drop_state(conn: &mut MySqlConnection, name: &str) -> Result<()> {
    for q in [DROP_LOG, DROP_LIMITER] {
        sqlx::query(q)
            .bind(name)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

/// Writes the state; the row exists (locked by [`load`], or deleted by it as expired and
/// then written again here).
async fn save(
    conn: &mut MySqlConnection,
    name: &Name,
    state: &RateState,
    config: &RateConfig,
) -> Result<()> {
    let values = (
        db(state.seq),
        db(state.tail),
        db(state.last),
        db(state.prev_last),
        db(state.p),
        db(state.base),
    );
    let matched = sqlx::query(SAVE)
        .bind(&state.config)
        .bind(values.0)
        .bind(values.1)
        .bind(values.2)
        .bind(values.3)
        .bind(values.4)
        .bind(values.5)
        .bind(encode_tat(&state.tat))
        .bind(encode_tat(&state.prev_tat))
        .bind(db(state.expires_at(config)))
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?
        .rows_affected();
    if matched == 0 {
        sqlx::query(
            "INSERT INTO tessera_rate_limiters \
             (config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at, name) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(&state.config)
        .bind(values.0)
        .bind(values.1)
        .bind(values.2)
        .bind(values.3)
        .bind(values.4)
        .bind(values.5)
        .bind(encode_tat(&state.tat))
        .bind(encode_tat(&state.prev_tat))
        .bind(db(state.expires_at(config)))
        .bind(name.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    }
    Ok(())
}

fn stored_config(name: &Name, state: &RateState) -> Result<RateConfig> {
    RateConfig::decode(&state.config).ok_or_else(|| {
        corrupt(format!(
            "rate limiter {name}: unreadable limits {:?}",
            state.config
        ))
    })
}

/// Deletes entries at or before the cutoff; moves `base` to the last one deleted.
async fn prune(
    conn: &mut MySqlConnection,
    name: &Name,
    state: &mut RateState,
    config: &RateConfig,
    now: StoreTime,
) -> Result<bool> {
    let cutoff = db(engine::prune_cutoff(config, now));
    let gone: Option<i64> = sqlx::query_scalar(PRUNED_TOTAL)
        .bind(name.as_str())
        .bind(cutoff)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let Some(p) = gone else { return Ok(false) };
    sqlx::query(PRUNE)
        .bind(name.as_str())
        .bind(cutoff)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    state.base = u64::try_from(p).map_err(|_| corrupt("negative rate total"))?;
    Ok(true)
}

async fn acquire(
    conn: &mut MySqlConnection,
    name: &Name,
    config: &RateConfig,
    req: &RateRequest,
) -> Result<RateReply> {
    let (now, existing) = load(conn, name).await?;
    // With `update`, differing stored limits are replaced even if the request is limited.
    let replaced = existing
        .as_ref()
        .is_some_and(|s| s.config != config.encode());
    let mut state = engine::check_config(name, existing, config, req.update, now)?;
    let pruned = match config.mode() {
        RateMode::Exact => prune(conn, name, &mut state, config, now).await?,
        RateMode::Smooth { .. } => false,
    };
    let mut found = Vec::new();
    for x in engine::thresholds(&state, config, req.cost) {
        found.push(match x {
            None => None,
            Some(x) => sqlx::query_scalar::<_, i64>(FIRST_AT_LEAST)
                .bind(name.as_str())
                .bind(db(x))
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?
                .map(|t| t.max(0) as u64),
        });
    }
    let (reply, entry) = engine::decide(&mut state, config, req, now, &found)?;
    if let RateReply::Admitted { .. } = reply {
        if let Some((t, p)) = entry {
            sqlx::query(APPEND)
                .bind(name.as_str())
                .bind(db(p))
                .bind(db(t))
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
        }
        save(conn, name, &state, config).await?;
    } else if pruned || replaced {
        // Limited: nothing is charged, but pruned entries move `base`, and limits replaced
        // by `update` stay replaced (as on SQLite and in the memory store).
        save(conn, name, &state, config).await?;
    }
    Ok(reply)
}

async fn cancel(
    conn: &mut MySqlConnection,
    name: &Name,
    reservation: u64,
    at: StoreTime,
) -> Result<bool> {
    let (now, state) = load(conn, name).await?;
    let Some(mut state) = state else {
        return Ok(false);
    };
    let config = stored_config(name, &state)?;
    let old_p = state.p;
    if !engine::cancel(&mut state, &config, reservation, at, now) {
        return Ok(false);
    }
    if let RateMode::Exact = config.mode() {
        sqlx::query(REMOVE_ENTRY)
            .bind(name.as_str())
            .bind(db(old_p))
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        let last: Option<i64> = sqlx::query_scalar(LAST_TOTAL)
            .bind(name.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        state.p = last.map_or(state.base, |p| p.max(0) as u64);
    }
    save(conn, name, &state, &config).await?;
    Ok(true)
}

/// Deletes the limiter's row and log; `true` if it had state that had not expired.
async fn delete(conn: &mut MySqlConnection, name: &Name) -> Result<bool> {
    // `load` drops an expired state (or the placeholder) itself.
    let existed = load(conn, name).await?.1.is_some();
    if existed {
        drop_state(conn, name.as_str()).await?;
    }
    Ok(existed)
}

async fn status(conn: &mut MySqlConnection, name: &Name) -> Result<Option<RateStatus>> {
    let (now, state) = load(conn, name).await?;
    let Some(mut state) = state else {
        return Ok(None);
    };
    let config = stored_config(name, &state)?;
    let mut log = VecLog::default();
    if let RateMode::Exact = config.mode() {
        if prune(conn, name, &mut state, &config, now).await? {
            save(conn, name, &state, &config).await?;
        }
        let rows = sqlx::query(WHOLE_LOG)
            .bind(name.as_str())
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        for row in rows {
            log.0
                .push_back((u64_at(&row, 0, "t")?, u64_at(&row, 1, "p")?));
        }
    }
    engine::status(name, &state, &config, &log, now).map(Some)
}

#[async_trait]
impl RateBackend for MysqlBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        step!(self, |conn| acquire(conn, name, config, req))
    }

    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        step!(self, |conn| cancel(conn, name, reservation, at))
    }

    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        step!(self, |conn| status(conn, name))
    }

    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        step!(self, |conn| delete(conn, name))
    }

    async fn rate_list(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        sqlx::query_scalar(LIST)
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)
    }
}
