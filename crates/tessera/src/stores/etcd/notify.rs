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
//! **One watch stream per backend.** etcd's Watch RPC carries many watchers on one
//! bidirectional stream, told apart by watch id. Every waiter of this backend has its
//! watchers (two or three) on one shared stream to the member the backend talks to: a
//! waiter's arrival sends a create request per key, its departure a cancel request per
//! watcher, and neither opens or resets an HTTP/2 stream. (Each waiter used to open a stream
//! of its own and reset it when it left. When thousands left at once, the server's frames
//! still in flight on streams h2 no longer remembered made h2 reset them again, and past
//! 1,024 such resets h2 closed the whole connection, `too_many_internal_resets`, failing
//! every request of the process.) The shared stream keeps these rules:
//!
//! - *Routing.* etcd answers the creates of one stream in the order they were sent, and
//!   sends a watcher's events only after the answer that created it. Each create is queued
//!   with its route (waiter, its registration's generation, the key's role) when it is
//!   sent; the answer pops the queue's front and binds the watch id etcd chose to that
//!   route. Events go by watch id to their waiter only. A watcher whose waiter left or was
//!   given another target meanwhile is cancelled as soon as its create is answered; events of
//!   an id with no route (cancelled, or of a waiter that left) are dropped.
//! - *Registration.* A waiter is registered from the watch set on it until it is granted,
//!   leaves, or is woken by the end of its watch. While registered, its watchers are created
//!   on the current stream, or their creates are on their way (it is not in sync), or no
//!   stream is open and the next one creates them.
//! - *A broken stream* (the connection dropped, the member went away or stopped answering)
//!   is opened again on the next member, and a move of the backend's requests to another
//!   member ([`Members::changes`]) moves it there. Every route of the old stream is
//!   forgotten, and every registered waiter's watchers are created again on the new one,
//!   each checked against its own `R` as above (a member behind the one read from starts
//!   a watcher before `R`, whose events only wake the waiter again). When no member answers
//!   within two rounds, every registered waiter is woken and unregistered: its heartbeat
//!   reads the semaphore afresh (through the same failover) and sets a new watch.
//! - *A watcher the server ends* (cancelled, compacted past its start, or a create refused)
//!   ends its waiter's registration: its other watchers are cancelled and it is woken to read
//!   again. A put of the waiter's own record that is a grant ends it too, the grant pushed
//!   with the wake-up. A gap therefore costs one extra read, never a lost wake-up.
//!
//! One task per backend reads the stream and routes; a second writes the requests, so that
//! thousands of creates sent at once never keep the reader from draining the answers etcd
//! must send before it reads more requests. The stream is opened with the first waiter and
//! kept while the backend lives (an idle stream costs etcd nothing).
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

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use std::time::Duration;

use etcd_client::{
    EventType, KeyValue, Txn, TxnOp, TxnOpResponse, WatchFilterType, WatchOptions,
    WatchRequestSender, WatchResponse,
};
use tokio::sync::{mpsc, Notify};
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

/// Which key of its waiter a watcher watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// The head's: every deletion under `q/`.
    Queue,
    /// The head's: the capacity, with each put's previous value.
    Capacity,
    /// The record ahead of a waiter behind another.
    Ahead,
    /// The waiter's own record.
    Own,
}

/// Whose a watcher of the stream is: a waiter's registration (its generation) and the key.
#[derive(Debug, Clone, Copy)]
struct Route {
    id: LeaseId,
    generation: u64,
    role: Role,
}

/// A request for the stream's writer.
enum Request {
    Create(String, WatchOptions),
    Cancel(i64),
}

/// A registered waiter (see "Registration" in the module docs).
struct Waiter {
    target: Target,
    keys: Keys,
    /// The first revision its watch must cover: `R + 1`.
    from: i64,
    generation: u64,
    /// Watch ids of its watchers created on the current stream.
    ids: Vec<i64>,
    /// Its watchers whose creates were sent on the current stream and not yet answered.
    to_create: usize,
    /// Behind another waiter: a watcher started after writes it has not seen.
    missed: bool,
    /// Every watcher created on the current stream, with nothing missed since `R`.
    in_sync: bool,
    /// The stamp of its last wake-up (0: none).
    woke: u64,
}

/// The stream open now (or being opened), as `set` and `stop` see it.
struct Link {
    epoch: u64,
    requests: mpsc::UnboundedSender<Request>,
}

