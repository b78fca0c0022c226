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
//!   longer wait for the disk (see the README's figures).
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
//!   waiters' unique key leads with the lease id and the queue head is found from `head_seq`
//!   up (migration 5, `sql/schema_5.sql`).
//! - **Migrations** are versioned (`tessera_migrations` in the schema) and run at connect in
//!   one transaction under `pg_advisory_xact_lock` on the schema's name, so processes starting
//!   at once run each migration exactly once; a schema newer than this build is refused. The
//!   step's functions carry a revision of their own (`ops::STEP_REVISION`): a build with a
//!   newer step creates it again at connect, under the same lock, without a new migration,
//!   so builds that know the same tables keep connecting side by side. A user without
//!   `CREATE` rights can use a schema that an administrator migrated (connect once with the
//!   owner's URL).
//! - **Waking**: a release returns the grants it made to waiters of this process in its
//!   reply, which wakes them; any other grant is pushed as in `listener.rs`: `pg_notify` to
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

mod conns;
mod heartbeats;
mod listener;
pub(crate) mod ops;
mod rate;
pub(crate) mod url;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow, Postgres};
use sqlx::{Connection, Row};

use crate::error::{Error, InvalidInput, Result, StoreErrorKind};
use crate::model::*;
use crate::seam::{Backend, Capabilities};
use crate::stores::expiries::Expiries;

use conns::Conns;
use heartbeats::{HeartbeatMany, Heartbeats};
use listener::Listener;
use ops::micros;
use url::{parse_url, Config};

/// How long one call may take before it fails with [`StoreErrorKind::Timeout`].
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections per backend for operations.
const POOL_SIZE: usize = 4;
/// Connections per backend for keep-alives (holders' renewals, waiters' heartbeats) when
/// none of the operations' is free, so that no burst of operations delays a keep-alive past
/// its TTL: one process that queued 10,000 acquires at once kept its 4 connections busy for
/// seconds, the heartbeats of its first waiters waited behind them, and those waiters
/// expired, were purged and queued again (`tessera-chaos --scenario s10-reclaim`).
const KEEP_POOL_SIZE: usize = 2;
/// The migrations, in order (each runs its files in order); the schema records the last one
/// it ran.
const MIGRATIONS: &[&[&[&str]]] = &[
    ops::MIGRATION_1,
    rate::MIGRATION_2,
    rate::MIGRATION_3,
    ops::MIGRATION_4,
    ops::MIGRATION_5,
];

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
        .map_err(|e| in_context(map_err(e), &config))?;
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

    /// Runs a keep-alive's statement (see [`keep_alive_conn`]) and returns its one row.
    async fn keep_alive_row(
        &self,
        query: sqlx::query::Query<'_, Postgres, PgArguments>,
    ) -> Result<PgRow> {
        let conn = keep_alive_conn(&self.conns, &self.keep).await?;
        run_row(conn, &self.url, query).await
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
}

/// A connection for a keep-alive (a renewal, waiters' heartbeats): one of the operations'
/// stack if one is free now, so that a process that only holds a lease keeps one
/// connection, else one of the keep-alives' own ([`KEEP_POOL_SIZE`]).
async fn keep_alive_conn<'a>(ops: &'a Conns, keep: &'a Conns) -> Result<conns::Lent<'a>> {
    match ops.take_free().await {
        Some(conn) => conn,
        None => keep.take().await,
    }
}

