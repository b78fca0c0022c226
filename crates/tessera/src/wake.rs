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
//!
//! A store that pushes the grant itself with the wake-up ([`notify_grant`], Redis) spares the
//! waiter the round trip that would ask for it. The waiter may use such a grant only while
//! its lease is certainly valid by a wide margin (see `crate::semaphore`); otherwise it asks
//! the store as after a plain wake-up.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use tokio::sync::Notify;

use crate::model::{Grant, LeaseId};

#[derive(Debug, Default)]
struct Slot {
    notify: Notify,
    /// A grant pushed with the last wake-up, not yet taken.
    grant: Mutex<Option<Grant>>,
}

static REGISTRY: LazyLock<Mutex<HashMap<LeaseId, Arc<Slot>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn slot(lease: LeaseId) -> Option<Arc<Slot>> {
    REGISTRY.lock().unwrap().get(&lease).cloned()
}

/// Wakes the task registered for `lease`, if any.
pub fn notify(lease: LeaseId) {
    if let Some(s) = slot(lease) {
        s.notify.notify_one();
    }
}

/// Wakes the task registered for the lease of `grant`, if any, handing it the grant.
pub fn notify_grant(grant: Grant) {
    if let Some(s) = slot(grant.lease.lease_id) {
        *s.grant.lock().unwrap() = Some(grant);
        s.notify.notify_one();
    }
}

/// A registration; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Registration {
    lease: LeaseId,
    slot: Arc<Slot>,
}

impl Registration {
    pub(crate) fn new(lease: LeaseId) -> Self {
        let slot = Arc::new(Slot::default());
        REGISTRY.lock().unwrap().insert(lease, Arc::clone(&slot));
        Registration { lease, slot }
    }

    /// Resolves at the next wake-up (or at once if one arrived since the last call).
    pub(crate) async fn notified(&self) {
        self.slot.notify.notified().await
    }

    /// The grant pushed with a wake-up, if any (taken: a second call returns `None`).
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        self.slot.grant.lock().unwrap().take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = REGISTRY.lock().unwrap();
        if reg
            .get(&self.lease)
            .is_some_and(|n| Arc::ptr_eq(n, &self.slot))
        {
            reg.remove(&self.lease);
        }
    }
}
