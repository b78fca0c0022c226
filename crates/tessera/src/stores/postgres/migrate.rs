//! Creating and migrating the schema, once per version, under an advisory lock.

use sqlx::Connection;

use tessera_core::error::{Error, Result, StoreErrorKind};

use super::conns::RESPONSE_TIMEOUT;
use super::error::map_err;
use super::url::Config;
use super::{admission, ops, rate};

/// The migrations, in order (each runs its files in order); the schema records the last one
/// it ran.
pub(super) const MIGRATIONS: &[&[&[&str]]] = &[
    ops::MIGRATION_1,
    rate::MIGRATION_2,
    rate::MIGRATION_3,
    ops::MIGRATION_4,
    ops::MIGRATION_5,
    admission::MIGRATION_6,
    admission::MIGRATION_7,
    ops::MIGRATION_8,
    ops::MIGRATION_9,
    ops::MIGRATION_10,
    ops::MIGRATION_11,
    ops::MIGRATION_12,
];

/// A migration refused for want of privileges (SQLSTATE 42501: an application role without
/// `CREATE` on the database, or not the schema's owner) says what to do about it.
pub(super) fn migration_refused(e: Error, schema: &str) -> Error {
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
pub(super) async fn schema_exists(conn: &mut sqlx::PgConnection, schema: &str) -> Result<bool> {
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
pub(super) async fn migrate(conn: &mut sqlx::PgConnection, config: &Config) -> Result<()> {
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
pub(super) async fn step_revision(conn: &mut sqlx::PgConnection) -> i32 {
    tokio::time::timeout(
        RESPONSE_TIMEOUT,
        sqlx::query_scalar::<_, i32>("SELECT tessera__step_revision()").fetch_one(conn),
    )
    .await
    .map_or(0, |r| r.unwrap_or(0))
}

/// A refusal for want of privileges (SQLSTATE 42501).
pub(super) fn is_privilege_refusal(e: &Error) -> bool {
    matches!(e, Error::Store { message, .. } if message.contains("SQLSTATE 42501"))
}

/// Runs the migrations the schema lacks, and the step again if `step_stale`, in one
/// transaction under the schema's advisory lock.
pub(super) async fn migrate_locked(
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
