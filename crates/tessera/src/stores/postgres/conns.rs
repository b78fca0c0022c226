//! A backend's connections, in two stacks: at most [`POOL_SIZE`](POOL_SIZE) for
//! operations and [`KEEP_POOL_SIZE`](KEEP_POOL_SIZE) for keep-alives, each reused
//! last in, first out.
//!
//! sqlx's pool sends a `Sync` and waits for its `ReadyForQuery` on every connection it takes
//! back, a second round trip per operation on the server and on the client's CPU. This one
//! needs none: a connection goes back only after a call that returned (a row or a database
//! error; the protocol is then at a message boundary, which sqlx resumes from), and a call
//! that timed out, was cancelled or broke the connection drops it ([`Lent`] closes on drop
//! unless [`Lent::put_back`] is called). A connection that sat idle longer than
//! [`STALE_AFTER`] is pinged before use (a server restart or an idle timeout in between
//! closed it), and replaced if the ping fails. So is one that went idle before another
//! connection was dropped unreturned: what broke one (a server restart, every session
//! terminated, a network cut) most likely broke the idle ones too, and without the ping each
//! of them would fail one operation in turn: after `pg_terminate_backend` of every session,
//! a lease's renewals met up to [`POOL_SIZE`](POOL_SIZE) dead connections one retry
//! apart before a new one was opened.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgArguments, PgConnectOptions, PgConnection, PgRow, Postgres};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Semaphore, SemaphorePermit};

use tessera_core::error::{Error, Result, StoreErrorKind};

use super::error::{map_err, reusable_after};

/// How long one call may take before it fails with [`StoreErrorKind::Timeout`].
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);

/// An idle connection older than this is pinged before it is used.
const STALE_AFTER: Duration = Duration::from_secs(30);
/// How long that ping may take.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// A new connection with tessera's session settings (`url::session_sql`): connect, then one
/// simple-protocol batch of `SET`s. Settings sent as the startup parameter `options` instead
/// would be refused by PgBouncer.
pub(crate) async fn open(options: &PgConnectOptions, session: &str) -> sqlx::Result<PgConnection> {
    let mut conn = options.connect().await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(session.to_string()))
        .execute(&mut conn)
        .await?;
    Ok(conn)
}

pub(crate) struct Conns {
    options: PgConnectOptions,
    /// The session's settings, run on each new connection ([`open`]).
    session: String,
    idle: Mutex<Idle>,
    slots: Semaphore,
    connect_timeout: Duration,
}

/// The idle connections, each with when it went idle, and when a connection was last dropped
/// unreturned.
#[derive(Default)]
struct Idle {
    conns: Vec<(PgConnection, Instant)>,
    dropped_at: Option<Instant>,
    /// When a call last returned on a connection of this stack (see [`Conns::take`]).
    returned_at: Option<Instant>,
}

impl Idle {
    /// Whether an idle connection that went idle at `since` must be pinged before use.
    fn suspect(&self, since: Instant) -> bool {
        since.elapsed() >= STALE_AFTER || self.dropped_at.is_some_and(|d| since <= d)
    }
}

/// A connection lent out; dropped without [`Lent::put_back`], it is closed.
pub(crate) struct Lent<'a> {
    conn: Option<PgConnection>,
    conns: &'a Conns,
    _slot: SemaphorePermit<'a>,
    /// Taken from the idle stack without a ping: a session the server ended meanwhile
    /// (`pg_terminate_backend`, a restart) shows only at its first call.
    unchecked: bool,
}

impl Conns {
    pub(crate) fn new(
        options: PgConnectOptions,
        session: String,
        size: usize,
        connect_timeout: Duration,
    ) -> Self {
        Conns {
            options,
            session,
            idle: Mutex::new(Idle::default()),
            slots: Semaphore::new(size),
            connect_timeout,
        }
    }

    /// A connection: an idle one, or a new one once fewer than the limit are open.
    ///
    /// The wait for a free slot fails only when no call has returned on this stack for the
    /// connect timeout (the server hangs, or is gone: every connection is stuck in a call
    /// that will time out); while calls keep returning, the connections are merely busy, and
    /// the caller waits its turn (FIFO) however long the line is. A process that queued
    /// 10,000 acquires at once saw the last third of them fail with this timeout although
    /// the server answered every call within milliseconds. Opening a connection is bounded
    /// by the connect timeout.
    pub(crate) async fn take(&self) -> Result<Lent<'_>> {
        // One wait, kept across the checks, so the caller keeps its place in the line.
        let acquire = self.slots.acquire();
        tokio::pin!(acquire);
        let slot = loop {
            match tokio::time::timeout(self.connect_timeout, acquire.as_mut()).await {
                Ok(slot) => {
                    break slot.map_err(|_| {
                        Error::store(StoreErrorKind::Connection, "the connections are closed")
                    })?
                }
                Err(_) if self.returned_within(self.connect_timeout) => continue,
                Err(_) => return Err(self.timed_out()),
            }
        };
        self.lend(slot).await
    }

    /// A connection if one is free now (an idle one, or a slot to open one), without
    /// waiting for another call to return one; `None` when every slot is in use.
    pub(crate) async fn take_free(&self) -> Option<Result<Lent<'_>>> {
        let slot = self.slots.try_acquire().ok()?;
        Some(self.lend(slot).await)
    }

    /// Whether a call returned on a connection of this stack within `span`.
    fn returned_within(&self, span: Duration) -> bool {
        let idle = self.idle.lock().unwrap();
        idle.returned_at.is_some_and(|at| at.elapsed() < span)
    }

    fn timed_out(&self) -> Error {
        Error::store(
            StoreErrorKind::Timeout,
            format!("no connection within {:?}", self.connect_timeout),
        )
    }

    /// An idle connection (pinged first if it is suspect), or a new one, for `slot`.
    async fn lend<'a>(&'a self, slot: SemaphorePermit<'a>) -> Result<Lent<'a>> {
        loop {
            let (idle, suspect) = {
                let mut idle = self.idle.lock().unwrap();
                let conn = idle.conns.pop();
                let suspect = conn.as_ref().is_some_and(|(_, since)| idle.suspect(*since));
                (conn, suspect)
            };
            let Some((mut conn, _)) = idle else {
                break;
            };
            if !suspect
                || matches!(
                    tokio::time::timeout(PING_TIMEOUT, conn.ping()).await,
                    Ok(Ok(()))
                )
            {
                return Ok(Lent {
                    conn: Some(conn),
                    conns: self,
                    _slot: slot,
                    unchecked: !suspect,
                });
            }
        }
        let conn = tokio::time::timeout(self.connect_timeout, open(&self.options, &self.session))
            .await
            .map_err(|_| self.timed_out())?
            .map_err(map_err)?;
        Ok(Lent {
            conn: Some(conn),
            conns: self,
            _slot: slot,
            unchecked: false,
        })
    }
}

