//! The reference model: every store operation of [`tessera_core::seam::Backend`] as a plain
//! function of the state and the store's time. The other stores are checked against it.
//!
//! One atomic step is purge → hand off → decide → hand off → collect wake-ups (see
//! [`crate::store`]). Every structure is indexed so each step costs O(log n) in holders and
//! waiters plus the work it does (expired entries purged, grants made):
//!
//! - holders by lease id, and a set ordered by expiry for the purge;
//! - the queue in a map ordered by start tag and arrival sequence (`docs/fair-shares.md`:
//!   without tenants the tags grow with arrival, so the order is FIFO), with indexes by
//!   lease id and by heartbeat expiry;
//! - a running count `used` instead of summing holder weights;
//! - free seats as "every seat at or above `seat_high`" plus a set of returned seats below
//!   it, so the lowest free seats are found without scanning all `C`.
//!
//! A semaphore exists only while it has holders or waiters; the store-wide fence high-water
//! mark outlives it, so fences never repeat after a deletion. The state of an idle semaphore
//! (no holders, no waiters) is kept for its next acquire, so an acquire/release loop does not
//! rebuild it every time, but every operation treats it as absent; idle states are swept out
//! when the map has doubled since the last sweep (at least [`SWEEP_MIN`] entries).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use super::rate::RateModel;
use tessera_core::error::{Error, InvalidInput, Result};
use tessera_core::model::*;
use tessera_core::seam::{AdmitReply, AdmitRequest, RateConfig, RateReply, RateRequest};

/// The map size below which idle states are never swept.
const SWEEP_MIN: usize = 1024;

/// All semaphores of one memory store.
#[derive(Debug, Default)]
pub(crate) struct Model {
    /// Live semaphores, and idle ones kept for reuse (see the module docs). Hashed with
    /// foldhash, seeded per process, rather than SipHash, which cost about 170 instructions a
    /// lookup here, a tenth of an uncontended acquire.
    sems: HashMap<Name, SemState, foldhash::fast::RandomState>,
    /// Highest fence ever issued by this store, for any semaphore.
    fence_hwm: u64,
    /// Sweep idle states when a new semaphore would make the map larger than this.
    sweep_at: usize,
    /// Tenants' ceilings and floors by name (`docs/fair-shares.md`): kept for the name, also
    /// while it is idle and its state is swept, until changed or deleted. Each state holds a
    /// copy.
    limits: HashMap<Name, TenantLimitMap, foldhash::fast::RandomState>,
}

/// Tenants' ceilings and floors on one semaphore.
type TenantLimitMap = BTreeMap<Box<str>, TenantLimits>;

/// A holder as the model keeps it: a [`Lease`] without the allocations, built into one only
/// when a reply needs it (a grant, a retry, a status). The holder label is shared with the
/// other leases that carry the same one ([`SemState::intern`]).
#[derive(Debug)]
struct Holder {
    weight: u32,
    seats: Seats,
    fence: u64,
    holder: Arc<str>,
    acquired_at: StoreTime,
    expires_at: StoreTime,
    /// The tenant it was granted to; `None` without one (no allocation).
    tenant: Option<Box<str>>,
}

/// The seats of a holder: one seat (the common case) without an allocation.
#[derive(Debug)]
enum Seats {
    One(u32),
    Many(Vec<u32>),
}

impl Seats {
    fn as_slice(&self) -> &[u32] {
        match self {
            Seats::One(s) => std::slice::from_ref(s),
            Seats::Many(v) => v,
        }
    }
}

impl Holder {
    fn lease(&self, lease_id: LeaseId) -> Lease {
        Lease {
            lease_id,
            weight: self.weight,
            seats: self.seats.as_slice().to_vec(),
            fence: self.fence,
            holder: String::from(&*self.holder),
            acquired_at: self.acquired_at,
            expires_at: self.expires_at,
            tenant: self.tenant.as_deref().map(String::from),
        }
    }
}

#[derive(Debug)]
struct QueuedWaiter {
    waiter: Waiter,
    /// The TTL of the lease this waiter will be granted.
    ttl: Duration,
    /// An admission waiter (`crate::admission`): the hand-off never grants it, its own step
    /// does; the hand-off wakes it once its permits fit and the store time is at least this
    /// (the instant its windows admit it, as last told), then sets it to the end of time
    /// until the waiter steps again.
    gate: Option<StoreTime>,
}

/// The name of the tenant `req` asks as, kept on its waiter and its lease.
fn tenant_name(req: &AcquireRequest) -> Option<String> {
    req.tenant.as_ref().map(|t| t.name().to_string())
}

/// Queue sequence numbers start here, so a waiter can join in front of the head.
const FIRST_SEQ: u64 = 1 << 62;

/// A waiter's place: its start tag (`docs/fair-shares.md`), then its arrival sequence.
type QueueKey = (u64, u64);

/// Tags count cost in these units, so a share divides it without losing much.
const TAG_UNIT: u64 = 1_000;

