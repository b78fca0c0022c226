//! From etcd-client errors to tessera's [`Error`].

use etcd_client::Error as EtcdError;
use tonic::Code;

use crate::error::{Error, StoreErrorKind};

/// Turns an etcd-client error into a tessera error; `secret` (the URL's password) never
/// appears.
pub(super) fn store_error(e: EtcdError, secret: Option<&str>) -> Error {
    if is_out_of_space(&e) {
        // Not `Busy`: nothing is written again until an operator frees space, so a waiter
        // that retried would wait out its whole wait as if the semaphore were taken.
        return Error::store(
            StoreErrorKind::Other,
            format!(
                "etcd: {e}: the cluster is over its space quota (--quota-backend-bytes, alarm \
                 NOSPACE) and refuses every write until an operator compacts, defragments and \
                 runs `etcdctl alarm disarm`; releases still work"
            ),
        );
    }
    let kind = match &e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => StoreErrorKind::Connection,
        // A keep-alive or watch stream that closed: the connection under it went away.
        EtcdError::LeaseKeepAliveError(_) | EtcdError::WatchError(_) => StoreErrorKind::Connection,
        EtcdError::GRpcStatus(s) => match s.code() {
            Code::Unavailable | Code::Cancelled | Code::Aborted | Code::Unknown => {
                StoreErrorKind::Connection
            }
            Code::DeadlineExceeded => StoreErrorKind::Timeout,
            Code::ResourceExhausted => StoreErrorKind::Busy,
            Code::Unauthenticated | Code::PermissionDenied => StoreErrorKind::Auth,
            // etcd answers a wrong user or password with InvalidArgument, and a user given
            // to a cluster without auth with FailedPrecondition.
            _ if s.message().contains("authentication")
                || s.message().contains("permission denied")
                || s.message().contains("user name is empty") =>
            {
                StoreErrorKind::Auth
            }
            _ => StoreErrorKind::Other,
        },
        _ => StoreErrorKind::Other,
    };
    let mut message = crate::error::mask_secret(&e.to_string(), secret);
    // The usual causes, where etcd's words do not name them.
    if message.contains("user name is empty") {
        message.push_str(": the cluster has authentication on; give etcd://USER:PASSWORD@HOST");
    } else if matches!(kind, StoreErrorKind::Connection)
        && (message.contains("BrokenPipe") || message.contains("connection reset"))
    {
        message.push_str(
            " (if the member speaks TLS, the URL's scheme is etcds://, with ?ca=FILE for a \
             private CA)",
        );
    }
    Error::store(kind, format!("etcd: {message}"))
}

/// Whether etcd refused a write because the cluster is over its space quota (alarm NOSPACE:
/// every put and lease grant is refused; deletes and reads still run).
pub(super) fn is_out_of_space(e: &EtcdError) -> bool {
    matches!(e, EtcdError::GRpcStatus(s) if s.message().contains("database space exceeded"))
}

/// Whether etcd said the lease does not exist (expired or revoked).
pub(super) fn is_lease_not_found(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(s) => {
            s.code() == Code::NotFound || s.message().contains("requested lease not found")
        }
        EtcdError::LeaseKeepAliveError(m) => m.contains("lease not found"),
        _ => false,
    }
}

/// Whether the request failed to reach a member or got no answer from it in time
/// (refused, reset, unavailable, black-holed): worth sending again, on another member.
pub(super) fn is_unreachable(e: &EtcdError) -> bool {
    match e {
        EtcdError::TransportError(_) | EtcdError::IoError(_) => true,
        EtcdError::GRpcStatus(s) => matches!(
            s.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
        ),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_user_name_is_an_auth_error_that_says_what_to_give() {
        let e = EtcdError::GRpcStatus(tonic::Status::invalid_argument(
            "etcdserver: user name is empty",
        ));
        let e = store_error(e, None);
        assert!(e.is_auth(), "{e:?}");
        assert!(e.to_string().contains("etcd://USER:PASSWORD@HOST"), "{e}");
    }
}
