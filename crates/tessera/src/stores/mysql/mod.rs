//! The MySQL / MariaDB store (`mysql://`, `mariadb://`): semaphores, locks and rate limits on
//! the database a team already shares.
//!
//! ```text
//! mysql://[user[:password]@]host[:port]/database[?ssl-mode=…][&ssl-ca=/abs/ca.pem][&wake=doorbell|poll][&socket=/path]
//! ```
//!
//! - `database` (required) holds tessera's tables (`tessera_*`), created and migrated at
//!   connect (`migrate.rs`); [`MysqlBackend::connect_existing`] (the CLI's `status`,
//!   `revoke`, `resize`, `delete`) creates nothing and answers [`Error::NoStore`] for a
//!   database without them. A database per tenant isolates tenants. The user needs `CREATE`,
//!   `SELECT`, `INSERT`, `UPDATE`, `DELETE` on it (`CREATE` only until the tables exist;
//!   `ALTER` once, to bring tables of before schema version 3 up to it, without which that
//!   client runs without holders' doorbells), and `EXECUTE` (`CREATE ROUTINE` until the procedures exist; without it operations run
//!   client side).
//! - `ssl-mode` (`disabled`, the default without `ssl-ca`; `preferred`, `required`,
//!   `verify_ca`, `verify_identity`) and `ssl-ca` (a PEM file; alone it means
//!   `verify_identity`): TLS through rustls. A CA file that cannot be read is an invalid
//!   URL; a server certificate the CA does not vouch for (or, without `ssl-ca`, that the
//!   built-in web roots do not) is a connection error saying "TLS handshake failed". Tested
//!   against MariaDB with a server certificate from a CA made with `openssl`
//!   (`tests.rs`): the pool and the doorbell connections are encrypted.
//! - `wake` (`doorbell`, the default, or `poll`): how waiters in other processes learn of a
//!   grant (`notify.rs`).
//! - Each option at most once (`ssl-mode` and `sslmode` are one option): a URL that gives
//!   one twice is refused.
//! - `socket=/path` connects through the server's Unix socket instead of the URL's host and
//!   port (`mysql://app@localhost/jobs?socket=/run/mysqld/mysqld.sock`).
//!
//! Passwords are never shown: messages carry the URL with the password replaced by `***`.
//! `mariadb://` is the same store; both speak to MariaDB and MySQL servers.
//!
//! # Versions
//!
//! Tested on MariaDB 10.11 (Debian 12). The SQL is written for MySQL 8 as well (no
//! `RETURNING`, no `FOR UPDATE OF`, no `INSERT … WITH`, `SYSDATE(6)` and `TIMESTAMPDIFF` for
//! the clock), but no MySQL 8 server was tested. Galera refuses `GET_LOCK`: migrations then
//! run without it (they are idempotent), but tessera was not tested on Galera.
//!
//! # How it runs
//!
//! - **The hot path in one round trip.** An acquire of one permit and a release, also one
//!   that hands the permit to the queue head, are one `CALL` of a stored procedure
//!   (`routines.sql`, `routines.rs`, installed by `migrate.rs`) that locks, decides, writes
//!   and commits on the server, so the semaphore's row is locked only while the server runs
//!   it. The procedures cover the common case and leave the rest (anything to purge, a
//!   weight other than 1, several hand-offs, a row that does not read back as the step
//!   writes it) to the client-side step below, having changed nothing. Without them (a
//!   user without `CREATE ROUTINE`) every operation runs client side. From schema version 6
//!   on (fair shares, `fair_shares.sql`) the procedures called are routine version 6's
//!   (`routines_v6.sql`), which keep the start tags, also a named tenant's (docs/fair-shares.md);
//!   from schema version 7 on (`tenant_rows.sql`), routine version 7's (`routines_v7.sql`),
//!   which also keep the tenant on holder and waiter rows and answer it with the lease.
//! - **One transaction per operation**, `READ COMMITTED`, running the shared SQL step
//!   (`stores/sql`) over this store's statements (`ops.rs`), client side: the first
//!   statement locks the semaphore's row (`SELECT … FOR UPDATE`, after an acquire's
//!   `INSERT … ON DUPLICATE KEY UPDATE` that creates it) and reads the server's clock
//!   (`SYSDATE(6)`, never `NOW()`) once the lock is held. Writes whose results the step
//!   does not read ride with the next statement or the `COMMIT` (`ops.rs`): an acquire of a
//!   free permit is two round trips, a release three (also one that hands the permit to a
//!   waiter), a waiter's heartbeat one read when nothing is due (see
//!   [`MysqlBackend::heartbeat`]); docs/performance.md has the measured figures.
//!   Deadlocks (1213) and lock wait timeouts (1205) roll the whole transaction back and the
//!   step is run again ([`STEP_RETRIES`] times), so neither is ever seen as an answer.
//! - **Durability** is the server's: with `innodb_flush_log_at_trx_commit=1` (the default)
//!   every grant and release is one durable commit.
//! - **Frozen clients.** A client stopped in the middle of a step holds the semaphore's row
//!   lock. Each session sets `idle_transaction_timeout` (MariaDB) to
//!   [`IDLE_TRANSACTION_TIMEOUT_S`] seconds, after which the server ends such a transaction
//!   and frees the row; others wait at most `innodb_lock_wait_timeout` =
//!   [`LOCK_WAIT_TIMEOUT_S`] s per try. MySQL 8 has no idle-transaction timeout: there a
//!   frozen client blocks its semaphore until its connection dies.
//! - **Keep-alives and connections** (`conns.rs`): operations share 8 connections;
//!   renewals and heartbeats take a free one of those, else one of 2 of their own, so they
//!   never wait behind a burst of acquires. A caller's wait for a connection fails only when
//!   no call has come back for 5 s, not when the line is long. The heartbeats of a client's waiters on one semaphore that arrive
//!   while one call of them runs go together in the next (`heartbeats.rs`, routine version
//!   5).
//! - **Waking**: a grant made in this process wakes the waiting task at once
//!   ([`tessera_core::wake::notify`]); waiters in other processes are rung on their doorbell
//!   connection (`notify.rs`), and poll as the safety net. A revoke or a delete rings the
//!   doorbells of the holders and waiters it removes, so a holder in another process has
//!   its `lost()` fired at once, not at its next renewal: a holder row names its client's
//!   doorbell (schema version 3, `holders_doorbell.sql`), written by that client once it
//!   holds the lease (`notify.rs`, "Holders are rung too"); a row that names none is found
//!   gone at the holder's next renewal, as before.