impl Lent<'_> {
    pub(crate) fn conn(&mut self) -> &mut PgConnection {
        self.conn
            .as_mut()
            .expect("a lent connection is there until it goes back")
    }

    /// Whether it came from the idle stack without a ping (see [`keep_alive_rows`]).
    pub(crate) fn unchecked(&self) -> bool {
        self.unchecked
    }

    /// Returns the connection for reuse: only after a call that returned.
    pub(crate) fn put_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let now = Instant::now();
            let mut idle = self.conns.idle.lock().unwrap();
            idle.conns.push((conn, now));
            idle.returned_at = Some(now);
        }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if self.conn.is_some() {
            self.conns.idle.lock().unwrap().dropped_at = Some(Instant::now());
        }
    }
}

/// Connections per backend for operations.
pub(super) const POOL_SIZE: usize = 4;

/// Connections per backend for keep-alives (holders' renewals, waiters' heartbeats) when
/// none of the operations' is free, so that no burst of operations delays a keep-alive past
/// its TTL: one process that queued 10,000 acquires at once kept its 4 connections busy for
/// seconds, the heartbeats of its first waiters waited behind them, and those waiters
/// expired, were purged and queued again (`tessera-chaos --scenario s10-reclaim`).
pub(super) const KEEP_POOL_SIZE: usize = 2;

/// A connection for a keep-alive (a renewal, waiters' heartbeats): one of the operations'
/// stack if one is free now, so that a process that only holds a lease keeps one
/// connection, else one of the keep-alives' own ([`KEEP_POOL_SIZE`]).
pub(super) async fn keep_alive_conn<'a>(ops: &'a Conns, keep: &'a Conns) -> Result<Lent<'a>> {
    match ops.take_free().await {
        Some(conn) => conn,
        None => keep.take().await,
    }
}

/// Runs a keep-alive statement (a renewal, heartbeats: each may run twice without harm) on a
/// keep-alive connection ([`keep_alive_conn`]) and returns its rows. If the connection came
/// from the idle stack unchecked and its session turns out to be gone (a connection error:
/// the server ended it while it sat idle), the statement runs once more at once on another
/// connection. The failed one was dropped, so every connection that went idle before it is
/// pinged before use and a dead one is replaced by a new session: one call, not one retry of
/// the lease keeper per dead connection. Without this, after `pg_terminate_backend` of every
/// session, the first renewal of each lease met its dead connection and waited the keeper's
/// retry interval, which could cost a hand-off grant (provisional for what is left of its
/// waiter's entry, `crate::lease::permit`) its lease in the chaos runner's `s9-client-kill`.
pub(super) async fn keep_alive_rows<'q>(
    ops: &Conns,
    keep: &Conns,
    url: &str,
    query: impl Fn() -> sqlx::query::Query<'q, Postgres, PgArguments>,
) -> Result<Vec<PgRow>> {
    let conn = keep_alive_conn(ops, keep).await?;
    let unchecked = conn.unchecked();
    match run_rows(conn, url, query()).await {
        Err(Error::Store {
            kind: StoreErrorKind::Connection,
            ..
        }) if unchecked => run_rows(keep_alive_conn(ops, keep).await?, url, query()).await,
        reply => reply,
    }
}

/// Runs one statement on `conn` and returns its one row (see [`run_rows`]).
pub(super) async fn run_row(
    conn: Lent<'_>,
    url: &str,
    query: sqlx::query::Query<'_, Postgres, PgArguments>,
) -> Result<PgRow> {
    run_rows(conn, url, query)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| Error::Corrupt("a tessera function answered no row".into()))
}

/// Runs one statement on `conn` and returns its rows, within [`RESPONSE_TIMEOUT`]; a
/// connection that timed out is closed rather than reused.
pub(super) async fn run_rows(
    mut conn: Lent<'_>,
    url: &str,
    query: sqlx::query::Query<'_, Postgres, PgArguments>,
) -> Result<Vec<PgRow>> {
    match tokio::time::timeout(RESPONSE_TIMEOUT, query.fetch_all(conn.conn())).await {
        Ok(Ok(rows)) => {
            conn.put_back();
            Ok(rows)
        }
        Ok(Err(e)) => {
            // A session started while the database was read-only keeps that default for
            // its life: close it, so the next session sees the fault lifted; a broken
            // connection is closed too.
            if reusable_after(&e) {
                conn.put_back();
            }
            Err(map_err(e))
        }
        Err(_) => Err(Error::store(
            StoreErrorKind::Timeout,
            format!("{url} did not answer within {RESPONSE_TIMEOUT:?}"),
        )),
    }
}