/// Runs one statement on `conn` and returns its one row (see [`run_rows`]).
async fn run_row(
    conn: conns::Lent<'_>,
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
async fn run_rows(
    mut conn: conns::Lent<'_>,
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

fn connect_timeout(config: &Config) -> Error {
    Error::store(
        StoreErrorKind::Timeout,
        format!("could not connect to {} in time", config.redacted),
    )
}

/// Names the (redacted) URL in a store error.
fn in_context(e: Error, config: &Config) -> Error {
    match e {
        Error::Store { kind, message } => {
            Error::store(kind, format!("{}: {message}", config.redacted))
        }
        other => other,
    }
}

/// A migration refused for want of privileges (SQLSTATE 42501: an application role without
/// `CREATE` on the database, or not the schema's owner) says what to do about it.
fn migration_refused(e: Error, schema: &str) -> Error {
    match e {
        Error::Store { kind, message } if message.contains("SQLSTATE 42501") => Error::Store {
            kind,
            message: format!(
                "{message}; tessera creates and migrates its schema \"{schema}\" at connect: \
                 connect once as a role that may (CREATE on the database, or the schema's \
                 owner), then GRANT this role USAGE ON SCHEMA \"{schema}\", SELECT, INSERT, \
                 UPDATE, DELETE ON ALL TABLES IN SCHEMA \"{schema}\" and EXECUTE ON ALL \
                 FUNCTIONS IN SCHEMA \"{schema}\" (again after each tessera upgrade)"
            ),
        },
        other => other,
    }
}

/// Whether `schema` holds tessera's tables: its migrations table, which the first migration
/// creates (the catalog is readable by every role, whatever its rights on the schema).
async fn schema_exists(conn: &mut sqlx::PgConnection, schema: &str) -> Result<bool> {
    tokio::time::timeout(
        RESPONSE_TIMEOUT,
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_tables \
             WHERE schemaname = $1 AND tablename = 'tessera_migrations')",
        )
        .bind(schema)
        .fetch_one(conn),
    )
    .await
    .map_err(|_| Error::store(StoreErrorKind::Timeout, "the schema check timed out"))?
    .map_err(map_err)
}

/// Runs the migrations the schema lacks (see the module docs).
async fn migrate(conn: &mut sqlx::PgConnection, config: &Config) -> Result<()> {
    let latest = MIGRATIONS.len() as i32;
    // Already up to date: nothing to lock or create (a user without CREATE rights gets here).
    let current: Option<i32> = sqlx::query_scalar("SELECT max(version) FROM tessera_migrations")
        .fetch_one(&mut *conn)
        .await
        .ok()
        .flatten();
    // The step's revision, once the tables are current (none before revisions existed).
    let step_stale = current == Some(latest) && step_revision(conn).await < ops::STEP_REVISION;
    if current == Some(latest) && !step_stale {
        return Ok(());
    }
    if current == Some(latest) {
        // Only the step is older. A role that may not replace it keeps the step an owner
        // created: every step revision works with the tables it was made for.
        return match migrate_locked(conn, config, step_stale).await {
            Err(e) if is_privilege_refusal(&e) => {
                tracing::warn!(
                    schema = %config.schema,
                    error = %e,
                    "tessera PostgreSQL: this role may not replace tessera's functions with \
                     this build's; the schema's older ones stay in use until its owner connects"
                );
                Ok(())
            }
            r => r,
        };
    }
    migrate_locked(conn, config, step_stale).await
}

/// The schema's step revision (0 before revisions existed, or when it cannot be read).
async fn step_revision(conn: &mut sqlx::PgConnection) -> i32 {
    tokio::time::timeout(
        RESPONSE_TIMEOUT,
        sqlx::query_scalar::<_, i32>("SELECT tessera__step_revision()").fetch_one(conn),
    )
    .await
    .map_or(0, |r| r.unwrap_or(0))
}

/// A refusal for want of privileges (SQLSTATE 42501).
fn is_privilege_refusal(e: &Error) -> bool {
    matches!(e, Error::Store { message, .. } if message.contains("SQLSTATE 42501"))
}

