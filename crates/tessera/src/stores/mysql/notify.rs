//! Waking waiters in other processes: one "doorbell" connection per client, rung with
//! `KILL QUERY`.
//!
//! MySQL and MariaDB have no LISTEN/NOTIFY. Each [`super::MysqlBackend`] keeps one extra
//! connection of its own parked in `SELECT GET_LOCK('tessera-bell-<token>', 60) /* tessera
//! doorbell <token> */`, waiting for a user lock that a second connection of the same
//! client, the *latch*, holds and never lets go. Its address, `<connection id>:<token>`, goes
//! into every waiter row this client writes (and is refreshed by each heartbeat, so a
//! doorbell that reconnected is found again). A step that grants waiters collects the
//! doorbells of the granted rows; after its commit the granting client rings each one that
//! is not its own (a release of routine version 10 does both steps below itself, inside the
//! procedure after its commit, and answers whether the client must look again:
//! `routines_v10.sql`):
//!
//! 1. `SELECT … FROM information_schema.PROCESSLIST WHERE ID = <id> AND INFO LIKE
//!    '%tessera doorbell <token>%'` — only a connection that is still that doorbell, parked,
//!    is rung: a connection id reused after the doorbell died (or after a server restart)
//!    belongs to someone else, whose query must not be interrupted. A doorbell that is
//!    connected but between two parks (it was just rung) is checked again, backed off, for
//!    about a quarter of a second: `KILL QUERY` on an idle connection does nothing, so a ring
//!    sent then would be lost until the waiter's next poll;
//! 2. `KILL QUERY <id>`: the wait ends at once.
//!
//! **Why a user-lock wait and not `SELECT SLEEP(60)`.** MariaDB 10.11 puts every `SLEEP()` to
//! sleep under one server-wide mutex, and `KILL` waits (in 50 ms steps, up to 2 s) for the
//! mutex of the thread it wakes; with several doorbells parked and rung at once, kills of
//! parked `SLEEP`s took seconds (8 ringers on 8 parked `SLEEP`s: p50 2.5 ms, p99 8 s, max
//! 14 s), and waiters behind a slow ring waited seconds for their grant. A `GET_LOCK` wait
//! sleeps on a mutex of its own: the same rings took p50 1.9 ms, max 11 ms. If the latch
//! cannot take its lock (a server that refuses `GET_LOCK`, such as a Galera cluster), the
//! doorbell parks in `SLEEP(60)` as before. If the latch's connection dies its lock is
//! released, the doorbell's `GET_LOCK` returns 1, and both are opened again.
//!
//! The woken client then wakes every waiter it has queued (it does not know which lease was
//! granted: one heartbeat each, only in that client). The granting operation sends the ring
//! after its commit, on a pooled connection, before it returns (so a process that exits
//! right after a release has rung); only the look-again rounds for a doorbell between two
//! parks run in a task of their own.
//!
//! A ring can still be lost: the doorbell was reconnecting, the server restarted, it stayed
//! unparked longer than the ring looks for it, or the user may not kill its own threads. (A
//! `KILL` that lands just after the doorbell's wait ended is not lost: the wait ended because
//! of another ring or its 60 s, and either way the doorbell wakes every waiter after it
//! ended, and so after the grant being rung was committed.) Waiters therefore keep polling
//! (backed off, see [`super::MysqlBackend::capabilities`]), and a doorbell that reconnects
//! wakes all its waiters, whose heartbeats find any grant made meanwhile.
//!
//! Privileges: `KILL QUERY` on a thread of the same user needs nothing more; clients that
//! connect as different users need `CONNECTION ADMIN` (MySQL 8) / `CONNECTION ADMIN` or
//! `SUPER` (MariaDB) to ring each other, and `PROCESS` to see each other's threads in
//! `PROCESSLIST`. Without them a ring finds nothing and waiters fall back to polling.
//! `GET_LOCK` needs no privilege.
//!
//! **Holders are rung too.** A revoke or a delete rings the doorbell of every holder and
//! waiter it removes, so a holder in another process has its `lost()` fired within
//! milliseconds, as on the other stores, instead of at its next renewal (TTL/3 later: until
//! then two processes would run under one permit). The invariant: *a holder row names the
//! doorbell of its client whenever that client's doorbell is parked, or the client learns
//! that the row is gone.* A holder row is written without one (by the procedures, which do
//! not know the column, and by hand-offs to other clients); the client that holds the lease
//! then opens its doorbell and writes the address into the row ([`Holders::claim`]), and
//! again into every row it holds whenever the doorbell parks at a new address. A revoke or
//! delete reads the doorbells with a lock (`ops.rs`), so a claim either comes first and is
//! rung, or comes after the commit and finds the row gone, which fires the holder's `lost()`
//! at once as a ring does. A rung client cannot tell why it was rung: beside waking its
//! waiters it reads, in one statement, which of its held leases' rows are gone
//! ([`Holders::check`]), and wakes their keepers, which renew, find them gone and fire
//! `lost()`. A row that names no doorbell (written before schema version 3, by a client with
//! `wake=poll`, or whose claim failed) and a ring that is lost (see above) leave the holder
//! to learn of it at its next renewal, as before.
//!
//! **Only while waiters wait or holders hold.** The doorbell's two connections are opened
//! when a waiter of the client is first queued or a lease is first granted to it, not at
//! connect, and closed again after a whole park (60 s) with no ring, no waiter queued and
//! no lease held. A client that only tries without getting a permit keeps just its pooled
//! connection; one that holds a lease (most `tessera run` processes) uses three while it
//! holds, so that a revoke reaches it. A waiter queued while its client's doorbell is still
//! connecting is written without an address; its first poll (20 ms later) moves it to the
//! doorbell, as after any reconnect; a holder's row is claimed once the doorbell parks.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlPool};
use sqlx::{ConnectOptions, Connection};
use tokio::task::JoinHandle;

