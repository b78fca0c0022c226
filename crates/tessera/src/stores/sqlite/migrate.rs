//! Creating the schema (idempotently, at every connect), the WAL journal mode, and the
//! state that lives only as long as the host's boot.

use std::time::Duration;

use sqlx::sqlite::SqliteConnection;
use sqlx::Connection;

use tessera_core::error::{Error, Result, StoreErrorKind};

use super::error::map_err;

/// The schema, created idempotently at every connect.
pub(super) const SCHEMA: &str = include_str!("schema.sql");

/// Version 1 to 2: fair shares' columns (see `schema_2.sql`).
const SCHEMA_2: &str = include_str!("schema_2.sql");

/// Version 2 to 3: the tenant on holder and waiter rows (see `schema_3.sql`).
const SCHEMA_3: &str = include_str!("schema_3.sql");

/// Version 3 to 4: tenants' limits (see `schema_4.sql`; the table is `schema.sql`'s).
const SCHEMA_4: &str = include_str!("schema_4.sql");

/// Version 4 to 5: tenants' window ceilings (see `schema_5.sql`; the columns are
/// `schema.sql`'s, added by [`migrate_from_4`] where missing).
const SCHEMA_5: &str = include_str!("schema_5.sql");

/// Version 5 to 6: the semaphore's row split in two, its queue's tail moved to
/// `tessera_tails` (see `schema_6.sql`, `docs/sql-queue.md`).
const SCHEMA_6: &str = include_str!("schema_6.sql");

/// Fair shares' index and tenants table, run once the columns of version 2 exist (see
/// `fair_schema.sql`).
const FAIR_SCHEMA: &str = include_str!("fair_schema.sql");

/// The rate-limiter tables, additive to [`SCHEMA`] (see `rate_schema.sql`).
pub(super) const RATE_SCHEMA: &str = include_str!("rate_schema.sql");

/// The rate tables' version this code reads and writes.
pub(super) const RATE_SCHEMA_VERSION: i64 = 1;

/// The schema version this code reads and writes (a file of version 1 to 5 is migrated at
/// connect).
pub(super) const SCHEMA_VERSION: i64 = 6;

