//! The PostgreSQL figures to compare tessera with, measured on the same server in the same
//! run as the workloads (`tessera bench --store postgres://…`):
//!
//! - **advisory W1**: one session's `pg_advisory_lock` / `pg_advisory_unlock` pairs per
//!   second (capacity 1, no lease, no fence, nothing durable);
//! - **advisory W2**: 8 sessions taking and giving back one advisory lock, hold ≈ 0: hand-offs
//!   (the lock passed to a different session) per second and the longest wait;
//! - **durable commits**: one session's `INSERT` + `COMMIT` of one row per second (the disk's
//!   durable-commit limit, which a durable grant pays once; with `synchronous_commit=off` in
//!   the store URL this session commits asynchronously too, like tessera's own);
//! - **SKIP LOCKED semaphore**: the hand-written semaphore tessera replaces, W3's shape (32
//!   sessions, capacity 4; see [`super::polling`]): a table of 4 slot rows, a holder keeps
//!   its slot locked (`SELECT … FOR UPDATE SKIP LOCKED`) in an open transaction until its
//!   `COMMIT`; a session that finds every slot locked rolls back and polls again. Each grant
//!   commits a row lock, durably unless the store URL turns `synchronous_commit` off.
//!
//! Each runs for `run` (a hard bound), on connections of its own.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};

use super::polling::{self, PollFigures, PollStats};

/// The comparison figures (one JSON line, `"workload": "postgres-baseline"`).
#[derive(Debug, Clone, Serialize)]
pub struct PgBaseline {
    pub workload: String,
    pub store: String,
    /// Advisory lock + unlock pairs per second, one session.
    pub advisory_w1_pairs_per_sec: f64,
    /// Advisory lock hand-offs per second among 8 sessions.
    pub advisory_w2_handoffs_per_sec: f64,
    /// Longest wait for the advisory lock among the 8 sessions, ms.
    pub advisory_w2_max_wait_ms: f64,
    /// One-row INSERT + COMMIT per second, one session.
    pub insert_commits_per_sec: f64,
    /// Whether the commit session ran with `synchronous_commit=off` (as the store URL asks).
    pub synchronous_commit_off: bool,
    /// The `SELECT … FOR UPDATE SKIP LOCKED` semaphore, 32 sessions on 4 slots.
    pub skip_locked: PollFigures,
}

/// Connection options from a tessera `postgres://` URL: its server and credentials, without
/// tessera's own parameters (schema, synchronous_commit) that sqlx does not know.
fn options(url: &str) -> anyhow::Result<(PgConnectOptions, bool)> {
    let mut u = url::Url::parse(url).context("store URL")?;
    let mut async_commit = false;
    let mut keep: Vec<(String, String)> = Vec::new();
    for (k, v) in u.query_pairs() {
        match &*k {
            "schema" => {}
            "synchronous_commit" => async_commit = v == "off",
            _ => keep.push((k.into_owned(), v.into_owned())),
        }
    }
    u.set_query(None);
    if !keep.is_empty() {
        u.query_pairs_mut().extend_pairs(keep);
    }
    let o: PgConnectOptions = u.as_str().parse().context("store URL")?;
    // Like tessera's own connections, nothing a pooler (PgBouncer) would refuse at startup.
    let o = o
        .application_name("tessera-bench-baseline")
        .extra_float_digits(None);
    Ok((o, async_commit))
}

async fn connect(o: &PgConnectOptions) -> anyhow::Result<PgConnection> {
    Ok(o.connect().await?)
}

/// Runs the four comparisons, each for at most `run`; the SKIP LOCKED semaphore's sessions
/// poll every `poll`.
pub async fn run(
    url: &str,
    redacted: &str,
    run: Duration,
    poll: Duration,
) -> anyhow::Result<PgBaseline> {
    let (o, async_commit) = options(url)?;
    let key: i64 = rand::random::<i64>() & 0x7fff_ffff_ffff;

    // Advisory W1.
    let mut c = connect(&o).await?;
    let t0 = Instant::now();
    let mut pairs = 0u64;
    while t0.elapsed() < run {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(key)
            .execute(&mut c)
            .await?;
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut c)
            .await?;
        pairs += 1;
    }
    let w1 = pairs as f64 / t0.elapsed().as_secs_f64();
    c.close().await.ok();

    // Advisory W2: 8 sessions, hold ≈ 0.
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(connect(&o).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let max_wait_us = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut c) in conns.into_iter().enumerate() {
        let (stop, last, handoffs, max_wait_us) = (
            Arc::clone(&stop),
            Arc::clone(&last),
            Arc::clone(&handoffs),
            Arc::clone(&max_wait_us),
        );
        tasks.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let asked = Instant::now();
                sqlx::query("SELECT pg_advisory_lock($1)")
                    .bind(key)
                    .execute(&mut c)
                    .await?;
                max_wait_us.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                if last.swap(i, Ordering::Relaxed) != i {
                    handoffs.fetch_add(1, Ordering::Relaxed);
                }
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(key)
                    .execute(&mut c)
                    .await?;
            }
            c.close().await.ok();
            Ok::<_, sqlx::Error>(())
        }));
    }
    tokio::time::sleep(run).await;
    stop.store(true, Ordering::Relaxed);
    let seconds = t0.elapsed().as_secs_f64();
    for t in tasks {
        t.await??;
    }
    let w2 = handoffs.load(Ordering::Relaxed) as f64 / seconds;
    let w2_max = max_wait_us.load(Ordering::Relaxed) as f64 / 1000.0;

    // Durable commits: one-row INSERT + COMMIT (autocommit) in a table of its own.
    let mut c = connect(&o).await?;
    if async_commit {
        sqlx::query("SET synchronous_commit = off")
            .execute(&mut c)
            .await?;
    }
    let table = format!("tessera_bench_commit_{key:x}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (id bigserial PRIMARY KEY, v int NOT NULL)"
    )))
    .execute(&mut c)
    .await?;
    let insert = format!("INSERT INTO {table} (v) VALUES ($1)");
    let t0 = Instant::now();
    let mut commits = 0u64;
    while t0.elapsed() < run {
        sqlx::query(sqlx::AssertSqlSafe(insert.clone()))
            .bind(commits as i32)
            .execute(&mut c)
            .await?;
        commits += 1;
    }
    let commit_rate = commits as f64 / t0.elapsed().as_secs_f64();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&mut c)
        .await?;
    c.close().await.ok();

    let skip_locked = skip_locked(&o, async_commit, key, run, poll).await?;

    Ok(PgBaseline {
        workload: "postgres-baseline".into(),
        store: redacted.to_string(),
        advisory_w1_pairs_per_sec: w1,
        advisory_w2_handoffs_per_sec: w2,
        advisory_w2_max_wait_ms: w2_max,
        insert_commits_per_sec: commit_rate,
        synchronous_commit_off: async_commit,
        skip_locked,
    })
}

