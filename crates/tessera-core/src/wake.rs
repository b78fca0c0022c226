//! Routing of wake-ups to the tasks of this process that wait on a lease id.
//!
//! Lease ids are random 128-bit values, unique across stores, so one process-wide registry
//! serves every store: a store that grants lease `X` (or revokes it) calls [`notify`]`(X)`,
//! whether the grant happened in this process (memory, SQLite) or arrived as a push from the
//! server. Only the task registered for `X` wakes: no thundering herd.
//!
//! A waiter registers *before* it sends its acquire, so a wake-up that arrives before the
//! acquire's reply is not missed: `Notify::notify_one` stores a permit for the next
//! `notified()`. An in-process store whose acquire runs at once (memory) is the exception:
//! its waiter registers only when the reply says it is queued, so an immediate grant
//! registers nothing for a wait it never does. A wake-up that finds nobody registered is
//! kept, a few per shard, for a registration that comes late ([`Registration::late`]).
//!
//! A store that pushes the grant itself with the wake-up ([`notify_grant`], Redis) spares the
//! waiter the round trip that would ask for it. The waiter may use such a grant only while
//! its lease is certainly valid by a wide margin (see `crate::semaphore`); otherwise it asks
//! the store as after a plain wake-up.
//!
//! Once granted, the waiter's registration passes to the permit, which keeps it while it
//! holds the lease: a later wake-up for that lease id (a revocation) goes to the lease keeper
//! through a [`Hook`] (see `crate::lease::keeper`), not to a waiting task. A lease granted without
//! a wait registers only its hook ([`HookRegistration`]).

use std::collections::{HashMap, VecDeque};
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
pub trait Hook: Send + Sync + std::fmt::Debug {
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
static SHARDS: [Shard; SHARD_COUNT] = [const {
    Shard(Mutex::new(Slots {
        by_lease: HashMap::with_hasher(BuildHasherDefault::new()),
        unclaimed: VecDeque::new(),
    }))
}; SHARD_COUNT];

const SHARD_COUNT: usize = 16;

/// How many wake-ups nobody was registered for each shard remembers (see [`Slots`]).
const UNCLAIMED_CAP: usize = 8;

/// One shard, on a cache line of its own.
#[repr(align(64))]
struct Shard(Mutex<Slots>);

struct Slots {
    by_lease: LeaseIdMap<Entry>,
    /// The last wake-ups that found nobody registered, with their grants: a registration
    /// made after its store call answered (an in-process store's step, which may queue the
    /// caller and, on another thread, grant it before the caller registers) takes its
    /// wake-up from here. Bounded: a wake-up that drops out is only late (the waiter's
    /// heartbeat finds the grant), never lost for good.
    unclaimed: VecDeque<(LeaseId, Option<Grant>)>,
}

/// Who hears of the wake-ups for one lease id.
enum Entry {
    /// A task that waits (an acquire), or that did and now holds the lease (with a hook).
    Slot(Arc<Slot>),
    /// A held lease that never waited: only its hook hears of wake-ups.
    Hook(Weak<dyn Hook>),
}

fn shard(lease: LeaseId) -> &'static Mutex<Slots> {
    &SHARDS[(lease.as_u128() >> 124) as usize % SHARD_COUNT].0
}

/// Who to wake for `lease`; with nobody registered, the wake-up is kept as unclaimed.
fn target(lease: LeaseId, grant: Option<Grant>) -> Option<(Target, Option<Grant>)> {
    let mut slots = shard(lease).lock().unwrap();
    match slots.by_lease.get(&lease) {
        Some(Entry::Slot(s)) => Some((Target::Slot(Arc::clone(s)), grant)),
        Some(Entry::Hook(h)) => h.upgrade().map(|h| (Target::Hook(h), grant)),
        None => {
            if slots.unclaimed.len() == UNCLAIMED_CAP {
                slots.unclaimed.pop_front();
            }
            slots.unclaimed.push_back((lease, grant));
            None
        }
    }
}

enum Target {
    Slot(Arc<Slot>),
    Hook(Arc<dyn Hook>),
}

