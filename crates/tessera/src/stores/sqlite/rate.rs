//! Rate limiters in the SQLite store: [`crate::RateBackend`] over the tables of
//! `rate_schema.sql`, one short `BEGIN IMMEDIATE` transaction per step. The step is the
//! SQL stores' shared one (`stores/sql/rate.rs`, deciding with the same pure functions as
//! the memory store); this file holds SQLite's statements for it. Each step also deletes up
//! to 16 limiters whose state has expired (and their logs), so idle limiters leave the file.
//! A status is no step: it reads the row and its log in one deferred read transaction,
//! without the write lock, and computes the step's answer from them
//! (`stores/sql/rate_snapshot.rs`).

use async_trait::async_trait;
use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;

use super::error::map_err;
use super::ops::{int_at, rq_err, text_at, SqliteRows};
use super::SqliteBackend;
use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::{Name, StoreTime};
use tessera_core::rate::engine::RateState;
use tessera_core::rate::seam::RateStatus;
use tessera_core::seam::{RateBackend, RateConfig, RateReply, RateRequest};
// The fuzz targets' decoder of the `tat` columns (`crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub(crate) use tessera_core::stores::sql::rate::decode_tat;
use tessera_core::stores::sql::rate::{
    self as shared, corrupt, db, encode_tat, non_negative, RateRow, RateRows, SettleRows,
    TenantLimiterRows,
};
use tessera_core::stores::sql::{read_rate_status, RateRead, RateSnapshot};

const LOAD: &str = "SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, \
     expires_at FROM tessera_rate_limiters WHERE name = ?1";
const SAVE: &str = "INSERT INTO tessera_rate_limiters \
     (name, config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at) \
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
     ON CONFLICT (name) DO UPDATE SET config = ?2, seq = ?3, tail = ?4, last = ?5, \
     prev_last = ?6, p = ?7, base = ?8, tat = ?9, prev_tat = ?10, expires_at = ?11";
const EXPIRED: &str = "SELECT name FROM tessera_rate_limiters WHERE expires_at <= ?1 \
     ORDER BY expires_at LIMIT 16";
const PRUNE: &str = "DELETE FROM tessera_rate_log WHERE name = ?1 AND t <= ?2 RETURNING p";
const WHOLE_LOG: &str = "SELECT t, p FROM tessera_rate_log WHERE name = ?1 ORDER BY p";
/// `rate_status` without the write lock (`stores/sql/rate_snapshot.rs`): the row as [`LOAD`]
/// reads it with the count of expired admissions, read first (the read that takes the
/// deferred transaction's snapshot), then the clock, then [`WHOLE_LOG`].
const READ_ROW: &str = "SELECT config, seq, tail, last, prev_last, p, base, tat, prev_tat, \
     expires_at, expired FROM tessera_rate_limiters WHERE name = ?1";
const LIST: &str = "SELECT name FROM tessera_rate_limiters WHERE expires_at > ?1 ORDER BY name";

/// [`RateRows`] in SQLite's statements: the transaction is `BEGIN IMMEDIATE` (the file's
/// write lock, taken before `now` was read), so every row is already locked.
struct SqliteRateRows<'c> {
    conn: &'c mut SqliteConnection,
    name: &'c str,
    now: StoreTime,
}

impl<'c> SqliteRateRows<'c> {
    fn new(conn: &'c mut SqliteConnection, name: &'c Name, now: StoreTime) -> Self {
        SqliteRateRows {
            conn,
            name: name.as_str(),
            now,
        }
    }
}

fn u64_at(row: &SqliteRow, i: usize, what: &str) -> Result<u64> {
    let v: i64 = row
        .try_get(i)
        .map_err(|e| corrupt(format!("rate {what}: {e}")))?;
    non_negative(v, what)
}