use super::ops::{batch, render, text_at, Lit, Results};
use tessera_core::model::LeaseId;

/// How long the doorbell sleeps per query before it parks again.
const PARK_S: u32 = 60;

/// The addresses of this process's parked doorbells. A grant to a waiter of this process
/// already woke it through [`tessera_core::wake::notify`] (the registry is process-wide), so these
/// are never rung.
static LOCAL: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// This process's parked doorbells, separated by commas: the ones a release of routine
/// version 10 must not ring (`routines_v10.sql`).
pub(crate) fn local_addresses() -> String {
    LOCAL.lock().unwrap().join(",")
}

fn set_local(addr: &str, parked: bool) {
    let mut local = LOCAL.lock().unwrap();
    local.retain(|a| a != addr);
    if parked {
        local.push(addr.to_string());
    }
}

/// The lease ids this client has queued, woken when its doorbell rings.
pub(crate) type Waiting = Arc<Mutex<HashSet<LeaseId>>>;

/// The leases this client holds, whose rows it makes name its doorbell (see the module
/// docs, "Holders"), and the pool it writes and checks them through.
#[derive(Debug)]
pub(crate) struct Holders {
    /// Lease id → semaphore name.
    held: Mutex<HashMap<LeaseId, String>>,
    pool: MySqlPool,
}

/// How many leases one claim or check sends in one round trip.
const HOLDERS_PER_BATCH: usize = 256;

impl Holders {
    pub(crate) fn new(pool: MySqlPool) -> Arc<Holders> {
        Arc::new(Holders {
            held: Mutex::default(),
            pool,
        })
    }

    pub(crate) fn insert(&self, name: &str, lease: LeaseId) {
        self.held.lock().unwrap().insert(lease, name.to_string());
    }

    pub(crate) fn remove(&self, lease: LeaseId) {
        self.held.lock().unwrap().remove(&lease);
    }