/// Runs one semaphore step in its own transaction, commits, then wakes the lease ids it
/// granted or revoked in this process and rings the doorbells of the granted waiters and
/// of the revoked or deleted holders and waiters in others. A
/// deadlock or lock wait timeout rolls back and runs the step again.
///
/// `step!(self, name, |rows| op)` runs a step of the shared SQL layer with `rows` the MySQL
/// row operations (`ops.rs`) of semaphore `name`; `step!(self, |conn| op)` runs a rate
/// step of `rate.rs` on the transaction's connection.
macro_rules! step {
    ($self:ident, $name:expr, |$rows:ident| $op:expr) => {{
        let doorbell = $self.doorbell_address();
        let mut attempt = 0u32;
        loop {
            let mut tx = $self.transaction().await?;
            let mut committing = false;
            let outcome = async {
                let mut rows = ops::MysqlRows::new(&mut tx.conn, $name.as_str(), &doorbell, true)
                    .with_holder_doorbells($self.holder_doorbells)
                    .with_gates($self.gates)
                    .with_fair_shares($self.fair)
                    .with_tenant_rows($self.tenant_rows)
                    .with_tenant_limits($self.db.tenant_limits())
                    .with_window_ceilings($self.db.window_ceilings())
                    .with_tails($self.db.tails());
                let $rows = &mut rows;
                let (reply, wakes) = $op.await?;
                let mut rung = rows.take_rung();
                // The holders and waiters the step removes and wakes (a revoke, a delete)
                // are rung too: in another process their wake-up goes through the doorbell.
                for (id, doorbell) in rows.take_removed() {
                    let woken = wakes.iter().any(|w| w.to_string() == id);
                    if woken && !doorbell.is_empty() && !rung.contains(&doorbell) {
                        rung.push(doorbell);
                    }
                }
                let granted = rows.take_granted();
                let pending = rows.take_pending();
                committing = true;
                tx.commit(pending).await?;
                Ok::<_, Error>((reply, wakes, rung, granted))
            }
            .await;
            match outcome {
                Ok((reply, wakes, rung, mut granted)) => {
                    // A waiter of this process gets its grant with the wake-up.
                    for &id in &wakes {
                        match granted.iter().position(|g| g.lease.lease_id == id) {
                            Some(i) => {
                                $self.granted_here($name, id);
                                tessera_core::wake::notify_grant(granted.swap_remove(i))
                            }
                            None => tessera_core::wake::notify(id),
                        }
                    }
                    // The connection goes back to the pool first: the ring takes one, and
                    // steps that each held theirs while waiting for another could exhaust it.
                    drop(tx);
                    notify::ring(&$self.conns.pool, rung, &doorbell).await;
                    break Ok::<_, Error>(reply);
                }
                Err(e) => {
                    tx.rollback().await;
                    if is_retryable(&e, committing, attempt) {
                        attempt += 1;
                        tokio::time::sleep(retry_pause(attempt)).await;
                        continue;
                    }
                    break Err(e);
                }
            }
        }
    }};
    ($self:ident, |$conn:ident| $op:expr) => {{
        let mut attempt = 0u32;
        loop {
            let mut tx = $self.transaction().await?;
            let mut committing = false;
            let outcome = async {
                $crate::stores::mysql::ops::batch(&mut tx.conn, "START TRANSACTION".into()).await?;
                let $conn: &mut sqlx::mysql::MySqlConnection = &mut tx.conn;
                let reply = $op.await?;
                committing = true;
                tx.commit(String::new()).await?;
                Ok::<_, Error>(reply)
            }
            .await;
            match outcome {
                Ok(reply) => break Ok::<_, Error>(reply),
                Err(e) => {
                    tx.rollback().await;
                    if is_retryable(&e, committing, attempt) {
                        attempt += 1;
                        tokio::time::sleep(retry_pause(attempt)).await;
                        continue;
                    }
                    break Err(e);
                }
            }
        }
    }};
}