impl RateRows for SqliteRateRows<'_> {
    tessera_core::shared_rate_rows!();

    async fn load(&mut self) -> Result<(StoreTime, Option<RateRow>)> {
        let Some(row) = sqlx::query(LOAD)
            .bind(self.name)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(map_err)?
        else {
            return Ok((self.now, None));
        };
        let text = |i: usize| -> Result<String> {
            row.try_get::<String, _>(i)
                .map_err(|e| corrupt(format!("rate column {i}: {e}")))
        };
        let row = RateRow::from_columns(text, |i, what| u64_at(&row, i, what))?;
        Ok((self.now, Some(row)))
    }

    async fn expired(&mut self, now: StoreTime) -> Result<Vec<String>> {
        sqlx::query_scalar(EXPIRED)
            .bind(db(now.0))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)
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
        let gone: Vec<i64> = sqlx::query_scalar(PRUNE)
            .bind(self.name)
            .bind(db(cutoff))
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)?;
        Ok(gone.into_iter().max())
    }

    async fn whole_log(&mut self) -> Result<Vec<(i64, i64)>> {
        sqlx::query_as(WHOLE_LOG)
            .bind(self.name)
            .fetch_all(&mut *self.conn)
            .await
            .map_err(map_err)
    }
}

/// [`RateRows`] on the semaphore step's own connection (rusqlite, see `ops.rs`), for an
/// admission: the limiter's rows change in the same `BEGIN IMMEDIATE` transaction as the
/// semaphore's, with the same statements as [`SqliteRateRows`] and the same `now`.
impl RateRows for SqliteRows<'_> {
    async fn load(&mut self) -> Result<(StoreTime, Option<RateRow>)> {
        let now = self.now();
        let mut st = self.db().prepare_cached(LOAD).map_err(rq_err)?;
        let mut rows = st.query([self.limiter()]).map_err(rq_err)?;
        let Some(row) = rows.next().map_err(rq_err)? else {
            return Ok((now, None));
        };
        let int = |i: usize, what: &str| non_negative(int_at(row, i)?, what);
        let row = RateRow::from_columns(|i| text_at(row, i), int)?;
        Ok((now, Some(row)))
    }

    async fn expired(&mut self, now: StoreTime) -> Result<Vec<String>> {
        let mut st = self.db().prepare_cached(EXPIRED).map_err(rq_err)?;
        let names = st
            .query_map([db(now.0)], |r| r.get::<_, String>(0))
            .map_err(rq_err)?;
        names.map(|n| n.map_err(rq_err)).collect()
    }

    async fn drop_state(&mut self, name: &str) -> Result<()> {
        use tessera_core::stores::sql::rate::{DROP_LIMITER, DROP_LOG};
        for q in [DROP_LOG, DROP_LIMITER] {
            let mut st = self.db().prepare_cached(q).map_err(rq_err)?;
            st.execute([name]).map_err(rq_err)?;
        }
        Ok(())
    }

    async fn save(&mut self, state: &RateState, expires_at: u64) -> Result<()> {
        let mut st = self.db().prepare_cached(SAVE).map_err(rq_err)?;
        st.execute(rusqlite::params![
            self.limiter(),
            state.config,
            db(state.seq),
            db(state.tail),
            db(state.last),
            db(state.prev_last),
            db(state.p),
            db(state.base),
            encode_tat(&state.tat),
            encode_tat(&state.prev_tat),
            db(expires_at)
        ])
        .map_err(rq_err)?;
        Ok(())
    }

    async fn prune(&mut self, cutoff: u64) -> Result<Option<i64>> {
        let mut st = self.db().prepare_cached(PRUNE).map_err(rq_err)?;
        let gone = st
            .query_map(rusqlite::params![self.limiter(), db(cutoff)], |r| {
                r.get::<_, i64>(0)
            })
            .map_err(rq_err)?;
        let mut max = None;
        for p in gone {
            let p = p.map_err(rq_err)?;
            max = Some(max.map_or(p, |m: i64| m.max(p)));
        }
        Ok(max)
    }

    async fn first_at_least(&mut self, p: u64) -> Result<Option<i64>> {
        self.one_int(tessera_core::stores::sql::rate::FIRST_AT_LEAST, Some(db(p)))
    }

    async fn append(&mut self, p: u64, t: u64) -> Result<()> {
        let mut st = self
            .db()
            .prepare_cached(tessera_core::stores::sql::rate::APPEND)
            .map_err(rq_err)?;
        st.execute(rusqlite::params![self.limiter(), db(p), db(t)])
            .map_err(rq_err)?;
        Ok(())
    }

    async fn remove_entry(&mut self, p: u64) -> Result<()> {
        let mut st = self
            .db()
            .prepare_cached(tessera_core::stores::sql::rate::REMOVE_ENTRY)
            .map_err(rq_err)?;
        st.execute(rusqlite::params![self.limiter(), db(p)])
            .map_err(rq_err)?;
        Ok(())
    }

    async fn last_total(&mut self) -> Result<Option<i64>> {
        self.one_int(tessera_core::stores::sql::rate::LAST_TOTAL, None)
    }

    async fn whole_log(&mut self) -> Result<Vec<(i64, i64)>> {
        let mut st = self.db().prepare_cached(WHOLE_LOG).map_err(rq_err)?;
        let log = st
            .query_map([self.limiter()], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(rq_err)?;
        log.map(|e| e.map_err(rq_err)).collect()
    }

    async fn count_expired(&mut self, until: u64) -> Result<()> {
        let mut st = self
            .db()
            .prepare_cached(tessera_core::stores::sql::rate::COUNT_EXPIRED)
            .map_err(rq_err)?;
        st.execute(rusqlite::params![db(until), db(until), self.limiter()])
            .map_err(rq_err)?;
        Ok(())
    }

    async fn expired_unused(&mut self) -> Result<u64> {
        let n = self.one_int(tessera_core::stores::sql::rate::EXPIRED_UNUSED, None)?;
        non_negative(n.unwrap_or(0), "expired count")
    }

    async fn drop_tenant_limiters(&mut self, name: &str) -> Result<()> {
        let (lo, hi) = tessera_core::stores::sql::rate::tenant_keys_of(name);
        for q in tessera_core::stores::sql::rate::TENANT_KEYS {
            let mut st = self.db().prepare_cached(q).map_err(rq_err)?;
            st.execute([&lo, &hi]).map_err(rq_err)?;
        }
        Ok(())
    }
}