    fn is_empty(&self) -> bool {
        self.held.lock().unwrap().is_empty()
    }

    fn all(&self) -> Vec<(LeaseId, String)> {
        let held = self.held.lock().unwrap();
        held.iter().map(|(l, n)| (*l, n.clone())).collect()
    }

    /// A lease whose row is gone (revoked, deleted, expired): its keeper is woken, renews
    /// and finds it gone, and `lost()` fires; it is forgotten here.
    fn gone(&self, lease: LeaseId) {
        self.remove(lease);
        tessera_core::wake::notify(lease);
    }

    /// Writes `address` into the holder rows of `leases` (all held leases if `None`). A row
    /// already gone is [`Holders::gone`]. The update waits for a step that holds the row
    /// locked: a revoke or delete reads the doorbell with a lock (`ops.rs`), so it either
    /// sees this address or committed before, and then this finds the row gone. A failed
    /// claim (a lost connection) leaves the row without a doorbell: the holder then learns
    /// of a revoke at its next renewal, as before.
    pub(crate) async fn claim(
        self: Arc<Self>,
        address: String,
        leases: Option<Vec<(LeaseId, String)>>,
    ) {
        let leases = leases.unwrap_or_else(|| self.all());
        for chunk in leases.chunks(HOLDERS_PER_BATCH) {
            let sql: Vec<String> = chunk
                .iter()
                .map(|(lease, name)| {
                    let lease = lease.to_string();
                    render(
                        "UPDATE tessera_holders SET doorbell = ? WHERE name = ? AND lease_id = ?",
                        &[Lit::Text(&address), Lit::Text(name), Lit::Text(&lease)],
                    )
                })
                .collect();
            let Some(results) = self.send(sql.join(";")).await else {
                return;
            };
            // FOUND_ROWS is on: an UPDATE reports the rows it matched.
            for ((lease, _), (_, matched)) in chunk.iter().zip(results) {
                if matched == 0 {
                    self.gone(*lease);
                }
            }
        }
    }

    /// After a ring: the held leases whose rows are gone are [`Holders::gone`]. One read,
    /// not a renewal per lease.
    async fn check(self: Arc<Self>) {
        let leases = self.all();
        for chunk in leases.chunks(HOLDERS_PER_BATCH) {
            let ids: Vec<String> = chunk.iter().map(|(l, _)| l.to_string()).collect();
            let wheres: Vec<String> = chunk
                .iter()
                .zip(&ids)
                .map(|((_, name), id)| {
                    render(
                        "(name = ? AND lease_id = ?)",
                        &[Lit::Text(name), Lit::Text(id)],
                    )
                })
                .collect();
            let sql = format!(
                "SELECT lease_id FROM tessera_holders WHERE {}",
                wheres.join(" OR ")
            );
            let Some(mut results) = self.send(sql).await else {
                return;
            };
            let rows = results.pop().map(|(rows, _)| rows).unwrap_or_default();
            let present: HashSet<String> = rows.iter().filter_map(|r| text_at(r, 0).ok()).collect();
            for ((lease, _), id) in chunk.iter().zip(&ids) {
                if !present.contains(id) {
                    self.gone(*lease);
                }
            }
        }
    }

    async fn send(&self, sql: String) -> Option<Results> {
        let sent = async {
            let mut conn = self.pool.acquire().await.map_err(super::error::map_err)?;
            batch(&mut conn, sql).await
        };
        match sent.await {
            Ok(results) => Some(results),
            Err(e) => {
                tracing::debug!(error = %e, "tessera MySQL doorbell: holder rows not reached");
                None
            }
        }
    }
}

/// One client's doorbell: the parked connection's task and its current address.
#[derive(Debug)]
pub(crate) struct Doorbell {
    address: Arc<Mutex<String>>,
    dormancy: Arc<Dormancy>,
    task: JoinHandle<()>,
}

