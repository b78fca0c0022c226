//! The backend's connections: the operations' pool, the keep-alives' own, and how a caller
//! waits for one.
//!
//! - **Operations** (acquires, releases, every step) share [`POOL_SIZE`] connections.
//! - **Keep-alives** (holders' renewals, waiters' heartbeats) take a free operation
//!   connection if one is free at that moment, else one of [`KEEP_POOL_SIZE`] of their own.
//!   A process that queued 10,000 acquires at once sends them one `CALL` each, a durable
//!   commit each, for seconds; keep-alives queued behind them came after their waiters'
//!   entries expired, and those waiters queued again. A process that only holds a lease
//!   still uses one connection.
//! - **A long line is not a server fault.** sqlx gives up on a caller after
//!   [`CONNECT_TIMEOUT`] in line. A caller here waits again as long as connections keep
//!   coming back to the pools (a call returned within that time), so a burst of acquires
//!   is served in turn instead of failing its last ones with a timeout the application
//!   sees; a hung server (no call returns) or an unreachable one still fails the wait after
//!   [`CONNECT_TIMEOUT`], with the server's own answer to one more connect when no
//!   connection is open (connection refused, access denied), not sqlx's bare pool timeout.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::mysql::{MySqlPool, MySqlPoolOptions, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Executor, MySql};

use tessera_core::error::{Error, Result, StoreErrorKind};

use super::error::map_err;
use super::{ops, routines};

/// Connections per backend for operations (besides the doorbell).
pub(crate) const POOL_SIZE: u32 = 8;
/// Connections per backend for keep-alives, used when the operations' are all busy.
pub(crate) const KEEP_POOL_SIZE: u32 = 2;

/// When a connection last came back to a pool.
#[derive(Debug)]
pub(crate) struct Returned {
    epoch: Instant,
    /// Milliseconds after `epoch`.
    at_ms: AtomicU64,
}

impl Default for Returned {
    fn default() -> Self {
        Returned {
            epoch: Instant::now(),
            at_ms: AtomicU64::new(0),
        }
    }
}

impl Returned {
    fn mark(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.at_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// Whether a connection came back at or after `t`.
    fn since(&self, t: Instant) -> bool {
        let ms = t.saturating_duration_since(self.epoch).as_millis() as u64;
        self.at_ms.load(Ordering::Relaxed) >= ms
    }
}

/// Why a pool that holds no connection timed out: sqlx tries a refused connect again until
/// its timeout and then reports only the timeout ("pool timed out while waiting for an open
/// connection"). One more connect, bounded, gets the server's own answer (connection
/// refused, access denied, too many connections), so the error says what is wrong.
async fn why_no_connection(pool: &MySqlPool) -> tessera_core::error::Error {
    let options = pool.connect_options();
    let attempt = sqlx::mysql::MySqlConnection::connect_with(&*options);
    match tokio::time::timeout(CONNECT_TIMEOUT, attempt).await {
        Ok(Err(e)) => {
            let e = map_err(e);
            match e {
                tessera_core::error::Error::Store { kind, message } => {
                    tessera_core::error::Error::store(
                        kind,
                        format!("no connection to the server could be opened: {message}"),
                    )
                }
                other => other,
            }
        }
        // It connects now, or hangs: the timeout it was.
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            map_err(sqlx::Error::PoolTimedOut)
        }
        Err(_) => map_err(sqlx::Error::PoolTimedOut),
    }
}

/// The pool settings of every pooled connection (see the module docs of `mod.rs`).
pub(crate) fn pool_options(size: u32, returned: &Arc<Returned>) -> MySqlPoolOptions {
    let returned = returned.clone();
    MySqlPoolOptions::new()
        .max_connections(size)
        .min_connections(0)
        .acquire_timeout(CONNECT_TIMEOUT)
        .test_before_acquire(false)
        .after_release(move |_, _| {
            returned.mark();
            Box::pin(async { Ok(true) })
        })
        .after_connect(|conn, _| {
            Box::pin(async move {
                conn.execute(SESSION).await?;
                conn.execute(KEEP_IDLE).await?;
                lift_statement_limit(conn).await;
                let lock_wait =
                    format!("SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_TIMEOUT_S}");
                conn.execute(sqlx::AssertSqlSafe(lock_wait)).await?;
                // MariaDB only; MySQL answers "unknown system variable": ignored.
                let idle =
                    format!("SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT_S}");
                let _ = conn.execute(sqlx::AssertSqlSafe(idle)).await;
                Ok(())
            })
        })
}

