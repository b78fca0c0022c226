//! What a MySQL / MariaDB server does without tessera, measured in the same run as the
//! workloads (`tessera bench --store mysql://…`), so tessera's figures can be read against
//! the server's own limits:
//!
//! - **durable commits**: one client's one-row `INSERT` loop in autocommit mode (each is one
//!   commit, durable when `innodb_flush_log_at_trx_commit=1`), per second: what a grant that
//!   survives a crash can at most reach;
//! - **`GET_LOCK` hand-offs**: 8 clients, each on its own connection, looping
//!   `GET_LOCK` / `RELEASE_LOCK` on one name (capacity 1, no lease, no fence, nothing
//!   durable, held by a session): hand-offs (the lock passed to a different client) per
//!   second and the longest wait;
//! - **lock table**: the hand-written lock tessera replaces, 8 clients on one lock (see
//!   [`super::polling`]): `INSERT` of the lock's row into a table with a unique key takes
//!   it, a duplicate-key error means it is held (the client sleeps and tries again), `DELETE`
//!   gives it back; each take and each release is one commit, durable as the server's.
//!
//! All run on the database of the store URL; the commit loop and the lock table use tables of
//! their own (`tessera_bench_commits`, `tessera_bench_locks`), dropped afterwards.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError};
use sqlx::{ConnectOptions, Connection};

use super::polling::{self, PollFigures, PollStats};

/// The server's own figures in this run.
#[derive(Debug, Clone, Serialize)]
pub struct MysqlBaselines {
    /// The store URL (password hidden).
    pub store: String,
    /// `innodb_flush_log_at_trx_commit` of the server (1: every commit is flushed).
    pub flush_log_at_trx_commit: i64,
    /// One client's one-row INSERT + COMMIT per second.
    pub insert_commit_per_sec: f64,
    /// `GET_LOCK` clients.
    pub get_lock_clients: usize,
    /// `GET_LOCK` acquisitions per second (all clients).
    pub get_lock_per_sec: f64,
    /// `GET_LOCK` hand-offs (to a different client than the previous holder) per second.
    pub get_lock_handoffs_per_sec: f64,
    /// The longest `GET_LOCK` wait, ms.
    pub get_lock_max_wait_ms: f64,
    /// The lock table of a unique key, 8 clients on one lock.
    pub lock_table: PollFigures,
}

/// Whether `url` names a MySQL / MariaDB store.
pub fn is_mysql(url: &str) -> bool {
    url.starts_with("mysql://") || url.starts_with("mariadb://")
}

/// sqlx's options for a tessera `mysql://` URL (tessera's own `wake` option removed).
fn options(url: &str) -> anyhow::Result<MySqlConnectOptions> {
    let mut u = url::Url::parse(url).context("store URL")?;
    let kept: Vec<(String, String)> = u
        .query_pairs()
        .filter(|(k, _)| k != "wake")
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    u.set_query(None);
    if !kept.is_empty() {
        u.query_pairs_mut().extend_pairs(kept);
    }
    let s = u.as_str().replacen("mariadb://", "mysql://", 1);
    MySqlConnectOptions::from_str(&s).context("store URL")
}

