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
//!
//! Once granted, the waiter's registration passes to the permit, which keeps it while it
//! holds the lease: a later wake-up for that lease id (a revocation) goes to the lease keeper
//! through a [`Hook`] (see `crate::keeper`), not to a waiting task.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use tokio::sync::Notify;

use crate::model::{Grant, LeaseId, LeaseIdMap};

#[derive(Debug, Default)]
struct Slot {
    notify: Notify,
    /// A grant pushed with the last wake-up, not yet taken.
    grant: Mutex<Option<Grant>>,
    /// Set once the lease is held: who else hears of wake-ups.
    hook: OnceLock<Weak<dyn Hook>>,
}

/// Hears of the wake-ups for a held lease, without a task waiting on them.
pub(crate) trait Hook: Send + Sync + std::fmt::Debug {
    /// Called by [`notify`] or [`notify_grant`] for the lease, on the caller's thread.
    fn wake(self: Arc<Self>);
}

impl Slot {
    fn wake(&self) {
        self.notify.notify_one();
        if let Some(hook) = self.hook.get().and_then(Weak::upgrade) {
            hook.wake();
        }
    }
}

/// The registry, split in shards by the top bits of the lease id (random, so the shards fill
/// evenly), so registrations on different workers seldom meet on one lock.
static SHARDS: [Shard; SHARD_COUNT] =
    [const { Shard(Mutex::new(HashMap::with_hasher(BuildHasherDefault::new()))) }; SHARD_COUNT];

const SHARD_COUNT: usize = 16;

/// One shard, on a cache line of its own.
#[repr(align(64))]
struct Shard(Mutex<Slots>);

type Slots = LeaseIdMap<Arc<Slot>>;

fn shard(lease: LeaseId) -> &'static Mutex<Slots> {
    &SHARDS[(lease.as_u128() >> 124) as usize % SHARD_COUNT].0
}

fn slot(lease: LeaseId) -> Option<Arc<Slot>> {
    shard(lease).lock().unwrap().get(&lease).cloned()
}

/// Wakes the task registered for `lease`, if any.
pub fn notify(lease: LeaseId) {
    if let Some(s) = slot(lease) {
        s.wake();
    }
}

/// Wakes the task registered for the lease of `grant`, if any, handing it the grant.
pub fn notify_grant(grant: Grant) {
    if let Some(s) = slot(grant.lease.lease_id) {
        *s.grant.lock().unwrap() = Some(grant);
        s.wake();
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
        shard(lease)
            .lock()
            .unwrap()
            .insert(lease, Arc::clone(&slot));
        Registration { lease, slot }
    }

    /// Resolves at the next wake-up (or at once if one arrived since the last call).
    pub(crate) async fn notified(&self) {
        self.slot.notify.notified().await
    }

    /// From now on, wake-ups for this lease also go to `hook` (at most one hook per
    /// registration; a second one is ignored).
    pub(crate) fn hand_to(&self, hook: Weak<dyn Hook>) {
        let _ = self.slot.hook.set(hook);
    }

    /// The grant pushed with a wake-up, if any (taken: a second call returns `None`).
    pub(crate) fn take_grant(&self) -> Option<Grant> {
        self.slot.grant.lock().unwrap().take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = shard(self.lease).lock().unwrap();
        if reg
            .get(&self.lease)
            .is_some_and(|n| Arc::ptr_eq(n, &self.slot))
        {
            reg.remove(&self.lease);
        }
    }
}