/// The operations' pool and the keep-alives' (see the module docs). Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Conns {
    pub(crate) pool: MySqlPool,
    pub(crate) keep: MySqlPool,
    pub(crate) returned: Arc<Returned>,
}

impl Conns {
    /// A connection for an operation.
    pub(crate) async fn ops(&self) -> Result<PoolConnection<MySql>> {
        self.wait(&self.pool).await
    }

    /// A connection for a keep-alive: a free operation connection, else a keep-alive one.
    pub(crate) async fn keep_alive(&self) -> Result<PoolConnection<MySql>> {
        match self.pool.try_acquire() {
            Some(conn) => Ok(conn),
            None => self.wait(&self.keep).await,
        }
    }

    /// Waits for a connection of `pool` while connections keep coming back.
    async fn wait(&self, pool: &MySqlPool) -> Result<PoolConnection<MySql>> {
        loop {
            let asked = Instant::now();
            match pool.acquire().await {
                Ok(conn) => return Ok(conn),
                Err(sqlx::Error::PoolTimedOut) if self.returned.since(asked) => {
                    tracing::debug!("tessera MySQL: still in line for a connection");
                }
                Err(sqlx::Error::PoolTimedOut) if pool.size() == 0 => {
                    return Err(why_no_connection(pool).await)
                }
                Err(e) => return Err(map_err(e)),
            }
        }
    }

    /// Runs one procedure call and returns its result rows (`None`: the procedure is
    /// missing), on an operation connection, or on a keep-alive one for a `keep_alive` call.
    /// A deadlock or lock wait timeout (the procedure rolled back) runs it again, as `step!`
    /// does. A connection lost during the call is tried again on another one, as `step!`
    /// does before its commit, only for a keep-alive (a renewal, a heartbeat: running one
    /// twice changes nothing more): another call may have committed, and its caller retries
    /// the operation itself. Without that, after `KILL CONNECTION` of a client's connections
    /// its renewals failed on the dead pooled ones until a hand-off grant (renewed first 100
    /// ms after it) was reported lost (chaos s9-client-kill). A connection whose call did not
    /// end cleanly is closed, not returned to the pool.
    pub(crate) async fn call(
        &self,
        call: String,
        keep_alive: bool,
    ) -> Result<Option<Vec<MySqlRow>>> {
        let mut attempt = 0u32;
        loop {
            let conn = if keep_alive {
                self.keep_alive().await?
            } else {
                self.ops().await?
            };
            let mut tx = Tx { conn, open: true };
            let outcome = routines::call(&mut tx.conn, call.clone()).await;
            if outcome.is_ok() {
                // The procedure ran to its end: committed or rolled back.
                tx.open = false;
            } else {
                // It rolled back before returning its error, unless it was interrupted
                // (`KILL QUERY`) in the middle: roll back here, or close the connection.
                tx.rollback().await;
            }
            match outcome {
                Err(e) if is_retryable(&e, !keep_alive, attempt) => {
                    attempt += 1;
                    tokio::time::sleep(retry_pause(attempt)).await;
                }
                other => return other,
            }
        }
    }

    /// [`Conns::call`] of a procedure that answers one row.
    pub(crate) async fn call_one(
        &self,
        call: String,
        keep_alive: bool,
    ) -> Result<Option<MySqlRow>> {
        match self.call(call, keep_alive).await? {
            None => Ok(None),
            Some(rows) => rows.into_iter().next().map(Some).ok_or_else(|| {
                tessera_core::error::Error::Corrupt("a tessera procedure returned no row".into())
            }),
        }
    }
}

/// How many times a step that hit a deadlock or a lock wait timeout is run again.
pub const STEP_RETRIES: u32 = 20;

