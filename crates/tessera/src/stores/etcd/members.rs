//! The members named in the URL, one connection each, and which one this backend talks to.
//!
//! etcd-client balances one channel over every endpoint, but a member that dies or is
//! black-holed (packets dropped, nothing closed) stays in its rotation: requests sent to it
//! hang until their timeout, and the balancer keeps picking it. So each member gets a
//! client of its own (connected on first use, so a member that is down when the backend
//! starts costs nothing until it is picked), and the backend talks to one member at a time:
//!
//! - every request attempt is bounded by [`ATTEMPT_TIMEOUT`]; an attempt that times out or
//!   cannot reach its member moves the backend to the next member ([`Members::failed`]), and
//!   the request is sent again there (every request of this store may be repeated: see
//!   [`super::EtcdBackend::call`]);
//! - keep-alive streams are opened on the current member, and reopened on the next one when
//!   an exchange fails or times out;
//! - the waiters' shared watch stream follows the current member: a failover
//!   ([`Members::changes`]) reopens it on the new member, where every waiter's watchers are
//!   created again, each checked against the snapshot its waiter decided on, so no wake-up is
//!   lost (see `notify.rs`).
//!
//! Members are tried in the URL's order, round and round; the first reachable one is kept
//! until it fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, Error as EtcdError};
use tokio::sync::watch;

/// How long one attempt of a request (or a keep-alive exchange) may take on one member
/// before the backend moves to the next member and sends it again there.
pub(super) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);

/// The members of the URL, one lazily connected client each.
pub(super) struct Members {
    endpoints: Vec<String>,
    options: ConnectOptions,
    clients: Vec<tokio::sync::Mutex<Option<Client>>>,
    current: AtomicUsize,
    /// Bumped at every failover.
    changes: watch::Sender<u64>,
}

impl Members {
    /// Nothing is connected yet: see [`Members::client`].
    pub(super) fn new(endpoints: Vec<String>, options: ConnectOptions) -> Members {
        let clients = endpoints
            .iter()
            .map(|_| tokio::sync::Mutex::default())
            .collect();
        Members {
            endpoints,
            options,
            clients,
            current: AtomicUsize::new(0),
            changes: watch::channel(0).0,
        }
    }

    /// Number of members.
    pub(super) fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// The member this backend talks to now.
    pub(super) fn current(&self) -> usize {
        self.current.load(Ordering::Acquire)
    }

    /// The client of member `i`, connected (and authenticated, with a user) on first use
    /// within [`ATTEMPT_TIMEOUT`].
    pub(super) async fn client(&self, i: usize) -> Result<Client, EtcdError> {
        let mut slot = self.clients[i].lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let connect = Client::connect([&self.endpoints[i]], Some(self.options.clone()));
        let c = tokio::time::timeout(ATTEMPT_TIMEOUT, connect)
            .await
            .map_err(|_| timed_out("connecting"))??;
        *slot = Some(c.clone());
        Ok(c)
    }

    /// Member `i` failed an attempt: if the backend still talks to it, it moves to the next
    /// member (a concurrent failure of the same member moves it once).
    pub(super) fn failed(&self, i: usize) {
        let next = (i + 1) % self.len();
        if next != i
            && self
                .current
                .compare_exchange(i, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            tracing::debug!(
                from = %self.endpoints[i],
                to = %self.endpoints[next],
                "etcd: moving to the next member"
            );
            self.changes.send_modify(|n| *n += 1);
        }
    }

    /// Changes at every failover (the watch stream reopens on the new member).
    pub(super) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }
}

/// The error of an attempt that got no answer in time.
pub(super) fn timed_out(what: &str) -> EtcdError {
    EtcdError::GRpcStatus(tonic::Status::deadline_exceeded(format!(
        "no answer from the member within {ATTEMPT_TIMEOUT:?} ({what})"
    )))
}
