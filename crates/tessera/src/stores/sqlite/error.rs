//! The store's errors: SQLite's and the driver's, mapped to [`Error`].

use std::time::Duration;

use tessera_core::error::{Error, StoreErrorKind};
use tessera_core::stores::sql::errors::driver_error;

/// How long a transaction waits for another connection's write lock.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// The error of a step that waited [`BUSY_TIMEOUT`] for the write lock or gate.
pub(super) fn busy_past_timeout() -> Error {
    Error::store(
        StoreErrorKind::Busy,
        format!(
            "the SQLite write lock stayed taken for {} s",
            BUSY_TIMEOUT.as_secs()
        ),
    )
}

/// Whether `e` is SQLITE_BUSY: another connection holds the lock.
pub(super) fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.extended_code & 0xff == 5)
}

/// Classifies an sqlx error: SQLITE_BUSY/LOCKED is [`StoreErrorKind::Busy`], I/O and "cannot
/// open" are [`StoreErrorKind::Connection`], a damaged file or a value of an unexpected type
/// is [`Error::Corrupt`], anything else [`StoreErrorKind::Other`].
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::Database(db) => {
            // sqlx reports SQLite's extended result code; the primary code is its low byte.
            let code = db.code().and_then(|c| c.parse::<i32>().ok()).unwrap_or(-1);
            match code & 0xff {
                5 | 6 => StoreErrorKind::Busy,         // SQLITE_BUSY, SQLITE_LOCKED
                10 | 14 => StoreErrorKind::Connection, // SQLITE_IOERR, SQLITE_CANTOPEN
                11 | 26 => return Error::Corrupt(format!("SQLite: {}", db.message())), // CORRUPT, NOTADB
                _ => StoreErrorKind::Other,
            }
        }
        // The driver's own; a protocol error here is a statement sqlx refused (a NUL byte,
        // a bad parameter), so it stays [`StoreErrorKind::Other`].
        _ => return driver_error(&e, e.to_string()),
    };
    Error::store(kind, e.to_string())
}