/// `innodb_lock_wait_timeout` of tessera's sessions, seconds.
pub const LOCK_WAIT_TIMEOUT_S: u32 = 5;

/// `idle_transaction_timeout` of tessera's sessions (MariaDB), seconds.
pub const IDLE_TRANSACTION_TIMEOUT_S: u32 = 3;

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The session settings of every pooled connection (see the module docs).
pub(super) const SESSION: &str = "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED";

/// Lifts the server's `wait_timeout` (often set to a minute or less to reap forgotten
/// clients) for tessera's own connections, to the largest value the server takes: they are
/// idle between a lease's renewals on purpose, and the doorbell's latch is idle for its
/// whole life. A connection the server closed while idle failed the next call on it (a
/// release then left the permit to expire by its TTL).
pub(crate) const KEEP_IDLE: &str = "SET SESSION wait_timeout = 31536000";

/// Lifts a statement time limit for tessera's own connections: MariaDB's `max_statement_time`
/// (a server default, or a user's `MAX_STATEMENT_TIME`) and MySQL's `max_execution_time` (for
/// `SELECT`s). The doorbell parks in a 60 s wait on purpose, and such a limit cut every park
/// short: each cut woke every waiter of the process to ask the store, and a ring sent
/// between two parks had to look for the doorbell again. A step's own time is bounded by the
/// client and by `innodb_lock_wait_timeout`. Each server knows one of the two names and
/// answers "unknown system variable" to the other, which is ignored.
pub(crate) async fn lift_statement_limit(conn: &mut sqlx::MySqlConnection) {
    for sql in [
        "SET SESSION max_statement_time = 0",
        "SET SESSION max_execution_time = 0",
    ] {
        let _ = sqlx::raw_sql(sql).execute(&mut *conn).await;
    }
}

/// One step's transaction on a pooled connection, opened by the step's first batch
/// (`START TRANSACTION` goes with it) and ended by [`Tx::commit`] or [`Tx::rollback`]. A
/// transaction dropped open (a cancelled step, a failed rollback) closes its connection
/// instead of returning it to the pool, so the server rolls it back and no other step ever
/// runs inside it.
pub(super) struct Tx {
    pub(super) conn: sqlx::pool::PoolConnection<sqlx::MySql>,
    pub(super) open: bool,
}

impl Tx {
    /// Sends the writes still held back and `COMMIT`, in one round trip.
    pub(super) async fn commit(&mut self, mut pending: String) -> Result<()> {
        pending.push_str("COMMIT");
        ops::batch(&mut self.conn, pending).await?;
        self.open = false;
        Ok(())
    }

    /// Rolls back after an error; a connection that cannot is closed (see [`Tx`]).
    pub(super) async fn rollback(&mut self) {
        if self.open && ops::batch(&mut self.conn, "ROLLBACK".into()).await.is_ok() {
            self.open = false;
        }
    }
}

impl Drop for Tx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

/// Whether a failed step rolled back and may simply run again: a deadlock (1213), a lock
/// wait timeout (1205), or a query interrupted by a misdirected doorbell ring (1317); before
/// the commit was sent, also a lost connection (nothing was committed: the server rolls back
/// the transaction of a connection that dies, e.g. one that died idle in the pool across a
/// server restart). A connection lost while the commit was under way is not retried here:
/// the step may have committed, and the caller retries it idempotently.
///
/// `attempt` counts the runs so far: at most [`STEP_RETRIES`] in all, and after a lost
/// connection at most one per pooled connection (each stale one is closed as it fails).
pub(super) fn is_retryable(e: &Error, committing: bool, attempt: u32) -> bool {
    match e {
        Error::Store {
            kind: StoreErrorKind::Busy,
            ..
        } => attempt < STEP_RETRIES,
        Error::Store {
            kind: StoreErrorKind::Connection,
            ..
        } => !committing && attempt < POOL_SIZE,
        _ => false,
    }
}

/// A short random pause before running a step again, growing with the attempt.
pub(super) fn retry_pause(attempt: u32) -> Duration {
    let cap = 200u64.min(1 << attempt.min(7));
    Duration::from_micros(rand::random_range(0..cap * 1_000))
}