mod conns;
mod error;
mod heartbeats;
mod migrate;
mod notify;
pub(crate) mod ops;
pub(crate) mod rate;
mod routines;
pub(crate) mod url;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::{ConnectOptions, Connection};

#[cfg(doc)]
use ops::MysqlRows;

use tessera_core::error::{Error, InvalidInput, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, Backend, Capabilities, GiveBack, RateConfig,
    Settlement, Waking, LOCKED_STEP_ARRIVALS,
};
use tessera_core::stores::sql;

use conns::{
    is_retryable, pool_options, retry_pause, Conns, Returned, Tx, CONNECT_TIMEOUT, KEEP_POOL_SIZE,
    POOL_SIZE,
};
use error::connect_error;
use heartbeats::{Answer, HeartbeatMany, Heartbeats};
use migrate::migration_refused;
use notify::{Doorbell, Holders, Waiting};
use routines::Fast;
use url::{parse_url, WakeMode};

/// The MySQL / MariaDB backend. Cheap to share behind an `Arc`; holds a small connection
/// pool and a doorbell (two connections while waiters of this client are queued).
pub struct MysqlBackend {
    conns: Conns,
    url: String,
    /// `None` with `wake=poll`.
    doorbell: Option<Doorbell>,
    /// Lease ids queued through this backend, woken when its doorbell rings.
    waiting: Waiting,
    /// Leases held through this backend, whose rows name its doorbell (`notify.rs`);
    /// `None` with `wake=poll`.
    holders: Option<Arc<Holders>>,
    /// Whether the holders' table has the `doorbell` column (schema version 3).
    holder_doorbells: bool,
    /// Whether the waiters' table has the `gate` column (schema version 4): admissions.
    gates: bool,
    /// Whether the limiters' table has the `expired` column (schema version 5): admissions
    /// given back past their use-by instant are counted.
    counts_expired: bool,
    /// Whether the tables have fair shares' tags (schema version 6): tenants, and the
    /// procedures of routine version 6 for what orders the queue (none below it).
    fair: bool,
    /// Whether holder and waiter rows keep their tenant (schema version 7), written and
    /// answered by the procedures of routine version 7 (none below it).
    tenant_rows: bool,
    /// The schema version and the version of the hot path's stored procedures the database
    /// holds (`routines.rs`): acquires, releases, renewals and heartbeats call the procedures
    /// written for the tables found ([`migrate::Migrated::calls`]), version 4's from 4 on;
    /// without them (0: none) every operation runs client side, as the procedures of
    /// versions 1 to 3 can read rows from before the step they waited for (`routines.sql`);
    /// from 5 on, waiters' heartbeats of one semaphore go together (`heartbeats.rs`).
    db: migrate::Migrated,
    /// Waiters' heartbeats gathered per semaphore; `None` below routine version 5.
    heartbeats: Option<Arc<Heartbeats>>,
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

impl MysqlBackend {
    /// Connects to a `mysql://` or `mariadb://` URL (see the module docs): parses it,
    /// migrates the schema and opens the pool (lazily); the doorbell opens when a waiter is
    /// first queued.
    pub async fn connect(raw: &str) -> Result<Self> {
        Self::open(raw, true).await
    }