impl SettleRows for SqliteRows<'_> {
    async fn last_at_or_before(&mut self, t: u64) -> Result<Option<(i64, i64)>> {
        let mut st = self
            .db()
            .prepare_cached(tessera_core::stores::sql::rate::LAST_AT_OR_BEFORE)
            .map_err(rq_err)?;
        let mut rows = st
            .query(rusqlite::params![self.limiter(), db(t)])
            .map_err(rq_err)?;
        match rows.next().map_err(rq_err)? {
            Some(row) => Ok(Some((int_at(row, 0)?, int_at(row, 1)?))),
            None => Ok(None),
        }
    }

    async fn total_before(&mut self, t: u64) -> Result<Option<i64>> {
        self.one_int(tessera_core::stores::sql::rate::TOTAL_BEFORE, Some(db(t)))
    }

    async fn lower(&mut self, t: u64, d: u64, keep: Option<u64>) -> Result<()> {
        let [delete, shift, flip] = tessera_core::stores::sql::rate::LOWER;
        let db_ = self.db();
        db_.prepare_cached(delete)
            .and_then(|mut st| st.execute(rusqlite::params![self.limiter(), db(t)]))
            .map_err(rq_err)?;
        db_.prepare_cached(shift)
            .and_then(|mut st| st.execute(rusqlite::params![db(d), self.limiter(), db(t)]))
            .map_err(rq_err)?;
        db_.prepare_cached(flip)
            .and_then(|mut st| st.execute([self.limiter()]))
            .map_err(rq_err)?;
        if let Some(p) = keep {
            self.append(p, t).await?;
        }
        Ok(())
    }
}

