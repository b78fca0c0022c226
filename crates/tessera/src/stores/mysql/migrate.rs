//! Versioned, idempotent schema migrations, safe when many processes connect at once.
//!
//! The schema is a list of migrations ([`MIGRATIONS`]); `tessera_meta.schema_version` holds
//! the last one applied. At connect, one connection:
//!
//! 1. takes `GET_LOCK('tessera.migrate.<database>')` (waiting up to 30 s), so processes that
//!    start together migrate one after another; a server that refuses `GET_LOCK` (Galera)
//!    goes on without it;
//! 2. reads the version (no table yet: 0). A version above the newest this build knows is
//!    refused ([`Error::Corrupt`]): a newer tessera wrote the tables;
//! 3. runs every migration above it, statement by statement (MySQL commits each DDL by
//!    itself, so a migration is not one transaction), then records its number with
//!    `GREATEST`, so the version never goes back;
//! 4. releases the lock.
//!
//! Every statement of every migration is idempotent (`CREATE TABLE IF NOT EXISTS`,
//! `INSERT IGNORE`, an `ALTER TABLE … ADD COLUMN` whose "duplicate column" error is taken as
//! done: MySQL 8 has no `ADD COLUMN IF NOT EXISTS`), so a migration interrupted half way (a killed process) is simply run
//! again by the next connect, and two processes running one concurrently (no `GET_LOCK`)
//! end with the same tables.
//!
//! # Routines
//!
//! The stored procedures of the hot path (`routines.sql`, called by `routines.rs`) are
//! versioned apart, in `tessera_meta.routines_version`, and installed in the same pass after
//! the tables ([`ROUTINES`]). They change no table, so they do not raise `schema_version`:
//! a build that knows only the tables (one of before the routines) still connects and runs
//! every operation client side, beside clients that call the procedures, since both lock
//! the semaphore's row first and keep the same invariants. Each routine version creates
//! procedures under names of its own (`tessera_v4_…`) with `CREATE PROCEDURE IF NOT EXISTS`
//! and never replaces one. This build creates version 4 and drops the procedures of versions
//! 1 to 3, which could decide on rows read before the step they waited for had committed
//! (see the header of `routines.sql`): a client of those versions finds its procedures
//! missing and runs its client-side step, which it already does on "no such procedure", and
//! this build calls only version 4's. A server that refuses them (a user without `CREATE
//! ROUTINE`, a MySQL before 8.0.29 without `IF NOT EXISTS`) is not an error: the connect goes
//! on with the version recorded before, or without any, and a client that finds a version
//! below 4 runs every operation client side (an application user on a database an owner set
//! up with an earlier version does so until the owner connects with this build). Version 5
//! (`routines_v5.sql`) adds one procedure, the heartbeats of many waiters in one call, and
//! is installed and recorded after version 4, so a server that refuses it (it needs
//! `JSON_TABLE`) keeps version 4. Versions 6 and 7 (`routines_v6.sql`, `routines_v7.sql`)
//! write the rows of schema versions 6 and 7: a client calls the version written for the
//! tables it found ([`Migrated::calls`]), and runs those operations client side when the
//! database lacks it.

use sqlx::mysql::MySqlConnection;
use sqlx::Row;

use tessera_core::error::{Error, Result};

use super::error::map_err;

/// The migrations in order: version `i + 1` is `MIGRATIONS[i]`.
const MIGRATIONS: &[&str] = &[
    include_str!("schema.sql"),
    include_str!("rate_schema.sql"),
    include_str!("holders_doorbell.sql"),
    include_str!("waiters_gate.sql"),
    include_str!("rate_expired.sql"),
    include_str!("fair_shares.sql"),
    include_str!("tenant_rows.sql"),
    include_str!("tenant_limits.sql"),
    include_str!("window_ceilings.sql"),
    include_str!("tails.sql"),
];