    /// Connects only if the URL's database holds tessera's tables (at any version: an older
    /// schema is migrated as by [`MysqlBackend::connect`]); otherwise [`Error::NoStore`], and
    /// nothing is created. For the tools that only read or change existing state, so a
    /// mistyped database is reported rather than set up as a new, empty store.
    pub async fn connect_existing(raw: &str) -> Result<Self> {
        Self::open(raw, false).await
    }

    async fn open(raw: &str, create: bool) -> Result<Self> {
        let config = parse_url(raw)?;
        let options = config.options.clone();
        let in_url = |e: Error| match e {
            Error::Store { kind, message } => Error::Store {
                kind,
                message: format!("{}: {message}", config.redacted),
            },
            other => other,
        };
        // One plain connection first: a wrong password or an unreachable server fails here,
        // with the URL (redacted) in the message; it also runs the migrations.
        let mut first = tokio::time::timeout(CONNECT_TIMEOUT, options.connect())
            .await
            .map_err(|_| {
                in_url(Error::store(
                    StoreErrorKind::Timeout,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                ))
            })?
            .map_err(|e| connect_error(e, &config.redacted))?;
        if !create && !migrate::exists(&mut first).await.map_err(in_url)? {
            let _ = first.close().await;
            return Err(Error::NoStore {
                url: config.redacted.clone(),
                reason: "the database holds no tessera tables (tessera_meta; they are created \
                         by the first process that acquires)"
                    .into(),
            });
        }
        let migrated = migrate::migrate(&mut first).await;
        let _ = first.close().await;
        let migrated = migrated.map_err(migration_refused).map_err(in_url)?;
        // Holders' doorbells need the column of schema version 3 (refused to a user who may
        // not ALTER: this client then leaves revokes to be found at renewal).
        let holder_doorbells = migrated.schema >= migrate::OPTIONAL_FROM;
        // Admissions need the waiters' gates of schema version 4 (refused likewise).
        let gates = migrated.schema >= migrate::GATES_FROM;
        // The count of expired admissions needs the column of schema version 5 (likewise).
        let counts_expired = migrated.schema >= migrate::EXPIRED_COUNT_FROM;
        // Fair shares need the tags of schema version 6 (refused likewise).
        let fair = migrated.fair();
        // Tenants on holder and waiter rows need the columns of schema version 7 (likewise).
        let tenant_rows = migrated.tenant_rows();
        let returned = Arc::new(Returned::default());
        let pool = |size| pool_options(size, &returned).connect_lazy_with(options.clone());
        let conns = Conns {
            pool: pool(POOL_SIZE),
            keep: pool(KEEP_POOL_SIZE),
            returned: returned.clone(),
        };
        let waiting: Waiting = Arc::default();
        let (doorbell, holders) = match config.wake {
            WakeMode::Doorbell if holder_doorbells => {
                let holders = Holders::new(conns.pool.clone());
                let doorbell = Doorbell::start(options, Arc::clone(&waiting), holders.clone());
                (Some(doorbell), Some(holders))
            }
            WakeMode::Doorbell => (
                Some(Doorbell::start(
                    options,
                    Arc::clone(&waiting),
                    Holders::new(conns.pool.clone()),
                )),
                None,
            ),
            WakeMode::Poll => (None, None),
        };
        // Gathered heartbeats read the queue head: in the tags' order from version 6.
        let heartbeats = migrated.heartbeat_many().map(|_| {
            Heartbeats::new(HeartbeatMany {
                conns: conns.clone(),
                doorbell: doorbell.as_ref().map(Doorbell::address_cell),
                db: migrated,
            })
        });
        Ok(MysqlBackend {
            conns,
            url: config.redacted,
            doorbell,
            waiting,
            holders,
            holder_doorbells,
            gates,
            counts_expired,
            fair,
            tenant_rows,
            db: migrated,
            heartbeats,
        })
    }