/// Everything the shared stream routes by, under one lock.
#[derive(Default)]
struct Registry {
    /// Numbers registrations; only ever grows.
    generation: u64,
    /// Numbers streams; only ever grows.
    epoch: u64,
    waiters: HashMap<LeaseId, Waiter>,
    /// Watch id → route, on the current stream.
    routes: HashMap<i64, Route>,
    /// Creates sent on the current stream and not yet answered, in the order sent.
    pending: VecDeque<Route>,
    link: Option<Link>,
}

/// The watches of one backend's waiters, on one shared stream.
pub(super) struct Watches {
    members: Arc<Members>,
    held: HeldMap,
    registry: Mutex<Registry>,
    /// Stamps wake-ups; only ever grows.
    clock: AtomicU64,
    /// The task that opens the stream and reads it (started by the first watch set).
    reader: Mutex<Option<JoinHandle<()>>>,
    /// A waiter was registered while no stream was open.
    kick: Arc<Notify>,
}

/// What the reader does once the registry's lock is released.
enum After {
    /// Wake this waiter (already stamped).
    Wake(LeaseId),
    /// A put of the waiter's own record: a grant ends its watch, anything else wakes it.
    OwnPut(Route, Keys, KeyValue),
    /// Read the record ahead and the waiter's own (see [`still_behind`]).
    Check {
        route: Route,
        epoch: u64,
        ahead: String,
        own: String,
        from: i64,
    },
}

impl Watches {
    pub(super) fn new(members: Arc<Members>, held: HeldMap) -> Arc<Watches> {
        Arc::new(Watches {
            members,
            held,
            registry: Mutex::default(),
            clock: AtomicU64::new(0),
            reader: Mutex::new(None),
            kick: Arc::new(Notify::new()),
        })
    }

    /// The stamp of the latest wake-up: taken before a full read, it is what
    /// [`Watches::quiet_since`] compares.
    pub(super) fn now(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// Whether `id`'s watch is registered, in sync, and has woken it for nothing since stamp
    /// `since` (from [`Watches::now`] before the read that set or kept it): nothing that can
    /// let `id` in happened after that read.
    pub(super) fn quiet_since(&self, id: LeaseId, since: u64) -> bool {
        let reg = self.registry.lock().unwrap();
        reg.link.is_some()
            && reg
                .waiters
                .get(&id)
                .is_some_and(|w| w.in_sync && w.woke <= since)
    }

    /// Makes `id` watch `target` from revision `from` on, unless it already watches it (a
    /// registered watch of the same target started earlier, so it misses nothing either).
    pub(super) fn set(self: &Arc<Self>, id: LeaseId, target: Target, keys: &Keys, from: i64) {
        // First (the reader's lock before the registry's, always): a reader started anew
        // creates every registered waiter's watchers.
        self.start_reader();
        let mut reg = self.registry.lock().unwrap();
        if reg
            .waiters
            .get(&id)
            .is_some_and(|w| w.target.covers(&target))
        {
            return;
        }
        reg.unregister(id);
        reg.generation += 1;
        let waiter = Waiter {
            target,
            keys: keys.clone(),
            from,
            generation: reg.generation,
            ids: Vec::new(),
            to_create: 0,
            missed: false,
            in_sync: false,
            woke: 0,
        };
        reg.waiters.insert(id, waiter);
        let open = reg.link.is_some();
        if open {
            reg.create(id);
        }
        drop(reg);
        if !open {
            self.kick.notify_one();
        }
    }

    /// `id` no longer waits.
    pub(super) fn stop(&self, id: LeaseId) {
        self.registry.lock().unwrap().unregister(id);
    }

    /// Ends every watch and the stream (the backend is dropped).
    pub(super) fn stop_all(&self) {
        if let Some(r) = self.reader.lock().unwrap().take() {
            r.abort();
        }
        let mut reg = self.registry.lock().unwrap();
        reg.waiters.clear();
        reg.broken();
    }

    /// Starts the reader task unless it runs (it ends with the runtime it ran on).
    fn start_reader(self: &Arc<Self>) {
        let mut reader = self.reader.lock().unwrap();
        if reader.as_ref().is_none_or(|r| r.is_finished()) {
            // A new reader opens a new stream: the old one's routes mean nothing to it.
            self.registry.lock().unwrap().broken();
            *reader = Some(tokio::spawn(read(Arc::downgrade(self))));
        }
    }

    /// Stamps a wake-up of `w` and returns the stamp.
    fn stamp(&self, w: Option<&mut Waiter>) -> u64 {
        let at = self.clock.fetch_add(1, Ordering::SeqCst) + 1;
        if let Some(w) = w {
            w.woke = at;
        }
        at
    }
}

impl Registry {
    /// Sends the creates of `id`'s watchers on the current stream.
    fn create(&mut self, id: LeaseId) {
        let Registry {
            waiters,
            pending,
            link,
            ..
        } = self;
        let (Some(link), Some(w)) = (link.as_ref(), waiters.get_mut(&id)) else {
            return;
        };
        let mut watchers = match &w.target {
            Target::Head { queue, cap } => vec![
                (
                    Role::Queue,
                    queue.clone(),
                    WatchOptions::new()
                        .with_prefix()
                        .with_filters([WatchFilterType::NoPut]),
                ),
                // With the value before each put: every waiter that joins puts the capacity
                // again, unchanged (`Keys::capacity_shared`), which must not wake the head.
                (
                    Role::Capacity,
                    cap.clone(),
                    WatchOptions::new().with_prev_key(),
                ),
            ],
            Target::Behind { ahead, .. } => {
                vec![(Role::Ahead, ahead.clone(), WatchOptions::new())]
            }
        };
        // Its own record: a release that hands it the permits writes the grant there; a
        // deletion (swept, purged, deleted by an admin, its session ended) wakes it too, so
        // a quiet watch also says the record is still there as last read.
        watchers.push((Role::Own, w.keys.lease(id), WatchOptions::new()));
        w.ids.clear();
        w.to_create = watchers.len();
        w.missed = false;
        w.in_sync = false;
        for (role, key, options) in watchers {
            pending.push_back(Route {
                id,
                generation: w.generation,
                role,
            });
            // Dropped only with the stream, which then creates every watcher again.
            let _ = link.requests.send(Request::Create(key, options));
        }
    }

