//! The waiters' watches: each waiter of this backend watches exactly what can let it in
//! (see the [store's docs](super)), and a watch event wakes only that waiter
//! ([`tessera_core::wake::notify`]), whose next heartbeat re-reads the semaphore and decides.
//!
//! A watch covers everything after the snapshot its waiter decided on (revision `R`), so
//! nothing that happened between the read and the watch is missed. It is opened from etcd's
//! current revision, not from `R + 1`: etcd serves a watcher whose start revision is behind
//! its current one from history, and puts it in sync only on a loop that runs every 100 ms,
//! so on a busy semaphore nearly every wait paid up to 100 ms before its first event (W2 on
//! one local etcd: p50 191 ms, 39 hand-offs/s). The reply that creates a watcher carries the
//! revision `H` it starts after; if `H > R`, something happened in between. The head is then
//! woken at once to read again (its heartbeat; the running watch covers what follows that
//! read). A waiter behind another depends on two keys only, the one ahead and its own: it
//! reads both once its watchers have started, and is woken only if either changed after `R`
//! (when thousands join at once, nearly every watcher starts after a few more joined, and
//! waking each to read the whole queue cost a read of the queue per waiter). A waiter that
//! joined a long queue watches the record the tail named without having read it
//! (`EtcdBackend::join`): it makes that read whatever its watchers' start, and is also woken
//! if that record no longer waits. The head's
//! watch of the capacity carries each put's previous value, and a put that leaves the value
//! as it was (every join puts it again, `Keys::capacity_shared`) does not wake it.
//!
//! etcd-client does not re-establish a watch; this module does: when a watch stream breaks
//! (the connection dropped, the member went away or stopped answering) it is opened again on
//! the next member, and when the backend's requests move to another member
//! ([`Members::changes`]) it follows them, each time checked against the same `R` (a member
//! behind the one read from starts the watch before `R`, whose events only wake the waiter
//! again). When the server cancels a watch, or no member answers, the waiter is woken, and
//! its heartbeat reads the semaphore afresh and sets a new watch from that read. A gap
//! therefore costs one extra read, never a lost wake-up.
//!
//! **Quiet watches.** Every such wake-up (an event, a watcher created after a gap, a watch
//! that ended) is stamped from one counter per backend ([`Watches::now`]). A waiter's place
//! can improve only through something its watch reports, so a heartbeat whose waiter's
//! watch is in sync and has stamped nothing since the heartbeat's last full read began
//! ([`Watches::quiet_since`]) needs no read at all: the watch reports every write and the
//! deletion of its own record too, so it only keeps the sessions alive
//! (`EtcdBackend::heartbeat`; a waiter session replaced since the read takes the full path). Without
//! this, every heartbeat of every waiter read the whole semaphore, so one process with
//! 10,000 waiters sent 10,000 reads of 10,000 records every second; reading its own record
//! still made them 10,000 reads a second.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use std::time::Duration;

use etcd_client::{EventType, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions};
use tokio::task::JoinHandle;

use super::held::{HeldHere, HeldMap};
use super::members::{timed_out, Members, ATTEMPT_TIMEOUT};
use super::ops::{Entry, Keys, Record};
use tessera_core::model::{LeaseId, StoreTime};
use tessera_core::wake;

/// What a waiter watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// The head of the queue: every deletion of a `q/` key (a holder leaving frees
    /// permits) and the capacity key (a resize).
    Head { queue: String, cap: String },
    /// Behind another waiter: that waiter's key (granted: this one may be the head now;
    /// deleted: this one moved up). `known_waiting`: the read the waiter decided on saw
    /// that record waiting; `false` for the record a join's tail named, unread
    /// (`EtcdBackend::join`), which the watch reads once its watchers have started.
    Behind { ahead: String, known_waiting: bool },
}

impl Target {
    /// Whether a running watch of this target also serves `other`: it watches the same
    /// keys (a watch of a record not yet known to wait checks it all the same).
    fn covers(&self, other: &Target) -> bool {
        match (self, other) {
            (Target::Behind { ahead: a, .. }, Target::Behind { ahead: b, .. }) => a == b,
            _ => self == other,
        }
    }
}

