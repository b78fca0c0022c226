//! The store's errors: the driver's and the server's (by error number), mapped to [`Error`].

use tessera_core::error::{Error, StoreErrorKind};
use tessera_core::stores::sql::errors::driver_error;

/// A first connection's error: nothing listening and refused credentials in the shape every
/// server store gives them (`MySQL: <cause> (<hint naming the URL>)`); anything else under
/// the URL.
pub(super) fn connect_error(e: sqlx::Error, redacted: &str) -> Error {
    if tessera_core::error::is_refusal(&e) {
        return match &e {
            sqlx::Error::Io(io) => tessera_core::error::refused_connection("MySQL", io, redacted),
            other => tessera_core::error::refused_connection("MySQL", other, redacted),
        };
    }
    let number = match &e {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|m| (m.number(), m.message().to_string())),
        _ => None,
    };
    match (map_err(e), number) {
        (
            Error::Store {
                kind: StoreErrorKind::Auth,
                ..
            },
            Some((number, message)),
        ) => Error::store(
            StoreErrorKind::Auth,
            format!(
                "MySQL: error {number}: {message} ({})",
                tessera_core::error::auth_hint(redacted)
            ),
        ),
        (Error::Store { kind, message }, _) => Error::store(kind, format!("{redacted}: {message}")),
        (other, _) => other,
    }
}

/// Classifies an sqlx error: a deadlock (1213), a lock wait timeout (1205) or an interrupted
/// query (1317) is [`StoreErrorKind::Busy`] (the step rolled back; it is run again); a lost
/// or refused connection (2002, 2006, 2013, 1053, 1927, 4031, I/O) is
/// [`StoreErrorKind::Connection`]; refused credentials (1045: a wrong user or password;
/// 1698: a user that may not log in with a password) are [`StoreErrorKind::Auth`]; a value of
/// an unexpected type is [`Error::Corrupt`]; anything else [`StoreErrorKind::Other`].
pub(crate) fn map_err(e: sqlx::Error) -> Error {
    let kind = match &e {
        sqlx::Error::Database(db) => {
            let number = db
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|m| m.number())
                .unwrap_or(0);
            match number {
                1205 | 1213 | 1317 => StoreErrorKind::Busy,
                // A server made read-only (`read_only`, `super_read_only`, a replica during a
                // switchover: 1290, 1836, 1792) or out of disk (1021, 1114): nothing ran, and
                // it passes without anything changed, as on PostgreSQL.
                1290 | 1836 | 1792 | 1021 | 1114 => StoreErrorKind::Busy,
                1040 | 1053 | 1927 | 2002 | 2006 | 2013 | 4031 => StoreErrorKind::Connection,
                1045 | 1698 => StoreErrorKind::Auth,
                _ => StoreErrorKind::Other,
            }
        }
        sqlx::Error::Tls(_) => {
            return Error::store(
                StoreErrorKind::Connection,
                format!("TLS handshake failed (check ssl-ca and ssl-mode): {e}"),
            )
        }
        // rustls reports a rejected certificate as an I/O error of the handshake.
        sqlx::Error::Io(io) if io.get_ref().is_some_and(is_tls_error) => {
            return Error::store(
                StoreErrorKind::Connection,
                format!("TLS handshake failed (check ssl-ca and ssl-mode): {io}"),
            )
        }
        sqlx::Error::Protocol(_) => StoreErrorKind::Connection,
        _ => return driver_error(&e, e.to_string()),
    };
    Error::store(kind, e.to_string())
}

/// Whether the source of an I/O error is rustls refusing the handshake (an unknown CA, a
/// certificate for another name, an expired one).
pub(super) fn is_tls_error(inner: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    inner.downcast_ref::<rustls::Error>().is_some()
}