#[derive(Debug)]
struct SemState {
    capacity: u32,
    used: u32,
    last_fence: u64,
    holders: LeaseIdMap<Holder>,
    /// The holder label of the last grant, shared by the next grants that carry the same.
    last_holder: Option<Arc<str>>,
    holder_expiry: BTreeSet<(StoreTime, LeaseId)>,
    queue: BTreeMap<QueueKey, QueuedWaiter>,
    queue_index: LeaseIdMap<QueueKey>,
    waiter_expiry: BTreeSet<(StoreTime, LeaseId)>,
    next_seq: u64,
    /// Virtual time: the start tag of the latest grant.
    vtime: u64,
    /// The latest finish tag of requests that name no tenant (the tenant `""`), kept apart
    /// so that an acquire without tenants hashes nothing.
    finish_default: u64,
    /// Each named tenant's latest finish tag (absent: at or below `vtime`).
    finish: HashMap<Box<str>, u64, foldhash::fast::RandomState>,
    /// Every seat `>= seat_high` is free.
    seat_high: u32,
    /// Free seats below `seat_high`.
    free_low: BTreeSet<u32>,
    /// Tenants' ceilings and floors (a copy of [`Model::limits`]); empty: none, and every
    /// step runs as without them.
    limits: TenantLimitMap,
    /// Tenants whose own limiter (under a window ceiling) refused an admission, until the
    /// instant it would admit it: their admission waiters are skipped for the head.
    window_capped: HashMap<Box<str>, StoreTime, foldhash::fast::RandomState>,
}

/// What to deliver after a step: the grants made to waiters (pushed with their wake-up, so
/// the waiter need not ask the store for them), and the lease ids of revoked or deleted
/// holders and waiters.
pub(crate) type Wakes = Vec<Wake>;

/// One wake-up of [`Wakes`].
#[derive(Debug)]
pub(crate) enum Wake {
    /// A waiter was granted this.
    Granted(Grant),
    /// The lease or wait ended without a grant.
    Ended(LeaseId),
    /// An admission waiter at the head whose permits fit: its own step decides.
    Turn(LeaseId),
}

impl SemState {
    fn new(capacity: u32, last_fence: u64) -> Self {
        SemState {
            capacity,
            used: 0,
            last_fence,
            holders: LeaseIdMap::default(),
            last_holder: None,
            holder_expiry: BTreeSet::new(),
            queue: BTreeMap::new(),
            queue_index: LeaseIdMap::default(),
            waiter_expiry: BTreeSet::new(),
            next_seq: FIRST_SEQ,
            vtime: 0,
            finish_default: 0,
            finish: HashMap::default(),
            seat_high: 0,
            free_low: BTreeSet::new(),
            limits: TenantLimitMap::new(),
            window_capped: HashMap::default(),
        }
    }