/// An admission's rows reach the tenants' own limiters too (window ceilings): the rate
/// statements above bind [`SqliteRows::limiter`].
impl TenantLimiterRows for SqliteRows<'_> {
    fn point_at(&mut self, key: Option<String>) {
        SqliteRows::point_at(self, key);
    }
}

impl SqliteRows<'_> {
    /// The first column of the first row of `sql` (the limiter's key, then `arg`), NULL as
    /// `None`.
    fn one_int(&self, sql: &'static str, arg: Option<i64>) -> Result<Option<i64>> {
        let mut st = self.db().prepare_cached(sql).map_err(rq_err)?;
        let mut rows = match arg {
            Some(a) => st.query(rusqlite::params![self.limiter(), a]),
            None => st.query([self.limiter()]),
        }
        .map_err(rq_err)?;
        match rows.next().map_err(rq_err)? {
            Some(row) => row
                .get::<_, Option<i64>>(0)
                .map_err(|e| corrupt(format!("rate column 0: {e}"))),
            None => Ok(None),
        }
    }
}

/// Limiter `name` (the name of `rows`) read inside a deferred read transaction: the row,
/// then `clock`, once the row's read has taken the snapshot, then the log.
fn read_in_snapshot(rows: &SqliteRows<'_>, clock: impl Fn() -> StoreTime) -> Result<RateSnapshot> {
    let db = rows.db();
    let mut st = db.prepare_cached(READ_ROW).map_err(rq_err)?;
    let mut found = st.query([rows.name()]).map_err(rq_err)?;
    let row = match found.next().map_err(rq_err)? {
        None => None,
        Some(r) => {
            let int = |i: usize, what: &str| non_negative(int_at(r, i)?, what);
            Some((
                RateRow::from_columns(|i| text_at(r, i), int)?,
                int_at(r, 10)?,
            ))
        }
    };
    drop(found);
    let now = clock();
    let Some((row, expired)) = row else {
        return Ok(RateSnapshot {
            now,
            row: None,
            log: Vec::new(),
            expired: None,
        });
    };
    let mut st = db.prepare_cached(WHOLE_LOG).map_err(rq_err)?;
    let log = st
        .query_map([rows.name()], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
        })
        .map_err(rq_err)?
        .map(|e| e.map_err(rq_err))
        .collect::<Result<Vec<_>>>()?;
    Ok(RateSnapshot {
        now,
        row: Some(row),
        log,
        expired: Some(expired),
    })
}

/// How far (µs) a reservation's time handed back to [`RateBackend::rate_cancel`] may be from
/// the stored one: the wall clock's drift or step between the admission and the cancel.
pub(super) const CANCEL_SLACK_US: u64 = 5_000_000;

