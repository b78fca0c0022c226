//! From etcd-client errors to tessera's [`Error`].

use std::error::Error as _;

use etcd_client::Error as EtcdError;
use tonic::Code;

use tessera_core::error::{Error, StoreErrorKind};

/// Turns an etcd-client error into a tessera error, in words (never a debug dump of the
/// gRPC layers); `url` is the store's URL with its password masked, named where the fault
/// is the URL's (nothing listens there, the credentials were refused); `secret` (the URL's
/// password) never appears.
pub(super) fn store_error(e: EtcdError, url: &str, secret: Option<&str>) -> Error {
    let cause = tessera_core::error::mask_secret(&plain_cause(&e), secret);
    if is_out_of_space(&e) {
        // Not `Busy`: nothing is written again until an operator frees space, so a waiter
        // that retried would wait out its whole wait as if the semaphore were taken.
        return Error::store(
            StoreErrorKind::Other,
            format!(
                "etcd: {cause}: the cluster is over its space quota (--quota-backend-bytes, \
                 alarm NOSPACE) and refuses every write until an operator compacts, \
                 defragments and runs `etcdctl alarm disarm`; releases still work"
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
    // The usual causes, where etcd's words do not name them.
    let hint = if is_refusal(&e) {
        Some(tessera_core::error::refused_hint(url))
    } else if cause.contains("user name is empty") {
        Some("the cluster has authentication on; give etcd://USER:PASSWORD@HOST".to_string())
    } else if cause.contains("authentication is not enabled") {
        Some(format!(
            "the cluster has authentication off; leave the user and password out of {url}"
        ))
    } else if kind == StoreErrorKind::Auth && !cause.contains("permission denied") {
        Some(tessera_core::error::auth_hint(url))
    } else if kind == StoreErrorKind::Connection && is_reset(&e, &cause) {
        Some(
            "if the member speaks TLS, the URL's scheme is etcds://, with ?ca=FILE for a \
             private CA"
                .to_string(),
        )
    } else {
        None
    };
    match hint {
        Some(hint) => Error::store(kind, format!("etcd: {cause} ({hint})")),
        None => Error::store(kind, format!("etcd: {cause}")),
    }
}

/// Whether nothing accepted the connection (the I/O error under tonic's layers).
fn is_refusal(e: &EtcdError) -> bool {
    match e {
        EtcdError::GRpcStatus(s) => tessera_core::error::is_refusal(s),
        EtcdError::TransportError(t) => tessera_core::error::is_refusal(t),
        EtcdError::IoError(io) => tessera_core::error::is_refusal(io),
        _ => false,
    }
}

/// Whether the member closed the connection under the request, as a member that speaks TLS
/// does to plain text. The debug text is looked at too (it names the I/O error's kind); it
/// is never shown.
fn is_reset(e: &EtcdError, cause: &str) -> bool {
    let debug = format!("{e:?}");
    debug.contains("BrokenPipe")
        || debug.contains("ConnectionReset")
        || cause.contains("connection reset")
}

/// What went wrong, in words: etcd's message, then each cause under it that adds something
/// (tonic and hyper wrap one fault in several layers that repeat each other or only say
/// "transport error"), e.g. `tcp connect error: Connection refused (os error 111)`. A gRPC
/// status's `Display` would end with a debug dump of its source.
fn plain_cause(e: &EtcdError) -> String {
    let (mut text, mut source): (String, Option<&(dyn std::error::Error + 'static)>) = match e {
        EtcdError::GRpcStatus(s) if s.message().is_empty() => (s.code().to_string(), s.source()),
        EtcdError::GRpcStatus(s) => (s.message().to_string(), s.source()),
        EtcdError::TransportError(t) => (String::new(), t.source()),
        other => (other.to_string(), None),
    };
    while let Some(cause) = source {
        let words = cause.to_string();
        if !words.is_empty() && words != "transport error" && !text.contains(&words) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&words);
        }
        source = cause.source();
    }
    if text.is_empty() {
        text = e.to_string();
    }
    text
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
        let e = store_error(e, "etcd://127.0.0.1:2379", None);
        assert!(e.is_auth(), "{e:?}");
        assert!(e.to_string().contains("etcd://USER:PASSWORD@HOST"), "{e}");
    }

    #[test]
    fn a_wrong_password_names_the_url_and_a_status_never_shows_its_debug_source() {
        let status = tonic::Status::invalid_argument(
            "etcdserver: authentication failed, invalid user ID or password",
        );
        let e = store_error(
            EtcdError::GRpcStatus(status),
            "etcd://root:***@127.0.0.1:2379",
            Some("hunter2"),
        );
        assert!(e.is_auth(), "{e:?}");
        assert_eq!(
            e.to_string(),
            "store error (auth): etcd: etcdserver: authentication failed, invalid user ID or \
             password (the server refused the credentials: check the user and password of \
             etcd://root:***@127.0.0.1:2379)"
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let mut status = tonic::Status::unavailable("h2 protocol error");
        status.set_source(std::sync::Arc::new(io));
        let e = store_error(EtcdError::GRpcStatus(status), "etcd://h:1", None);
        assert!(e.is_connection(), "{e:?}");
        let text = e.to_string();
        assert!(
            text.contains("etcd: h2 protocol error: reset by peer (if the member speaks TLS"),
            "{text}"
        );
        assert!(
            !text.contains("Custom") && !text.contains("kind:"),
            "{text}"
        );
    }
}