/// The schema version this build reads and writes (the number of migrations).
pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// This build's routines by version, in order (see the module docs); versions 1 to 3 are
/// no longer created.
const ROUTINES: &[(i64, &str)] = &[
    (super::routines::VERSION, include_str!("routines.sql")),
    (
        super::routines::HEARTBEAT_MANY_VERSION,
        include_str!("routines_v5.sql"),
    ),
    (
        super::routines::FAIR_VERSION,
        include_str!("routines_v6.sql"),
    ),
    (
        super::routines::TENANT_VERSION,
        include_str!("routines_v7.sql"),
    ),
    (
        super::routines::LIMITS_VERSION,
        include_str!("routines_v8.sql"),
    ),
    (
        super::routines::TAILS_VERSION,
        include_str!("routines_v9.sql"),
    ),
    (
        super::routines::RING_VERSION,
        include_str!("routines_v10.sql"),
    ),
];

/// The routine version this build installs (the test checks it is the last file's): version
/// 9's procedures on tables of schema version 10 (`Migrated::calls`), and version 10's release
/// (`Migrated::release`).
#[cfg_attr(not(test), allow(dead_code))]
pub const ROUTINES_VERSION: i64 = ROUTINES[ROUTINES.len() - 1].0;

/// How long a connect waits for another process's migration.
const LOCK_WAIT_S: i64 = 30;

/// The statements of one migration file: separated by lines holding only `;`, comments
/// (`--` lines) dropped.
fn statements(file: &str) -> Vec<String> {
    file.split("\n;")
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// What the database holds after [`migrate`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migrated {
    /// The schema version: below [`SCHEMA_VERSION`] when an optional migration was refused
    /// ([`OPTIONAL_FROM`]).
    pub(crate) schema: i64,
    /// The routine version: below [`ROUTINES_VERSION`] when the server refused this build's.
    pub(crate) routines: i64,
}

impl Migrated {
    /// The tables have fair shares' tags (schema version 6).
    pub(crate) fn fair(self) -> bool {
        self.schema >= FAIR_FROM
    }

    /// Holder and waiter rows keep their tenant (schema version 7).
    pub(crate) fn tenant_rows(self) -> bool {
        self.schema >= TENANTS_FROM
    }

    /// Names may carry tenants' ceilings and floors (schema version 8).
    pub(crate) fn tenant_limits(self) -> bool {
        self.schema >= LIMITS_FROM
    }

    /// Tenants' limits may carry window ceilings (schema version 9).
    pub(crate) fn window_ceilings(self) -> bool {
        self.schema >= WINDOWS_FROM
    }

    /// The semaphore's row is split in two, its queue's tail in `tessera_tails` (schema
    /// version 10, `docs/sql-queue.md`).
    pub(crate) fn tails(self) -> bool {
        self.schema >= TAILS_FROM
    }

    /// The routine version whose acquire and release of one permit this client calls, the
    /// one written for these tables: 9 with the tail rows, 8 with tenants' limits (it leaves a name with limits to
    /// the client-side step), 7 with tenants on the rows, 6 with fair shares' tags, else 4;
    /// `None` when the database lacks it (those operations then run client side).
    pub(crate) fn calls(self) -> Option<i64> {
        use super::routines::{
            FAIR_VERSION, LIMITS_VERSION, TAILS_VERSION, TENANT_VERSION, VERSION,
        };
        let version = match (self.tenant_limits(), self.tenant_rows(), self.fair()) {
            _ if self.tails() => TAILS_VERSION,
            (true, _, _) => LIMITS_VERSION,
            (false, true, _) => TENANT_VERSION,
            (false, false, true) => FAIR_VERSION,
            (false, false, false) => VERSION,
        };
        (self.routines >= version).then_some(version)
    }

    /// The routine version whose release of one permit this client calls: 10 (which rings the
    /// granted waiter's doorbell itself) where the database has it and the tail rows, else
    /// [`Migrated::calls`]'s.
    pub(crate) fn release(self) -> Option<i64> {
        use super::routines::RING_VERSION;
        if self.tails() && self.routines >= RING_VERSION {
            return Some(RING_VERSION);
        }
        self.calls()
    }

    /// The routine version whose keep-alive (renewals, a heartbeat alone) this client calls:
    /// 9 with the tail rows, 7 with tenants on the rows (its heartbeat's grant carries the
    /// tenant), else 4.
    pub(crate) fn keep_alive(self) -> Option<i64> {
        use super::routines::{TAILS_VERSION, TENANT_VERSION, VERSION};
        let version = match self.tenant_rows() {
            _ if self.tails() => TAILS_VERSION,
            true => TENANT_VERSION,
            false => VERSION,
        };
        (self.routines >= version).then_some(version)
    }