#[async_trait]
impl RateBackend for SqliteBackend {
    async fn rate_acquire(
        &self,
        name: &Name,
        config: &RateConfig,
        req: &RateRequest,
    ) -> Result<RateReply> {
        let reply = step!(self, |conn, now| async {
            shared::acquire(&mut SqliteRateRows::new(conn, name, now), name, config, req)
                .await
                .map(|r| (r, Vec::new()))
        });
        // Store times leave the store as wall time (see the module docs of `sqlite`).
        let wall = self.to_wall();
        Ok(match reply {
            RateReply::Admitted {
                at,
                now,
                reservation,
            } => RateReply::Admitted {
                at: wall(at),
                now: wall(now),
                reservation,
            },
            RateReply::Limited { retry_at, now } => RateReply::Limited {
                retry_at: wall(retry_at),
                now: wall(now),
            },
        })
    }
    /// `at` comes back in wall time, converted from the boot clock at the admission; it is
    /// converted back now, which is exact unless the wall clock was stepped meanwhile, so the
    /// stored admission time within `CANCEL_SLACK_US` of it counts as `at`.
    async fn rate_cancel(&self, name: &Name, reservation: u64, at: StoreTime) -> Result<bool> {
        let at = self.wall_to_store(at);
        let slack = if self.wall.is_some() {
            CANCEL_SLACK_US
        } else {
            0
        };
        Ok(step!(self, |conn, now| async {
            let rows = &mut SqliteRateRows::new(conn, name, now);
            shared::cancel(rows, name, reservation, at, slack)
                .await
                .map(|r| (r, Vec::new()))
        }))
    }
    /// From one snapshot without the write lock (`stores/sql/rate_snapshot.rs`); the step
    /// only for a snapshot that reads wrong, or that a lock kept from being read (not in WAL
    /// mode, or WAL recovery: the step waits).
    async fn rate_status(&self, name: &Name) -> Result<Option<RateStatus>> {
        let clock = || self.clock.now();
        let read = self
            .read_unlocked(name, |rows| {
                rows.in_read_transaction(|rows| read_in_snapshot(rows, clock))
            })
            .await;
        let read = match read {
            Err(Error::Store {
                kind: StoreErrorKind::Busy,
                ..
            }) => RateRead::Step,
            read => read_rate_status(name, read)?,
        };
        let status = match read {
            RateRead::Settled(status) => status,
            RateRead::Step => step!(self, |conn, now| async {
                let rows = &mut SqliteRateRows::new(conn, name, now);
                shared::status(rows, name, true)
                    .await
                    .map(|r| (r, Vec::new()))
            }),
        };
        let wall = self.to_wall();
        Ok(status.map(|mut s| {
            s.now = wall(s.now);
            s.last_admit = wall(s.last_admit);
            s.next_free = wall(s.next_free);
            for l in &mut s.limits {
                l.next_free = wall(l.next_free);
            }
            s
        }))
    }
    async fn rate_delete(&self, name: &Name) -> Result<bool> {
        Ok(step!(self, |conn, now| async {
            let rows = &mut SqliteRateRows::new(conn, name, now);
            shared::delete(rows, name).await.map(|r| (r, Vec::new()))
        }))
    }
    /// The tenants' own limiters (window ceilings) are left out: they are their names'.
    async fn rate_list(&self) -> Result<Vec<String>> {
        let now = self.clock.now();
        let mut conn = self.pool.acquire().await.map_err(map_err)?;
        let mut names: Vec<String> = sqlx::query_scalar(LIST)
            .bind(db(now.0))
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        names.retain(|n| !shared::is_tenant_key(n));
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use sqlx::{ConnectOptions, Connection};

    use super::*;
    use crate::rate::{RateMode, RateSpec};
    use crate::stores::memory::MemoryBackend;
    use tessera_core::clock::ManualClock;

    const T0: StoreTime = StoreTime(1_800_000_000_000_000);

    #[tokio::test]
    async fn files_written_before_rate_limiters_still_open_and_gain_the_tables() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.db");
        // A file as the build before rate limiters left it: schema.sql only.
        let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .connect()
            .await
            .unwrap();
        sqlx::raw_sql(super::super::SCHEMA)
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        let url = format!("sqlite://{}", path.display());
        let backend = SqliteBackend::connect(&url).await.unwrap();
        let config = RateConfig::new(&["2/s".parse().unwrap()], RateMode::Exact).unwrap();
        let req = RateRequest {
            cost: 2,
            max_wait: None,
            update: false,
        };
        let name = Name::new("old-file").unwrap();
        assert!(matches!(
            backend.rate_acquire(&name, &config, &req).await.unwrap(),
            RateReply::Admitted { .. }
        ));
        // And a second connect (tables present) opens it as well.
        drop(backend);
        let again = SqliteBackend::connect(&url).await.unwrap();
        assert!(matches!(
            again.rate_acquire(&name, &config, &req).await.unwrap(),
            RateReply::Limited { .. }
        ));
    }