    /// Cancels watcher `watch_id` of the current stream and forgets its route.
    fn cancel(&mut self, watch_id: i64) {
        self.routes.remove(&watch_id);
        if let Some(link) = &self.link {
            let _ = link.requests.send(Request::Cancel(watch_id));
        }
    }

    /// Unregisters `id`, cancelling its watchers (a create still unanswered is cancelled
    /// once answered).
    fn unregister(&mut self, id: LeaseId) -> Option<Waiter> {
        let w = self.waiters.remove(&id)?;
        for &watch_id in &w.ids {
            self.cancel(watch_id);
        }
        Some(w)
    }

    /// The route of `watch_id`, if its waiter's registration is still the one it was made
    /// for.
    fn live(&self, watch_id: i64) -> Option<Route> {
        let route = *self.routes.get(&watch_id)?;
        self.current(route).then_some(route)
    }

    fn current(&self, route: Route) -> bool {
        self.waiters
            .get(&route.id)
            .is_some_and(|w| w.generation == route.generation)
    }

    /// The stream is gone: every route goes with it, and every registered waiter waits
    /// for the next stream to create its watchers.
    fn broken(&mut self) {
        self.link = None;
        self.routes.clear();
        self.pending.clear();
        for w in self.waiters.values_mut() {
            w.ids.clear();
            w.to_create = 0;
            w.in_sync = false;
        }
    }
}

/// How a stream ended.
enum Ended {
    /// The backend moved to another member: reopen there.
    Failover,
    /// The stream broke or its member did not answer: reopen on the next member.
    Broken(etcd_client::Error),
    /// Every waiter left before the stream was opened.
    Idle,
    /// The backend is gone.
    Dropped,
}

/// The reader task: opens the shared stream on the current member while waiters are
/// registered, routes what it receives, and opens it again when it ends (see the module
/// docs).
async fn read(watches: Weak<Watches>) {
    let Some(members) = watches.upgrade().map(|w| Arc::clone(&w.members)) else {
        return;
    };
    let mut changes = members.changes();
    let mut failures = 0;
    let mut backoff = Duration::from_millis(20);
    loop {
        // Opened with the first waiter: until then there is nothing to create on it.
        loop {
            let Some(w) = watches.upgrade() else { return };
            if !w.registry.lock().unwrap().waiters.is_empty() {
                break;
            }
            let kick = Arc::clone(&w.kick);
            drop(w);
            kick.notified().await;
        }
        changes.borrow_and_update();
        let member = members.current();
        let ended = stream(&watches, &members, member, &mut changes, &mut failures).await;
        // At once: no waiter is in sync on a stream that ended.
        if let Some(w) = watches.upgrade() {
            w.registry.lock().unwrap().broken();
        }
        match ended {
            Ended::Dropped => return,
            Ended::Idle => {}
            Ended::Failover => failures = 0,
            Ended::Broken(e) => {
                tracing::debug!(error = %e, "etcd watch stream broke; reopening it on the next member");
                members.failed(member);
                failures += 1;
                if failures > 2 * members.len() {
                    // No member answers: each waiter's heartbeat is the safety net (it reads
                    // again, through the same failover, and sets a new watch).
                    failures = 0;
                    let Some(w) = watches.upgrade() else { return };
                    let woken: Vec<LeaseId> = {
                        let mut reg = w.registry.lock().unwrap();
                        reg.waiters.drain().map(|(id, _)| id).collect()
                    };
                    w.stamp(None);
                    for id in woken {
                        wake::notify(id);
                    }
                    continue;
                }
                if failures % members.len() == 0 {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(400));
                }
            }
        }
    }
}