/// Runs the migrations the schema lacks, and the step again if `step_stale`, in one
/// transaction under the schema's advisory lock.
async fn migrate_locked(
    conn: &mut sqlx::PgConnection,
    config: &Config,
    step_stale: bool,
) -> Result<()> {
    let latest = MIGRATIONS.len() as i32;
    let mut tx = conn.begin().await.map_err(map_err)?;
    // The wait for another process's migration and the migration itself are bounded by the
    // client (above), not by the session's statement limit of one call (`url::limits`).
    sqlx::raw_sql("SET LOCAL statement_timeout TO 0")
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))")
        .bind(format!("tessera:migrate:{}", config.schema))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    // `CREATE SCHEMA IF NOT EXISTS` needs CREATE on the database even when the schema
    // exists: only when it is missing, so the owner of a schema a DBA made can set it up.
    let schema_missing: bool = sqlx::query_scalar(
        "SELECT NOT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1)",
    )
    .bind(&config.schema)
    .fetch_one(&mut *tx)
    .await
    .map_err(map_err)?;
    let setup = format!(
        "{create}SET LOCAL search_path TO \"{0}\"; \
         CREATE TABLE IF NOT EXISTS tessera_migrations (version int PRIMARY KEY, \
         applied_at timestamptz NOT NULL DEFAULT now())",
        config.schema,
        create = if schema_missing {
            format!("CREATE SCHEMA IF NOT EXISTS \"{}\"; ", config.schema)
        } else {
            String::new()
        }
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(setup))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    let current: i32 =
        sqlx::query_scalar("SELECT coalesce(max(version), 0) FROM tessera_migrations")
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
    if current > latest {
        return Err(Error::Corrupt(format!(
            "the tessera schema \"{}\" is at version {current}; this build knows up to \
             version {latest} (upgrade tessera)",
            config.schema
        )));
    }
    // Tables current, step older: the step again (idempotent, so another process having done
    // it meanwhile changes nothing). A migration runs the step as well.
    if current == latest && step_stale {
        for sql in ops::STEP_AGAIN.iter().flat_map(|part| part.iter()) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
    }
    for (i, files) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        for sql in files.iter().flat_map(|part| part.iter()) {
            sqlx::raw_sql(sqlx::AssertSqlSafe(*sql))
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        sqlx::query("INSERT INTO tessera_migrations (version) VALUES ($1)")
            .bind(i as i32 + 1)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
    }
    tx.commit().await.map_err(map_err)
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
        // Run on the server to the end even if this future is dropped (see `settle`).
        let gate = Arc::new(tokio::sync::Mutex::new(()));
        let held = Arc::clone(&gate).lock_owned().await;
        self.inflight
            .lock()
            .unwrap()
            .insert(req.lease_id, Arc::clone(&gate));
        let (conns, url, inflight) = (
            Arc::clone(&self.conns),
            self.url.clone(),
            Arc::clone(&self.inflight),
        );
        let args = (
            name.to_string(),
            i64::from(capacity),
            req.lease_id,
            i64::from(req.weight),
            micros(req.ttl),
            req.holder.clone(),
            self.listener.client_id().to_string(),
        );
        let task = tokio::spawn(async move {
            let (name, capacity, lease, weight, ttl, holder, client) = args;
            let row = run_row(
                conns.take().await?,
                &url,
                sqlx::query(ops::ACQUIRE)
                    .bind(name)
                    .bind(capacity)
                    .bind(lease.to_string())
                    .bind(weight)
                    .bind(ttl)
                    .bind(holder)
                    .bind(client)
                    .bind(waiter_ttl)
                    .bind(queue_cap),
            )
            .await;
            let mut map = inflight.lock().unwrap();
            if map.get(&lease).is_some_and(|g| Arc::ptr_eq(g, &gate)) {
                map.remove(&lease);
            }
            drop(held);
            row
        });
        let row = task.await.unwrap_or_else(|e| {
            Err(Error::store(
                StoreErrorKind::Other,
                format!("acquire task failed: {e}"),
            ))
        });
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
                    .keep_alive_row(
                        sqlx::query(ops::HEARTBEAT)
                            .bind(name.as_str())
                            .bind(lease.to_string())
                            .bind(ttl_us),
                    )
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
        let (held, grants) = match row.and_then(|row| ops::parse_release(&row)) {
            Ok(reply) => reply,
            Err(e) => {
                // The call may have committed a grant to a waiter of this process, whose
                // wake-up was in the reply that is lost: every waiter here asks the store.
                self.listener.wake_all();
                return Err(e);
            }
        };
        // Grants to this process's waiters come in the reply, read after the commit.
        for payload in &grants {
            self.listener.route(payload);
        }
        Ok(held)
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        self.settle(lease).await;
        let row = self
            .keep_alive_row(
                sqlx::query(ops::RENEW)
                    .bind(name.as_str())
                    .bind(lease.to_string())
                    .bind(micros(ttl)),
            )
            .await?;
        ops::parse_renew(&row)
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let row = self
            .row(sqlx::query(ops::STATUS).bind(name.as_str()))
            .await?;
        let json: Option<String> = row
            .try_get(0)
            .map_err(|e| ops::corrupt(format!("status: {e}")))?;
        json.map(|j| ops::parse_status(&j, name)).transpose()
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

    fn capabilities(&self) -> Capabilities {
        Capabilities::push()
    }

    /// As the last `queued` or `waiting` row for `name` said.
    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        self.expiries.get(name)
    }
    fn rate(&self) -> Option<&dyn crate::seam::RateBackend> {
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

/// The database refused a write because the session is read-only (SQLSTATE `25006`).
fn is_read_only(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("25006"))
}