    /// The routine version whose gathered heartbeats this client calls: 9 with the tail
    /// rows, 7 with tenants on the rows, 6 with fair shares' tags (they read the queue head
    /// in their order), else 5.
    pub(crate) fn heartbeat_many(self) -> Option<i64> {
        use super::routines::{
            FAIR_VERSION, HEARTBEAT_MANY_VERSION, TAILS_VERSION, TENANT_VERSION,
        };
        let version = match (self.tenant_rows(), self.fair()) {
            _ if self.tails() => TAILS_VERSION,
            (true, _) => TENANT_VERSION,
            (false, true) => FAIR_VERSION,
            (false, false) => HEARTBEAT_MANY_VERSION,
        };
        (self.routines >= version).then_some(version)
    }
}

/// Brings the database's schema to [`SCHEMA_VERSION`] and its routines to at least
/// [`ROUTINES_VERSION`] (see the module docs).
pub(crate) async fn migrate(conn: &mut MySqlConnection) -> Result<Migrated> {
    let locked: Option<i64> =
        sqlx::query_scalar("SELECT GET_LOCK(LEFT(CONCAT('tessera.migrate.', DATABASE()), 64), ?)")
            .bind(LOCK_WAIT_S)
            .fetch_one(&mut *conn)
            .await
            .unwrap_or(None);
    let result = match run(conn).await {
        Ok(schema) => install_routines(conn)
            .await
            .map(|routines| Migrated { schema, routines }),
        Err(e) => Err(e),
    };
    if locked == Some(1) {
        let _ = sqlx::query("DO RELEASE_LOCK(LEFT(CONCAT('tessera.migrate.', DATABASE()), 64))")
            .execute(&mut *conn)
            .await;
    }
    result
}

/// The first migration a user may lack the rights for (an `ALTER TABLE`): refused, the
/// schema stays below it and the build runs without it (version 3: holders' doorbells; see
/// `holders_doorbell.sql`).
pub const OPTIONAL_FROM: i64 = 3;

/// The schema version with admission waiters' gates (`waiters_gate.sql`): below it, the
/// store has no admissions.
pub const GATES_FROM: i64 = 4;

/// The schema version with the limiters' count of admissions given back past their use-by
/// instant (`rate_expired.sql`): below it, `status` shows no count.
pub const EXPIRED_COUNT_FROM: i64 = 5;
/// The schema version with fair shares' tags (`fair_shares.sql`): below it, a request that
/// names a tenant answers Unsupported.
pub const FAIR_FROM: i64 = 6;
/// The schema version with the tenant on holder and waiter rows (`tenant_rows.sql`): below
/// it, leases and waiters read back name no tenant.
pub const TENANTS_FROM: i64 = 7;
/// The schema version with tenants' ceilings and floors (`tenant_limits.sql`): below it,
/// setting limits answers Unsupported.
pub const LIMITS_FROM: i64 = 8;
/// The schema version with tenants' window ceilings (`window_ceilings.sql`): below it,
/// setting one answers Unsupported.
pub const WINDOWS_FROM: i64 = 9;
/// The schema version with the semaphore's row split in two (`tails.sql`,
/// `docs/sql-queue.md`): below it, the queue's tail is on the semaphore's row.
pub const TAILS_FROM: i64 = 10;

/// `(table, column)` of an `ALTER TABLE <table> ADD COLUMN <column> …` statement.
fn added_column(statement: &str) -> Option<(String, String)> {
    let words: Vec<&str> = statement.split_whitespace().take(6).collect();
    match words[..] {
        ["ALTER", "TABLE", table, "ADD", "COLUMN", column] => {
            Some((table.to_string(), column.to_string()))
        }
        _ => None,
    }
}

/// Whether `table` of the connection's database has `column`.
async fn has_column(conn: &mut MySqlConnection, table: String, column: String) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?",
    )
    .bind(table)
    .bind(column)
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(n > 0)
}