/// Whether the doorbell is closed for want of waiters, and the signal that opens it.
#[derive(Debug)]
struct Dormancy {
    dormant: Mutex<bool>,
    wake: tokio::sync::Notify,
}

impl Dormancy {
    /// Goes dormant if no waiter is queued. The check and the change happen under the
    /// `dormant` lock, and [`Doorbell::wake`] takes it after its waiter (holder) was added to
    /// `waiting` (`holders`): one added meanwhile either is seen here or wakes the doorbell
    /// again.
    fn sleep_if_idle(&self, waiting: &Waiting, holders: &Holders) -> bool {
        let mut dormant = self.dormant.lock().unwrap();
        if waiting.lock().unwrap().is_empty() && holders.is_empty() {
            *dormant = true;
        }
        *dormant
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        self.task.abort();
        set_local(&self.address(), false);
    }
}

impl Doorbell {
    /// The doorbell of a client, dormant (no connection) until [`Doorbell::wake`].
    pub(crate) fn start(
        options: MySqlConnectOptions,
        waiting: Waiting,
        holders: Arc<Holders>,
    ) -> Doorbell {
        Doorbell::start_parking(options, waiting, holders, PARK_S)
    }

    /// Like [`Doorbell::start`], parking `park_s` seconds at a time (tests).
    pub(crate) fn start_parking(
        options: MySqlConnectOptions,
        waiting: Waiting,
        holders: Arc<Holders>,
        park_s: u32,
    ) -> Doorbell {
        // The parked SLEEP is slow on purpose: not a statement to warn about.
        let options = options.disable_statement_logging();
        let address = Arc::new(Mutex::new(String::new()));
        let dormancy = Arc::new(Dormancy {
            dormant: Mutex::new(true),
            wake: tokio::sync::Notify::new(),
        });
        let task = tokio::spawn(park_loop(
            options,
            park_s,
            Arc::clone(&address),
            Arc::clone(&dormancy),
            waiting,
            holders,
        ));
        Doorbell {
            address,
            dormancy,
            task,
        }
    }

    /// Opens a dormant doorbell (it connects and parks in the background); call it after
    /// adding a waiter to `waiting` or a holder to `holders`.
    pub(crate) fn wake(&self) {
        let mut dormant = self.dormancy.dormant.lock().unwrap();
        if *dormant {
            *dormant = false;
            self.dormancy.wake.notify_one();
        }
    }

    /// `<connection id>:<token>`, or `""` while the doorbell is not connected.
    pub(crate) fn address(&self) -> String {
        self.address.lock().unwrap().clone()
    }

    /// Where [`Doorbell::address`] is kept, for a task that reads it later.
    pub(crate) fn address_cell(&self) -> Arc<Mutex<String>> {
        self.address.clone()
    }
}

/// A doorbell's connections: the parked one, its latch, its address and its park query.
struct Parked {
    conn: MySqlConnection,
    /// Holds the user lock `conn` waits for; `None` when the lock could not be taken (the
    /// doorbell then parks in `SLEEP`).
    latch: Option<MySqlConnection>,
    addr: String,
    park: String,
}

impl Parked {
    async fn close(self) {
        let _ = self.conn.close().await;
        if let Some(latch) = self.latch {
            let _ = latch.close().await;
        }
    }
}