    fn is_empty(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// Checks the capacity a client declares: an idle semaphore (every lease and waiter
    /// expired: as if it did not exist) takes it; a live one must hold the same.
    fn declare(&mut self, name: &Name, capacity: u32) -> Result<()> {
        if self.is_empty() {
            self.capacity = capacity;
            self.vtime = 0;
            self.finish_default = 0;
            self.finish.clear();
        }
        if self.capacity != capacity {
            return Err(Error::CapacityMismatch {
                name: name.to_string(),
                stored: self.capacity,
                declared: capacity,
            });
        }
        Ok(())
    }

    fn available(&self) -> u32 {
        self.capacity.saturating_sub(self.used)
    }

    /// Drops expired holders and waiters, then hands freed permits to the queue.
    fn purge_and_hand_off(&mut self, now: StoreTime, hwm: &mut u64, wakes: &mut Wakes) {
        while let Some(&(t, id)) = self.holder_expiry.first() {
            if t > now {
                break;
            }
            self.remove_holder(id);
        }
        while let Some(&(t, id)) = self.waiter_expiry.first() {
            if t > now {
                break;
            }
            self.remove_waiter(id);
        }
        self.hand_off(now, hwm, wakes);
    }

    /// Strict FIFO: grant the head while it fits; a head that does not fit blocks the rest,
    /// and so does an admission waiter, which only its own step grants (woken here once it
    /// fits).
    fn hand_off(&mut self, now: StoreTime, hwm: &mut u64, wakes: &mut Wakes) {
        if !self.limits.is_empty() {
            return self.hand_off_limited(now, hwm, wakes);
        }
        while let Some(mut head) = self.queue.first_entry() {
            if self.used + head.get().waiter.weight > self.capacity {
                break;
            }
            let head = head.get_mut();
            if let Some(wake_at) = &mut head.gate {
                if now >= *wake_at {
                    *wake_at = StoreTime(u64::MAX);
                    wakes.push(Wake::Turn(head.waiter.lease_id));
                }
                break;
            }
            let ((start, _), qw) = self.queue.pop_first().expect("head exists");
            self.grant_queued(start, qw, now, hwm, wakes);
        }
    }

    /// The hand-off with tenants' ceilings and floors (`docs/fair-shares.md`): first a waiter
    /// whose tenant is below its floor and may be granted, in queue order, ahead of the head;
    /// then the head, the first waiter whose tenant is not at its ceiling for it, while it
    /// may be granted. An admission waiter at the head is woken as without limits. The
    /// queue and the holders are scanned: the reference model keeps no index by tenant.
    fn hand_off_limited(&mut self, now: StoreTime, hwm: &mut u64, wakes: &mut Wakes) {
        loop {
            let floor = self.queue.iter().find_map(|(&key, q)| {
                let (t, w) = (q.waiter.tenant.as_deref(), q.waiter.weight);
                (q.gate.is_none() && self.below_floor(t, w) && self.may_grant(t, w)).then_some(key)
            });
            let key = match floor {
                Some(key) => key,
                None => {
                    let Some(key) = self.head_key(now) else { break };
                    let q = &self.queue[&key];
                    if !self.may_grant(q.waiter.tenant.as_deref(), q.waiter.weight) {
                        break;
                    }
                    let q = self.queue.get_mut(&key).expect("the head exists");
                    if let Some(wake_at) = &mut q.gate {
                        if now >= *wake_at {
                            *wake_at = StoreTime(u64::MAX);
                            wakes.push(Wake::Turn(q.waiter.lease_id));
                        }
                        break;
                    }
                    key
                }
            };
            let qw = self.queue.remove(&key).expect("found above");
            self.grant_queued(key.0, qw, now, hwm, wakes);
        }
    }

    /// Grants a waiter taken out of the queue (its start tag `start`).
    fn grant_queued(
        &mut self,
        start: u64,
        qw: QueuedWaiter,
        now: StoreTime,
        hwm: &mut u64,
        wakes: &mut Wakes,
    ) {
        self.vtime = self.vtime.max(start);
        self.queue_index.remove(&qw.waiter.lease_id);
        self.waiter_expiry
            .remove(&(qw.waiter.expires_at, qw.waiter.lease_id));
        let w = qw.waiter;
        // Provisional until renewed: no longer than the waiter's entry would have lived.
        let ttl = qw.ttl.min(w.expires_at.since(now));
        let lease = self.grant(w.lease_id, w.weight, ttl, &w.holder, w.tenant, now, hwm);
        wakes.push(Wake::Granted(Grant { lease, now }));
    }

    /// Permits held by `tenant`'s leases (the holders scanned: only with limits set).
    fn held_by(&self, tenant: &str) -> u32 {
        self.holders
            .values()
            .filter(|h| h.tenant.as_deref() == Some(tenant))
            .map(|h| h.weight)
            .sum()
    }

    fn limits_of(&self, tenant: Option<&str>) -> TenantLimits {
        tenant
            .and_then(|t| self.limits.get(t))
            .copied()
            .unwrap_or_default()
    }

    /// Whether `tenant` (`None`: a request that named none) is at its ceiling for `weight`
    /// more permits.
    fn capped(&self, tenant: Option<&str>, weight: u32) -> bool {
        match (tenant, self.limits_of(tenant).ceiling) {
            (Some(t), Some(c)) => self.held_by(t) + weight > c,
            _ => false,
        }
    }

    /// Whether `weight` more permits keep `tenant` within its floor.
    fn below_floor(&self, tenant: Option<&str>, weight: u32) -> bool {
        match (tenant, self.limits_of(tenant).floor) {
            (Some(t), floor) if floor > 0 => self.held_by(t) + weight <= floor,
            _ => false,
        }
    }

    /// Whether `tenant` may be granted `weight` permits now: they fit, its ceiling allows
    /// them, and they leave what the other tenants' floors keep (each floor less what its
    /// tenant holds). Without limits: they fit.
    fn may_grant(&self, tenant: Option<&str>, weight: u32) -> bool {
        if self.limits.is_empty() {
            return self.used + weight <= self.capacity;
        }
        if self.capped(tenant, weight) {
            return false;
        }
        let kept: u64 = self
            .limits
            .iter()
            .filter(|(u, _)| Some(&***u) != tenant)
            .map(|(u, l)| l.floor.saturating_sub(self.held_by(u)) as u64)
            .sum();
        weight as u64 + kept <= self.available() as u64
    }

    /// The head: the first waiter whose tenant is not at its ceiling for it, and that is not
    /// an admission waiter of a tenant window-capped at `now` (without limits, the first
    /// waiter).
    fn head_key(&self, now: StoreTime) -> Option<QueueKey> {
        if self.limits.is_empty() {
            return self.queue.first_key_value().map(|(&k, _)| k);
        }
        self.queue
            .iter()
            .find(|(_, q)| {
                let t = q.waiter.tenant.as_deref();
                let window_capped = q.gate.is_some() && self.window_capped(t, now);
                !(self.capped(t, q.waiter.weight) || window_capped)
            })
            .map(|(&k, _)| k)
    }

    /// Whether `tenant` has a window ceiling whose own limiter refused it until after `now`.
    fn window_capped(&self, tenant: Option<&str>, now: StoreTime) -> bool {
        let Some(t) = tenant else { return false };
        self.limits_of(tenant).window_ceiling.is_some()
            && self.window_capped.get(t).is_some_and(|&until| until > now)
    }

    #[allow(clippy::too_many_arguments)]
    fn grant(
        &mut self,
        lease_id: LeaseId,
        weight: u32,
        ttl: Duration,
        holder: &str,
        tenant: Option<String>,
        now: StoreTime,
        hwm: &mut u64,
    ) -> Lease {
        debug_assert!(self.used + weight <= self.capacity);
        let seats = self.take_seats(weight);
        let fence = (self.last_fence + 1).max(now.0).max(*hwm + 1);
        self.last_fence = fence;
        *hwm = fence;
        let h = Holder {
            weight,
            seats,
            fence,
            holder: self.intern(holder),
            acquired_at: now,
            expires_at: now.plus(ttl),
            tenant: tenant.map(String::into_boxed_str),
        };
        let lease = h.lease(lease_id);
        self.used += weight;
        self.holder_expiry.insert((h.expires_at, lease_id));
        self.holders.insert(lease_id, h);
        lease
    }

    /// `holder` as a shared label: the last one if it is the same (one client's grants all
    /// carry its label), else a new one.
    fn intern(&mut self, holder: &str) -> Arc<str> {
        match &self.last_holder {
            Some(h) if **h == *holder => Arc::clone(h),
            _ => {
                let h: Arc<str> = Arc::from(holder);
                self.last_holder = Some(Arc::clone(&h));
                h
            }
        }
    }

    /// The `n` lowest free seats below the capacity. There are always enough: free seats
    /// below `C` number at least `C - used`.
    fn take_seats(&mut self, n: u32) -> Seats {
        if n == 1 {
            // The lowest free seat: a returned one below the high-water mark, else the mark.
            let seat = match self.free_low.first() {
                Some(&s) if s < self.capacity => {
                    self.free_low.remove(&s);
                    s
                }
                _ => {
                    debug_assert!(self.seat_high < self.capacity);
                    self.seat_high += 1;
                    self.seat_high - 1
                }
            };
            return Seats::One(seat);
        }
        let mut seats: Vec<u32> = self
            .free_low
            .range(..self.capacity)
            .take(n as usize)
            .copied()
            .collect();
        for s in &seats {
            self.free_low.remove(s);
        }
        while seats.len() < n as usize {
            debug_assert!(self.seat_high < self.capacity);
            seats.push(self.seat_high);
            self.seat_high += 1;
        }
        Seats::Many(seats)
    }

    fn return_seats(&mut self, seats: &[u32]) {
        // Seats (ascending) right below the high-water mark lower it directly: the common
        // case of a release in an uncontended loop touches no set.
        let mut rest = seats;
        while let Some((&top, below)) = rest.split_last() {
            if top + 1 != self.seat_high {
                break;
            }
            self.seat_high = top;
            rest = below;
        }
        for &s in rest {
            self.free_low.insert(s);
        }
        // Shrink the high-water mark over returned seats at its top, keeping the set small.
        while self.seat_high > 0 && self.free_low.remove(&(self.seat_high - 1)) {
            self.seat_high -= 1;
        }
    }

    fn remove_holder(&mut self, id: LeaseId) -> bool {
        let Some(h) = self.holders.remove(&id) else {
            return false;
        };
        self.holder_expiry.remove(&(h.expires_at, id));
        self.used -= h.weight;
        self.return_seats(h.seats.as_slice());
        true
    }

    fn remove_waiter(&mut self, id: LeaseId) -> Option<Waiter> {
        let seq = self.queue_index.remove(&id)?;
        let qw = self.queue.remove(&seq).expect("indexed waiter exists");
        self.waiter_expiry.remove(&(qw.waiter.expires_at, id));
        Some(qw.waiter)
    }

    /// The start and finish tags a new request of `tenant` and `cost` would get (see
    /// `docs/fair-shares.md`); nothing changes until [`SemState::take_tags`].
    fn tags(&self, tenant: Option<&Tenant>, cost: u32) -> (u64, u64) {
        let (last, share) = match tenant {
            None => (self.finish_default, 1),
            Some(t) => (self.finish.get(t.name()).copied().unwrap_or(0), t.share()),
        };
        let start = last.max(self.vtime);
        (start, start + cost as u64 * TAG_UNIT / share as u64)
    }

    /// Records a request's finish tag, and, granted at once, moves the virtual time to its
    /// start. Tenants whose finish tag the virtual time has passed are forgotten now and
    /// then (they start at the virtual time either way).
    fn take_tags(&mut self, tenant: Option<&Tenant>, (start, finish): (u64, u64), granted: bool) {
        match tenant {
            None => self.finish_default = finish,
            Some(t) => match self.finish.get_mut(t.name()) {
                Some(f) => *f = finish,
                None => {
                    self.finish.insert(t.name().into(), finish);
                }
            },
        }
        if granted {
            self.vtime = self.vtime.max(start);
        }
        if self.finish.len() > 2 * (self.queue.len() + self.holders.len()) + 16 {
            let v = self.vtime;
            self.finish.retain(|_, f| *f > v);
        }
    }

    /// Whether a request with this start tag, arriving now, would be the head.
    fn would_lead(&self, start: u64, now: StoreTime) -> bool {
        self.head_key(now)
            .is_none_or(|first| (start, self.next_seq) < first)
    }

    /// Queues `req` with its start tag (or at the head) with `gate` (see [`QueuedWaiter`]);
    /// its position. [`Error::QueueFull`] if the queue has `wait.queue_cap` waiters.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        &mut self,
        name: &Name,
        req: &AcquireRequest,
        wait: WaitSpec,
        now: StoreTime,
        gate: Option<StoreTime>,
        at_head: bool,
        tags: (u64, u64),
    ) -> Result<u64> {
        if self.queue.len() as u64 >= wait.queue_cap as u64 {
            return Err(Error::QueueFull {
                name: name.to_string(),
                cap: wait.queue_cap,
            });
        }
        self.take_tags(req.tenant.as_ref(), tags, false);
        let seq = match self.queue.first_key_value() {
            Some((&(tag, first), _)) if at_head => (tag, first - 1),
            _ => {
                self.next_seq += 1;
                (tags.0, self.next_seq - 1)
            }
        };
        let waiter = Waiter {
            lease_id: req.lease_id,
            weight: req.weight,
            holder: req.holder.clone(),
            enqueued_at: now,
            expires_at: now.plus(wait.waiter_ttl),
            tenant: tenant_name(req),
        };
        self.waiter_expiry.insert((waiter.expires_at, req.lease_id));
        self.queue_index.insert(req.lease_id, seq);
        self.queue.insert(
            seq,
            QueuedWaiter {
                waiter,
                ttl: req.ttl,
                gate,
            },
        );
        Ok(self.queue.range(..seq).count() as u64)
    }

