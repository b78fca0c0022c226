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
//!   second and the longest wait.
//!
//! Both run on the database of the store URL; the commit loop uses a table of its own
//! (`tessera_bench_commits`), dropped afterwards.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use sqlx::mysql::MySqlConnectOptions;
use sqlx::{ConnectOptions, Connection};

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

/// Measures both baselines for `time` each.
pub async fn baselines(url: &str, time: Duration) -> anyhow::Result<MysqlBaselines> {
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
    Ok(MysqlBaselines {
        store: tessera::backend::redact_url(url),
        flush_log_at_trx_commit: flush,
        insert_commit_per_sec,
        get_lock_clients: clients,
        get_lock_per_sec: grants.load(Ordering::Relaxed) as f64 / secs,
        get_lock_handoffs_per_sec: handoffs.load(Ordering::Relaxed) as f64 / secs,
        get_lock_max_wait_ms: max_wait_us.load(Ordering::Relaxed) as f64 / 1000.0,
    })
}

/// The baselines as a few lines under the workloads' table.
pub fn table(b: &MysqlBaselines) -> String {
    format!(
        "server baselines (same run, innodb_flush_log_at_trx_commit={}):\n  \
         1 client INSERT+COMMIT: {:.0}/s\n  \
         GET_LOCK, {} clients: {:.0} grants/s, {:.0} hand-offs/s, max wait {:.1} ms\n",
        b.flush_log_at_trx_commit,
        b.insert_commit_per_sec,
        b.get_lock_clients,
        b.get_lock_per_sec,
        b.get_lock_handoffs_per_sec,
        b.get_lock_max_wait_ms
    )
}
