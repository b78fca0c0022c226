//! The errors of sqlx's own (its pool, its I/O, decoding), which every SQL store reads alike.
//! The server's errors are each store's, read by its codes (SQLite's result codes, MySQL's
//! error numbers, PostgreSQL's SQLSTATE), and so are TLS and protocol errors: a lost
//! connection on a network store, a statement sqlx refused on SQLite. Only this file of the
//! SQL step names sqlx.

use crate::error::{Error, StoreErrorKind};

/// `e`, an error that is not the server's, as every SQL store reads it: I/O, a closed pool
/// or a crashed worker is [`StoreErrorKind::Connection`]; a pool that gave no connection in
/// time is [`StoreErrorKind::Timeout`]; a value of an unexpected type or a missing column is
/// [`Error::Corrupt`]; anything else is [`StoreErrorKind::Other`]. `message` words the store
/// error.
pub fn driver_error(e: &sqlx::Error, message: String) -> Error {
    let kind = match e {
        sqlx::Error::Io(_) | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
            StoreErrorKind::Connection
        }
        sqlx::Error::PoolTimedOut => StoreErrorKind::Timeout,
        sqlx::Error::ColumnDecode { .. }
        | sqlx::Error::Decode(_)
        | sqlx::Error::ColumnNotFound(_)
        | sqlx::Error::ColumnIndexOutOfBounds { .. }
        | sqlx::Error::TypeNotFound { .. } => return Error::Corrupt(e.to_string()),
        _ => StoreErrorKind::Other,
    };
    Error::store(kind, message)
}
