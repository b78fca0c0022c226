//! The lease keeper: one background task per tokio runtime keeps every lease held in that
//! runtime alive, following the rules of `crate::lease::permit` (when to renew, until when a lease is
//! certainly valid, when `lost()` fires).
//!
//! # Implementation details
//!
//! A [`Held`] is the state one permit shares with the keeper. On grant it enters the queue of
//! its runtime's keeper, ordered by the instant the lease next needs attention: its next
//! renewal or, while renewals fail, the moment `lost()` must fire if that comes first. The
//! keeper task sleeps until the earliest entry, takes out every entry that is due and runs
//! one *turn* per due lease ([`turn`]: fire `lost()`, or renew once), all of them at once in
//! one `FuturesUnordered`. Each turn bounds its renewal by its own deadline, so one slow or
//! hung renewal delays neither another lease's renewal nor its `lost()`. A finished turn puts
//! its lease back in the queue at its next instant, unless the lease was lost or released.
//!
//! A granted lease does not enter that ordered queue at once: it is pushed on the keeper's list
//! of new leases (a `Vec` of weak references, no ordering work), and the keeper task moves the
//! ones still held into the queue when it next looks — which it does before the earliest of
//! them is due. A lease released before then (an acquire/release loop) costs the keeper one
//! push and nothing at its release; the list is compacted when it has doubled, so released
//! leases never pile up in it.
//!
//! A lease is in exactly one [`Stage`]: new, queued under a key, in a turn, or ended
//! (released, dropped or lost). Every change of stage happens under the lease's `state` lock, which is
//! taken before the keeper's `queue` lock when both are needed; the keeper task never takes a
//! `state` lock while it holds `queue`. So a release racing with the keeper taking the entry
//! out is decided under `state`: either the release removes the entry first, or the turn
//! starts and sees the release (and a renewal in flight is abandoned at once).
//!
//! Entering and leaving the queue (grant, release, drop) take these two short locks and spawn
//! nothing. The keeper is woken only when a new entry is due before the keeper's planned
//! wake-up ([`Queue::look_by`]), which is rare: a lease enters due a keep-alive interval from
//! now, after the leases already held. A wake-up pushed for a held lease (a revocation, see
//! `tessera_core::wake`) moves its entry to now; if its turn is running, the lease gets another turn
//! as soon as this one ends.
//!
//! There is one keeper per runtime (keyed by [`tokio::runtime::Handle::id`]), started by the
//! first grant and ended after [`IDLE_LINGER`] without leases, so its task never outlives its
//! runtime, never keeps one busy, and is not restarted at every grant of an acquire/release
//! loop. A runtime that ends (a test's runtime) takes its keeper task along; a later runtime
//! gets a keeper of its own, so no lease is handed to a keeper that can no longer run. A
//! permit kept past the end of the runtime that granted it is no longer renewed; dropping it
//! releases the lease through the clean-up thread (`crate::cleanup`).

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::runtime::{self, Handle};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::conn::{Conn, Tracked};
use crate::lease::SemaphoreConfig;
use tessera_core::error::LossReason;
use tessera_core::model::*;
use tessera_core::wake;

/// The log target of loss and renewal events: the permit's, where users (and the CLI's
/// default filter) expect them.
const LOG_TARGET: &str = "tessera::permit";

/// How long a keeper without leases waits for a new one before its task ends.
const IDLE_LINGER: Duration = Duration::from_secs(1);

/// The length below which the list of new leases is never compacted.
const NEW_MIN: usize = 64;

/// A lease granted for less than half its TTL (a hand-off grant, provisional until renewed:
/// `crate::lease::permit`) is first renewed this soon after it starts, so that it is a full lease
/// by the time a store fault could meet its first renewal; a hold shorter than this (an
/// acquire/release loop) ends before and costs no renewal.
const PROVISIONAL_RENEWAL: Duration = Duration::from_millis(100);

/// A turn later than this (and than a tenth of the TTL) means the process stalled.
const STALL_MIN: Duration = Duration::from_millis(50);

/// A held lease: what the permit and the keeper share.
#[derive(Debug)]
pub(crate) struct Held {
    pub(crate) conn: Conn,
    pub(crate) config: Arc<SemaphoreConfig>,
    pub(crate) lease: Lease,
    keeper: Arc<Keeper>,
    state: Mutex<HeldState>,
    /// Cancelled when the lease is lost; made on first use, as most permits never ask.
    lost: OnceLock<CancellationToken>,
    /// Wakes a turn in progress when the permit is released or dropped.
    stop: Notify,
    /// Whoever sets this first (release, drop, `Store::close`) sends the one release.
    released: AtomicBool,
}

