//! The store's errors: the driver's and PostgreSQL's (by SQLSTATE), mapped to [`Error`].

use tessera_core::error::{
    refused_connection, with_auth_hint, Error, InvalidInput, StoreErrorKind,
};
use tessera_core::stores::sql::errors::driver_error;

use super::url::Config;

pub(super) fn connect_timeout(config: &Config) -> Error {
    Error::store(
        StoreErrorKind::Timeout,
        format!("could not connect to {} in time", config.redacted),
    )
}

/// A first connection's error: nothing listening and refused credentials in the shape every
/// server store gives them (`PostgreSQL: <cause> (<hint naming the URL>)`); anything else
/// under the URL ([`in_context`]).
pub(super) fn connect_error(e: sqlx::Error, config: &Config) -> Error {
    if tessera_core::error::is_refusal(&e) {
        return match &e {
            sqlx::Error::Io(io) => refused_connection("PostgreSQL", io, &config.redacted),
            other => refused_connection("PostgreSQL", other, &config.redacted),
        };
    }
    match map_err(e) {
        auth @ Error::Store {
            kind: StoreErrorKind::Auth,
            ..
        } => with_auth_hint(auth, &config.redacted),
        other => in_context(other, config),
    }
}

/// Names the (redacted) URL in a store error.
pub(super) fn in_context(e: Error, config: &Config) -> Error {
    match e {
        Error::Store { kind, message } => {
            Error::store(kind, format!("{}: {message}", config.redacted))
        }
        other => other,
    }
}

/// The database refused a write because the session is read-only (SQLSTATE `25006`).
pub(super) fn is_read_only(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(db) if db.code().as_deref() == Some("25006"))
}

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

/// Classifies an sqlx error: tessera's own `TS001` and undecodable values are
/// [`Error::Corrupt`], its `TS002` [`InvalidInput::Cost`] (see
/// [`cost_above_window_ceiling`]); connection failures, a server shutting down or starting up are
/// [`StoreErrorKind::Connection`]; a wrong password (`28P01`) or a role the server does not
/// admit (`28000`: no such role, no `pg_hba.conf` entry) is [`StoreErrorKind::Auth`]; lock
/// and serialization conflicts, a read-only database (`25006`) and insufficient resources
/// (class `53`: disk full, out of memory) are [`StoreErrorKind::Busy`], faults that pass
/// without anything changed; a cancelled statement is [`StoreErrorKind::Timeout`]; anything
/// else (missing rights) is [`StoreErrorKind::Other`] with PostgreSQL's message.
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            match &*code {
                "TS001" => return Error::Corrupt(db.message().to_string()),
                "TS002" => return cost_above_window_ceiling(&**db),
                // 22P02 invalid text, 22003 out of range: a row tessera reads is damaged.
                "22P02" | "22003" | "XX001" | "XX002" => {
                    return Error::Corrupt(format!("PostgreSQL: {}", db.message()))
                }
                c if c.starts_with("08") => StoreErrorKind::Connection,
                // 57P: the server ended the session (shutdown, crash, a dropped database,
                // `idle_session_timeout`); the next call takes another connection.
                c if c.starts_with("57P") => StoreErrorKind::Connection,
                "53300" => StoreErrorKind::Connection,
                "28P01" | "28000" => StoreErrorKind::Auth,
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
        sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => StoreErrorKind::Connection,
        _ => return driver_error(&e, describe(&e)),
    };
    Error::store(kind, describe(&e))
}

/// `tessera_admit`'s refusal of a cost above the largest one a tenant's window ceiling lets
/// through (SQLSTATE `TS002`, `sql/admit.sql`; the statement rolled back, nothing changed):
/// [`InvalidInput::Cost`] with the cost and that largest cost, which the error's DETAIL
/// carries as two numbers. A DETAIL that does not read so is [`Error::Corrupt`].
fn cost_above_window_ceiling(db: &dyn sqlx::error::DatabaseError) -> Error {
    let detail = db
        .try_downcast_ref::<sqlx::postgres::PgDatabaseError>()
        .and_then(|e| e.detail());
    let numbers = detail.and_then(|d| {
        let (cost, max) = d.split_once(' ')?;
        Some((cost.parse().ok()?, max.parse().ok()?))
    });
    match numbers {
        Some((cost, max)) => Error::InvalidInput(InvalidInput::Cost { cost, max }),
        None => Error::Corrupt(format!(
            "PostgreSQL: {} (detail {:?})",
            db.message(),
            detail.unwrap_or_default()
        )),
    }
}

/// The message of an error for people: a server's error as its message and SQLSTATE
/// (`PostgreSQL: database "x" does not exist (SQLSTATE 3D000)`), without sqlx's prefix and
/// the server's C source line; any other error as sqlx words it.
pub(super) fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => match db.code() {
            Some(code) => format!("PostgreSQL: {} (SQLSTATE {code})", db.message()),
            None => format!("PostgreSQL: {}", db.message()),
        },
        _ => format!("PostgreSQL: {e}"),
    }
}
