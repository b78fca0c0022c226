//! The PostgreSQL store (`postgres://`, `postgresql://`): the whole contract on the database
//! most teams already run.
//!
//! ```text
//! postgres://[user[:password]@]host[:port][/database][?schema=tessera]
//!     [&sslmode=disable|allow|prefer|require|verify-ca|verify-full][&sslrootcert=/path/ca.pem]
//!     [&synchronous_commit=on|off]
//! postgres://[user[:password]@]localhost[:port]/database?host=/var/run/postgresql[&…]
//! postgres:///database?host=/var/run/postgresql[&…]
//! ```
//!
//! - `host=/dir` (an absolute path, as in libpq) connects through the server's Unix socket
//!   in that directory (`.s.PGSQL.<port>`, the URL's port or 5432) instead of the URL's
//!   host, which may then be left out.
//! - `schema` (default `tessera`; `a-z 0-9 _`) holds tessera's tables and functions and
//!   isolates tenants: every connection of the store sets `search_path` to it.
//! - `sslmode` and `sslrootcert` as in libpq; TLS is rustls with the system's roots (or the
//!   given CA file). The password is never printed (messages show `***`).
//! - `synchronous_commit=off` turns PostgreSQL's `synchronous_commit` off for tessera's own
//!   connections (every transaction they run; nobody else's). **What it risks:** a commit
//!   returns before its WAL is flushed, so a server crash (not a client crash, not a clean
//!   restart) can lose the last fraction of a second of operations. A lost *release* or
//!   *renewal* only delays a permit (the lease expires by its TTL); a lost *grant* is worse:
//!   its holder was told it holds a permit that the server no longer records, and the server
//!   may give the same permit to someone else — for at most the lease's TTL, and only after
//!   a server crash. Fences stay monotonic (floored at server time). Keep the default (`on`)
//!   unless an over-grant right after a database crash is acceptable; off, hand-offs no
//!   longer wait for the disk (see docs/performance.md for figures).
//!
//! # How it runs
//!
//! - **One statement per operation.** Each operation calls one PL/pgSQL function (`sql/`,
//!   one file per operation; the step they share is `sql/common.sql`) as a single statement
//!   in its own implicit transaction: one round trip. The function locks the semaphore's row
//!   (`SELECT … FOR UPDATE`; an acquire creates it first), reads `clock_timestamp()` once the
//!   lock is held (the server's clock, never the client's), and runs the step of
//!   `stores/sql/step.rs` statement for statement: purge, hand-off to the queue head, decide,
//!   fence `max(last + 1, now µs, hwm + 1)`, seats. The step is checked against the memory
//!   reference model by the differential test (`tests/postgres_store.rs`). Work per call is
//!   bounded (at most 256 expired holders, 4,096 expired waiters and 1,024 grants; the queue
//!   head's heartbeat continues).
//! - **Two deviations from `step.rs`, same invariants:** the store-wide fence high-water mark
//!   (`tessera_meta.fence_hwm`) is written only when a semaphore's row is deleted (it went
//!   idle, or `delete`), raised to that semaphore's last fence, and read only when a row is
//!   new or idle, whose `last_fence` starts from it. A live semaphore's own `last_fence`
//!   already carries its fences, so fences of a name still never repeat across deletions,
//!   and steps on different semaphores do not queue on one row. And the row keeps
//!   `purge_at`, a lower bound of every holder's and waiter's expiry (migration 4): a step
//!   skips the purge while the clock is before it, which is what the purge would find anyway.
//!   So the common steps run few statements: an acquire of an idle semaphore 5, a release 4,
//!   an enqueue 4, a release that hands off 5 and its `NOTIFY` (`sql/common.sql`, "Cost").
//! - **Plans.** Every connection of the store sets `enable_seqscan=off`. The functions'
//!   statements are planned once per session and cached, while tessera's tables are tiny;
//!   the tables then fill with dead row versions (every grant and release deletes a row)
//!   until VACUUM removes them, which a long transaction anywhere in the database holds
//!   back. A cached sequential scan walks every dead version on each call (measured: 4,000
//!   pages per lookup of a holder, W2 hand-offs down from about 1,100/s to about 300/s
//!   within 20 s of a transaction left open); an index scan of a lease's key reads a few
//!   pages whatever the table holds. For the same reason the expiry indexes are partial, the
//!   waiters' unique key leads with the lease id and the queue head is found from a bound
//!   up: `head_seq` (migration 5, `sql/schema_5.sql`), since migration 8 the virtual time in
//!   the `(tag, seq)` order of fair shares.
//! - **Migrations** are versioned (`tessera_migrations` in the schema) and run at connect in
//!   one transaction under `pg_advisory_xact_lock` on the schema's name, so processes starting
//!   at once run each migration exactly once; a schema newer than this build is refused. The
//!   step's functions carry a revision of their own (`ops::STEP_REVISION`): a build with a
//!   newer step creates it again at connect, under the same lock, without a new migration,
//!   so builds that know the same tables keep connecting side by side. A user without
//!   `CREATE` rights can use a schema that an administrator migrated (connect once with the
//!   owner's URL).
//! - **Waking**: a release returns the grants it made to waiters of this process in its
//!   reply, which wakes them; any other grant is pushed as in `notify.rs`: `pg_notify` to
//!   the granted client's own channel, one
//!   `LISTEN` connection per process and server, re-check of every waiter after a reconnect,
//!   a periodic query on the listener's own connection against half-open connections (no
//!   self-`NOTIFY`: each would wake every listening backend); waiters keep their heartbeat as
//!   the safety net.
//! - **Keep-alives**: the heartbeats of a process's waiters on one semaphore that arrive
//!   while one of them is being sent go together in the next call (`heartbeats.rs`,
//!   `sql/heartbeat_many.sql`), and renewals and heartbeats take a connection of their own
//!   ([`KEEP_POOL_SIZE`]) when every operation connection is busy: a burst of operations
//!   never delays a keep-alive past its TTL.
//! - **Rate limiters** (`rate.rs`; tables in migration 2, functions in migration 3) run one
//!   PL/pgSQL function per step as well (`sql/rate_*.sql`), the decision of
//!   `rate/engine.rs` line by line: the limiter's row is locked with `SELECT … FOR UPDATE`
//!   first, `clock_timestamp()` read once after the lock.
//! - **Admission** (`admission.rs`; migration 6, `sql/schema_6.sql`): permits and rate
//!   windows in one function call, `tessera_admit` (`sql/admit.sql`) and `tessera_give_back`
//!   (`sql/give_back.sql`), which lock the semaphore's row and then the limiter's of the same
//!   name (the only order any function takes both in) and share the rate functions' decision
//!   (`tessera__rate_step` in `sql/rate_common.sql`). An admission waiter's row carries a
//!   `gate` that every hand-off stops at, waking the waiter without a grant once it fits and
//!   its windows' instant has come; it then asks again and its own step charges and grants.
//!   An admission runs to its end on the server even if its future is dropped, as an acquire
//!   does (see `PostgresBackend::settle`).
//! - **Fair shares** (migration 8, `sql/schema_8.sql`; step revision 7): the queue is ordered
//!   by start tags, `(tag, seq)`, kept in the rows the other SQL stores keep (the semaphore
//!   row's `vtime`, `finish` and `tenants`, the table `tessera_tenants`) by the functions'
//!   step (`sql/common.sql`, "Fair shares"); `tessera_acquire` and `tessera_admit` take the
//!   tenant and its share as arguments with defaults, so a call of an older build's
//!   arguments is a request without a tenant. A request without a tenant runs the
//!   statements it ran before. Migration 9 (`sql/schema_9.sql`; step revision 8) keeps the
//!   tenant a request named on its waiter's row and its holder's (`tenant`, NULL for none):
//!   every lease and waiter the store returns carries it, a hand-off's wake-up payload too.
//! - **Ceilings and floors** (migration 10, `sql/schema_10.sql`; step revision 9): tenants'
//!   limits in the table `tessera_limits`, kept for the name (an idle semaphore's row goes,
//!   they stay), counted on the semaphore's row (`limits`) so that a step of a name without
//!   limits runs the statements it ran before; the memory store's rules in the functions'
//!   step (`sql/common.sql`, "Ceilings and floors"), set by `tessera_set_tenant_limits`
//!   (`sql/limits.sql`) and read by a plain query (`ops::TENANT_LIMITS`).
//! - **Window ceilings** (migration 11, `sql/schema_11.sql`; step revision 10): a tenant's
//!   window ceiling and the instant its own limiter refused it until, on its row of
//!   `tessera_limits`; its own limiter (the shared configuration scaled) a row of the rate
//!   tables under the key `name#tenant`, served by the same rate functions. `tessera_admit`
//!   asks it first and charges it with the shared one under the same id, `tessera_give_back`
//!   and `tessera_settle` return or settle both, and the head passes over a window-capped
//!   tenant's admission waiters (`sql/admit.sql`, `sql/common.sql`, "Window ceilings").
//! - **The queue's tail** (migration 12, `sql/schema_12.sql`; step revision 11;
//!   docs/sql-queue.md): `next_seq`, the count of waiters enqueued and the finish tag of
//!   requests without a tenant live in a second row per semaphore, `tessera_tails`, locked
//!   after the semaphore's row. An acquire without a tenant that would not lead enqueues
//!   under the tail's lock alone (4 statements, no wait for the semaphore's row); a step
//!   that commits with free permits takes the tail `FOR SHARE` and hands off again, so an
//!   enqueue in flight is never left beside free permits (`sql/common.sql`).
//! - **Poolers.** A connection sends no startup parameter beyond user, database and
//!   `application_name`, and sets its session (`search_path`, `enable_seqscan`, `READ
//!   COMMITTED`, `synchronous_commit`, no `idle_session_timeout`: see `url::session_sql`,
//!   whatever the database's or role's defaults) with one batch after connecting
//!   (`conns::open`): a stock PgBouncer refuses any other startup parameter. Through
//!   PgBouncer, tessera needs *session* pooling (`pool_mode = session`, or
//!   `pool_mode=session` on the database entry tessera connects to): its sessions carry
//!   those settings and sqlx's prepared statements, and the listener's `LISTEN` lives in its
//!   session. Transaction pooling is not supported (a call fails, e.g. with "prepared
//!   statement … already exists"); the conformance suite runs through a session-pooling
//!   PgBouncer as well as directly.
//! - **Faults**: every call has a [`RESPONSE_TIMEOUT`]; a connection that timed out is
//!   closed, not reused. A read-only database (SQLSTATE `25006`) and a full disk or other
//!   exhausted resource (class `53`) are [`StoreErrorKind::Busy`]: nothing was written, and
//!   the call succeeds once the fault is lifted; a session that met a read-only default is
//!   closed, since a session keeps the defaults it started with. A failed or timed-out call may or may not have committed, exactly
//!   like a lost reply: retries are idempotent (lease ids) and the waiting and keep-alive
//!   logic above the seam handles it. Unreadable rows are [`Error::Corrupt`] (the functions
//!   raise SQLSTATE `TS001`; the client checks every value again).