/// Brings the tables to [`SCHEMA_VERSION`], or stops below an optional migration the user
/// may not run; the schema version reached.
async fn run(conn: &mut MySqlConnection) -> Result<i64> {
    let mut version = stored_version(conn).await?;
    if version > SCHEMA_VERSION {
        return Err(Error::Corrupt(format!(
            "tessera schema version {version} in the database; this build reads versions up \
             to {SCHEMA_VERSION} (a newer tessera created the tables)"
        )));
    }
    for (i, file) in MIGRATIONS.iter().enumerate() {
        let to = i as i64 + 1;
        if version >= to {
            continue;
        }
        // Version 10 moves the tails under LOCK TABLES, unless a run interrupted after its
        // ALTER moved them already (the old columns are gone): then only what is idempotent.
        let moved = to == TAILS_FROM
            && !has_column(conn, "tessera_semaphores".into(), "queued".into()).await?;
        let mut locked = false;
        for statement in statements(file) {
            if moved
                && !statement.starts_with("ALTER TABLE tessera_semaphores ADD COLUMN")
                && !statement.starts_with("CREATE TABLE IF NOT EXISTS")
            {
                continue;
            }
            if statement.starts_with("LOCK TABLES") {
                locked = true;
            } else if statement.starts_with("UNLOCK TABLES") {
                locked = false;
            }
            let added = added_column(&statement);
            if let Some((table, column)) = added.clone() {
                // MySQL 8 has no ADD COLUMN IF NOT EXISTS; tables created since carry it.
                if has_column(conn, table, column).await? {
                    continue;
                }
            }
            let result = sqlx::raw_sql(sqlx::AssertSqlSafe(statement.clone()))
                .execute(&mut *conn)
                .await;
            if result.is_err() && (locked || statement.starts_with("LOCK TABLES")) {
                // Never leave this connection holding table locks.
                let _ = sqlx::raw_sql("UNLOCK TABLES").execute(&mut *conn).await;
            }
            match result {
                Ok(_) => {}
                // Added meanwhile (a migration run concurrently without the lock).
                Err(e) if added.is_some() && error_number(&e) == Some(1060) => {}
                // A user who may not ALTER: the build runs without what it adds (see
                // OPTIONAL_FROM); a user who may connects later and completes it.
                // (1044: LOCK TABLES refused, version 10.)
                Err(e)
                    if to >= OPTIONAL_FROM
                        && (error_number(&e) == Some(1142)
                            || (to == TAILS_FROM && error_number(&e) == Some(1044))) =>
                {
                    tracing::warn!(
                        error = %e,
                        "tessera MySQL: schema version {to} not applied (this user may not \
                         ALTER tessera's tables); until a user who may connects, revokes and \
                         deletes reach holders in other processes at their next renewal \
                         (below version 3), admissions are unavailable (below version 4) and \
                         enqueues lock the semaphore's row (below version 10)"
                    );
                    return Ok(version);
                }
                Err(e) => return Err(map_err(e)),
            }
        }
        record_version(conn, "schema_version", to).await?;
        version = to;
    }
    Ok(version)
}

/// The server's error number of `e`, if it is a server error.
fn error_number(e: &sqlx::Error) -> Option<u16> {
    match e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| m.number()),
        _ => None,
    }
}

/// Records that `key` (`schema_version` or `routines_version`) reached `to`; never lowers it.
async fn record_version(conn: &mut MySqlConnection, key: &str, to: i64) -> Result<()> {
    sqlx::query(
        "INSERT INTO tessera_meta (meta_key, meta_value) VALUES (?, ?) \
         ON DUPLICATE KEY UPDATE meta_value = GREATEST(meta_value, ?)",
    )
    .bind(key)
    .bind(to)
    .bind(to)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(())
}

/// Installs the routine versions above the recorded one, recording each; the version there
/// afterwards. A statement the server refuses stops the installation, logged, and leaves the
/// recorded version at the last one installed whole (version 5 needs `JSON_TABLE`: a server
/// without it still gets version 4).
async fn install_routines(conn: &mut MySqlConnection) -> Result<i64> {
    let row =
        sqlx::query("SELECT meta_value FROM tessera_meta WHERE meta_key = 'routines_version'")
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
    let mut version = match row {
        None => 0,
        Some(row) => row
            .try_get::<i64, _>(0)
            .map_err(|e| Error::Corrupt(format!("routines_version: {e}")))?,
    };
    for &(to, file) in ROUTINES {
        if version >= to {
            continue;
        }
        for statement in statements(file) {
            if let Err(e) = sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
                .execute(&mut *conn)
                .await
            {
                tracing::warn!(
                    error = %e,
                    version,
                    "tessera MySQL: stored procedures of version {to} not installed; the \
                     operations they would run take more round trips instead"
                );
                return Ok(version);
            }
        }
        record_version(conn, "routines_version", to).await?;
        version = to;
    }
    Ok(version)
}

