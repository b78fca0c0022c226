//! From redis-rs errors to tessera's [`Error`].

use redis::RedisError;

use tessera_core::error::{Error, StoreErrorKind};

/// Turns a redis-rs error into a tessera error; `secret` (the URL's password) never appears.
pub(super) fn store_error(e: RedisError, secret: Option<&str>) -> Error {
    if e.code() == Some("TESSERA_CORRUPT") {
        return Error::Corrupt(e.detail().unwrap_or("corrupt semaphore state").to_string());
    }
    if e.code() == Some("WRONGTYPE") {
        // A key of tessera's layout holds something else: written by someone else.
        return Error::Corrupt(format!("a tessera key holds another type: {e}"));
    }
    let kind = if is_auth(&e) {
        // A wrong user or password, none given where one is required, or an ACL that
        // refuses a command or key.
        StoreErrorKind::Auth
    } else if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.kind() == redis::ErrorKind::ClusterConnectionNotFound
    {
        // The last: a cluster's node for the name's slot is down and no replica serves the
        // slot yet (a failover under way), a fault to ride out like any lost connection.
        StoreErrorKind::Connection
    } else if e.code() == Some("BUSY") || e.code() == Some("LOADING") {
        StoreErrorKind::Busy
    } else {
        StoreErrorKind::Other
    };
    let mut message = tessera_core::error::mask_secret(&e.to_string(), secret);
    if e.kind() == redis::ErrorKind::ClusterConnectionNotFound {
        message = format!("the cluster node of this name's slot does not answer ({message})");
    }
    Error::store(kind, format!("redis: {message}"))
}

/// `e` with `secret` (a second password: the sentinels') masked in its message as well.
pub(super) fn mask_in(e: Error, secret: Option<&str>) -> Error {
    match e {
        Error::Store { kind, message } => {
            Error::store(kind, tessera_core::error::mask_secret(&message, secret))
        }
        other => other,
    }
}

/// Whether the server refused the credentials (or their lack). A cluster client's first
/// connect wraps the node's refusal in an I/O error ("Failed to create initial connections -
/// Io: \"NOAUTH\": …"), so the refusal's code is looked for in the text as well.
pub(super) fn is_auth(e: &RedisError) -> bool {
    const REFUSALS: [&str; 3] = ["NOAUTH", "WRONGPASS", "NOPERM"];
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || e.code().is_some_and(|c| REFUSALS.contains(&c))
        || REFUSALS
            .iter()
            .any(|r| e.to_string().contains(&format!("\"{r}\"")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_node_that_is_gone_is_a_connection_fault_to_ride_out() {
        let e = RedisError::from((
            redis::ErrorKind::ClusterConnectionNotFound,
            "Requested connection not found",
            "127.0.0.1:7620".to_string(),
        ));
        let e = store_error(e, None);
        assert!(
            matches!(
                &e,
                Error::Store {
                    kind: StoreErrorKind::Connection,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.is_transient());
        assert!(e.to_string().contains("cluster node"), "{e}");
    }
}