mod admission;
mod conns;
mod error;
mod heartbeats;
mod migrate;
mod notify;
pub(crate) mod ops;
mod rate;
pub(crate) mod url;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow, Postgres};
use sqlx::{Connection, Row};

use tessera_core::error::{Error, InvalidInput, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{Backend, Capabilities, LOCKED_STEP_ARRIVALS};
use tessera_core::stores::expiries::Expiries;
use tessera_core::stores::sql;

pub use conns::RESPONSE_TIMEOUT;
use conns::{keep_alive_rows, run_row, Conns, KEEP_POOL_SIZE, POOL_SIZE};
use error::{connect_error, connect_timeout, in_context, map_err};
use heartbeats::{HeartbeatMany, Heartbeats};
use migrate::{migrate, migration_refused, schema_exists, step_revision};
use notify::Listener;
use ops::micros;
use url::parse_url;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Acquires still running on the server, by lease id: the gate is held until the reply is in.
type Inflight = Arc<std::sync::Mutex<HashMap<LeaseId, Arc<tokio::sync::Mutex<()>>>>>;

/// The PostgreSQL backend. Cheap to share behind an `Arc`.
pub struct PostgresBackend {
    conns: Arc<Conns>,
    /// See [`KEEP_POOL_SIZE`].
    keep: Arc<Conns>,
    /// See [`PostgresBackend::settle`].
    inflight: Inflight,
    listener: Arc<Listener>,
    /// Waiters' heartbeats gathered per semaphore (`heartbeats.rs`); `None` while the
    /// schema's step predates `tessera_heartbeat_many` (step revision 2: a role that may not
    /// replace the functions, until the owner connects), which heartbeats one call each.
    heartbeats: Option<Arc<Heartbeats>>,
    /// When each semaphore waited on may next expire something (`Backend::next_expiry`), as
    /// the last `queued` or `waiting` row said; shared with the gathered heartbeats.
    expiries: Arc<Expiries>,
    /// The schema's step orders the queue by tenants' shares (step revision 7, migration 8).
    fair_shares: bool,
    /// The schema's step keeps tenants' ceilings and floors (step revision 9, migration 10).
    tenant_limits: bool,
    /// The schema's step keeps tenants' window ceilings (step revision 10, migration 11).
    window_ceilings: bool,
    url: String,
    schema: String,
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("url", &self.url)
            .field("schema", &self.schema)
            .finish_non_exhaustive()
    }
}