    /// The URL, password replaced.
    pub fn url(&self) -> &str {
        &self.url
    }

    fn doorbell_address(&self) -> String {
        self.doorbell
            .as_ref()
            .map(Doorbell::address)
            .unwrap_or_default()
    }

    /// A pooled connection for one step's transaction (see [`Tx`]).
    async fn transaction(&self) -> Result<Tx> {
        Ok(Tx {
            conn: self.conns.ops().await?,
            open: true,
        })
    }

    /// How many calls carried several waiters' heartbeats of one semaphore (`heartbeats.rs`);
    /// 0 below routine version 5 (for tests).
    #[doc(hidden)]
    pub fn heartbeat_calls(&self) -> u64 {
        self.heartbeats.as_ref().map_or(0, |h| h.calls())
    }

    fn set_waiting(&self, lease: LeaseId, waiting: bool) {
        let mut set = self.waiting.lock().unwrap();
        if waiting {
            set.insert(lease);
        } else {
            set.remove(&lease);
        }
        drop(set);
        // A queued waiter opens a dormant doorbell (after it is in the set: see `notify.rs`).
        if waiting {
            if let Some(doorbell) = &self.doorbell {
                doorbell.wake();
            }
        }
    }
}

impl MysqlBackend {
    /// Notes a lease granted through this backend: its holder row is made to name this
    /// client's doorbell, opened for it if dormant (`notify.rs`, "Holders"), so that a
    /// revoke or delete in another process rings it.
    fn hold(&self, name: &Name, lease: LeaseId) {
        let (Some(holders), Some(doorbell)) = (&self.holders, &self.doorbell) else {
            return;
        };
        holders.insert(name.as_str(), lease);
        doorbell.wake();
        // After the insert: a doorbell that parks meanwhile claims every held lease after
        // it published its address, so one of the two claims this lease.
        let address = doorbell.address();
        if !address.is_empty() {
            let leases = vec![(lease, name.as_str().to_string())];
            tokio::spawn(Arc::clone(holders).claim(address, Some(leases)));
        }
    }

    /// A grant this process made to a waiter of its own and delivers with the wake-up, so
    /// that no heartbeat of the waiter asks the store for it: from now on the lease is held
    /// here ([`MysqlBackend::hold`]). A grant to another process's waiter changes nothing.
    fn granted_here(&self, name: &Name, lease: LeaseId) {
        let mine = self.waiting.lock().unwrap().remove(&lease);
        if mine {
            self.hold(name, lease);
        }
    }

    /// The step's status, row lock included (`sql::status`).
    async fn status_step(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        step!(self, name, |rows| sql::status(rows, name))
    }