struct Watch {
    target: Target,
    generation: u64,
    task: JoinHandle<()>,
    state: Arc<WatchState>,
}

/// What a running watch has seen (see "Quiet watches" in the module docs).
#[derive(Default)]
struct WatchState {
    /// Every watcher of the current stream was created with nothing missed since the
    /// snapshot it covers.
    in_sync: AtomicBool,
    /// The stamp of its last wake-up (0: none).
    woke: AtomicU64,
}

/// The watches of one backend's waiters, by lease id.
pub(super) struct Watches {
    members: Arc<Members>,
    held: HeldMap,
    map: Mutex<(u64, HashMap<LeaseId, Watch>)>,
    /// Stamps wake-ups; only ever grows.
    clock: Arc<AtomicU64>,
}

impl Watches {
    pub(super) fn new(members: Arc<Members>, held: HeldMap) -> Arc<Watches> {
        Arc::new(Watches {
            members,
            held,
            map: Mutex::new((0, HashMap::new())),
            clock: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The stamp of the latest wake-up: taken before a full read, it is what
    /// [`Watches::quiet_since`] compares.
    pub(super) fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// Whether `id`'s watch is running, in sync, and has woken it for nothing since stamp
    /// `since` (from [`Watches::now`] before the read that set or kept it): nothing that can
    /// let `id` in happened after that read.
    pub(super) fn quiet_since(&self, id: LeaseId, since: u64) -> bool {
        let map = self.map.lock().unwrap();
        map.1.get(&id).is_some_and(|w| {
            !w.task.is_finished()
                && w.state.in_sync.load(Ordering::SeqCst)
                && w.state.woke.load(Ordering::SeqCst) <= since
        })
    }

    /// Makes `id` watch `target` from revision `from` on, unless it already watches it (a
    /// running watch of the same target started earlier, so it misses nothing either).
    pub(super) fn set(self: &Arc<Self>, id: LeaseId, target: Target, keys: &Keys, from: i64) {
        let mut map = self.map.lock().unwrap();
        if let Some(w) = map.1.get(&id) {
            if w.target.covers(&target) && !w.task.is_finished() {
                return;
            }
            w.task.abort();
        }
        map.0 += 1;
        let generation = map.0;
        let state = Arc::new(WatchState::default());
        let task = tokio::spawn(run(
            Arc::downgrade(self),
            Arc::clone(&self.members),
            id,
            (target.clone(), keys.clone()),
            from,
            (generation, Arc::clone(&state), Arc::clone(&self.clock)),
        ));
        map.1.insert(
            id,
            Watch {
                target,
                generation,
                task,
                state,
            },
        );
    }

    /// `id` no longer waits.
    pub(super) fn stop(&self, id: LeaseId) {
        if let Some(w) = self.map.lock().unwrap().1.remove(&id) {
            w.task.abort();
        }
    }

    pub(super) fn stop_all(&self) {
        for (_, w) in self.map.lock().unwrap().1.drain() {
            w.task.abort();
        }
    }
}

/// How a watch stream ended.
enum Ended {
    /// A grant of the waiter's own record was pushed to it: the watch is done.
    Granted,
    /// Cancelled by the server or compacted past its start: the waiter must read again.
    Reread,
    /// The backend moved to another member: reopen there.
    Failover,
    /// The stream broke or its member did not answer: reopen on the next member.
    Broken(etcd_client::Error),
}

/// Wakes waiter `id`, stamped on its watch's state.
fn wake(id: LeaseId, state: &WatchState, clock: &AtomicU64) {
    state
        .woke
        .store(clock.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
    wake::notify(id);
}

async fn run(
    watches: Weak<Watches>,
    members: Arc<Members>,
    id: LeaseId,
    (target, keys): (Target, Keys),
    from: i64,
    (generation, state, clock): (u64, Arc<WatchState>, Arc<AtomicU64>),
) {
    let mut changes = members.changes();
    let mut failures = 0;
    let mut backoff = Duration::from_millis(20);
    let granted = loop {
        changes.borrow_and_update();
        let member = members.current();
        // Reopened from the member's current revision and checked against the same
        // snapshot: nothing after the snapshot the waiter decided on is missed.
        match watch_once(
            &watches,
            &members,
            member,
            id,
            (&target, &keys),
            (from, &state, &clock),
            &mut changes,
        )
        .await
        {
            Ended::Granted => break true,
            Ended::Reread => break false,
            Ended::Failover => failures = 0,
            Ended::Broken(e) => {
                tracing::debug!(lease = %id, error = %e, "etcd watch broke; reopening it on the next member");
                members.failed(member);
                failures += 1;
                if failures > 2 * members.len() {
                    // No member answers: the waiter's heartbeat is the safety net (it reads
                    // again, through the same failover, and sets a new watch).
                    break false;
                }
                if failures % members.len() == 0 {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(400));
                }
            }
        }
    };
    // The watch ended: forget it (unless a newer one replaced it) and wake the waiter, whose
    // heartbeat reads the semaphore again and sets a new watch.
    if let Some(w) = watches.upgrade() {
        let mut map = w.map.lock().unwrap();
        if map.1.get(&id).is_some_and(|w| w.generation == generation) {
            map.1.remove(&id);
        }
    }
    if !granted {
        wake(id, &state, &clock);
    }
}

/// One watch stream on `member`, covering revision `from` on (see the module docs), until it
/// ends.
async fn watch_once(
    watches: &Weak<Watches>,
    members: &Members,
    member: usize,
    id: LeaseId,
    (target, keys): (&Target, &Keys),
    (from, state, clock): (i64, &WatchState, &AtomicU64),
    changes: &mut tokio::sync::watch::Receiver<u64>,
) -> Ended {
    // In sync again only once every watcher of this stream is created.
    state.in_sync.store(false, Ordering::SeqCst);
    let mut to_create = match target {
        Target::Head { .. } => 3,
        Target::Behind { .. } => 2,
    };
    let own = keys.lease(id);
    let open = async {
        let mut client = members.client(member).await?;
        let (key, options) = match target {
            Target::Head { queue, .. } => (
                queue.clone(),
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoPut]),
            ),
            Target::Behind { ahead, .. } => (ahead.clone(), WatchOptions::new()),
        };
        // From etcd's current revision (no start revision): in sync at once.
        let mut stream = client.watch(key, Some(options)).await?;
        if let Target::Head { cap, .. } = target {
            // With the value before each put: every waiter that joins puts the capacity
            // again, unchanged (`Keys::capacity_shared`), which must not wake the head.
            let options = WatchOptions::new().with_prev_key();
            stream.watch(cap.clone(), Some(options)).await?;
        }
        // Its own record: a release that hands it the permits writes the grant there; a
        // deletion (swept, purged, deleted by an admin, its session ended) wakes it too, so
        // a quiet watch also says the record is still there as last read.
        stream.watch(own.clone(), None).await?;
        Ok::<_, etcd_client::Error>(stream)
    };
    let mut stream = match tokio::time::timeout(ATTEMPT_TIMEOUT, open).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Ended::Broken(e),
        Err(_) => return Ended::Broken(timed_out("opening a watch")),
    };
    // A watcher of a waiter behind another started after writes it has not seen.
    let mut missed = false;
    loop {
        // A black-holed member's stream neither answers nor closes until the connection's
        // HTTP/2 keep-alive gives up; a failover of the backend's requests moves it sooner.
        let resp = tokio::select! {
            r = stream.message() => r,
            _ = changes.changed() => return Ended::Failover,
        };
        let resp = match resp {
            Ok(Some(r)) => r,
            Ok(None) => {
                return Ended::Broken(etcd_client::Error::WatchError(
                    "the watch stream ended".into(),
                ))
            }
            Err(e) => return Ended::Broken(e),
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            // Cancelled by the server (or, as a server may still report, compacted): re-read.
            return Ended::Reread;
        }
        // A watcher created: it starts after the reply's revision. Anything between the
        // waiter's snapshot and that is not in it: the waiter reads again.
        if resp.created() {
            if resp.header().is_some_and(|h| h.revision() >= from) {
                match target {
                    Target::Head { .. } => wake(id, state, clock),
                    Target::Behind { .. } => missed = true,
                }
            }
            to_create -= 1;
            if to_create == 0 {
                if let Target::Behind {
                    ahead,
                    known_waiting,
                } = target
                {
                    // Only two keys can let it in: the waiter ahead and its own record.
                    // The one ahead still waiting and both unchanged since the snapshot
                    // (read after every watcher started): nothing it watches happened in
                    // between, and it stays asleep. With thousands of waiters joining at
                    // once, nearly every watcher starts after a few more joined, and waking
                    // each to read the queue cost a read of the whole queue per waiter. A
                    // record the tail named was never read: this read is its only one.
                    if (missed || !known_waiting)
                        && !still_behind(members, member, ahead, &own, from).await
                    {
                        wake(id, state, clock);
                    }
                }
                state.in_sync.store(true, Ordering::SeqCst);
            }
        }
        let mut woken = false;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            if ev.event_type() == EventType::Put && kv.key() == own.as_bytes() {
                if let Some(w) = watches.upgrade() {
                    if w.pushed_grant(id, keys, kv) {
                        return Ended::Granted;
                    }
                }
            }
            // The capacity put again as it was: nothing for the head.
            let same_capacity = matches!(target, Target::Head { cap, .. } if kv.key() == cap.as_bytes())
                && ev.event_type() == EventType::Put
                && ev.prev_kv().is_some_and(|p| p.value() == kv.value());
            woken |= !same_capacity;
        }
        if woken {
            wake(id, state, clock);
        }
    }
}

