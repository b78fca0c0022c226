//! The connection engine under the [`Store`](crate::Store) façade: one opened backend, its
//! URL (redacted for show, whole for reconnecting), the leases held through it and the count
//! of its clean-ups under way. Everything below the façade (clean-ups, lease keeping,
//! permits) takes a [`Conn`], so none of it imports the façade that wraps it.

use std::sync::{Arc, Mutex, Weak};

use tokio::sync::watch;

use crate::arrivals::{Arrivals, Pass};
use crate::stores::Open;
use tessera_core::error::{redact_url, LossReason, Result};
use tessera_core::model::{LeaseId, Name, Tenant};
use tessera_core::seam::Backend;

/// A lease held through a connection, as the connection sees it: something to give back when
/// the store closes or the process exits. The lease keeper implements it.
pub(crate) trait Tracked: Send + Sync {
    /// Claims the lease's release (`None` if it was already claimed: released, or being
    /// released), fires its loss signal with `lost` if given, stops its keep-alive, and
    /// names what to release.
    fn take_for_release(&self, lost: Option<LossReason>) -> Option<(Name, LeaseId)>;
}

/// One opened store. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub(crate) struct Conn {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn").field("url", &self.url()).finish()
    }
}

struct Shared {
    backend: Arc<dyn Backend>,
    /// The URL with any password replaced by `***`: the only form ever shown.
    url: String,
    /// The URL as given (password included) for the clean-up thread to reconnect with;
    /// `None` for a store built from a backend. Never printed.
    reconnect: Option<String>,
    /// The leases held through this connection, for closing and the exit handler.
    held: Mutex<Held>,
    /// Background clean-ups under way for this connection (see `crate::cleanup`).
    cleanups: watch::Sender<usize>,
    /// New requests per semaphore at the store at once (see `crate::arrivals`).
    arrivals: Arrivals,
}

/// The leases of a connection: a list of weak references, pushed at grant and never
/// searched. A released lease stays until the list is compacted (when it has doubled since
/// the last time), and is skipped when drained because its release was already claimed; so a
/// release costs nothing here.
#[derive(Default)]
struct Held {
    leases: Vec<Weak<dyn Tracked>>,
    limit: usize,
}

/// The length below which [`Held`] is never compacted.
const HELD_MIN: usize = 64;

impl Held {
    fn push(&mut self, lease: Weak<dyn Tracked>) {
        if self.leases.len() >= self.limit.max(HELD_MIN) {
            self.leases.retain(|h| h.strong_count() > 0);
            self.limit = 2 * self.leases.len();
        }
        self.leases.push(lease);
    }
}

/// Every connection of the process, for the exit handler.
static LIVE: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

impl Conn {
    /// Opens the store named by `url` (see [`Store::connect`](crate::Store::connect)).
    pub(crate) async fn open(url: &str, open: Open) -> Result<Conn> {
        let backend = crate::stores::open(url, open).await?;
        Ok(Conn::build(backend, url, Some(url.to_string())))
    }

    pub(crate) fn build(backend: Arc<dyn Backend>, url: &str, reconnect: Option<String>) -> Conn {
        // A store opened from a URL reports its calls (see `crate::telemetry`); one built from
        // a backend is the caller's, who may wrap it (tests wrap a URL-opened one in faults).
        let backend: Arc<dyn Backend> = match reconnect {
            Some(_) => Arc::new(crate::telemetry::Instrumented::new(backend)),
            None => backend,
        };
        let arrivals = Arrivals::new(backend.capabilities().arrivals_in_flight as usize);
        let shared = Arc::new(Shared {
            backend,
            arrivals,
            url: redact_url(url),
            reconnect,
            held: Mutex::new(Held::default()),
            cleanups: watch::Sender::new(0),
        });
        let mut live = LIVE.lock().unwrap();
        live.retain(|s| s.strong_count() > 0);
        live.push(Arc::downgrade(&shared));
        Conn { shared }
    }

    /// Every connection of the process still in use (for the exit handler).
    pub(crate) fn live() -> Vec<Conn> {
        match LIVE.lock() {
            Ok(live) => live
                .iter()
                .filter_map(Weak::upgrade)
                .map(|shared| Conn { shared })
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// The URL with any password replaced by `***`.
    pub(crate) fn url(&self) -> &str {
        &self.shared.url
    }

    pub(crate) fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    /// Waits for a place for a new request of `tenant` on `name` (see `crate::arrivals`);
    /// the place is freed when the returned pass is dropped.
    pub(crate) async fn arrive(&self, name: &Name, tenant: Option<&Tenant>) -> Pass {
        let tenant = tenant.map_or("", Tenant::name);
        self.shared.arrivals.enter(name.as_str(), tenant).await
    }

    pub(crate) fn reconnect_url(&self) -> Option<&str> {
        self.shared.reconnect.as_deref()
    }

    pub(crate) fn cleanups(&self) -> &watch::Sender<usize> {
        &self.shared.cleanups
    }

    /// Notes a lease held through this connection, for closing and the exit handler (which
    /// its caller arms: `crate::cleanup::arm_exit`).
    pub(crate) fn track(&self, lease: Weak<dyn Tracked>) {
        self.shared.held.lock().unwrap().push(lease);
    }

    /// Every lease still held, emptying the list.
    pub(crate) fn drain_held(&self) -> Vec<Arc<dyn Tracked>> {
        let Ok(mut held) = self.shared.held.lock() else {
            return Vec::new();
        };
        held.limit = 0;
        held.leases.drain(..).filter_map(|h| h.upgrade()).collect()
    }
}