    /// Forgets a lease this backend no longer holds.
    fn unhold(&self, lease: LeaseId) {
        if let Some(holders) = &self.holders {
            holders.remove(lease);
        }
    }
}

impl MysqlBackend {
    /// An acquire of one permit in one round trip (`routines.rs`), retried as a step is;
    /// [`Fast::Fallback`] without the routines, for a weight other than 1, or when the
    /// procedure leaves the case to the client-side step (it then changed nothing).
    async fn acquire_one(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<Fast<Result<AcquireReply>>> {
        // A named tenant only where the procedure keeps tags (routine version 6 on).
        let Some(version) = self.db.calls() else {
            return Ok(Fast::Fallback);
        };
        if req.weight != 1 || (req.tenant.is_some() && !self.fair) {
            return Ok(Fast::Fallback);
        }
        let doorbell = self.doorbell_address();
        let call = routines::acquire_one_call(name.as_str(), capacity, req, &doorbell, version);
        let row = self.conns.call_one(call, false).await?;
        let (reply, step_now) = routines::acquire_one_answer(row, name.as_str(), capacity, req)?;
        let (Fast::Done(Ok(AcquireReply::Queued { position })), true, Some(wait)) =
            (&reply, step_now, req.wait)
        else {
            return Ok(reply);
        };
        // Enqueued without the semaphore row's lock while permits were freed (routine
        // version 9, `docs/sql-queue.md`): the locked step now, a heartbeat's (purge, hand
        // off), so the waiter is not left beside free permits until its next heartbeat.
        let lease = req.lease_id;
        let beat = step!(self, name, |rows| sql::heartbeat(
            rows,
            lease,
            wait.waiter_ttl
        ))?;
        Ok(Fast::Done(Ok(match beat {
            WaitReply::Granted(grant) => AcquireReply::Granted(grant),
            WaitReply::Waiting | WaitReply::Gone => AcquireReply::Queued {
                position: *position,
            },
        })))
    }

    /// A release in one round trip (`routines.rs`), handing the permit to the queue head
    /// in the same call; wakes that waiter after the commit as a step does.
    async fn release_fast(&self, name: &Name, lease: LeaseId) -> Result<Fast<bool>> {
        let Some(version) = self.db.release() else {
            return Ok(Fast::Fallback);
        };
        let local = notify::local_addresses();
        let call = routines::release_call(name.as_str(), &lease.to_string(), version, &local);
        let row = self.conns.call_one(call, false).await?;
        let Fast::Done(released) = routines::release_reply(row)? else {
            return Ok(Fast::Fallback);
        };
        if let Some((grant, doorbell)) = released.handed_off {
            // A waiter of this process gets its grant with the wake-up; one in another
            // process is rung on its doorbell (never this process's own doorbells): by the
            // release itself (routine version 10), else here.
            self.granted_here(name, grant.lease.lease_id);
            tessera_core::wake::notify_grant(grant);
            if !doorbell.is_empty() {
                match released.rung {
                    routines::Rung::Done => {}
                    routines::Rung::LookAgain => {
                        notify::ring_each(&self.conns.pool, vec![doorbell]).await
                    }
                    routines::Rung::NotTried => {
                        let own = self.doorbell_address();
                        notify::ring(&self.conns.pool, vec![doorbell], &own).await
                    }
                }
            }
        }
        Ok(Fast::Done(released.held))
    }

    /// A renewal in one round trip (`routines.rs`), so that a holder process frozen in the
    /// middle of one cannot keep the semaphore's row locked (a client-side renewal holds it
    /// across three round trips, until the server ends the idle transaction).
    async fn renew_fast(
        &self,
        name: &Name,
        lease: LeaseId,
        ttl: Duration,
    ) -> Result<Fast<RenewReply>> {
        let Some(version) = self.db.keep_alive() else {
            return Ok(Fast::Fallback);
        };
        let call = routines::renew_call(name.as_str(), &lease.to_string(), ttl, version);
        routines::renew_reply(self.conns.call_one(call, true).await?)
    }

    /// A waiter's heartbeat in one round trip (`routines.rs`), for the same reason as
    /// [`MysqlBackend::renew_fast`] (see [`heartbeats::fast`]; for tests).
    #[cfg(test)]
    async fn heartbeat_fast(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<Fast<WaitReply>> {
        let doorbell = self.doorbell_address();
        heartbeats::fast(
            &self.conns,
            &doorbell,
            self.db,
            name.as_str(),
            lease,
            waiter_ttl,
        )
        .await
    }

    /// The read-only part of a heartbeat ([`heartbeats::probe`]; for tests).
    #[cfg(test)]
    async fn probe_heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<Option<WaitReply>> {
        let doorbell = self.doorbell_address();
        heartbeats::probe(
            &self.conns,
            &doorbell,
            self.db,
            name.as_str(),
            lease,
            waiter_ttl,
        )
        .await
    }
}

impl MysqlBackend {
    /// One heartbeat alone ([`heartbeats::alone`]), or the client-side step when the
    /// procedure leaves the case to it.
    async fn heartbeat_alone(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        let doorbell = self.doorbell_address();
        let answered = heartbeats::alone(
            &self.conns,
            &doorbell,
            self.db,
            name.as_str(),
            lease,
            waiter_ttl,
        )
        .await?;
        match answered {
            Some(reply) => Ok(reply),
            None => step!(self, name, |rows| sql::heartbeat(rows, lease, waiter_ttl)),
        }
    }
}

#[async_trait]
impl Backend for MysqlBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        if req.weight == 0 {
            // The client checks 1 <= weight <= capacity; the schema relies on weight >= 1.
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let reply = match self.acquire_one(name, capacity, req).await? {
            Fast::Done(reply) => reply?,
            Fast::Fallback => step!(self, name, |rows| sql::acquire(rows, name, capacity, req))??,
        };
        self.set_waiting(req.lease_id, matches!(reply, AcquireReply::Queued { .. }));
        if matches!(reply, AcquireReply::Granted(_)) {
            self.hold(name, req.lease_id);
        }
        Ok(reply)
    }

    /// Gathered with the other heartbeats of this client's waiters on `name` that arrive
    /// while one call of them runs (`heartbeats.rs`), from routine version 5 on. A
    /// heartbeat alone (a lone one, or one that call leaves alone) is a read-only probe when
    /// the waiter's entry is fresh and nothing else is due, else one procedure call, else
    /// the client-side step.
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        let answer = match &self.heartbeats {
            Some(batcher) => {
                let ttl = i64::try_from(waiter_ttl.as_micros()).unwrap_or(i64::MAX);
                batcher.send(name.as_str(), (lease, ttl)).await?
            }
            None => Answer::Alone,
        };
        let reply = match answer {
            Answer::Reply(reply) => reply,
            Answer::Alone => self.heartbeat_alone(name, lease, waiter_ttl).await?,
            Answer::Step => step!(self, name, |rows| sql::heartbeat(rows, lease, waiter_ttl))?,
        };
        self.set_waiting(lease, reply == WaitReply::Waiting);
        if matches!(reply, WaitReply::Granted(_)) {
            self.hold(name, lease);
        }
        Ok(reply)
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        self.set_waiting(lease, false);
        self.unhold(lease);
        step!(self, name, |rows| sql::cancel(rows, lease))
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        self.unhold(lease);
        match self.release_fast(name, lease).await? {
            Fast::Done(held) => Ok(held),
            Fast::Fallback => step!(self, name, |rows| sql::release(rows, lease)),
        }
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let reply = match self.renew_fast(name, lease, ttl).await? {
            Fast::Done(reply) => reply,
            Fast::Fallback => step!(self, name, |rows| sql::renew(rows, lease, ttl))?,
        };
        if reply == RenewReply::Gone {
            self.unhold(lease);
        }
        Ok(reply)
    }