    /// Sets an admission waiter's gate (see [`QueuedWaiter`]).
    fn set_gate(&mut self, id: LeaseId, gate: StoreTime) {
        if let Some(seq) = self.queue_index.get(&id) {
            if let Some(qw) = self.queue.get_mut(seq) {
                qw.gate = Some(gate);
            }
        }
    }

    fn refresh_waiter(&mut self, id: LeaseId, expires_at: StoreTime) -> bool {
        let Some(&seq) = self.queue_index.get(&id) else {
            return false;
        };
        let qw = self.queue.get_mut(&seq).expect("indexed waiter exists");
        self.waiter_expiry.remove(&(qw.waiter.expires_at, id));
        qw.waiter.expires_at = qw.waiter.expires_at.max(expires_at);
        self.waiter_expiry.insert((qw.waiter.expires_at, id));
        true
    }

    fn position(&self, id: LeaseId) -> Option<u64> {
        let seq = *self.queue_index.get(&id)?;
        Some(self.queue.range(..seq).count() as u64)
    }

    fn status(&self, name: &Name, now: StoreTime) -> SemaphoreStatus {
        let mut holders: Vec<Lease> = self.holders.iter().map(|(id, h)| h.lease(*id)).collect();
        holders.sort_by_key(|l| (l.acquired_at, l.fence));
        let queue = self.queue.values().map(|q| q.waiter.clone()).collect();
        SemaphoreStatus::new(name, self.capacity, self.used, now, holders, queue)
    }
}