/// Whether the connection's database holds tessera's tables: its version table,
/// `tessera_meta`, created first by migration 1. Reads the catalog only.
pub(crate) async fn exists(conn: &mut MySqlConnection) -> Result<bool> {
    let tables: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM information_schema.TABLES \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'tessera_meta'",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(tables > 0)
}

/// The recorded version; 0 when tessera's tables do not exist yet.
async fn stored_version(conn: &mut MySqlConnection) -> Result<i64> {
    if !exists(conn).await? {
        return Ok(0);
    }
    let row = sqlx::query("SELECT meta_value FROM tessera_meta WHERE meta_key = 'schema_version'")
        .fetch_optional(&mut *conn)
        .await
        .map_err(map_err)?;
    match row {
        None => Ok(0),
        Some(row) => row
            .try_get::<i64, _>(0)
            .map_err(|e| Error::Corrupt(format!("schema_version: {e}"))),
    }
}

/// A migration refused for want of privileges (1142: a command denied on a table, 1044: on
/// the database) says what to do about it.
pub(super) fn migration_refused(e: Error) -> Error {
    match e {
        Error::Store { kind, message }
            if message.contains(" 1142 (") || message.contains(" 1044 (") =>
        {
            Error::Store {
                kind,
                message: format!(
                    "{message}; tessera creates and migrates its tables (tessera_*) at connect: \
                     connect once as a user that may (CREATE and CREATE ROUTINE on the \
                     database), then this user needs only SELECT, INSERT, UPDATE, DELETE and \
                     EXECUTE there"
                ),
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_migration_splits_into_statements_without_comments() {
        let all: Vec<String> = MIGRATIONS.iter().flat_map(|m| statements(m)).collect();
        assert_eq!(all.len(), 31, "{all:#?}");
        let mut created_all = Vec::new();
        for &(version, file) in ROUTINES {
            let routines = statements(file);
            let (created, dropped): (Vec<_>, Vec<_>) = routines
                .iter()
                .partition(|s| s.starts_with("CREATE PROCEDURE IF NOT EXISTS "));
            for s in &created {
                assert!(
                    s.starts_with(&format!(
                        "CREATE PROCEDURE IF NOT EXISTS tessera_v{version}_"
                    )),
                    "not versioned: {s}"
                );
                assert!(
                    s.contains("\nSQL SECURITY INVOKER\n"),
                    "runs with its creator's rights: {s}"
                );
            }
            for s in dropped {
                assert!(
                    (1..version)
                        .any(|v| s.starts_with(&format!("DROP PROCEDURE IF EXISTS tessera_v{v}_"))),
                    "neither a versioned creation nor an idempotent drop of an earlier version: {s}"
                );
            }
            created_all.extend(created.into_iter().cloned());
        }
        assert_eq!(created_all.len(), 19, "{created_all:#?}");
        let newest = format!("CREATE PROCEDURE IF NOT EXISTS tessera_v{ROUTINES_VERSION}_");
        assert!(created_all.last().unwrap().starts_with(&newest));
        for s in &all {
            assert!(!s.contains("--"), "{s}");
            // An ADD COLUMN is made idempotent by `run` (error 1060 is taken as done); a
            // MODIFY COLUMN to the same definition changes nothing the second time.
            // Version 10's move under LOCK TABLES is skipped once its ALTER ran (`run`).
            let moving = [
                "LOCK TABLES ",
                "DELETE FROM tessera_tails",
                "INSERT INTO tessera_tails ",
                "UPDATE tessera_semaphores SET dequeued = 0",
                "ALTER TABLE tessera_semaphores DROP COLUMN queued,",
                "UNLOCK TABLES",
            ];
            assert!(
                s.starts_with("CREATE TABLE IF NOT EXISTS")
                    || moving.iter().any(|m| s.starts_with(m))
                    || s.starts_with("INSERT IGNORE")
                    || (s.starts_with("ALTER TABLE")
                        && (s.contains("ADD COLUMN") || s.contains("MODIFY COLUMN"))),
                "not idempotent: {s}"
            );
        }
    }
}