    /// Read from one snapshot without the row lock when the step would change nothing
    /// (`stores/sql/snapshot.rs`, `ops::read_snapshot`), else the step. A read that lost
    /// its connection is left to the step too, which runs again on another.
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let mut tx = self.transaction().await?;
        let read = ops::read_snapshot(
            &mut tx.conn,
            name.as_str(),
            self.gates,
            self.fair,
            self.tenant_rows,
            self.db.tails(),
        )
        .await;
        match &read {
            Ok(_) => tx.open = false,
            Err(_) => tx.rollback().await,
        }
        drop(tx);
        let read = match read {
            Err(e) if is_retryable(&e, false, 0) => return self.status_step(name).await,
            read => read,
        };
        match sql::read_status(name, read)? {
            sql::Read::Settled(answer) => Ok(answer),
            sql::Read::Step => self.status_step(name).await,
        }
    }

    async fn list(&self) -> Result<Vec<String>> {
        let mut conn = self.conns.ops().await?;
        ops::list(&mut conn).await
    }

    /// `SELECT 1` on a pooled connection: no transaction, no row lock (a status is a step).
    async fn ping(&self) -> Result<()> {
        let mut conn = self.conns.ops().await?;
        ops::ping(&mut conn).await
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        step!(self, name, |rows| sql::resize(rows, name, capacity))?
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        step!(self, name, |rows| sql::revoke(rows, lease))
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        step!(self, name, |rows| sql::delete(rows))
    }