impl Model {
    /// Runs one step on a semaphore that has state (live or idle): purge and hand off,
    /// then `f`. `None` if it has none.
    fn step<R>(
        &mut self,
        name: &Name,
        now: StoreTime,
        wakes: &mut Wakes,
        f: impl FnOnce(&mut SemState, &mut u64, &mut Wakes) -> R,
    ) -> Option<R> {
        let st = self.sems.get_mut(name)?;
        Some(Self::step_on(st, &mut self.fence_hwm, now, wakes, f))
    }

    fn step_on<R>(
        st: &mut SemState,
        hwm: &mut u64,
        now: StoreTime,
        wakes: &mut Wakes,
        f: impl FnOnce(&mut SemState, &mut u64, &mut Wakes) -> R,
    ) -> R {
        st.purge_and_hand_off(now, hwm, wakes);
        f(st, hwm, wakes)
    }

    /// Makes room for a new semaphore's state: when the map has doubled since the last sweep,
    /// drops every idle state (amortised O(1) per new name).
    fn sweep_idle(&mut self) {
        if self.sems.len() < self.sweep_at.max(SWEEP_MIN) {
            return;
        }
        self.sems.retain(|_, st| !st.is_empty());
        self.sweep_at = 2 * self.sems.len();
    }

    /// A new state for `name`, with the tenant limits kept for it.
    fn insert_state(&mut self, name: &Name, capacity: u32) {
        self.sweep_idle();
        let mut st = SemState::new(capacity, self.fence_hwm);
        if let Some(limits) = self.limits.get(name) {
            st.limits = limits.clone();
        }
        self.sems.insert(name.clone(), st);
    }