#[derive(Debug)]
struct HeldState {
    expires_at: StoreTime,
    valid_until: Instant,
    /// The lease's length as the last grant or renewal gave it (`crate::lease::permit`): the TTL,
    /// or less for a provisional hand-off grant. Renewals and `lost()` are timed by it.
    span: Duration,
    /// When the last acknowledged renewal was sent; at first, when the permit started.
    last_ok: Instant,
    /// The last renewal error, while renewals fail.
    failing: Option<String>,
    /// When the turn in progress (or the last one) was due.
    planned: Instant,
    loss: Option<LossReason>,
    stage: Stage,
    /// A wake-up arrived during a turn: take another one at once.
    poked: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// In the keeper's list of new leases, first due at this instant.
    New(Instant),
    Queued(Key),
    InTurn,
    Ended,
}

/// A queue entry: when it is due, and a sequence number that makes it unique.
type Key = (Instant, u64);

/// The span of a lease that the store says has `remaining` left: at most the TTL.
fn span_of(remaining: Duration, ttl: Duration) -> Duration {
    remaining.min(ttl)
}

/// The allowance for clock-rate drift between the two machines over `span`.
fn margin(span: Duration) -> Duration {
    span / 50
}

impl Tracked for Held {
    fn take_for_release(&self, lost: Option<LossReason>) -> Option<(Name, LeaseId)> {
        if !self.claim_release() {
            return None;
        }
        if let Some(reason) = lost {
            self.lose(reason);
        }
        self.stop();
        Some((self.config.name.clone(), self.lease.lease_id))
    }
}

impl Held {
    /// A granted lease, entered in the keeper of the current runtime and noted by `conn`
    /// for `Store::close` and the exit handler. `sent` is when the request that got the grant was sent.
    ///
    /// Panics outside a tokio runtime.
    pub(crate) fn start(
        conn: Conn,
        config: Arc<SemaphoreConfig>,
        grant: Grant,
        sent: Instant,
    ) -> Arc<Held> {
        let remaining = grant.lease.expires_at.since(grant.now);
        let span = span_of(remaining, config.ttl);
        // The request's send instant, not a fresh clock read: the first renewal comes a
        // little earlier, never later.
        let now = sent;
        let state = HeldState {
            expires_at: grant.lease.expires_at,
            valid_until: sent + remaining.saturating_sub(margin(span)),
            span,
            last_ok: now,
            failing: None,
            planned: now,
            loss: None,
            stage: Stage::Ended,
            poked: false,
        };
        let mut first = state.next_turn(&config, now);
        if span < config.ttl / 2 {
            first = first.min(Instant::now() + PROVISIONAL_RENEWAL);
        }
        let state = HeldState {
            stage: Stage::New(first),
            ..state
        };
        let held = Arc::new(Held {
            conn,
            config,
            lease: grant.lease,
            keeper: Keeper::current(),
            state: Mutex::new(state),
            lost: OnceLock::new(),
            stop: Notify::new(),
            released: AtomicBool::new(false),
        });
        held.keeper.enter_new(first, &held);
        crate::cleanup::arm_exit();
        let tracked: Weak<dyn Tracked> = Arc::downgrade(&held) as Weak<Held>;
        held.conn.track(tracked);
        held
    }

    /// The expiry on the store's clock as of the last renewal, and until when the lease is
    /// certainly valid on this process's clock.
    pub(crate) fn clock(&self) -> (StoreTime, Instant) {
        let st = self.state.lock().unwrap();
        (st.expires_at, st.valid_until)
    }

    pub(crate) fn loss(&self) -> Option<LossReason> {
        self.state.lock().unwrap().loss.clone()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.state.lock().unwrap().loss.is_some()
    }

    /// The token cancelled when the lease is lost.
    pub(crate) fn lost_token(&self) -> &CancellationToken {
        if let Some(token) = self.lost.get() {
            return token;
        }
        // Made under `state`, where `lose` looks for it: either `lose` finds the token and
        // cancels it, or the token is made after the loss and cancelled at once.
        let st = self.state.lock().unwrap();
        self.lost.get_or_init(|| {
            let token = CancellationToken::new();
            if st.loss.is_some() {
                token.cancel();
            }
            token
        })
    }