/// A fresh doorbell: its connection, its latch holding the user lock it parks on, and its
/// address.
async fn connect(options: &MySqlConnectOptions, park_s: u32) -> Option<Parked> {
    let mut conn = options.connect().await.ok()?;
    sqlx::raw_sql(super::conns::KEEP_IDLE)
        .execute(&mut conn)
        .await
        .ok()?;
    super::conns::lift_statement_limit(&mut conn).await;
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut conn)
        .await
        .ok()?;
    let token = format!("{:016x}", rand::random::<u64>());
    let lock = format!("tessera-bell-{token}");
    let latch = match options.connect().await {
        Ok(mut latch) => {
            // The latch is idle for its whole life: a server's `wait_timeout` would end it.
            let _ = sqlx::raw_sql(super::conns::KEEP_IDLE)
                .execute(&mut latch)
                .await;
            let taken: Option<Option<i64>> = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                .bind(&lock)
                .fetch_one(&mut latch)
                .await
                .ok();
            if taken == Some(Some(1)) {
                Some(latch)
            } else {
                let _ = latch.close().await;
                None
            }
        }
        Err(_) => None,
    };
    let park = match latch {
        Some(_) => format!("SELECT GET_LOCK('{lock}', {park_s}) /* tessera doorbell {token} */"),
        None => format!("SELECT SLEEP({park_s}) /* tessera doorbell {token} */"),
    };
    Some(Parked {
        conn,
        latch,
        addr: format!("{id}:{token}"),
        park,
    })
}

fn wake_all(waiting: &Waiting) {
    let leases: Vec<LeaseId> = waiting.lock().unwrap().iter().copied().collect();
    for lease in leases {
        tessera_core::wake::notify(lease);
    }
}

/// After a ring (or a whole park): every waiter asks the store once, and the holders whose
/// rows are gone are told (one read for all of them).
fn rung(waiting: &Waiting, holders: &Arc<Holders>) {
    wake_all(waiting);
    if !holders.is_empty() {
        tokio::spawn(Arc::clone(holders).check());
    }
}

async fn park_loop(
    options: MySqlConnectOptions,
    park_s: u32,
    address: Arc<Mutex<String>>,
    dormancy: Arc<Dormancy>,
    waiting: Waiting,
    holders: Arc<Holders>,
) {
    let mut backoff = Duration::from_millis(50);
    loop {
        // `notify_one` keeps a wake that comes before this wait starts.
        while *dormancy.dormant.lock().unwrap() {
            dormancy.wake.notified().await;
        }
        let Some(mut parked) = connect(&options, park_s).await else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        };
        backoff = Duration::from_millis(50);
        set_local(&parked.addr, true);
        *address.lock().unwrap() = parked.addr.clone();
        // Rings sent to an older address were lost: let every waiter ask the store, and
        // move every holder row to this address (which finds those removed meanwhile).
        wake_all(&waiting);
        tokio::spawn(Arc::clone(&holders).claim(parked.addr.clone(), None));
        let latched = parked.latch.is_some();
        loop {
            match sqlx::query_scalar::<_, Option<i64>>(sqlx::AssertSqlSafe(parked.park.clone()))
                .fetch_one(&mut parked.conn)
                .await
            {
                // `GET_LOCK` took the lock: the latch's connection is gone. Open both again.
                Ok(Some(1)) if latched => {
                    wake_all(&waiting);
                    tokio::spawn(Arc::clone(&holders).check());
                    break;
                }
                // Waited the whole time (both waits answer 0): a ring that found it parked
                // just before the end sent its `KILL QUERY` to an idle connection, where it
                // does nothing, so every waiter asks the store once. With none queued, the
                // doorbell closes until the next one is.
                Ok(Some(0)) => {
                    rung(&waiting, &holders);
                    if dormancy.sleep_if_idle(&waiting, &holders) {
                        break;
                    }
                }
                // Rung (`KILL QUERY` makes `SLEEP` return 1, a `GET_LOCK` wait NULL on some
                // servers): every waiter asks the store once; then park again.
                Ok(_) => rung(&waiting, &holders),
                // MariaDB answers the killed wait with "query execution was interrupted"
                // (1317); the connection itself lives on.
                Err(sqlx::Error::Database(db))
                    if db
                        .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                        .is_some_and(|e| e.number() == 1317) =>
                {
                    rung(&waiting, &holders)
                }
                Err(_) => break,
            }
        }
        let old = std::mem::take(&mut *address.lock().unwrap());
        set_local(&old, false);
        parked.close().await;
    }
}