/// One stream on `member`: every registered waiter's watchers created on it, then its
/// answers routed, until it ends.
async fn stream(
    watches: &Weak<Watches>,
    members: &Members,
    member: usize,
    changes: &mut tokio::sync::watch::Receiver<u64>,
    failures: &mut usize,
) -> Ended {
    let Some(w) = watches.upgrade() else {
        return Ended::Dropped;
    };
    // The creates of every registered waiter, queued in order; the first opens the stream.
    let (epoch, requests, first) = {
        let mut reg = w.registry.lock().unwrap();
        reg.broken();
        reg.epoch += 1;
        let epoch = reg.epoch;
        let (tx, mut rx) = mpsc::unbounded_channel();
        reg.link = Some(Link {
            epoch,
            requests: tx,
        });
        let ids: Vec<LeaseId> = reg.waiters.keys().copied().collect();
        for id in ids {
            reg.create(id);
        }
        match rx.try_recv() {
            Ok(Request::Create(key, options)) => (epoch, rx, (key, options)),
            // Every waiter left meanwhile: nothing to open the stream with.
            _ => return Ended::Idle,
        }
    };
    let open = async {
        let mut client = members.client(member).await?;
        client.watch(first.0, Some(first.1)).await
    };
    let stream = match tokio::time::timeout(ATTEMPT_TIMEOUT, open).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Ended::Broken(e),
        Err(_) => return Ended::Broken(timed_out("opening a watch stream")),
    };
    drop(w);
    let (sender, mut responses) = stream.split();
    let _writer = AbortOnDrop(tokio::spawn(write(sender, requests)));
    loop {
        // A black-holed member's stream neither answers nor closes until the connection's
        // HTTP/2 keep-alive gives up; a failover of the backend's requests moves it sooner.
        let resp = tokio::select! {
            r = responses.message() => r,
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
        *failures = 0;
        let Some(w) = watches.upgrade() else {
            return Ended::Dropped;
        };
        let after = w.route(&resp, epoch);
        w.after(after, member);
    }
}

/// Aborts its task when dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The writer task: sends the creates and cancels in the order they were queued.
async fn write(mut sender: WatchRequestSender, mut requests: mpsc::UnboundedReceiver<Request>) {
    while let Some(r) = requests.recv().await {
        let sent = match r {
            Request::Create(key, options) => sender.watch(key, Some(options)).await,
            Request::Cancel(id) => sender.cancel(id).await,
        };
        if sent.is_err() {
            // The stream ended: the reader sees it too and opens another.
            return;
        }
    }
}

