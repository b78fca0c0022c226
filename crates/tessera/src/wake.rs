//! Routing of wake-ups to the tasks of this process that wait on a lease id.
//!
//! Lease ids are random 128-bit values, unique across stores, so one process-wide registry
//! serves every store: a store that grants lease `X` (or revokes it) calls [`notify`]`(X)`,
//! whether the grant happened in this process (memory, SQLite) or arrived as a push from the
//! server. Only the task registered for `X` wakes: no thundering herd.
//!
//! A waiter registers *before* it sends its acquire, so a wake-up that arrives before the
//! acquire's reply is not missed: `Notify::notify_one` stores a permit for the next
//! `notified()`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::Notify;

use crate::model::LeaseId;

static REGISTRY: LazyLock<Mutex<HashMap<LeaseId, Arc<Notify>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Wakes the task registered for `lease`, if any.
pub fn notify(lease: LeaseId) {
    let n = REGISTRY.lock().unwrap().get(&lease).cloned();
    if let Some(n) = n {
        n.notify_one();
    }
}

/// A registration; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    lease: LeaseId,
    notify: Arc<Notify>,
}

impl Registration {
    pub(crate) fn new(lease: LeaseId) -> Self {
        let notify = Arc::new(Notify::new());
        REGISTRY
            .lock()
            .unwrap()
            .insert(lease, Arc::clone(&notify));
        Registration { lease, notify }
    }

    /// Resolves at the next wake-up (or at once if one arrived since the last call).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = REGISTRY.lock().unwrap();
        if reg
            .get(&self.lease)
            .is_some_and(|n| Arc::ptr_eq(n, &self.notify))
        {
            reg.remove(&self.lease);
        }
    }
}