/// Classifies an sqlx error: tessera's own `TS001` and undecodable values are
/// [`Error::Corrupt`]; connection failures, a server shutting down or starting up are
/// [`StoreErrorKind::Connection`]; lock and serialization conflicts, a read-only database
/// (`25006`) and insufficient resources (class `53`: disk full, out of memory) are
/// [`StoreErrorKind::Busy`], faults that pass without anything changed; a cancelled
/// statement is [`StoreErrorKind::Timeout`]; anything else (missing rights) is
/// [`StoreErrorKind::Other`] with PostgreSQL's message.
/// Whether a connection whose call failed with `e` may serve another call: only after an
/// error the server reported for the statement alone, on a session that is still fine (not
/// a read-only default, which a session keeps for its life, nor a shutdown or a lost
/// connection).
pub(crate) fn reusable_after(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            !(code.starts_with("08") || code.starts_with("57P") || is_read_only(e))
        }
        _ => false,
    }
}

pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            match &*code {
                "TS001" => return Error::Corrupt(db.message().to_string()),
                // 22P02 invalid text, 22003 out of range: a row tessera reads is damaged.
                "22P02" | "22003" | "XX001" | "XX002" => {
                    return Error::Corrupt(format!("PostgreSQL: {}", db.message()))
                }
                c if c.starts_with("08") => StoreErrorKind::Connection,
                // 57P: the server ended the session (shutdown, crash, a dropped database,
                // `idle_session_timeout`); the next call takes another connection.
                c if c.starts_with("57P") => StoreErrorKind::Connection,
                "53300" => StoreErrorKind::Connection,
                "40001" | "40P01" | "55P03" => StoreErrorKind::Busy,
                // Nothing was written; writable again (space freed), the call succeeds.
                "25006" => StoreErrorKind::Busy,
                c if c.starts_with("53") => StoreErrorKind::Busy,
                "57014" => StoreErrorKind::Timeout,
                // A prepared statement that exists twice or not at all: the session under
                // this connection changed between statements, as behind a pooler in
                // transaction mode (see the module docs, "Poolers").
                "42P05" | "26000" => {
                    return Error::store(
                        StoreErrorKind::Other,
                        format!(
                            "{} (tessera's sessions hold prepared statements and \
                             settings: a pooler in front of PostgreSQL must use session \
                             pooling, e.g. PgBouncer's pool_mode = session)",
                            describe(&e)
                        ),
                    )
                }
                _ => StoreErrorKind::Other,
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreErrorKind::Connection,
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => return Error::Corrupt(e.to_string()),
        _ => StoreErrorKind::Other,
    };
    Error::store(kind, describe(&e))
}

/// The message of an error for people: a server's error as its message and SQLSTATE
/// (`PostgreSQL: database "x" does not exist (SQLSTATE 3D000)`), without sqlx's prefix and
/// the server's C source line; any other error as sqlx words it.
fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("PostgreSQL: {} (SQLSTATE {code})", db.message()),
            None => format!("PostgreSQL: {}", db.message()),
        },
        _ => format!("PostgreSQL: {e}"),
    }
}

#[cfg(test)]
mod tests;