/// Measures the baselines for `time` each; the lock table's clients poll every `poll`.
pub async fn baselines(
    url: &str,
    time: Duration,
    poll: Duration,
) -> anyhow::Result<MysqlBaselines> {
    let opts = options(url)?;
    let mut conn = opts
        .connect()
        .await
        .context("connecting for the baselines")?;
    let flush: i64 = sqlx::query_scalar("SELECT CAST(@@innodb_flush_log_at_trx_commit AS SIGNED)")
        .fetch_one(&mut conn)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS tessera_bench_commits \
         (id BIGINT AUTO_INCREMENT PRIMARY KEY, v INT NOT NULL) ENGINE=InnoDB",
    )
    .execute(&mut conn)
    .await?;
    let start = Instant::now();
    let mut commits = 0u64;
    while start.elapsed() < time {
        sqlx::query("INSERT INTO tessera_bench_commits (v) VALUES (1)")
            .execute(&mut conn)
            .await?;
        commits += 1;
    }
    let insert_commit_per_sec = commits as f64 / start.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE tessera_bench_commits")
        .execute(&mut conn)
        .await?;
    conn.close().await.ok();

    let clients = 8;
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let grants = Arc::new(AtomicU64::new(0));
    let max_wait_us = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(
            opts.connect()
                .await
                .context("connecting a GET_LOCK client")?,
        );
    }
    let start = Instant::now();
    let lock = format!("tessera_bench_{:08x}", rand::random::<u32>());
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut conn)| {
            let (last, handoffs, grants, max_wait_us, lock) = (
                Arc::clone(&last),
                Arc::clone(&handoffs),
                Arc::clone(&grants),
                Arc::clone(&max_wait_us),
                lock.clone(),
            );
            tokio::spawn(async move {
                while start.elapsed() < time {
                    let asked = Instant::now();
                    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK(?, 10)")
                        .bind(&lock)
                        .fetch_one(&mut conn)
                        .await?;
                    anyhow::ensure!(got == Some(1), "GET_LOCK answered {got:?}");
                    max_wait_us.fetch_max(asked.elapsed().as_micros() as u64, Ordering::Relaxed);
                    grants.fetch_add(1, Ordering::Relaxed);
                    if last.swap(i, Ordering::Relaxed) != i {
                        handoffs.fetch_add(1, Ordering::Relaxed);
                    }
                    let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                        .bind(&lock)
                        .fetch_one(&mut conn)
                        .await?;
                }
                conn.close().await.ok();
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    let lock_table = lock_table(&opts, clients, time, poll).await?;
    Ok(MysqlBaselines {
        store: tessera::backend::redact_url(url),
        flush_log_at_trx_commit: flush,
        insert_commit_per_sec,
        get_lock_clients: clients,
        get_lock_per_sec: grants.load(Ordering::Relaxed) as f64 / secs,
        get_lock_handoffs_per_sec: handoffs.load(Ordering::Relaxed) as f64 / secs,
        get_lock_max_wait_ms: max_wait_us.load(Ordering::Relaxed) as f64 / 1000.0,
        lock_table,
    })
}

/// MySQL's duplicate-key error: the lock's row is there, someone holds the lock.
const ER_DUP_ENTRY: u16 = 1062;
/// A deadlock, which InnoDB reports on this design's `INSERT`s and `DELETE`s racing for the
/// row's key (each side's duplicate check takes a shared lock): the statement is tried again,
/// as the design's users must.
const ER_LOCK_DEADLOCK: u16 = 1213;

/// The MySQL error number of `e`, if the server answered one.
fn number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(d) => d
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// The lock table for `time`, `clients` on one lock, hold ≈ 0 (see the module docs).
async fn lock_table(
    opts: &MySqlConnectOptions,
    clients: usize,
    time: Duration,
    poll: Duration,
) -> anyhow::Result<PollFigures> {
    let mut conn = opts
        .connect()
        .await
        .context("connecting for the lock table")?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS tessera_bench_locks (name VARCHAR(64) PRIMARY KEY, \
         owner VARCHAR(64) NOT NULL, expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
    )
    .execute(&mut conn)
    .await?;
    let mut conns = Vec::new();
    for _ in 0..clients {
        conns.push(
            opts.connect()
                .await
                .context("connecting a lock table client")?,
        );
    }
    let lock = format!("tessera_bench_{:08x}", rand::random::<u32>());
    let stats = Arc::new(PollStats::new(clients, 1));
    let start = Instant::now();
    let tasks: Vec<_> = conns
        .into_iter()
        .enumerate()
        .map(|(i, mut conn)| {
            let (stats, lock) = (Arc::clone(&stats), lock.clone());
            let owner = format!("client-{i}");
            tokio::spawn(async move {
                'grants: while start.elapsed() < time {
                    let asked = Instant::now();
                    loop {
                        let taken = sqlx::query(
                            "INSERT INTO tessera_bench_locks (name, owner, expires_at) \
                             VALUES (?, ?, NOW(6) + INTERVAL 30 SECOND)",
                        )
                        .bind(&lock)
                        .bind(&owner)
                        .execute(&mut conn)
                        .await;
                        match taken {
                            Ok(_) => break,
                            Err(e) if number(&e) == Some(ER_LOCK_DEADLOCK) => {}
                            Err(e) if number(&e) == Some(ER_DUP_ENTRY) => {
                                stats.polled();
                                if start.elapsed() >= time {
                                    break 'grants;
                                }
                                tokio::time::sleep(poll).await;
                            }
                            Err(e) => return Err(e.into()),
                        }
                    }
                    stats.granted(i, asked.elapsed());
                    stats.leaving();
                    loop {
                        let released = sqlx::query(
                            "DELETE FROM tessera_bench_locks WHERE name = ? AND owner = ?",
                        )
                        .bind(&lock)
                        .bind(&owner)
                        .execute(&mut conn)
                        .await;
                        match released {
                            Ok(_) => break,
                            Err(e) if number(&e) == Some(ER_LOCK_DEADLOCK) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                }
                conn.close().await.ok();
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await??;
    }
    let secs = start.elapsed().as_secs_f64();
    sqlx::query("DROP TABLE tessera_bench_locks")
        .execute(&mut conn)
        .await?;
    conn.close().await.ok();
    Ok(stats.figures("lock table", poll, secs))
}

/// The baselines as a few lines under the workloads' table.
pub fn table(b: &MysqlBaselines) -> String {
    format!(
        "server baselines (same run, innodb_flush_log_at_trx_commit={}):\n  \
         1 client INSERT+COMMIT: {:.0}/s\n  \
         GET_LOCK, {} clients: {:.0} grants/s, {:.0} hand-offs/s, max wait {:.1} ms\n  {}",
        b.flush_log_at_trx_commit,
        b.insert_commit_per_sec,
        b.get_lock_clients,
        b.get_lock_per_sec,
        b.get_lock_handoffs_per_sec,
        b.get_lock_max_wait_ms,
        polling::line(&b.lock_table)
    )
}