    /// Sets (or, with [`TenantLimits::is_none`], removes) `tenant`'s limits on `name`, then
    /// hands off what they let in (a raised ceiling, a lowered floor).
    pub(crate) fn set_tenant_limits(
        &mut self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> Result<()> {
        let mut map = self.limits.get(name).cloned().unwrap_or_default();
        match limits.is_none() {
            true => map.remove(tenant),
            false => map.insert(tenant.into(), limits),
        };
        if let Some(st) = self.sems.get(name).filter(|st| !st.is_empty()) {
            let floors: u64 = map.values().map(|l| l.floor as u64).sum();
            if floors > st.capacity as u64 {
                return Err(Error::InvalidInput(InvalidInput::Other(format!(
                    "the floors on {name} would add up to {floors}, above its capacity {}",
                    st.capacity
                ))));
            }
        }
        if let Some(st) = self.sems.get_mut(name) {
            st.limits = map.clone();
            st.purge_and_hand_off(now, &mut self.fence_hwm, wakes);
        }
        match map.is_empty() {
            true => self.limits.remove(name),
            false => self.limits.insert(name.clone(), map),
        };
        Ok(())
    }

    /// The tenant of `name`'s holder `lease`, if it is held and named one.
    pub(crate) fn holder_tenant(&self, name: &Name, lease: LeaseId) -> Option<Box<str>> {
        self.sems.get(name)?.holders.get(&lease)?.tenant.clone()
    }

    /// The tenants' limits kept for `name`.
    pub(crate) fn tenant_limits(&self, name: &Name) -> BTreeMap<String, TenantLimits> {
        self.limits.get(name).map_or_else(BTreeMap::new, |m| {
            m.iter().map(|(t, l)| (t.to_string(), *l)).collect()
        })
    }

    pub(crate) fn acquire(
        &mut self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> Result<AcquireReply> {
        // One lookup when the state exists (every acquire but a name's first).
        if let Some(st) = self.sems.get_mut(name) {
            return Self::step_on(st, &mut self.fence_hwm, now, wakes, |st, hwm, _| {
                Self::acquire_step(st, hwm, name, capacity, req, now)
            });
        }
        self.insert_state(name, capacity);
        self.step(name, now, wakes, |st, hwm, _| {
            Self::acquire_step(st, hwm, name, capacity, req, now)
        })
        .expect("state inserted above")
    }

    /// The decision of an acquire, after purge and hand-off.
    fn acquire_step(
        st: &mut SemState,
        hwm: &mut u64,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
        now: StoreTime,
    ) -> Result<AcquireReply> {
        {
            st.declare(name, capacity)?;
            // A retry of an acquire whose reply was lost: report what it already has.
            if let Some(h) = st.holders.get(&req.lease_id) {
                return Ok(AcquireReply::Granted(Grant {
                    lease: h.lease(req.lease_id),
                    now,
                }));
            }
            if let Some(wait) = req.wait {
                if st.refresh_waiter(req.lease_id, now.plus(wait.waiter_ttl)) {
                    let position = st.position(req.lease_id).unwrap_or(0);
                    return Ok(AcquireReply::Queued { position });
                }
            }
            // Only a request that would be the head may take free permits: without tenants,
            // one that finds nobody waiting; neither a try nor a newcomer jumps the queue.
            let tags = st.tags(req.tenant.as_ref(), req.weight);
            let tenant = req.tenant.as_ref().map(Tenant::name);
            // With limits, a tenant below its floor goes ahead of the queue.
            let first = st.would_lead(tags.0, now) || st.below_floor(tenant, req.weight);
            if first && st.may_grant(tenant, req.weight) {
                st.take_tags(req.tenant.as_ref(), tags, true);
                let lease = st.grant(
                    req.lease_id,
                    req.weight,
                    req.ttl,
                    &req.holder,
                    tenant_name(req),
                    now,
                    hwm,
                );
                return Ok(AcquireReply::Granted(Grant { lease, now }));
            }
            let Some(wait) = req.wait else {
                return Ok(AcquireReply::NoPermit {
                    available: st.available(),
                    queued: st.queue.len() as u64,
                });
            };
            let position = st.enqueue(name, req, wait, now, None, false, tags)?;
            Ok(AcquireReply::Queued { position })
        }
    }

    /// One admission step (see `tessera_core::admission::seam`): the semaphore's and the
    /// limiter's state under the two locks, taken in this order by every step that takes
    /// both.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn admit(
        &mut self,
        rate: &mut RateModel,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> Result<AdmitReply> {
        if !self.sems.contains_key(name) {
            self.insert_state(name, capacity);
        }
        let st = self.sems.get_mut(name).expect("state inserted above");
        let hwm = &mut self.fence_hwm;
        st.purge_and_hand_off(now, hwm, wakes);
        st.declare(name, capacity)?;
        let a = &req.acquire;
        // A retry whose reply was lost: the grant stands (its charge id is not kept here, so
        // a give-back of it releases the permits and leaves the windows charged).
        if let Some(h) = st.holders.get(&a.lease_id) {
            return Ok(AdmitReply::Granted {
                grant: Grant {
                    lease: h.lease(a.lease_id),
                    now,
                },
                reservation: 0,
            });
        }
        let queued_at = st.position(a.lease_id);
        let tags = st.tags(a.tenant.as_ref(), req.cost);
        let tenant = a.tenant.as_ref().map(Tenant::name);
        let first = match st.queue_index.get(&a.lease_id) {
            Some(&key) => st.head_key(now) == Some(key),
            // A request that gave back an admission it could not use goes first.
            None => st.would_lead(tags.0, now) || req.at_head,
        };
        let turn = (first || st.below_floor(tenant, a.weight)) && st.may_grant(tenant, a.weight);
        let mut window_at = None;
        if turn {
            let ask = RateRequest {
                cost: req.cost,
                max_wait: None,
                update: req.update,
            };
            // A tenant with a window ceiling: its own limiter first, charging nothing.
            let own = match (tenant, st.limits_of(tenant).window_ceiling) {
                (Some(t), Some(pct)) => {
                    let scaled = config.scaled(pct);
                    if req.cost > scaled.max_cost() {
                        return Err(Error::InvalidInput(InvalidInput::Cost {
                            cost: req.cost,
                            max: scaled.max_cost(),
                        }));
                    }
                    let refused = rate.tenant_refuses(name, t, &scaled, req.cost, now)?;
                    Some((t, scaled, refused))
                }
                _ => None,
            };
            let reply = match &own {
                Some((t, _, Some(until))) => {
                    st.window_capped.insert((*t).into(), *until);
                    match rate.peek(name, config, &ask, now)? {
                        RateReply::Limited { retry_at, .. } => {
                            window_at = Some(retry_at.max(*until))
                        }
                        RateReply::Admitted { .. } => window_at = Some(*until),
                    }
                    // The waiters behind a tenant now capped may be woken.
                    st.hand_off(now, hwm, wakes);
                    None
                }
                _ => Some(rate.acquire(name, config, &ask, now)?),
            };
            match reply {
                Some(RateReply::Admitted { reservation, .. }) => {
                    if let Some((t, scaled, None)) = &own {
                        st.window_capped.remove(*t);
                        let charged =
                            rate.charge_tenant(name, t, scaled, req.cost, reservation, now)?;
                        debug_assert!(charged, "asked in this step");
                    }
                    match st.queue_index.get(&a.lease_id) {
                        Some(&(start, _)) => st.vtime = st.vtime.max(start),
                        // At the head by a give-back, the virtual time stays where the
                        // head is.
                        None => {
                            let lead = st.would_lead(tags.0, now);
                            st.take_tags(a.tenant.as_ref(), tags, lead)
                        }
                    }
                    st.remove_waiter(a.lease_id);
                    let lease = st.grant(
                        a.lease_id,
                        a.weight,
                        a.ttl,
                        &a.holder,
                        tenant_name(a),
                        now,
                        hwm,
                    );
                    // The waiters behind a head that was an admission get what still fits.
                    st.hand_off(now, hwm, wakes);
                    return Ok(AdmitReply::Granted {
                        grant: Grant { lease, now },
                        reservation,
                    });
                }
                Some(RateReply::Limited { retry_at, .. }) => window_at = Some(retry_at),
                None => {}
            }
        }
        let gate = window_at.unwrap_or(StoreTime(0));
        if let Some(position) = queued_at {
            if let Some(wait) = a.wait {
                st.refresh_waiter(a.lease_id, now.plus(wait.waiter_ttl));
            }
            st.set_gate(a.lease_id, gate);
            return Ok(AdmitReply::Queued {
                position,
                window_at,
                now,
            });
        }
        let Some(wait) = a.wait else {
            return Ok(AdmitReply::Refused {
                available: st.available(),
                queued: st.queue.len() as u64,
                window_at,
                now,
            });
        };
        let position = st.enqueue(name, a, wait, now, Some(gate), req.at_head, tags)?;
        Ok(AdmitReply::Queued {
            position,
            window_at,
            now,
        })
    }

    /// The earliest expiry of a lease or queue entry of `name`, if it has any.
    pub(crate) fn next_expiry(&self, name: &Name) -> Option<StoreTime> {
        let st = self.sems.get(name)?;
        let holder = st.holder_expiry.first().map(|&(t, _)| t);
        let waiter = st.waiter_expiry.first().map(|&(t, _)| t);
        match (holder, waiter) {
            (Some(h), Some(w)) => Some(h.min(w)),
            (h, w) => h.or(w),
        }
    }

    pub(crate) fn heartbeat(
        &mut self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> WaitReply {
        self.step(name, now, wakes, |st, _, _| {
            if let Some(h) = st.holders.get(&lease) {
                WaitReply::Granted(Grant {
                    lease: h.lease(lease),
                    now,
                })
            } else if st.refresh_waiter(lease, now.plus(waiter_ttl)) {
                WaitReply::Waiting
            } else {
                WaitReply::Gone
            }
        })
        .unwrap_or(WaitReply::Gone)
    }

    pub(crate) fn cancel(
        &mut self,
        name: &Name,
        lease: LeaseId,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> CancelReply {
        self.step(name, now, wakes, |st, hwm, wakes| {
            let reply = if st.remove_waiter(lease).is_some() {
                CancelReply::Dequeued
            } else if st.remove_holder(lease) {
                CancelReply::Released
            } else {
                return CancelReply::NotFound;
            };
            // Removing the head of the queue, or freeing permits, may let the next in.
            st.hand_off(now, hwm, wakes);
            reply
        })
        .unwrap_or(CancelReply::NotFound)
    }

    pub(crate) fn release(
        &mut self,
        name: &Name,
        lease: LeaseId,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> bool {
        self.step(name, now, wakes, |st, hwm, wakes| {
            let held = st.remove_holder(lease);
            st.hand_off(now, hwm, wakes);
            held
        })
        .unwrap_or(false)
    }

    pub(crate) fn renew(
        &mut self,
        name: &Name,
        lease: LeaseId,
        ttl: Duration,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> RenewReply {
        self.step(name, now, wakes, |st, _, _| {
            let Some(l) = st.holders.get_mut(&lease) else {
                return RenewReply::Gone;
            };
            let old = l.expires_at;
            l.expires_at = old.max(now.plus(ttl));
            let expires_at = l.expires_at;
            st.holder_expiry.remove(&(old, lease));
            st.holder_expiry.insert((expires_at, lease));
            RenewReply::Renewed { expires_at, now }
        })
        .unwrap_or(RenewReply::Gone)
    }

    pub(crate) fn status(
        &mut self,
        name: &Name,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> Option<SemaphoreStatus> {
        self.step(name, now, wakes, |st, _, _| st.status(name, now))
            .filter(|s| !(s.holders.is_empty() && s.queue.is_empty()))
    }

    pub(crate) fn list(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .sems
            .iter()
            .filter(|(_, st)| !st.is_empty())
            .map(|(n, _)| n.to_string())
            .collect();
        names.sort();
        names
    }

    pub(crate) fn resize(
        &mut self,
        name: &Name,
        capacity: u32,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> Result<u32> {
        self.step(name, now, wakes, |st, hwm, wakes| {
            if st.is_empty() {
                return None;
            }
            let old = std::mem::replace(&mut st.capacity, capacity);
            st.hand_off(now, hwm, wakes);
            Some(old)
        })
        .flatten()
        .ok_or_else(|| not_found(name))
    }

    pub(crate) fn revoke(
        &mut self,
        name: &Name,
        lease: LeaseId,
        now: StoreTime,
        wakes: &mut Wakes,
    ) -> bool {
        self.step(name, now, wakes, |st, hwm, wakes| {
            let held = st.remove_holder(lease);
            if held {
                wakes.push(Wake::Ended(lease));
                st.hand_off(now, hwm, wakes);
            }
            held
        })
        .unwrap_or(false)
    }

    pub(crate) fn delete(&mut self, name: &Name, wakes: &mut Wakes) -> bool {
        let limits = self.limits.remove(name).is_some();
        let Some(st) = self.sems.remove(name) else {
            return limits;
        };
        if st.is_empty() {
            return limits;
        }
        wakes.extend(st.holders.keys().copied().map(Wake::Ended));
        wakes.extend(st.queue_index.keys().copied().map(Wake::Ended));
        true
    }
}

pub(crate) fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore \"{name}\" has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(lease: LeaseId) -> AcquireRequest {
        AcquireRequest {
            lease_id: lease,
            weight: 1,
            ttl: Duration::from_secs(10),
            holder: "t".into(),
            wait: None,
            tenant: None,
            first_send: false,
        }
    }

    fn grant(m: &mut Model, name: &Name, now: StoreTime) -> Lease {
        match m.acquire(name, 2, &req(LeaseId::random()), now, &mut Vec::new()) {
            Ok(AcquireReply::Granted(g)) => g.lease,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_idle_semaphore_is_absent_to_every_operation_and_keeps_its_fences_rising() {
        let mut m = Model::default();
        let name = Name::new("idle").unwrap();
        let now = StoreTime(1_000);
        let first = grant(&mut m, &name, now);
        assert!(m.release(&name, first.lease_id, now, &mut Vec::new()));
        // Idle: kept for reuse, but absent to status, list, resize and delete.
        assert!(m.status(&name, now, &mut Vec::new()).is_none());
        assert!(m.list().is_empty());
        assert!(m.resize(&name, 5, now, &mut Vec::new()).is_err());
        assert!(!m.release(&name, first.lease_id, now, &mut Vec::new()));
        // Reused with another capacity, seats from 0 again, fences still rising.
        let again = match m.acquire(&name, 7, &req(LeaseId::random()), now, &mut Vec::new()) {
            Ok(AcquireReply::Granted(g)) => g.lease,
            other => panic!("{other:?}"),
        };
        assert_eq!(again.seats, vec![0]);
        assert!(again.fence > first.fence);
        assert_eq!(m.status(&name, now, &mut Vec::new()).unwrap().capacity, 7);
        assert!(m.release(&name, again.lease_id, now, &mut Vec::new()));
        assert!(
            !m.delete(&name, &mut Vec::new()),
            "an idle semaphore is not deleted"
        );
        let after = grant(&mut m, &name, now);
        assert!(after.fence > again.fence);
    }

    #[test]
    fn idle_states_are_swept_so_many_names_used_once_do_not_pile_up() {
        let mut m = Model::default();
        let now = StoreTime(1_000);
        for i in 0..10 * SWEEP_MIN {
            let name = Name::new(format!("n{i}")).unwrap();
            let l = grant(&mut m, &name, now);
            assert!(m.release(&name, l.lease_id, now, &mut Vec::new()));
            assert!(m.sems.len() <= SWEEP_MIN, "{} states kept", m.sems.len());
        }
        // A live one is never swept.
        let live = Name::new("live").unwrap();
        let held = grant(&mut m, &live, now);
        for i in 0..3 * SWEEP_MIN {
            let name = Name::new(format!("m{i}")).unwrap();
            let l = grant(&mut m, &name, now);
            assert!(m.release(&name, l.lease_id, now, &mut Vec::new()));
        }
        assert_eq!(
            m.status(&live, now, &mut Vec::new()).unwrap().holders[0],
            held
        );
    }

    #[test]
    fn seats_returned_below_others_are_reused_lowest_first() {
        let mut m = Model::default();
        let name = Name::new("seats").unwrap();
        let now = StoreTime(1_000);
        let a = grant(&mut m, &name, now);
        let b = grant(&mut m, &name, now);
        assert_eq!((a.seats.clone(), b.seats.clone()), (vec![0], vec![1]));
        assert!(m.release(&name, a.lease_id, now, &mut Vec::new()));
        assert_eq!(grant(&mut m, &name, now).seats, vec![0]);
    }
}