/// Rings the doorbells at `addresses` (but not `own`, nor any other doorbell of this
/// process).
pub(crate) async fn ring(pool: &MySqlPool, addresses: Vec<String>, own: &str) {
    let local = LOCAL.lock().unwrap().clone();
    let remote = addresses
        .into_iter()
        .filter(|a| a != own && !local.contains(a))
        .collect();
    ring_each(pool, remote).await;
}

/// How long a ring keeps looking for a doorbell that is connected but not parked: after
/// each ring the doorbell wakes its waiters and then parks again, and a ring that came in
/// between would otherwise be lost (a `KILL QUERY` on an idle connection does nothing; the
/// waiters would wait for their next poll). The checks are spaced 1, 2, 4, … ms apart.
const RING_RETRIES: u32 = 8;

/// How long the granting call waits for its first round of rings.
const RING_INLINE: Duration = Duration::from_secs(1);

/// Rings every doorbell at `addresses` (see the module docs).
///
/// The first round runs before this returns, so a process that ends right after a release
/// has rung the waiters it granted (a ring left to a background task died with a `tessera
/// run` that exited at once, and each waiter in another process then found its grant only
/// at its next poll, up to a second later). A doorbell that is connected but between two
/// parks is checked again in the background, backed off, for about a quarter of a second
/// ([`RING_RETRIES`]); a connection id that is gone, or that never parks with this token
/// (reused by another client), is left alone.
pub(crate) async fn ring_each(pool: &MySqlPool, addresses: Vec<String>) {
    let pending: Vec<(u64, String)> = addresses
        .into_iter()
        .filter_map(|a| {
            let (id, token) = a.split_once(':')?;
            let token_ok = !token.is_empty() && token.bytes().all(|b| b.is_ascii_hexdigit());
            Some((id.parse().ok()?, token.to_string())).filter(|_| token_ok)
        })
        .collect();
    if pending.is_empty() {
        return;
    }
    // Bounded: a server gone silent after the commit must not hold the granting call (the
    // waiters' polls then find their grants).
    let Ok(mut pending) = tokio::time::timeout(RING_INLINE, ring_round(pool, pending)).await else {
        return;
    };
    if pending.is_empty() {
        return;
    }
    let pool = pool.clone();
    tokio::spawn(async move {
        for attempt in 1..=RING_RETRIES {
            tokio::time::sleep(Duration::from_millis(1 << (attempt - 1))).await;
            pending = ring_round(&pool, pending).await;
            if pending.is_empty() {
                return;
            }
        }
    });
}

/// Rings each parked doorbell of `pending` once; returns those connected but not parked.
/// The pooled connection is taken per round, so that a ring backing off holds none.
async fn ring_round(pool: &MySqlPool, pending: Vec<(u64, String)>) -> Vec<(u64, String)> {
    let Ok(mut conn) = pool.acquire().await else {
        return Vec::new();
    };
    let mut unparked = Vec::new();
    for (id, token) in pending {
        // NULL: no such connection; 0: connected, not parked (or not a doorbell of this
        // token); 1: parked.
        let parked: Option<Option<i64>> = sqlx::query_scalar(
            "SELECT INFO LIKE ? FROM information_schema.PROCESSLIST WHERE ID = ?",
        )
        .bind(format!("%tessera doorbell {token}%"))
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .unwrap_or(None);
        match parked {
            Some(Some(1)) => {
                let kill = format!("KILL QUERY {id}");
                if let Err(e) = sqlx::query(sqlx::AssertSqlSafe(kill))
                    .execute(&mut *conn)
                    .await
                {
                    tracing::debug!(error = %e, "tessera MySQL doorbell: KILL QUERY failed");
                }
            }
            Some(_) => unparked.push((id, token)),
            None => {}
        }
    }
    unparked
}