    /// The permit was released or dropped: no turn any more, and a renewal in flight is
    /// abandoned.
    pub(crate) fn stop(&self) {
        let mut st = self.state.lock().unwrap();
        let stage = std::mem::replace(&mut st.stage, Stage::Ended);
        drop(st);
        match stage {
            Stage::Queued(key) => self.keeper.remove(key),
            Stage::InTurn => self.stop.notify_waiters(),
            // The keeper drops it from its list of new leases when it next looks.
            Stage::New(_) | Stage::Ended => {}
        }
    }

    /// `true` for the first caller only: that one sends the lease's release.
    pub(crate) fn claim_release(&self) -> bool {
        !self.released.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn lose(&self, reason: LossReason) {
        let mut st = self.state.lock().unwrap();
        if st.loss.is_none() {
            crate::telemetry::lost(&reason);
            tracing::warn!(target: LOG_TARGET, name = %self.config.name, lease = %self.lease.lease_id, %reason, "lease lost");
            st.loss = Some(reason);
        }
        let token = self.lost.get().cloned();
        drop(st);
        if let Some(token) = token {
            token.cancel();
        }
    }

    /// The keeper took the entry `key` out of its queue: start a turn unless the lease left
    /// the queue or moved in it meanwhile.
    fn begin_turn(&self, key: Key) -> bool {
        let mut st = self.state.lock().unwrap();
        if st.stage == Stage::Queued(key) {
            st.stage = Stage::InTurn;
            st.planned = key.0;
            true
        } else {
            false
        }
    }

    /// A turn ended: queue the next one, unless the lease was lost or released meanwhile.
    fn end_turn(self: &Arc<Self>) {
        let mut st = self.state.lock().unwrap();
        if st.stage != Stage::InTurn {
            return;
        }
        if st.loss.is_some() {
            st.stage = Stage::Ended;
            return;
        }
        let now = Instant::now();
        let at = if std::mem::take(&mut st.poked) {
            now
        } else {
            st.next_turn(&self.config, now)
        };
        st.stage = Stage::Queued(self.keeper.insert(at, self, true));
    }
}

impl HeldState {
    /// When the lease needs its next turn, `now` being the end of the last one: a renewal
    /// every keep-alive interval, or earlier if less than half the span is certainly left; a
    /// quick retry while renewals fail, or the moment `lost()` must fire if that is earlier.
    fn next_turn(&self, config: &SemaphoreConfig, now: Instant) -> Instant {
        let (span, interval) = (self.span, config.keep_alive);
        let valid_until = self.valid_until;
        match self.failing {
            Some(_) => {
                let retry = (interval / 8).max(Duration::from_millis(10));
                (now + retry).min(valid_until.checked_sub(span / 3).unwrap_or(valid_until))
            }
            None => (self.last_ok + interval)
                .min(valid_until.checked_sub(span / 2).unwrap_or(valid_until)),
        }
    }
}

impl wake::Hook for Held {
    /// A push about this lease (a revocation): ask the store at once.
    fn wake(self: Arc<Self>) {
        let mut st = self.state.lock().unwrap();
        match st.stage {
            Stage::Queued(key) => {
                self.keeper.remove(key);
                st.stage = Stage::Queued(self.keeper.insert(Instant::now(), &self, false));
            }
            // Still in the list of new leases, where the keeper skips it from now on.
            Stage::New(_) => {
                st.stage = Stage::Queued(self.keeper.insert(Instant::now(), &self, false));
            }
            Stage::InTurn => st.poked = true,
            Stage::Ended => {}
        }
    }
}

/// Whether a turn that started `late` after it was due means the process stalled.
fn stalled(late: Duration, ttl: Duration) -> bool {
    late > (ttl / 10).max(STALL_MIN)
}

/// One turn of a lease: fires `lost()` if renewals have failed until `valid_until - span/3`,
/// or renews once, bounded by that instant (by `valid_until` once past it). Ends early if the
/// permit is released or dropped.
async fn turn(held: Arc<Held>) -> Arc<Held> {
    take_turn(&held).await;
    held
}

async fn take_turn(held: &Held) {
    let ttl = held.config.ttl;
    let stopped = held.stop.notified();
    tokio::pin!(stopped);
    stopped.as_mut().enable();
    let (valid_until, span, failing, planned) = {
        let st = held.state.lock().unwrap();
        if st.stage != Stage::InTurn {
            return;
        }
        (st.valid_until, st.span, st.failing.clone(), st.planned)
    };
    let lost_at = valid_until.checked_sub(span / 3).unwrap_or(valid_until);
    let now = Instant::now();
    // A turn that starts (or a timer that fires) long after it was due means this process
    // did not run meanwhile (SIGSTOP, suspend, CPU starvation): say so, rather than blaming
    // the store for a renewal that was never sent.
    let loss = |late: Duration, failing: Option<String>| {
        if stalled(late, ttl) {
            LossReason::Stalled(late)
        } else {
            LossReason::RenewalsFailing(
                failing.unwrap_or_else(|| "the store did not answer".to_string()),
            )
        }
    };
    let late = now.saturating_duration_since(planned);
    if failing.is_some() && now >= lost_at {
        held.lose(loss(late, failing));
        return;
    }
    let deadline = if now < lost_at { lost_at } else { valid_until };
    let sent = Instant::now();
    let reply = tokio::select! {
        biased;
        _ = &mut stopped => return,
        _ = tokio::time::sleep_until(deadline) => {
            let overshoot = Instant::now().saturating_duration_since(deadline);
            held.lose(loss(late.max(overshoot), failing));
            return;
        }
        r = held.conn.backend().renew(&held.config.name, held.lease.lease_id, ttl) => r,
    };
    match reply {
        Ok(RenewReply::Renewed { expires_at, now }) => {
            crate::telemetry::renewal("ok");
            let mut st = held.state.lock().unwrap();
            let remaining = expires_at.since(now);
            st.expires_at = expires_at;
            st.span = span_of(remaining, ttl);
            st.valid_until = st
                .valid_until
                .max(sent + remaining.saturating_sub(margin(st.span)));
            st.last_ok = sent;
            st.failing = None;
        }
        // Gone after a stall: the lease most likely expired because nobody renewed it.
        Ok(RenewReply::Gone) if stalled(late, ttl) => {
            crate::telemetry::renewal("gone");
            held.lose(LossReason::Stalled(late))
        }
        Ok(RenewReply::Gone) => {
            crate::telemetry::renewal("gone");
            held.lose(LossReason::Gone)
        }
        Err(e) => {
            crate::telemetry::renewal("error");
            tracing::debug!(target: LOG_TARGET, lease = %held.lease.lease_id, error = %e, "renewal failed; retrying");
            held.state.lock().unwrap().failing = Some(e.to_string());
        }
    }
}

/// The keeper of one runtime: its queue, and how to wake or start its task.
pub(crate) struct Keeper {
    runtime: Handle,
    queue: Mutex<Queue>,
    wake: Notify,
}

struct Queue {
    due: BTreeMap<Key, Arc<Held>>,
    /// Leases granted since the task last looked, not yet in `due` (see the module docs).
    new: Vec<Weak<Held>>,
    /// The earliest instant one of `new` is due.
    new_due: Option<Instant>,
    /// `new` is compacted when it reaches this length.
    new_limit: usize,
    next_seq: u64,
    /// Whether a task runs for this keeper, and which one (a new one gets a new number).
    running: bool,
    task: u64,
    /// The task looks at the queue again by this instant (`None`: only when woken), so an
    /// entry due earlier must wake it.
    look_by: Option<Instant>,
}

impl fmt::Debug for Keeper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeper")
            .field("runtime", &self.runtime.id())
            .finish_non_exhaustive()
    }
}