/// Whether the record `ahead` still waits and it and the waiter's own record `own` were
/// last written before revision `from`, read on `member` now (`false` if the read fails):
/// then nothing that can let the waiter in happened since the snapshot it decided on. (A
/// waiting record is written again only by its grant.)
async fn still_behind(members: &Members, member: usize, ahead: &str, own: &str, from: i64) -> bool {
    let read = async {
        let mut client = members.client(member).await?;
        let txn = Txn::new().and_then([ahead, own].map(|k| TxnOp::get(k, None)));
        client.txn(txn).await
    };
    let Ok(Ok(resp)) = tokio::time::timeout(ATTEMPT_TIMEOUT, read).await else {
        return false;
    };
    let kv = |op: Option<&TxnOpResponse>| match op {
        Some(TxnOpResponse::Get(g)) => g
            .kvs()
            .first()
            .filter(|kv| kv.mod_revision() < from)
            .cloned(),
        _ => None,
    };
    let ops = resp.op_responses();
    let waiting =
        |kv: &etcd_client::KeyValue| Record::decode(kv.value()).is_ok_and(|r| r.g.is_none());
    kv(ops.first()).is_some_and(|a| waiting(&a)) && kv(ops.get(1)).is_some()
}

impl Watches {
    /// A put of `id`'s own record seen by its watch: if it is a grant (a release handed it
    /// the permits), noted as held and pushed to the waiter with the wake-up, sparing it
    /// the round trip that would ask. The grant is on this client's session of the lease
    /// TTL, or, provisional, of the waiter TTL (the one its queue entry was on); this client
    /// kept either alive after the waiter's last request was sent, so the waiter's bound
    /// (that send time + the session's TTL) holds.
    fn pushed_grant(&self, id: LeaseId, keys: &Keys, kv: &etcd_client::KeyValue) -> bool {
        let Ok(record) = Record::decode(kv.value()) else {
            return false;
        };
        if record.g.is_none() {
            return false;
        }
        let entry = Entry {
            id,
            record,
            create_rev: kv.create_revision(),
            mod_rev: kv.mod_revision(),
            lease: kv.lease(),
        };
        let (held, grant) = HeldHere::new(keys, &entry, StoreTime::host_now());
        self.held.lock().unwrap().insert(id, held);
        wake::notify_grant(grant);
        true
    }
}