impl Target {
    fn wake(self, grant: Option<Grant>) {
        match self {
            Target::Slot(s) => {
                if let Some(g) = grant {
                    *s.grant.lock().unwrap() = Some(g);
                }
                s.wake()
            }
            Target::Hook(h) => h.wake(),
        }
    }
}

/// Wakes the task registered for `lease`, if any.
pub fn notify(lease: LeaseId) {
    if let Some((t, g)) = target(lease, None) {
        t.wake(g);
    }
}

/// Wakes the task registered for the lease of `grant`, if any, handing it the grant.
pub fn notify_grant(grant: Grant) {
    if let Some((t, g)) = target(grant.lease.lease_id, Some(grant)) {
        t.wake(g);
    }
}

/// Takes the unclaimed wake-up of `lease`, if one was kept: `Some(grant pushed with it)`.
fn claim(slots: &mut Slots, lease: LeaseId) -> Option<Option<Grant>> {
    let i = slots.unclaimed.iter().position(|(l, _)| *l == lease)?;
    slots.unclaimed.remove(i).map(|(_, g)| g)
}

/// A registration; unregisters on drop.
#[derive(Debug)]
pub struct Registration {
    lease: LeaseId,
    slot: Arc<Slot>,
}

impl Registration {
    /// Registers before the store call that may lead to a wake-up.
    pub fn new(lease: LeaseId) -> Self {
        let slot = Arc::new(Slot::default());
        shard(lease)
            .lock()
            .unwrap()
            .by_lease
            .insert(lease, Entry::Slot(Arc::clone(&slot)));
        Registration { lease, slot }
    }

    /// Registers after the store call answered (see `Slots::unclaimed`): a wake-up that
    /// came in between is delivered at once.
    pub fn late(lease: LeaseId) -> Self {
        let slot = Arc::new(Slot::default());
        let mut slots = shard(lease).lock().unwrap();
        slots.by_lease.insert(lease, Entry::Slot(Arc::clone(&slot)));
        if let Some(grant) = claim(&mut slots, lease) {
            *slot.grant.lock().unwrap() = grant;
            slot.notify.notify_one();
        }
        drop(slots);
        Registration { lease, slot }
    }

    /// Resolves at the next wake-up (or at once if one arrived since the last call).
    pub async fn notified(&self) {
        self.slot.notify.notified().await
    }

    /// From now on, wake-ups for this lease also go to `hook` (at most one hook per
    /// registration; a second one is ignored).
    pub fn hand_to(&self, hook: Weak<dyn Hook>) {
        let _ = self.slot.hook.set(hook);
    }

    /// The grant pushed with a wake-up, if any (taken: a second call returns `None`).
    pub fn take_grant(&self) -> Option<Grant> {
        self.slot.grant.lock().unwrap().take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut slots = shard(self.lease).lock().unwrap();
        if let Some(Entry::Slot(s)) = slots.by_lease.get(&self.lease) {
            if Arc::ptr_eq(s, &self.slot) {
                slots.by_lease.remove(&self.lease);
            }
        }
    }
}

/// The registration of a held lease whose acquire never waited: wake-ups (revocations) go to
/// its hook only, and no slot is made for a task that will never wait on it. Made after the
/// grant; a wake-up that came before is delivered to the hook at once. Unregisters on drop.
#[derive(Debug)]
pub struct HookRegistration {
    lease: LeaseId,
}

impl HookRegistration {
    pub fn new(lease: LeaseId, hook: &Arc<dyn Hook>) -> Self {
        let mut slots = shard(lease).lock().unwrap();
        slots
            .by_lease
            .insert(lease, Entry::Hook(Arc::downgrade(hook)));
        let missed = claim(&mut slots, lease).is_some();
        drop(slots);
        if missed {
            Arc::clone(hook).wake();
        }
        HookRegistration { lease }
    }
}

impl Drop for HookRegistration {
    fn drop(&mut self) {
        let mut slots = shard(self.lease).lock().unwrap();
        if let Some(Entry::Hook(_)) = slots.by_lease.get(&self.lease) {
            slots.by_lease.remove(&self.lease);
        }
    }
}