static KEEPERS: LazyLock<Mutex<HashMap<runtime::Id, Weak<Keeper>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

thread_local! {
    /// The keeper this thread used last, so a grant usually takes no global lock.
    static LAST: RefCell<Option<(runtime::Id, Weak<Keeper>)>> = const { RefCell::new(None) };
}

impl Keeper {
    /// The keeper of the current runtime, created if it has none (or its last one ended).
    fn current() -> Arc<Keeper> {
        let runtime = Handle::current();
        let id = runtime.id();
        let cached = LAST
            .try_with(|last| match &*last.borrow() {
                Some((i, k)) if *i == id => k.upgrade(),
                _ => None,
            })
            .ok()
            .flatten();
        if let Some(k) = cached {
            return k;
        }
        let keeper = {
            let mut keepers = KEEPERS.lock().unwrap();
            match keepers.get(&id).and_then(Weak::upgrade) {
                Some(k) => k,
                None => {
                    keepers.retain(|_, k| k.strong_count() > 0);
                    let k = Arc::new(Keeper {
                        runtime,
                        queue: Mutex::new(Queue {
                            due: BTreeMap::new(),
                            new: Vec::new(),
                            new_due: None,
                            new_limit: NEW_MIN,
                            next_seq: 0,
                            running: false,
                            task: 0,
                            look_by: None,
                        }),
                        wake: Notify::new(),
                    });
                    keepers.insert(id, Arc::downgrade(&k));
                    k
                }
            }
        };
        let _ = LAST.try_with(|last| *last.borrow_mut() = Some((id, Arc::downgrade(&keeper))));
        keeper
    }