/// Switches the file to WAL if it is not yet (a new file): done once, then a property of the
/// file. Changing the journal mode needs an exclusive lock that the busy timeout does not
/// wait for, so a race with another process creating the same file is retried here.
pub(super) async fn ensure_wal(conn: &mut SqliteConnection) -> Result<()> {
    let mut last = None;
    for _ in 0..100 {
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        if mode.eq_ignore_ascii_case("wal") {
            return Ok(());
        }
        match sqlx::query_scalar::<_, String>("PRAGMA journal_mode = WAL")
            .fetch_one(&mut *conn)
            .await
        {
            Ok(mode) if mode.eq_ignore_ascii_case("wal") => return Ok(()),
            Ok(mode) => {
                return Err(Error::store(
                    StoreErrorKind::Other,
                    format!("SQLite refused WAL journal mode (still {mode})"),
                ))
            }
            Err(e) => {
                let e = map_err(e);
                if !e.is_transient() {
                    return Err(e);
                }
                last = Some(e);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err(last.unwrap_or_else(|| Error::store(StoreErrorKind::Busy, "cannot switch to WAL")))
}

/// Drops every lease, waiter and rate-limiter state, keeps the fence high-water mark and the
/// tenants' limits (an administrator's setting), less their window-capped-until instants,
/// which are times of the boot clock dropped with the state.
pub(super) const DROP_BOOT_STATE: &str =
    "DELETE FROM tessera_holders; DELETE FROM tessera_waiters; \
     DELETE FROM tessera_free_seats; DELETE FROM tessera_semaphores; \
     DELETE FROM tessera_tails; DELETE FROM tessera_tenants; \
     DELETE FROM tessera_rate_log; DELETE FROM tessera_rate_limiters; \
     UPDATE tessera_tenant_limits SET window_capped_until = NULL \
     WHERE window_capped_until IS NOT NULL;";

/// Makes the file's state belong to `boot` (see the module docs): state written under another
/// boot id, or before the file recorded one, is on another boot clock and held by processes
/// that cannot be alive, so it is dropped (the fence high-water mark stays). `None` (the
/// kernel has no boot id): nothing is checked.
pub(super) async fn ensure_boot(conn: &mut SqliteConnection, boot: Option<u128>) -> Result<()> {
    let Some(boot) = boot else { return Ok(()) };
    let (hi, lo) = ((boot >> 64) as u64 as i64, boot as u64 as i64);
    let stored: Vec<(String, i64)> = sqlx::query_as(
        "SELECT key, value FROM tessera_meta WHERE key IN ('boot_id_hi', 'boot_id_lo')",
    )
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let get = |k: &str| stored.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
    if get("boot_id_hi") == Some(hi) && get("boot_id_lo") == Some(lo) {
        return Ok(());
    }
    let held: i64 = sqlx::query_scalar(
        "SELECT (SELECT count(*) FROM tessera_semaphores) \
         + (SELECT count(*) FROM tessera_rate_limiters)",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    sqlx::raw_sql(DROP_BOOT_STATE)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    sqlx::query(
        "INSERT INTO tessera_meta (key, value) VALUES ('boot_id_hi', ?1), ('boot_id_lo', ?2) \
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
    )
    .bind(hi)
    .bind(lo)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    if held > 0 {
        let old = match (get("boot_id_hi"), get("boot_id_lo")) {
            (Some(h), Some(l)) => format!("{:032x}", (h as u64 as u128) << 64 | l as u64 as u128),
            _ => "none recorded".into(),
        };
        tracing::warn!(
            semaphores_and_rate_limiters = held,
            old_boot = %old,
            boot = %format!("{boot:032x}"),
            "tessera SQLite store: state written under another boot dropped (no process of \
             that boot can still hold it; fences keep rising)"
        );
    }
    Ok(())
}

/// Creates the tables if missing, migrates a file of version 1 to 5, checks the schema
/// versions and the boot id.
pub(super) async fn ensure_schema(conn: &mut SqliteConnection, boot: Option<u128>) -> Result<()> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await.map_err(map_err)?;
    sqlx::raw_sql(SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    let version: Option<i64> =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
    match version {
        Some(SCHEMA_VERSION) => {}
        Some(1) => {
            migrate_from_1(&mut tx).await?;
            migrate_from_2(&mut tx).await?;
            migrate_from_3(&mut tx).await?;
            migrate_from_4(&mut tx).await?;
            migrate_from_5(&mut tx).await?;
        }
        Some(2) => {
            migrate_from_2(&mut tx).await?;
            migrate_from_3(&mut tx).await?;
            migrate_from_4(&mut tx).await?;
            migrate_from_5(&mut tx).await?;
        }
        Some(3) => {
            migrate_from_3(&mut tx).await?;
            migrate_from_4(&mut tx).await?;
            migrate_from_5(&mut tx).await?;
        }
        Some(4) => {
            migrate_from_4(&mut tx).await?;
            migrate_from_5(&mut tx).await?;
        }
        Some(5) => migrate_from_5(&mut tx).await?,
        _ => {
            return Err(Error::Corrupt(format!(
                "tessera schema version {version:?} in the file; this build reads version {SCHEMA_VERSION}"
            )))
        }
    }
    sqlx::raw_sql(FAIR_SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    sqlx::raw_sql(RATE_SCHEMA)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
    let rate_version: Option<i64> =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'rate_schema_version'")
            .fetch_optional(&mut *tx)
            .await
            .map_err(map_err)?;
    if rate_version != Some(RATE_SCHEMA_VERSION) {
        return Err(Error::Corrupt(format!(
            "tessera rate schema version {rate_version:?} in the file; this build reads version {RATE_SCHEMA_VERSION}"
        )));
    }
    // Columns added to files made before them (see `schema.sql` and `rate_schema.sql`):
    // the waiters' wake-up socket and admission gate, the limiters' count of expired
    // admissions. Older builds never name them, so they still open the file.
    for (table, column, add) in [
        (
            "tessera_waiters",
            "wake",
            "ALTER TABLE tessera_waiters ADD COLUMN wake TEXT",
        ),
        (
            "tessera_waiters",
            "gate",
            "ALTER TABLE tessera_waiters ADD COLUMN gate INTEGER",
        ),
        (
            "tessera_rate_limiters",
            "expired",
            "ALTER TABLE tessera_rate_limiters ADD COLUMN expired INTEGER NOT NULL DEFAULT 0",
        ),
    ] {
        add_column(&mut tx, table, column, add).await?;
    }
    ensure_boot(&mut tx, boot).await?;
    tx.commit().await.map_err(map_err)
}

/// Runs `add` (an `ALTER TABLE … ADD COLUMN`) unless `table` has `column`.
async fn add_column(
    conn: &mut SqliteConnection,
    table: &str,
    column: &str,
    add: &'static str,
) -> Result<()> {
    let has: bool =
        sqlx::query_scalar("SELECT count(*) > 0 FROM pragma_table_info(?1) WHERE name = ?2")
            .bind(table)
            .bind(column)
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
    if !has {
        sqlx::raw_sql(add)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

/// Migrates a file of schema version 1 to 2 inside the connect's transaction: fair shares'
/// columns (`schema_2.sql`). Columns added without a version (the waiters' wake-up socket
/// and gate, the limiters' count) follow in `ensure_schema`.
async fn migrate_from_1(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::raw_sql(SCHEMA_2)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Migrates a file of schema version 2 to 3 inside the connect's transaction: the tenant
/// on holder and waiter rows (`schema_3.sql`); the rows already there name none.
async fn migrate_from_2(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::raw_sql(SCHEMA_3)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Migrates a file of schema version 3 to 4 inside the connect's transaction: tenants'
/// limits (`schema_4.sql`; `schema.sql` created their table, empty).
async fn migrate_from_3(conn: &mut SqliteConnection) -> Result<()> {
    sqlx::raw_sql(SCHEMA_4)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Migrates a file of schema version 4 to 5 inside the connect's transaction: tenants'
/// window ceilings (`schema_5.sql`), the columns `schema.sql` declares added to a limits
/// table made before them.
async fn migrate_from_4(conn: &mut SqliteConnection) -> Result<()> {
    for (column, add) in [
        (
            "window_ceiling",
            "ALTER TABLE tessera_tenant_limits ADD COLUMN window_ceiling INTEGER \
             CHECK (window_ceiling IS NULL OR window_ceiling BETWEEN 1 AND 100)",
        ),
        (
            "window_capped_until",
            "ALTER TABLE tessera_tenant_limits ADD COLUMN window_capped_until INTEGER",
        ),
    ] {
        add_column(conn, "tessera_tenant_limits", column, add).await?;
    }
    sqlx::raw_sql(SCHEMA_5)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Migrates a file of schema version 5 to 6 inside the connect's transaction (one
/// transaction with the rest of the connect's schema work, so no process sees half of it):
/// the semaphore row's `dequeued` added, then each row's queue tail moved to `tessera_tails`
/// and the old columns dropped (`schema_6.sql`).
async fn migrate_from_5(conn: &mut SqliteConnection) -> Result<()> {
    add_column(
        conn,
        "tessera_semaphores",
        "dequeued",
        "ALTER TABLE tessera_semaphores ADD COLUMN dequeued INTEGER NOT NULL DEFAULT 0",
    )
    .await?;
    sqlx::raw_sql(SCHEMA_6)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(())
}