impl Watches {
    /// Routes one answer of stream `epoch` (see "Routing" in the module docs); what needs
    /// no lock is returned to be done after.
    fn route(&self, resp: &WatchResponse, epoch: u64) -> Vec<After> {
        let mut after = Vec::new();
        let mut reg = self.registry.lock().unwrap();
        if reg.link.as_ref().is_none_or(|l| l.epoch != epoch) {
            return after;
        }
        let watch_id = resp.watch_id();
        if resp.created() {
            let Some(route) = reg.pending.pop_front() else {
                return after;
            };
            let refused = resp.canceled() || watch_id < 0;
            if !reg.current(route) {
                // Its waiter left or was given another target while the create was on its
                // way.
                if !refused {
                    reg.cancel(watch_id);
                }
                return after;
            }
            if refused {
                self.end(&mut reg, route.id, &mut after);
                return after;
            }
            reg.routes.insert(watch_id, route);
            let w = reg.waiters.get_mut(&route.id).expect("current");
            w.ids.push(watch_id);
            // The watcher starts after the reply's revision. Anything between the waiter's
            // snapshot and that is not in it: the waiter reads again.
            if resp.header().is_some_and(|h| h.revision() >= w.from) {
                match w.target {
                    Target::Head { .. } => {
                        self.stamp(Some(w));
                        after.push(After::Wake(route.id));
                    }
                    Target::Behind { .. } => w.missed = true,
                }
            }
            w.to_create -= 1;
            if w.to_create == 0 {
                match &w.target {
                    Target::Behind {
                        ahead,
                        known_waiting,
                    } if w.missed || !known_waiting => {
                        // In sync once the read below says whether it must be woken.
                        after.push(After::Check {
                            route,
                            epoch,
                            ahead: ahead.clone(),
                            own: w.keys.lease(route.id),
                            from: w.from,
                        });
                    }
                    _ => w.in_sync = true,
                }
            }
            return after;
        }
        let Some(route) = reg.live(watch_id) else {
            // Cancelled (this answer may be the cancel's), or of a waiter that left.
            return after;
        };
        if resp.canceled() || resp.compact_revision() > 0 {
            // Cancelled by the server (or, as a server may still report, compacted).
            reg.routes.remove(&watch_id);
            self.end(&mut reg, route.id, &mut after);
            return after;
        }
        let w = reg.waiters.get_mut(&route.id).expect("live");
        let mut woken = false;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let put = ev.event_type() == EventType::Put;
            if put && route.role == Role::Own {
                // A grant ends the watch; anything else wakes the waiter, which reads all.
                after.push(After::OwnPut(route, w.keys.clone(), kv.clone()));
                return after;
            }
            // The capacity put again as it was: nothing for the head.
            let same_capacity = route.role == Role::Capacity
                && put
                && ev.prev_kv().is_some_and(|p| p.value() == kv.value());
            woken |= !same_capacity;
        }
        if woken {
            self.stamp(Some(w));
            after.push(After::Wake(route.id));
        }
        after
    }

    /// Unregisters `id` (its watch ended) and wakes it to read again.
    fn end(&self, reg: &mut Registry, id: LeaseId, after: &mut Vec<After>) {
        if reg.unregister(id).is_some() {
            self.stamp(None);
            after.push(After::Wake(id));
        }
    }

    /// Does what [`Watches::route`] left for after the lock.
    fn after(self: &Arc<Self>, after: Vec<After>, member: usize) {
        let mut woken = Vec::new();
        for a in after {
            match a {
                After::Wake(id) => woken.push(id),
                After::OwnPut(route, keys, kv) => {
                    if self.pushed_grant(route.id, &keys, &kv) {
                        // Granted: its watch is done, and the grant was its wake-up.
                        let mut reg = self.registry.lock().unwrap();
                        if reg.current(route) {
                            reg.unregister(route.id);
                        }
                    } else {
                        let mut reg = self.registry.lock().unwrap();
                        if reg.current(route) {
                            self.stamp(reg.waiters.get_mut(&route.id));
                            woken.push(route.id);
                        }
                    }
                }
                After::Check {
                    route,
                    epoch,
                    ahead,
                    own,
                    from,
                } => {
                    let watches = Arc::downgrade(self);
                    let members = Arc::clone(&self.members);
                    tokio::spawn(async move {
                        let still = still_behind(&members, member, &ahead, &own, from).await;
                        let Some(w) = watches.upgrade() else { return };
                        let wake_it = {
                            let mut reg = w.registry.lock().unwrap();
                            if reg.link.as_ref().is_none_or(|l| l.epoch != epoch)
                                || !reg.current(route)
                            {
                                return;
                            }
                            let waiter = reg.waiters.get_mut(&route.id).expect("current");
                            waiter.in_sync = true;
                            if !still {
                                w.stamp(Some(waiter));
                            }
                            !still
                        };
                        if wake_it {
                            wake::notify(route.id);
                        }
                    });
                }
            }
        }
        woken.dedup();
        for id in woken {
            wake::notify(id);
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