impl PostgresBackend {
    /// Connects to a `postgres://` URL (see the module docs): runs the migrations the schema
    /// lacks, opens the pool, and starts (or joins) this process's wake-up listener.
    pub async fn connect(raw: &str) -> Result<Self> {
        Self::open(raw, true).await
    }

    /// Connects only if the database holds tessera's schema (the URL's `schema`, at any
    /// version); otherwise [`Error::NoStore`], and nothing is created. For the tools that
    /// only read or change existing state, so a mistyped `?schema=` or database is reported
    /// rather than set up as a new, empty store.
    pub async fn connect_existing(raw: &str) -> Result<Self> {
        Self::open(raw, false).await
    }

    async fn open(raw: &str, create: bool) -> Result<Self> {
        let config = parse_url(raw)?;
        if !matches!(
            config.options.get_ssl_mode(),
            sqlx::postgres::PgSslMode::Disable
        ) {
            // sqlx builds its rustls config with the process-wide provider; install ring
            // unless the application already chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut conn = tokio::time::timeout(
            CONNECT_TIMEOUT,
            conns::open(&config.options, &config.session),
        )
        .await
        .map_err(|_| connect_timeout(&config))?
        .map_err(|e| connect_error(e, &config))?;
        if !create && !schema_exists(&mut conn, &config.schema).await? {
            let _ = conn.close().await;
            return Err(Error::NoStore {
                url: config.redacted.clone(),
                reason: format!(
                    "no tessera tables in schema \"{}\" of this database; the first \
                     process that acquires sets them up",
                    config.schema
                ),
            });
        }
        let migrated = tokio::time::timeout(RESPONSE_TIMEOUT * 4, migrate(&mut conn, &config))
            .await
            .map_err(|_| connect_timeout(&config))
            .and_then(|r| r);
        let revision = if migrated.is_ok() {
            step_revision(&mut conn).await
        } else {
            0
        };
        let _ = conn.close().await;
        migrated.map_err(|e| migration_refused(e, &config.schema))?;
        let pool = |size| {
            Arc::new(Conns::new(
                config.options.clone(),
                config.session.clone(),
                size,
                CONNECT_TIMEOUT,
            ))
        };
        let (conns, keep) = (pool(POOL_SIZE), pool(KEEP_POOL_SIZE));
        let o = &config.options;
        let key = format!(
            "{}{}:{}/{}/{}",
            o.get_socket()
                .map(|d| d.display().to_string())
                .unwrap_or_default(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or(""),
            o.get_username()
        );
        let listener = Listener::shared(&key, &config.options)
            .await
            .map_err(|e| in_context(e, &config))?;
        let expiries = Arc::new(Expiries::default());
        let heartbeats = (revision >= 2).then(|| {
            Heartbeats::new(HeartbeatMany {
                conns: conns.clone(),
                keep: keep.clone(),
                url: config.redacted.clone(),
                expiries: Arc::clone(&expiries),
            })
        });
        Ok(PostgresBackend {
            conns,
            keep,
            inflight: Inflight::default(),
            listener,
            heartbeats,
            expiries,
            fair_shares: revision >= 7,
            tenant_limits: revision >= 9,
            window_ceilings: revision >= 10,
            url: config.redacted,
            schema: config.schema,
        })
    }

    /// This process's client id (the suffix of its wake-up channel `tessera_w<id>`).
    pub fn client_id(&self) -> &str {
        self.listener.client_id()
    }

    /// The server pid of this process's listener connection (for fault tests).
    #[doc(hidden)]
    pub fn listener_pid(&self) -> u32 {
        self.listener.pid()
    }

    /// How many times this process's listener connection was replaced (for fault tests).
    #[doc(hidden)]
    pub fn listener_reconnects(&self) -> u64 {
        self.listener.reconnects()
    }

    /// How many calls carried waiters' heartbeats, several waiters of one semaphore per call
    /// (`heartbeats.rs`); 0 while the schema's step predates those calls (for tests).
    #[doc(hidden)]
    pub fn heartbeat_calls(&self) -> u64 {
        self.heartbeats.as_ref().map_or(0, |h| h.calls())
    }

    /// The schema of tessera's tables and functions.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Runs one statement and returns its one row (see [`run_row`]).
    async fn row(&self, query: sqlx::query::Query<'_, Postgres, PgArguments>) -> Result<PgRow> {
        run_row(self.conns.take().await?, &self.url, query).await
    }

    /// Whether a release (or a give-back) found the lease held, from its reply; the grants it
    /// made to this process's waiters come in the reply, read after the commit, and are
    /// delivered here. A lost reply may have carried such a grant: every waiter here asks.
    fn released(&self, row: Result<PgRow>) -> Result<bool> {
        let (held, grants) = match row.and_then(|row| ops::parse_release(&row)) {
            Ok(reply) => reply,
            Err(e) => {
                self.listener.wake_all();
                return Err(e);
            }
        };
        for payload in &grants {
            self.listener.route(payload);
        }
        Ok(held)
    }

    /// Runs a keep-alive's statement (see [`keep_alive_conn`]) and returns its one row.
    async fn keep_alive_row<'q>(
        &self,
        query: impl Fn() -> sqlx::query::Query<'q, Postgres, PgArguments>,
    ) -> Result<PgRow> {
        keep_alive_rows(&self.conns, &self.keep, &self.url, query)
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Corrupt("a tessera function answered no row".into()))
    }

    /// Waits until an acquire of `lease` that is still running on the server has its reply.
    ///
    /// The race: an acquire future dropped by its caller (a timeout, a cancelled task) drops
    /// its reply, not its statement, which the server may run *after* the cancel or release
    /// that the client sends next on another pooled connection; the cancel would find
    /// nothing and the late acquire would grant or queue a lease nobody holds. So every
    /// acquire runs in a task of its own that holds the lease's gate until its reply is in,
    /// and every later operation on that lease passes the gate first.
    async fn settle(&self, lease: LeaseId) {
        let gate = self.inflight.lock().unwrap().get(&lease).cloned();
        if let Some(gate) = gate {
            let _passed = gate.lock().await;
        }
    }

    /// Runs `query`, a step that may grant or queue `lease` (an acquire, an admission), in a
    /// task of its own that holds the lease's gate until its reply is in (see
    /// [`PostgresBackend::settle`]): it runs on the server to the end even if this future is
    /// dropped. Returns its one row.
    async fn run_settled(
        &self,
        lease: LeaseId,
        query: sqlx::query::Query<'static, Postgres, PgArguments>,
    ) -> Result<PgRow> {
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&gate).lock_owned().await;
        self.inflight
            .lock()
            .unwrap()
            .insert(lease, Arc::clone(&gate));
        let (conns, url, inflight) = (
            Arc::clone(&self.conns),
            self.url.clone(),
            Arc::clone(&self.inflight),
        );
        let task = tokio::spawn(async move {
            let row = match conns.take().await {
                Ok(conn) => run_row(conn, &url, query).await,
                Err(e) => Err(e),
            };
            let mut map = inflight.lock().unwrap();
            if map.get(&lease).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
                map.remove(&lease);
            }
            drop(held);
            row
        });
        task.await.unwrap_or_else(|e| {
            Err(Error::store(
                StoreErrorKind::Other,
                format!("step task failed: {e}"),
            ))
        })
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        if req.weight == 0 {
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let (waiter_ttl, queue_cap) = match req.wait {
            Some(w) => (Some(micros(w.waiter_ttl).max(1)), i64::from(w.queue_cap)),
            None => (None, 0),
        };
        // Registered before the call: a wake-up that overtakes the reply is not lost after
        // a listener reconnect either.
        if waiter_ttl.is_some() {
            self.listener.set_waiting(req.lease_id, true);
        }
        let row = self
            .run_settled(
                req.lease_id,
                sqlx::query(ops::ACQUIRE)
                    .bind(name.to_string())
                    .bind(i64::from(capacity))
                    .bind(req.lease_id.to_string())
                    .bind(i64::from(req.weight))
                    .bind(micros(req.ttl))
                    .bind(req.holder.clone())
                    .bind(self.listener.client_id().to_string())
                    .bind(waiter_ttl)
                    .bind(queue_cap)
                    .bind(req.tenant.as_ref().map(|t| t.name().to_string()))
                    .bind(req.tenant.as_ref().map_or(1, |t| i64::from(t.share()))),
            )
            .await;
        let reply = row.and_then(|row| {
            if let Some(after) = ops::expiry_in(&row) {
                self.expiries.note(name, after);
            }
            ops::parse_acquire(&row, name, capacity, req)
        });
        let queued = matches!(reply, Ok(AcquireReply::Queued { .. }));
        if !queued && !matches!(reply, Err(ref e) if e.is_transient()) {
            self.listener.set_waiting(req.lease_id, false);
        }
        reply
    }

    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        self.settle(lease).await;
        let ttl_us = micros(waiter_ttl).max(1);
        let reply = match &self.heartbeats {
            Some(batches) => batches.send(name.as_str(), (lease, ttl_us)).await?,
            None => {
                let row = self
                    .keep_alive_row(|| {
                        sqlx::query(ops::HEARTBEAT)
                            .bind(name.as_str())
                            .bind(lease.to_string())
                            .bind(ttl_us)
                    })
                    .await?;
                if let Some(after) = ops::expiry_in(&row) {
                    self.expiries.note(name, after);
                }
                ops::parse_heartbeat(&row, lease)?
            }
        };
        self.listener
            .set_waiting(lease, reply == WaitReply::Waiting);
        Ok(reply)
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        self.settle(lease).await;
        let row = self
            .row(
                sqlx::query(ops::CANCEL)
                    .bind(name.as_str())
                    .bind(lease.to_string()),
            )
            .await?;
        self.listener.set_waiting(lease, false);
        ops::parse_cancel(&scalar::<String>(&row)?)
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        self.settle(lease).await;
        let row = self
            .row(
                sqlx::query(ops::RELEASE)
                    .bind(name.as_str())
                    .bind(lease.to_string())
                    .bind(self.listener.client_id()),
            )
            .await;
        self.released(row)
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        self.settle(lease).await;
        let row = self
            .keep_alive_row(|| {
                sqlx::query(ops::RENEW)
                    .bind(name.as_str())
                    .bind(lease.to_string())
                    .bind(micros(ttl))
            })
            .await?;
        ops::parse_renew(&row)
    }

    /// Read from one snapshot without the row lock when the step would change nothing
    /// (`stores/sql/snapshot.rs`), else the step (`tessera_status`).
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let row = self
            .row(sqlx::query(ops::READ_STATUS).bind(name.as_str()))
            .await?;
        let read = row
            .try_get::<Option<String>, _>(0)
            .map_err(|e| ops::corrupt(format!("status: {e}")))
            .and_then(|json| json.map(|j| ops::parse_snapshot(&j, name)).transpose());
        if let sql::Read::Settled(answer) = sql::read_status(name, read)? {
            return Ok(answer);
        }
        let row = self
            .row(sqlx::query(ops::STATUS).bind(name.as_str()))
            .await?;
        let json: Option<String> = row
            .try_get(0)
            .map_err(|e| ops::corrupt(format!("status: {e}")))?;
        json.map(|j| ops::parse_status(&j, name)).transpose()
    }

    /// `SELECT 1` on a pooled connection: no function, no row lock.
    async fn ping(&self) -> Result<()> {
        self.row(sqlx::query("SELECT 1")).await.map(drop)
    }

    async fn list(&self) -> Result<Vec<String>> {
        let names = tokio::time::timeout(RESPONSE_TIMEOUT, async {
            let mut conn = self.conns.take().await?;
            let names = sqlx::query_scalar::<_, String>(ops::LIST)
                .fetch_all(conn.conn())
                .await
                .map_err(map_err)?;
            conn.put_back();
            Ok::<_, Error>(names)
        })
        .await
        .map_err(|_| Error::store(StoreErrorKind::Timeout, "list timed out"))??;
        Ok(names)
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        let row = self
            .row(
                sqlx::query(ops::RESIZE)
                    .bind(name.as_str())
                    .bind(i64::from(capacity)),
            )
            .await?;
        match row
            .try_get::<Option<i64>, _>(0)
            .map_err(|e| ops::corrupt(format!("resize: {e}")))?
        {
            Some(old) => u32::try_from(old)
                .ok()
                .filter(|c| (1..=MAX_CAPACITY).contains(c))
                .ok_or_else(|| ops::corrupt(format!("capacity = {old} is out of range"))),
            None => Err(Error::NotFound(format!(
                "semaphore \"{name}\" has no holders or waiters (its capacity is set by the \
                 clients that use it)"
            ))),
        }
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let row = self
            .row(
                sqlx::query(ops::REVOKE)
                    .bind(name.as_str())
                    .bind(lease.to_string()),
            )
            .await?;
        scalar(&row)
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        let row = self
            .row(sqlx::query(ops::DELETE).bind(name.as_str()))
            .await?;
        scalar(&row)
    }

    /// Fair shares from step revision 7 (migration 8) on: the queue's order is `(tag, seq)`;
    /// tenants' ceilings and floors from step revision 9 (migration 10) on, their window
    /// ceilings from step revision 10 (migration 11) on.
    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::push().with_arrivals_in_flight(LOCKED_STEP_ARRIVALS);
        let caps = match self.fair_shares {
            true => caps.with_fair_shares(),
            false => caps,
        };
        let caps = match self.tenant_limits {
            true => caps.with_tenant_limits(),
            false => caps,
        };
        match self.window_ceilings {
            true => caps.with_window_ceilings(),
            false => caps,
        }
    }

    /// One call (`tessera_set_tenant_limits`, `sql/limits.sql`): checks the floors against a
    /// live semaphore's capacity under its row lock, writes the limits and hands off what they
    /// let in; this process's waiters' grants come in the reply.
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        if !self.tenant_limits {
            return Err(Error::Unsupported(
                "this schema's functions keep no tenant ceilings or floors (its owner's next \
                 connect creates them)"
                    .into(),
            ));
        }
        let row = self
            .row(
                sqlx::query(ops::SET_TENANT_LIMITS)
                    .bind(name.as_str())
                    .bind(tenant)
                    .bind(limits.ceiling.map(i64::from))
                    .bind(i64::from(limits.floor))
                    .bind(self.listener.client_id())
                    .bind(limits.window_ceiling.map(i64::from)),
            )
            .await;
        let grants = match row.and_then(|row| ops::parse_set_tenant_limits(&row, name)) {
            Ok(grants) => grants,
            Err(e @ Error::InvalidInput(_)) => return Err(e),
            Err(e) => {
                // A lost reply may have carried a grant: every waiter here asks.
                self.listener.wake_all();
                return Err(e);
            }
        };
        for payload in &grants {
            self.listener.route(payload);
        }
        Ok(())
    }

    /// A plain read of `tessera_limits` (no lock, no step).
    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        if !self.tenant_limits {
            return Ok(BTreeMap::new());
        }
        let rows = tokio::time::timeout(RESPONSE_TIMEOUT, async {
            let mut conn = self.conns.take().await?;
            let rows = sqlx::query(ops::TENANT_LIMITS)
                .bind(name.as_str())
                .fetch_all(conn.conn())
                .await
                .map_err(map_err)?;
            conn.put_back();
            Ok::<_, Error>(rows)
        })
        .await
        .map_err(|_| Error::store(StoreErrorKind::Timeout, "tenant limits timed out"))??;
        ops::parse_tenant_limits(&rows)
    }

    /// As the last `queued` or `waiting` row for `name` said.
    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        self.expiries.get(name)
    }
    fn rate(&self) -> Option<&dyn tessera_core::seam::RateBackend> {
        Some(self)
    }

    fn admission(&self) -> Option<&dyn tessera_core::seam::AdmissionBackend> {
        Some(self)
    }
}

/// The one non-NULL value of a one-column row.
fn scalar<T>(row: &PgRow) -> Result<T>
where
    T: for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    row.try_get::<Option<T>, _>(0)
        .map_err(|e| ops::corrupt(e.to_string()))?
        .ok_or_else(|| ops::corrupt("a function returned NULL"))
}

#[cfg(test)]
mod tests;