    /// Queues `held` at `at`, starting the task if none runs and waking it if it would look
    /// too late; `from_task` when the task itself calls (it looks again anyway).
    fn insert(self: &Arc<Self>, at: Instant, held: &Arc<Held>, from_task: bool) -> Key {
        let mut q = self.queue.lock().unwrap();
        let key = (at, q.next_seq);
        q.next_seq += 1;
        q.due.insert(key, Arc::clone(held));
        self.kick(q, at, from_task);
        key
    }

    /// Puts a lease just granted, first due at `at`, on the list of new leases; compacts the
    /// list (drops the leases released meanwhile) when it has doubled since the last time.
    fn enter_new(self: &Arc<Self>, at: Instant, held: &Arc<Held>) {
        let mut q = self.queue.lock().unwrap();
        if q.new.len() >= q.new_limit {
            q.new.retain(|h| h.strong_count() > 0);
            q.new_limit = (2 * q.new.len()).max(NEW_MIN);
        }
        q.new.push(Arc::downgrade(held));
        q.new_due = Some(q.new_due.map_or(at, |d| d.min(at)));
        self.kick(q, at, false);
    }

    /// After an entry due at `at` was added under `q`: starts the task if none runs, or wakes
    /// it if it would look too late.
    fn kick(
        self: &Arc<Self>,
        mut q: std::sync::MutexGuard<'_, Queue>,
        at: Instant,
        from_task: bool,
    ) {
        if !q.running {
            q.running = true;
            q.task += 1;
            q.look_by = Some(Instant::now());
            let guard = TaskGuard {
                keeper: Arc::clone(self),
                task: q.task,
            };
            drop(q);
            // On a runtime that has shut down, the task is dropped at once, and its guard
            // with it (which takes the queue lock, hence spawning after releasing it):
            // nothing runs there any more.
            self.runtime.spawn(run(guard));
        } else if !from_task && q.look_by.is_none_or(|t| at < t) {
            drop(q);
            self.wake.notify_one();
        }
    }

    fn remove(&self, key: Key) {
        self.queue.lock().unwrap().due.remove(&key);
    }
}

/// Owned by a keeper task; marks the keeper as without a task when the task ends or is
/// dropped with its runtime.
struct TaskGuard {
    keeper: Arc<Keeper>,
    task: u64,
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        let mut q = self.keeper.queue.lock().unwrap();
        if q.task == self.task {
            q.running = false;
            q.look_by = None;
        }
    }
}

/// The keeper task: takes out due entries, runs their turns concurrently, queues the next
/// turns; ends after [`IDLE_LINGER`] with nothing queued and no turn running.
async fn run(guard: TaskGuard) {
    let keeper = &guard.keeper;
    let mut turns = FuturesUnordered::new();
    let mut due = Vec::new();
    let mut new = Vec::new();
    let mut idle_until: Option<Instant> = None;
    loop {
        // The leases granted since the last look that are still held enter the queue (under
        // their own lock first, then the queue's, in that order).
        {
            let mut q = keeper.queue.lock().unwrap();
            std::mem::swap(&mut q.new, &mut new);
            q.new_due = None;
            q.new_limit = NEW_MIN;
        }
        for held in new.drain(..).filter_map(|h| h.upgrade()) {
            let mut st = held.state.lock().unwrap();
            if let Stage::New(at) = st.stage {
                st.stage = Stage::Queued(keeper.insert(at, &held, true));
            }
        }
        let now = Instant::now();
        let look_by = {
            let mut q = keeper.queue.lock().unwrap();
            while let Some(entry) = q.due.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove_entry());
            }
            if q.due.is_empty() && q.new.is_empty() && due.is_empty() && turns.is_empty() {
                let until = *idle_until.get_or_insert(now + IDLE_LINGER);
                if now >= until {
                    // Ends the task; the guard marks the keeper as without one, under this
                    // same lock, so an entry queued from now on starts a new task.
                    q.running = false;
                    q.look_by = None;
                    return;
                }
                q.look_by = Some(until);
            } else {
                idle_until = None;
                let first = q.due.first_key_value().map(|(k, _)| k.0);
                q.look_by = match (first, q.new_due) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
            q.look_by
        };
        for (key, held) in due.drain(..) {
            if held.begin_turn(key) {
                turns.push(turn(held));
            }
        }
        tokio::select! {
            biased;
            Some(held) = turns.next(), if !turns.is_empty() => held.end_turn(),
            _ = keeper.wake.notified() => {}
            _ = sleep_until(look_by) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