    /// The SQLite store answers every random rate step exactly as the memory model does.
    #[tokio::test]
    async fn random_rate_steps_match_the_reference_model() {
        for seed in 0..6u64 {
            let mut rng = StdRng::seed_from_u64(seed);
            let clock = Arc::new(ManualClock::new(T0));
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}/t.db", dir.path().display());
            let sqlite = SqliteBackend::connect_with_clock(&url, clock.clone())
                .await
                .unwrap();
            let memory = MemoryBackend::with_clock(clock.clone());
            let mode = match seed % 3 {
                2 => RateMode::Smooth { burst: 2 },
                _ => RateMode::Exact,
            };
            let limits: Vec<RateSpec> = (0..1 + seed % 3)
                .map(|i| RateSpec::new(3 + i as u32 * 2, Duration::from_millis(20 + 30 * i)))
                .collect::<Result<_, _>>()
                .unwrap();
            let config = RateConfig::new(&limits, mode)
                .unwrap()
                .with_margin(Duration::from_micros(seed * 1_500))
                .unwrap();
            let name = Name::new("diff").unwrap();
            let mut last_admit: Option<(u64, StoreTime)> = None;
            for step in 0..400 {
                clock.advance(Duration::from_micros(rng.random_range(0..8_000)));
                let kind = rng.random_range(0..10);
                if kind == 0 {
                    let (a, b) = (
                        sqlite.rate_status(&name).await.unwrap(),
                        memory.rate_status(&name).await.unwrap(),
                    );
                    assert_eq!(a, b, "seed {seed} step {step}: status");
                    continue;
                }
                if kind == 1 {
                    if let Some((id, at)) = last_admit {
                        let (a, b) = (
                            sqlite.rate_cancel(&name, id, at).await.unwrap(),
                            memory.rate_cancel(&name, id, at).await.unwrap(),
                        );
                        assert_eq!(a, b, "seed {seed} step {step}: cancel");
                    }
                    continue;
                }
                let req = RateRequest {
                    cost: rng.random_range(1..=config.max_cost()),
                    max_wait: (kind >= 6).then(|| Duration::from_millis(rng.random_range(0..60))),
                    update: false,
                };
                let a = sqlite.rate_acquire(&name, &config, &req).await.unwrap();
                let b = memory.rate_acquire(&name, &config, &req).await.unwrap();
                assert_eq!(a, b, "seed {seed} step {step}: {req:?}");
                if let RateReply::Admitted {
                    at, reservation, ..
                } = a
                {
                    last_admit = Some((reservation, at));
                }
            }
        }
    }

    #[tokio::test]
    async fn the_log_holds_at_most_n_entries_of_the_longest_limit() {
        let clock = Arc::new(ManualClock::new(T0));
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let backend = SqliteBackend::connect_with_clock(&url, clock.clone())
            .await
            .unwrap();
        let limits = ["5/20ms".parse().unwrap(), "8/50ms".parse().unwrap()];
        let config = RateConfig::new(&limits, RateMode::Exact).unwrap();
        let name = Name::new("bounded").unwrap();
        let req = RateRequest {
            cost: 1,
            max_wait: None,
            update: false,
        };
        let mut admitted = 0;
        for _ in 0..2000 {
            clock.advance(Duration::from_micros(700));
            if let RateReply::Admitted { .. } =
                backend.rate_acquire(&name, &config, &req).await.unwrap()
            {
                admitted += 1;
            }
            let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM tessera_rate_log")
                .fetch_one(&backend.pool)
                .await
                .unwrap();
            assert!(rows <= 8, "{rows} log rows");
        }
        // 1.4 s of demand above the limit: 8 per 50 ms.
        assert_eq!(admitted, 8 * 1400 / 50);
        // Unused past the longest period, the state leaves the file at the next step.
        clock.advance(Duration::from_millis(60));
        let other = Name::new("other").unwrap();
        backend.rate_acquire(&other, &config, &req).await.unwrap();
        let rows: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM tessera_rate_log WHERE name = 'bounded') + \
             (SELECT count(*) FROM tessera_rate_limiters WHERE name = 'bounded')",
        )
        .fetch_one(&backend.pool)
        .await
        .unwrap();
        assert_eq!(rows, 0);
    }
}