/// Sessions and slots of the SKIP LOCKED semaphore (W3's shape).
const SKIP_LOCKED_CLIENTS: usize = 32;
const SKIP_LOCKED_SLOTS: u32 = 4;

/// The `SELECT … FOR UPDATE SKIP LOCKED` semaphore for `run`, hold ≈ 0 (see the module docs).
async fn skip_locked(
    o: &PgConnectOptions,
    async_commit: bool,
    key: i64,
    run: Duration,
    poll: Duration,
) -> anyhow::Result<PollFigures> {
    let table = format!("tessera_bench_slots_{key:x}");
    let mut c = connect(o).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (slot int PRIMARY KEY); \
         INSERT INTO {table} SELECT generate_series(0, {})",
        SKIP_LOCKED_SLOTS - 1
    )))
    .execute(&mut c)
    .await?;
    let mut conns = Vec::new();
    for _ in 0..SKIP_LOCKED_CLIENTS {
        let mut s = connect(o).await?;
        if async_commit {
            sqlx::query("SET synchronous_commit = off")
                .execute(&mut s)
                .await?;
        }
        conns.push(s);
    }
    let take = format!("SELECT slot FROM {table} ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED");
    let stats = Arc::new(PollStats::new(SKIP_LOCKED_CLIENTS, SKIP_LOCKED_SLOTS));
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut s) in conns.into_iter().enumerate() {
        let (stats, take) = (Arc::clone(&stats), take.clone());
        tasks.push(tokio::spawn(async move {
            'grants: while t0.elapsed() < run {
                let asked = Instant::now();
                loop {
                    let mut tx = s.begin().await?;
                    let slot: Option<i32> = sqlx::query_scalar(sqlx::AssertSqlSafe(take.clone()))
                        .fetch_optional(&mut *tx)
                        .await?;
                    if slot.is_some() {
                        stats.granted(i, asked.elapsed());
                        stats.leaving();
                        tx.commit().await?;
                        break;
                    }
                    stats.polled();
                    tx.rollback().await?;
                    if t0.elapsed() >= run {
                        break 'grants;
                    }
                    tokio::time::sleep(poll).await;
                }
            }
            s.close().await.ok();
            Ok::<_, anyhow::Error>(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let seconds = t0.elapsed().as_secs_f64();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&mut c)
        .await?;
    c.close().await.ok();
    Ok(stats.figures("SKIP LOCKED semaphore", poll, seconds))
}

/// The figures as lines under the workloads' table, with the ratios.
pub fn table(b: &PgBaseline, reports: &[super::report::WorkloadReport]) -> String {
    let find = |w: &str| reports.iter().find(|r| r.workload == w);
    let mut out = format!(
        "postgres, same server, same run: advisory W1 {:.0} pairs/s; advisory W2 {:.0} \
         hand-offs/s (max wait {:.1} ms); INSERT+COMMIT {:.0}/s{}\n",
        b.advisory_w1_pairs_per_sec,
        b.advisory_w2_handoffs_per_sec,
        b.advisory_w2_max_wait_ms,
        b.insert_commits_per_sec,
        if b.synchronous_commit_off {
            " (synchronous_commit off)"
        } else {
            ""
        },
    );
    if let Some(w1) = find("w1") {
        out += &format!(
            "  tessera W1 / commits = {:.2}\n",
            w1.ops_per_sec / b.insert_commits_per_sec
        );
    }
    if let Some(w2) = find("w2") {
        out += &format!(
            "  tessera W2 hand-offs / commits = {:.2}; / advisory W2 = {:.2}\n",
            w2.handoffs_per_sec / b.insert_commits_per_sec,
            w2.handoffs_per_sec / b.advisory_w2_handoffs_per_sec
        );
    }
    out += &format!("  {}", polling::line(&b.skip_locked));
    if let Some(w3) = find("w3") {
        out += &format!(
            "  tessera W3 grants / SKIP LOCKED grants = {:.2}\n",
            w3.ops_per_sec / b.skip_locked.grants_per_sec
        );
    }
    out
}