    /// A client-side step (`stores/sql/step.rs`): the semaphore's row locked (a
    /// placeholder created if it has none), the limits' row written, the hand-off of what
    /// they let in. The procedures of routine version 8 leave every later acquire and
    /// release of the name to the client-side step while it has limits.
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        if !self.db.tenant_limits() {
            return Err(Error::Unsupported(
                "tenant ceilings and floors need tessera's MySQL schema version 8 (connect \
                 once as a user that may CREATE on the database)"
                    .into(),
            ));
        }
        if limits.window_ceiling.is_some() && !self.db.window_ceilings() {
            return Err(Error::Unsupported(
                "tenant window ceilings need tessera's MySQL schema version 9 (connect once \
                 as a user that may ALTER tessera's tables)"
                    .into(),
            ));
        }
        step!(self, name, |rows| sql::set_tenant_limits(
            rows, name, tenant, limits
        ))?
    }

    /// One read on a pooled connection: no transaction, no row lock.
    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        if !self.db.tenant_limits() {
            return Ok(BTreeMap::new());
        }
        let mut conn = self.conns.ops().await?;
        ops::tenant_limits(&mut conn, name.as_str(), self.db.window_ceilings()).await
    }

    /// Grants reach waiters in other processes through their doorbell (`notify.rs`), which
    /// can miss a ring (a doorbell reconnecting, a server restart, a user not allowed to
    /// kill its own threads): waiters also poll, from 20 ms backing off to 1 s, so a lost
    /// ring costs at most about a second and an idle waiter one read-write step a second.
    /// Fair shares from schema version 6 on (`fair_shares.sql`).
    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::push()
            .with_waking(Waking::PushWithPoll {
                min: Duration::from_millis(20),
                max: Duration::from_secs(1),
            })
            .with_arrivals_in_flight(LOCKED_STEP_ARRIVALS);
        let caps = match self.fair {
            true => caps.with_fair_shares(),
            false => caps,
        };
        // Tenants' limits from schema version 8 on (`tenant_limits.sql`), their window
        // ceilings from version 9 on (`window_ceilings.sql`).
        match (self.db.tenant_limits(), self.db.window_ceilings()) {
            (true, true) => caps.with_tenant_limits().with_window_ceilings(),
            (true, false) => caps.with_tenant_limits(),
            (false, _) => caps,
        }
    }

    fn rate(&self) -> Option<&dyn tessera_core::seam::RateBackend> {
        Some(self)
    }

    /// From schema version 4 on (`waiters_gate.sql`).
    fn admission(&self) -> Option<&dyn AdmissionBackend> {
        self.gates.then_some(self as &dyn AdmissionBackend)
    }
}

/// Permits and rate windows in one step (`tessera_core::admission::seam`): the shared SQL step's
/// `admit` with the limiter's rows on the step's own transaction (`rate.rs`), the semaphore's
/// row locked first. Always client side: the procedures of `routines.sql` leave an admission
/// waiter at the head of the queue to the client-side step (see `waiters_gate.sql`).
#[async_trait]
impl AdmissionBackend for MysqlBackend {
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply> {
        let lease = req.acquire.lease_id;
        if req.acquire.weight == 0 {
            // The client checks 1 <= weight <= capacity; the schema relies on weight >= 1.
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let reply = step!(self, name, |rows| sql::admit(
            rows, name, capacity, config, req
        ))??;
        self.set_waiting(lease, matches!(reply, AdmitReply::Queued { .. }));
        if matches!(reply, AdmitReply::Granted { .. }) {
            self.hold(name, lease);
        }
        Ok(reply)
    }

    /// The release and the return of the charge in one transaction (to the lease's tenant's
    /// own limiter too under a window ceiling, `stores/sql/step.rs`).
    async fn give_back(&self, name: &Name, lease: LeaseId, g: GiveBack) -> Result<bool> {
        self.unhold(lease);
        let counted = self.counts_expired;
        step!(self, name, |rows| sql::give_back(
            rows, name, lease, &g, 0, counted
        ))
    }

    /// The release and the settle in one transaction (see [`MysqlBackend::give_back`]).
    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        self.unhold(lease);
        step!(self, name, |rows| sql::settle(
            rows, name, lease, settlement, 0
        ))
    }
}

#[cfg(test)]
mod tests;
