//! The step, written once for every SQL store: the reference model of
//! `stores/memory/ops.rs`, operation by operation, over the row operations of a
//! [`SemRows`] dialect (see the module docs of `sql/mod.rs` for its shape and invariants).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use super::dialect::{
    Dirty, HeadRow, HolderRow, LimitRow, NewHolder, NewWaiter, Place, QueueRow, SemRow, SemRows,
    WaiterRow,
};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use super::rate::{self, TenantLimiterRows};
use super::{decode_seats, encode_seats, runs};
use crate::error::{Error, InvalidInput, Result};
use crate::model::*;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::seam::{AdmitReply, AdmitRequest, RateConfig, RateReply, RateRequest};

/// Lease ids to wake after the commit (granted waiters, revoked or deleted holders).
pub type Wakes = Vec<LeaseId>;

/// The outcome of one operation and the lease ids to wake once it is committed. The outcome
/// may itself be an error (capacity mismatch, full queue) that still commits the purge.
pub type Done<R> = (R, Wakes);

/// Batch size when shrinking `seat_high` over free seats.
const SHRINK_BATCH: usize = 256;

/// Tags count cost in these units, so a share divides it without losing much (as the
/// reference model's `TAG_UNIT`).
const TAG_UNIT: u64 = 1_000;

/// A request's start and finish tags (`docs/fair-shares.md`), computed before the decision
/// and recorded only if it is granted or queued ([`Step::take_tags`]).
#[derive(Debug, Clone, Copy)]
struct Tags {
    start: u64,
    finish: u64,
    /// The tenant's row existed (a write updates it rather than adding one).
    stored: bool,
}

/// The counters of one semaphore row, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Sem {
    capacity: u32,
    used: u32,
    /// Waiters ever inserted (the tail row's `enqueued`) and ever removed (the semaphore
    /// row's `dequeued`): the queue holds `enqueued - dequeued` ([`Sem::queued`]).
    enqueued: u64,
    dequeued: u64,
    last_fence: u64,
    next_seq: u64,
    seat_high: u32,
    /// Fair shares' virtual time, the tenant `""`'s finish tag, and the number of tenant
    /// rows (`docs/fair-shares.md`, "The SQL stores").
    vtime: u64,
    finish: u64,
    tenants: u64,
}

impl Sem {
    fn from_row(row: &SemRow) -> Result<Sem> {
        if row.dequeued > row.enqueued {
            return Err(corrupt(format!(
                "dequeued {} > enqueued {}",
                row.dequeued, row.enqueued
            )));
        }
        Ok(Sem {
            capacity: capacity_of(row.capacity)?,
            used: u32_of(row.used, "used")?,
            enqueued: u64_of(row.enqueued, "enqueued")?,
            dequeued: u64_of(row.dequeued, "dequeued")?,
            last_fence: u64_of(row.last_fence, "last_fence")?,
            next_seq: u64_of(row.next_seq, "next_seq")?,
            seat_high: u32_of(row.seat_high, "seat_high")?,
            vtime: u64_of(row.vtime, "vtime")?,
            finish: u64_of(row.finish, "finish")?,
            tenants: u64_of(row.tenants, "tenants")?,
        })
    }

    /// How many waiters the queue holds.
    fn queued(&self) -> u64 {
        self.enqueued - self.dequeued
    }

    /// Which of the two rows differ from `old` (`None`: neither is stored yet).
    fn dirty(&self, old: Option<&Sem>) -> Dirty {
        let Some(old) = old else {
            return Dirty {
                sem: true,
                tail: true,
            };
        };
        Dirty {
            sem: (
                self.capacity,
                self.used,
                self.dequeued,
                self.last_fence,
                self.seat_high,
                self.vtime,
                self.tenants,
            ) != (
                old.capacity,
                old.used,
                old.dequeued,
                old.last_fence,
                old.seat_high,
                old.vtime,
                old.tenants,
            ),
            tail: (self.next_seq, self.enqueued, self.finish)
                != (old.next_seq, old.enqueued, old.finish),
        }
    }

    fn to_row(&self) -> Result<SemRow> {
        Ok(SemRow {
            capacity: self.capacity.into(),
            used: self.used.into(),
            enqueued: db_int(self.enqueued)?,
            dequeued: db_int(self.dequeued)?,
            last_fence: db_int(self.last_fence)?,
            next_seq: db_int(self.next_seq)?,
            seat_high: self.seat_high.into(),
            vtime: db_int(self.vtime)?,
            finish: db_int(self.finish)?,
            tenants: db_int(self.tenants)?,
        })
    }
}

/// Tenants' ceilings and floors of a name that has some (`docs/fair-shares.md`, "Ceilings
/// and floors"), read at the step's start, and the permits each named tenant holds.
#[derive(Debug)]
struct Limits {
    by_tenant: HashMap<String, TenantLimits>,
    /// `held[t]`; `None`: to be read (at its first use, and after a holder was removed).
    held: Option<HashMap<String, u32>>,
    /// The window-capped-until instants kept on the limits' rows (`docs/fair-shares.md`, "A
    /// ceiling on a share of the windows"): the tenant's own limiter refused an admission
    /// until then.
    capped: HashMap<String, StoreTime>,
}

/// A waiter as the hand-off with limits sees it ([`QueueRow`], checked).
#[derive(Debug, Clone)]
struct Queued {
    lease_id: String,
    weight: u32,
    tenant: Option<String>,
    gate: Option<i64>,
    tag: i64,
    seq: i64,
}

/// One atomic step on one semaphore, inside the caller's locked transaction.
struct Step<'r, R: SemRows> {
    rows: &'r mut R,
    now: StoreTime,
    /// The wall clock beside `now`: the fences' floor only, never an expiry.
    wall: StoreTime,
    sem: Sem,
    /// The row as loaded (`None`: not in the store yet), to skip writing an unchanged row.
    loaded: Option<Sem>,
    /// The store-wide fence high-water mark.
    hwm: u64,
    hwm_dirty: bool,
    wakes: Wakes,
    /// The name's tenants' limits; `None`: it has none, and every step is as without them.
    limits: Option<Limits>,
}

impl<'r, R: SemRows> Step<'r, R> {
    /// Loads the semaphore and runs purge → hand off. Without a row, creates one with
    /// `create` as capacity (acquire), or returns `None`.
    async fn load(rows: &'r mut R, create: Option<u32>) -> Result<Option<Step<'r, R>>> {
        let Some(mut step) = Step::open(rows, create).await? else {
            return Ok(None);
        };
        if step.loaded.is_some() {
            step.purge_and_hand_off().await?;
        }
        Ok(Some(step))
    }

    /// Loads the semaphore (and its tenants' limits, if it has any) without purging.
    async fn open(rows: &'r mut R, create: Option<u32>) -> Result<Option<Step<'r, R>>> {
        let found = rows.load(create).await?;
        let hwm = u64_of(found.hwm, "fence_hwm")?;
        let loaded = found.sem.as_ref().map(Sem::from_row).transpose()?;
        let mut step = Step {
            rows,
            now: found.now,
            wall: found.wall,
            sem: Sem {
                capacity: 0,
                used: 0,
                enqueued: 0,
                dequeued: 0,
                last_fence: 0,
                next_seq: 0,
                seat_high: 0,
                vtime: 0,
                finish: 0,
                tenants: 0,
            },
            loaded: loaded.clone(),
            hwm,
            hwm_dirty: false,
            wakes: Vec::new(),
            limits: None,
        };
        match (loaded, create) {
            (Some(sem), _) => step.sem = sem,
            (None, Some(capacity)) => {
                // A new semaphore starts at the store-wide high-water mark.
                step.sem.capacity = capacity;
                step.sem.last_fence = hwm;
            }
            (None, None) => return Ok(None),
        }
        if found.limits != 0 {
            let (by_tenant, capped) = limits_and_caps(step.rows.tenant_limits().await?)?;
            step.limits = Some(Limits {
                by_tenant: by_tenant.into_iter().collect(),
                held: None,
                capped,
            });
        }
        Ok(Some(step))
    }

    /// Writes the semaphore row back, or deletes it if nothing is left in it, and the fence
    /// high-water mark; returns the lease ids to wake after the commit.
    async fn finish(self) -> Result<Wakes> {
        if self.is_empty() {
            self.rows.drop_semaphore().await?;
            // With every seat returned, `seat_high` fell to 0 over the free seats, so there
            // are none left to drop unless it did not.
            if self.sem.seat_high != 0 {
                self.rows.drop_free_seats().await?;
            }
            // Idle: the tags restart at 0 with the next request.
            if self.sem.tenants != 0 {
                self.rows.drop_tenants().await?;
            }
        } else if self.loaded.as_ref() != Some(&self.sem) {
            let dirty = self.sem.dirty(self.loaded.as_ref());
            self.rows.save(&self.sem.to_row()?, dirty).await?;
        }
        if self.hwm_dirty {
            self.rows.raise_hwm(db_int(self.hwm)?).await?;
        }
        Ok(self.wakes)
    }

    /// No holders and no waiters. Every holder has a weight of at least 1 (the schema
    /// checks it), so `used == 0` means no holders.
    fn is_empty(&self) -> bool {
        self.sem.used == 0 && self.sem.queued() == 0
    }

    /// Checks the capacity a client declares: an idle semaphore (every lease and waiter
    /// expired: as if it did not exist) takes it, as in the reference model; a live one must
    /// hold the same.
    async fn declare(&mut self, name: &Name, capacity: u32) -> Result<Result<()>> {
        if self.is_empty() {
            self.sem.capacity = capacity;
            self.reset_tags().await?;
        }
        if self.sem.capacity != capacity {
            return Ok(Err(Error::CapacityMismatch {
                name: name.to_string(),
                stored: self.sem.capacity,
                declared: capacity,
            }));
        }
        Ok(Ok(()))
    }

    /// An idle semaphore forgets every tag (`V` and the finish tags restart at 0).
    async fn reset_tags(&mut self) -> Result<()> {
        self.sem.vtime = 0;
        self.sem.finish = 0;
        if self.sem.tenants != 0 {
            self.rows.drop_tenants().await?;
            self.sem.tenants = 0;
        }
        Ok(())
    }

    /// The start and finish tags a new request of `tenant` and `cost` would get; nothing
    /// changes until [`Step::take_tags`]. Reads the tenant's row only for a named tenant.
    async fn tags(&mut self, tenant: Option<&Tenant>, cost: u32) -> Result<Tags> {
        let (last, share, stored) = match tenant {
            None => (self.sem.finish, 1, true),
            Some(t) => match self.rows.tenant_finish(t.name()).await? {
                Some(f) => (u64_of(f, "tenant finish")?, t.share(), true),
                None => (0, t.share(), false),
            },
        };
        let start = last.max(self.sem.vtime);
        let finish = start.saturating_add(cost as u64 * TAG_UNIT / share.max(1) as u64);
        Ok(Tags {
            start,
            finish,
            stored,
        })
    }

    /// Records a request's finish tag and, granted at once, moves the virtual time to its
    /// start. Tenants whose finish tag the virtual time has passed are deleted now and then
    /// (they start at the virtual time either way).
    async fn take_tags(
        &mut self,
        tenant: Option<&Tenant>,
        tags: Tags,
        granted: bool,
    ) -> Result<()> {
        match tenant {
            None => self.sem.finish = tags.finish,
            Some(t) => {
                self.rows
                    .save_tenant(t.name(), db_int(tags.finish)?)
                    .await?;
                if !tags.stored {
                    self.sem.tenants += 1;
                }
            }
        }
        if granted {
            self.sem.vtime = self.sem.vtime.max(tags.start);
        }
        let live = self.sem.queued().saturating_add(self.sem.used.into());
        if self.sem.tenants > live.saturating_mul(2).saturating_add(16) {
            let gone = self.rows.prune_tenants(db_int(self.sem.vtime)?).await?;
            self.sem.tenants = self.sem.tenants.saturating_sub(gone);
        }
        Ok(())
    }

    /// Whether a request with start tag `start` (of `tenant`), arriving now, would be the
    /// queue head. Without tenant rows and without a tenant, a non-empty queue holds only
    /// requests without a tenant, whose start tags are below this one's: the head is not
    /// read (`docs/fair-shares.md`, "The SQL stores").
    async fn would_lead(&mut self, tenant: Option<&Tenant>, start: u64) -> Result<bool> {
        if self.sem.queued() == 0 {
            return Ok(true);
        }
        if self.sem.tenants == 0 && tenant.is_none() {
            return Ok(false);
        }
        let Some(head) = self.rows.head_key().await? else {
            return Err(corrupt(format!(
                "queued {} but no queue head",
                self.sem.queued()
            )));
        };
        let next = db_int(self.sem.next_seq)?;
        Ok((db_int(start)?, next) < (head.tag, head.seq))
    }

    /// The position a new waiter with key `(tag, seq)` takes (it is not queued yet): last,
    /// without tenants; counted otherwise.
    async fn position_of(&mut self, tenant: Option<&Tenant>, tag: i64, seq: i64) -> Result<u64> {
        if self.sem.tenants == 0 && tenant.is_none() {
            return Ok(self.sem.queued());
        }
        u64_of(self.rows.waiters_ahead(tag, seq).await?, "position")
    }

    fn available(&self) -> u32 {
        self.sem.capacity.saturating_sub(self.sem.used)
    }

    /// Whether a new request of `tenant` for `weight` permits (start tag `start`) is granted
    /// at once. Without limits: it fits and would be the head. With limits (the reference
    /// model's arrival): it would be the head (the first waiter not at its ceiling) or is
    /// within its tenant's floor, and it may be granted ([`Step::may_grant`]).
    async fn grants_at_once(
        &mut self,
        tenant: Option<&Tenant>,
        weight: u32,
        start: u64,
    ) -> Result<bool> {
        if self.limits.is_none() {
            return Ok(
                self.sem.used as u64 + weight as u64 <= self.sem.capacity as u64
                    && self.would_lead(tenant, start).await?,
            );
        }
        self.ensure_held().await?;
        let t = tenant.map(Tenant::name);
        if !self.may_grant(t, weight) {
            return Ok(false);
        }
        Ok(self.below_floor(t, weight) || self.would_lead_limited(start).await?)
    }

    /// With limits: whether a request with start tag `start`, arriving now, would be the
    /// head, the first waiter whose tenant is not at its ceiling for it (none: it would).
    async fn would_lead_limited(&mut self, start: u64) -> Result<bool> {
        if self.sem.queued() == 0 {
            return Ok(true);
        }
        let queue = self.read_queue().await?;
        let next = db_int(self.sem.next_seq)?;
        Ok(match self.head_of(&queue) {
            None => true,
            Some(i) => (db_int(start)?, next) < (queue[i].tag, queue[i].seq),
        })
    }

    /// The queue in `(tag, seq)` order (a name with limits only).
    async fn read_queue(&mut self) -> Result<Vec<Queued>> {
        let rows: Vec<QueueRow> = self.rows.queue().await?;
        rows.into_iter()
            .map(|q| {
                Ok(Queued {
                    weight: u32_of(q.weight, "weight")?,
                    tenant: tenant_of(&q.tenant)?,
                    lease_id: q.lease_id,
                    gate: q.gate,
                    tag: q.tag,
                    seq: q.seq,
                })
            })
            .collect()
    }

    /// The index of the head in `queue`: the first waiter whose tenant is not at its
    /// ceiling for it, and that is not an admission waiter of a tenant window-capped now
    /// (plain waiters are never window-capped).
    fn head_of(&self, queue: &[Queued]) -> Option<usize> {
        queue.iter().position(|q| {
            let t = q.tenant.as_deref();
            let window_capped = q.gate.is_some() && self.window_capped(t);
            !self.capped(t, q.weight) && !window_capped
        })
    }

    /// Whether `tenant` has a window ceiling whose own limiter refused it until after now.
    fn window_capped(&self, tenant: Option<&str>) -> bool {
        let (Some(t), Some(l)) = (tenant, &self.limits) else {
            return false;
        };
        self.limits_of(tenant).window_ceiling.is_some()
            && l.capped.get(t).is_some_and(|&until| until > self.now)
    }

    /// Whether a tenant of the name has a window ceiling (then a give-back or a settle
    /// reaches the lease's tenant's own limiter too).
    fn has_window_ceilings(&self) -> bool {
        self.limits
            .as_ref()
            .is_some_and(|l| l.by_tenant.values().any(|t| t.window_ceiling.is_some()))
    }

    /// Records (`Some`) or clears `tenant`'s window-capped-until instant, on its row too.
    async fn cap_window(&mut self, tenant: &str, until: Option<StoreTime>) -> Result<()> {
        let Some(l) = &mut self.limits else {
            return Err(corrupt("internal: a window cap without limits"));
        };
        let old = match until {
            Some(at) => l.capped.insert(tenant.to_string(), at),
            None => l.capped.remove(tenant),
        };
        if old != until {
            let at = until.map(|t| db_int(t.0)).transpose()?;
            self.rows.cap_window(tenant, at).await?;
        }
        Ok(())
    }

    /// Reads `held[t]` if it is not known (a name with limits only).
    async fn ensure_held(&mut self) -> Result<()> {
        if self.limits.as_ref().is_none_or(|l| l.held.is_some()) {
            return Ok(());
        }
        let mut held = HashMap::new();
        for (tenant, weight) in self.rows.held_by_tenant().await? {
            held.insert(tenant, u32_of(weight, "a tenant's held permits")?);
        }
        if let Some(l) = &mut self.limits {
            l.held = Some(held);
        }
        Ok(())
    }

    /// A holder went: `held[t]` is read again when next needed.
    fn forget_held(&mut self) {
        if let Some(l) = &mut self.limits {
            l.held = None;
        }
    }

    /// Permits held by `tenant`'s leases (after [`Step::ensure_held`]).
    fn held_by(&self, tenant: &str) -> u32 {
        self.limits
            .as_ref()
            .and_then(|l| l.held.as_ref())
            .and_then(|h| h.get(tenant))
            .copied()
            .unwrap_or(0)
    }

    fn limits_of(&self, tenant: Option<&str>) -> TenantLimits {
        match (tenant, &self.limits) {
            (Some(t), Some(l)) => l.by_tenant.get(t).copied().unwrap_or_default(),
            _ => TenantLimits::default(),
        }
    }

    /// Whether `tenant` (`None`: a request that named none) is at its ceiling for `weight`
    /// more permits.
    fn capped(&self, tenant: Option<&str>, weight: u32) -> bool {
        match (tenant, self.limits_of(tenant).ceiling) {
            (Some(t), Some(c)) => self.held_by(t) as u64 + weight as u64 > c as u64,
            _ => false,
        }
    }

    /// Whether `weight` more permits keep `tenant` within its floor.
    fn below_floor(&self, tenant: Option<&str>, weight: u32) -> bool {
        match (tenant, self.limits_of(tenant).floor) {
            (Some(t), floor) if floor > 0 => self.held_by(t) as u64 + weight as u64 <= floor as u64,
            _ => false,
        }
    }

    /// Whether `tenant` may be granted `weight` permits now: they fit, its ceiling allows
    /// them, and they leave what the other tenants' floors keep (each floor less what its
    /// tenant holds). Without limits: they fit.
    fn may_grant(&self, tenant: Option<&str>, weight: u32) -> bool {
        let Some(limits) = &self.limits else {
            return self.sem.used as u64 + weight as u64 <= self.sem.capacity as u64;
        };
        if self.capped(tenant, weight) {
            return false;
        }
        let kept: u64 = limits
            .by_tenant
            .iter()
            .filter(|(u, _)| Some(u.as_str()) != tenant)
            .map(|(u, l)| l.floor.saturating_sub(self.held_by(u)) as u64)
            .sum();
        weight as u64 + kept <= self.available() as u64
    }

    fn now_db(&self) -> Result<i64> {
        db_int(self.now.0)
    }

    /// Drops expired holders and waiters, then hands freed permits to the queue.
    async fn purge_and_hand_off(&mut self) -> Result<()> {
        if self.sem.used > 0 {
            let now = self.now_db()?;
            let mut freed = Vec::new();
            for row in self.rows.purge_holders(now).await? {
                let weight = u32_of(row.weight, "weight")?;
                freed.extend(decode_seats(&row.seats, weight)?);
                self.take_used(weight)?;
            }
            if !freed.is_empty() {
                self.forget_held();
            }
            freed.sort_unstable();
            self.return_seats(freed).await?;
        }
        if self.sem.queued() > 0 {
            let gone = self.rows.purge_waiters(self.now_db()?).await?;
            self.take_queued(gone)?;
        }
        self.hand_off().await
    }

    fn take_used(&mut self, weight: u32) -> Result<()> {
        self.sem.used = self.sem.used.checked_sub(weight).ok_or_else(|| {
            corrupt(format!(
                "used {} < a holder's weight {weight}",
                self.sem.used
            ))
        })?;
        Ok(())
    }

    fn take_queued(&mut self, n: u64) -> Result<()> {
        if n > self.sem.queued() {
            return Err(corrupt(format!(
                "queued {} < {n} waiters removed",
                self.sem.queued()
            )));
        }
        self.sem.dequeued += n;
        Ok(())
    }

    /// Strict FIFO: grant the head while it fits; a head that does not fit blocks the rest,
    /// and so does an admission waiter, which only its own step grants (woken here once it
    /// fits: `SemRows::wake_gated_head`).
    async fn hand_off(&mut self) -> Result<()> {
        if self.limits.is_some() {
            return self.hand_off_limited().await;
        }
        while self.sem.queued() > 0 && self.sem.used < self.sem.capacity {
            let available = self.available().into();
            let Some(head) = self.rows.pop_head_if_fits(available).await? else {
                let now = self.now_db()?;
                if let Some(lease) = self.rows.wake_gated_head(available, now).await? {
                    self.wakes.push(lease_of(&lease)?);
                }
                break;
            };
            self.grant_popped(head).await?;
        }
        Ok(())
    }

    /// The hand-off with tenants' ceilings and floors (`docs/fair-shares.md`, the reference
    /// model's `hand_off_limited`): first a waiter whose tenant is below its floor and may be
    /// granted, in queue order, ahead of the head (an admission waiter among them is left to
    /// its own step); then the head, the first waiter whose tenant is not at its ceiling for
    /// it, while it may be granted (an admission waiter there is woken as without limits).
    /// The queue is read once per hand-off: O(queue), for names with limits only.
    async fn hand_off_limited(&mut self) -> Result<()> {
        if self.sem.queued() == 0 || self.sem.used >= self.sem.capacity {
            // Nothing may be granted with no permit free (every weight is at least 1).
            return Ok(());
        }
        let mut queue = self.read_queue().await?;
        loop {
            self.ensure_held().await?;
            let floor = queue.iter().position(|q| {
                let (t, w) = (q.tenant.as_deref(), q.weight);
                q.gate.is_none() && self.below_floor(t, w) && self.may_grant(t, w)
            });
            let i = match floor {
                Some(i) => i,
                None => {
                    let Some(i) = self.head_of(&queue) else { break };
                    let q = &queue[i];
                    if !self.may_grant(q.tenant.as_deref(), q.weight) {
                        break;
                    }
                    if q.gate.is_some() {
                        let now = self.now_db()?;
                        if let Some(lease) = self.rows.wake_gated(&q.lease_id, now).await? {
                            self.wakes.push(lease_of(&lease)?);
                        }
                        break;
                    }
                    i
                }
            };
            let q = queue.remove(i);
            let Some(head) = self.rows.pop_waiter(&q.lease_id).await? else {
                return Err(corrupt(format!(
                    "waiter {} read but not queued",
                    q.lease_id
                )));
            };
            self.grant_popped(head).await?;
        }
        Ok(())
    }

    /// Grants a waiter taken out of the queue by a hand-off.
    async fn grant_popped(&mut self, head: HeadRow) -> Result<()> {
        self.take_queued(1)?;
        self.sem.vtime = self.sem.vtime.max(u64_of(head.tag, "tag")?);
        let lease_id = lease_of(&head.lease_id)?;
        let weight = u32_of(head.weight, "weight")?;
        let ttl = Duration::from_micros(u64_of(head.ttl, "ttl")?);
        // Provisional until renewed: no longer than the waiter's entry would have lived.
        let entry = StoreTime(u64_of(head.expires_at, "waiter expires_at")?).since(self.now);
        self.grant(lease_id, weight, ttl.min(entry), head.holder, head.tenant)
            .await?;
        self.wakes.push(lease_id);
        Ok(())
    }

    async fn grant(
        &mut self,
        lease_id: LeaseId,
        weight: u32,
        ttl: Duration,
        holder: String,
        tenant: Option<String>,
    ) -> Result<Lease> {
        let seats = self.take_seats(weight).await?;
        let fence = self
            .sem
            .last_fence
            .saturating_add(1)
            .max(self.wall.0)
            .max(self.hwm.saturating_add(1));
        self.sem.last_fence = fence;
        self.hwm = fence;
        self.hwm_dirty = true;
        self.sem.used += weight;
        if let (Some(t), Some(held)) = (&tenant, self.limits.as_mut().and_then(|l| l.held.as_mut()))
        {
            *held.entry(t.clone()).or_default() += weight;
        }
        let lease = Lease {
            lease_id,
            weight,
            seats,
            fence,
            holder,
            acquired_at: self.now,
            expires_at: self.now.plus(ttl),
            tenant,
        };
        let (lease_text, seats_text) = (lease_id.to_string(), encode_seats(&lease.seats));
        let row = NewHolder {
            lease_id: &lease_text,
            weight: weight.into(),
            seats: &seats_text,
            fence: db_int(fence)?,
            holder: &lease.holder,
            acquired_at: db_int(lease.acquired_at.0)?,
            expires_at: db_int(lease.expires_at.0)?,
            tenant: lease.tenant.as_deref(),
        };
        self.rows.insert_holder(&row).await?;
        Ok(lease)
    }

    /// The `n` lowest free seats below the capacity: returned seats first, then from
    /// `seat_high` up. There are always enough while `used + n <= capacity`.
    async fn take_seats(&mut self, n: u32) -> Result<Vec<u32>> {
        let mut seats = Vec::with_capacity(n as usize);
        if self.sem.seat_high > 0 {
            for seat in self
                .rows
                .take_free_seats(self.sem.capacity.into(), n.into())
                .await?
            {
                seats.push(u32_of(seat, "seat")?);
            }
        }
        let rest = n - seats.len() as u32;
        if rest == 0 {
            // After a shrinking resize `seat_high` may exceed the capacity; that is fine as
            // long as the returned seats below the capacity sufficed.
            return Ok(seats);
        }
        let high = self.sem.seat_high;
        if high as u64 + rest as u64 > self.sem.capacity as u64 {
            return Err(corrupt(format!(
                "no {n} free seats below capacity {} (seat_high {high})",
                self.sem.capacity
            )));
        }
        seats.extend(high..high + rest);
        self.sem.seat_high = high + rest;
        Ok(seats)
    }

    /// Returns ascending `seats` to the free set, lowering `seat_high` over free seats at
    /// its top so the free set stays small.
    async fn return_seats(&mut self, mut seats: Vec<u32>) -> Result<()> {
        let old_high = self.sem.seat_high;
        if seats.last().is_some_and(|&s| s >= old_high) {
            return Err(corrupt(format!(
                "seat {:?} >= seat_high {old_high}",
                seats.last()
            )));
        }
        // Seats right below `seat_high` need no row: they just lower it.
        let mut high = old_high;
        while seats.last().is_some_and(|&s| s + 1 == high) {
            seats.pop();
            high -= 1;
        }
        for (lo, hi) in runs(&seats) {
            self.rows.insert_free_seats(lo.into(), hi.into()).await?;
        }
        if high < old_high {
            // `old_high - 1` was returned; keep lowering over free seats already stored.
            while high > 0 {
                let top = self
                    .rows
                    .top_free_seats(high.into(), SHRINK_BATCH as i64)
                    .await?;
                let mut lowered = 0;
                for seat in top {
                    if u32_of(seat, "seat")?.checked_add(1) != Some(high) {
                        break;
                    }
                    high -= 1;
                    lowered += 1;
                }
                if lowered > 0 {
                    self.rows.drop_free_seats_from(high.into()).await?;
                }
                if lowered < SHRINK_BATCH {
                    break;
                }
            }
        }
        self.sem.seat_high = high;
        Ok(())
    }

    async fn remove_holder(&mut self, lease: LeaseId) -> Result<bool> {
        let Some(freed) = self.rows.remove_holder(&lease.to_string()).await? else {
            return Ok(false);
        };
        let weight = u32_of(freed.weight, "weight")?;
        let seats = decode_seats(&freed.seats, weight)?;
        self.take_used(weight)?;
        self.forget_held();
        self.return_seats(seats).await?;
        Ok(true)
    }

    async fn remove_waiter(&mut self, lease: LeaseId) -> Result<bool> {
        let n = self.rows.remove_waiter(&lease.to_string()).await?;
        self.take_queued(n)?;
        Ok(n > 0)
    }

    async fn refresh_waiter(&mut self, lease: LeaseId, expires_at: StoreTime) -> Result<bool> {
        if self.sem.queued() == 0 {
            return Ok(false);
        }
        let at = db_int(expires_at.0)?;
        Ok(self.rows.refresh_waiter(&lease.to_string(), at).await? > 0)
    }

    /// The place of a queued waiter: how many are ahead, and its start tag.
    async fn place(&mut self, lease: LeaseId) -> Result<(u64, u64)> {
        let Some(Place { ahead, tag }) = self.rows.waiter_place(&lease.to_string()).await? else {
            return Err(corrupt(format!("waiter {lease} refreshed but not queued")));
        };
        Ok((u64_of(ahead, "position")?, u64_of(tag, "tag")?))
    }

    async fn holder(&mut self, lease: LeaseId) -> Result<Option<Lease>> {
        if self.sem.used == 0 {
            return Ok(None);
        }
        let row = self.rows.holder(&lease.to_string()).await?;
        row.as_ref().map(lease_of_row).transpose()
    }

    async fn snapshot(&mut self, name: &Name) -> Result<SemaphoreStatus> {
        let holders = self
            .rows
            .holders()
            .await?
            .iter()
            .map(lease_of_row)
            .collect::<Result<Vec<_>>>()?;
        let queue = self
            .rows
            .waiters()
            .await?
            .iter()
            .map(waiter_of_row)
            .collect::<Result<Vec<_>>>()?;
        Ok(SemaphoreStatus::new(
            name,
            self.sem.capacity,
            self.sem.used,
            self.now,
            holders,
            queue,
        ))
    }
}

pub async fn acquire(
    rows: &mut impl SemRows,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<Done<Result<AcquireReply>>> {
    let mut st = Step::load(rows, Some(capacity))
        .await?
        .ok_or_else(|| corrupt("internal: semaphore not created"))?;
    let reply = decide_acquire(&mut st, name, capacity, req).await?;
    Ok((reply, st.finish().await?))
}

async fn decide_acquire<R: SemRows>(
    st: &mut Step<'_, R>,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<Result<AcquireReply>> {
    let now = st.now;
    if let Err(e) = st.declare(name, capacity).await? {
        return Ok(Err(e));
    }
    // A retry of an acquire whose reply was lost: report what it already has.
    if let Some(lease) = st.holder(req.lease_id).await? {
        return Ok(Ok(AcquireReply::Granted(Grant { lease, now })));
    }
    if let Some(wait) = req.wait {
        if st
            .refresh_waiter(req.lease_id, now.plus(wait.waiter_ttl))
            .await?
        {
            let (position, _) = st.place(req.lease_id).await?;
            return Ok(Ok(AcquireReply::Queued { position }));
        }
    }
    // Only a request that would be the head may take free permits: without tenants, one
    // that finds nobody waiting; neither a try nor a newcomer jumps the queue.
    let tenant = req.tenant.as_ref();
    let tags = st.tags(tenant, req.weight).await?;
    if st.grants_at_once(tenant, req.weight, tags.start).await? {
        st.take_tags(tenant, tags, true).await?;
        let lease = st
            .grant(
                req.lease_id,
                req.weight,
                req.ttl,
                req.holder.clone(),
                tenant.map(|t| t.name().to_string()),
            )
            .await?;
        return Ok(Ok(AcquireReply::Granted(Grant { lease, now })));
    }
    let Some(wait) = req.wait else {
        return Ok(Ok(AcquireReply::NoPermit {
            available: st.available(),
            queued: st.sem.queued(),
        }));
    };
    if st.sem.queued() >= wait.queue_cap as u64 {
        return Ok(Err(Error::QueueFull {
            name: name.to_string(),
            cap: wait.queue_cap,
        }));
    }
    st.take_tags(tenant, tags, false).await?;
    let (tag, seq) = (db_int(tags.start)?, db_int(st.sem.next_seq)?);
    let position = st.position_of(tenant, tag, seq).await?;
    let lease_id = req.lease_id.to_string();
    st.rows
        .insert_waiter(&NewWaiter {
            tag,
            seq,
            lease_id: &lease_id,
            weight: req.weight.into(),
            holder: &req.holder,
            ttl: db_int(req.ttl.as_micros().min(u64::MAX as u128) as u64)?,
            enqueued_at: db_int(now.0)?,
            expires_at: db_int(now.plus(wait.waiter_ttl).0)?,
            gate: None,
            tenant: tenant.map(Tenant::name),
        })
        .await?;
    st.sem.next_seq = st.sem.next_seq.saturating_add(1);
    st.sem.enqueued += 1;
    Ok(Ok(AcquireReply::Queued { position }))
}

/// One admission step (`crate::admission::seam`), the semaphore's rows and the limiter's in
/// one transaction: the dialect's rows are also its [`TenantLimiterRows`] (the name's
/// limiter's rows, and its tenants' own limiters'), and the reference model is
/// `Model::admit` in `stores/memory/ops.rs`.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn admit<R: SemRows + TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    capacity: u32,
    config: &RateConfig,
    req: &AdmitRequest,
) -> Result<Done<Result<AdmitReply>>> {
    let mut st = Step::load(rows, Some(capacity))
        .await?
        .ok_or_else(|| corrupt("internal: semaphore not created"))?;
    let reply = decide_admit(&mut st, name, capacity, config, req).await?;
    Ok((reply, st.finish().await?))
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
async fn decide_admit<R: SemRows + TenantLimiterRows>(
    st: &mut Step<'_, R>,
    name: &Name,
    capacity: u32,
    config: &RateConfig,
    req: &AdmitRequest,
) -> Result<Result<AdmitReply>> {
    let now = st.now;
    let a = &req.acquire;
    if let Err(e) = st.declare(name, capacity).await? {
        return Ok(Err(e));
    }
    // A retry whose reply was lost: the grant stands (its charge id is not kept, so a
    // give-back of it releases the permits and leaves the windows charged).
    if let Some(lease) = st.holder(a.lease_id).await? {
        return Ok(Ok(AdmitReply::Granted {
            grant: Grant { lease, now },
            reservation: 0,
        }));
    }
    let queued = match a.wait {
        Some(wait) => {
            st.refresh_waiter(a.lease_id, now.plus(wait.waiter_ttl))
                .await?
        }
        None => false,
    };
    // A queued waiter's place and start tag.
    let place = match queued {
        true => Some(st.place(a.lease_id).await?),
        false => None,
    };
    let position = place.map_or(0, |p| p.0);
    let tenant = a.tenant.as_ref();
    let tags = match place {
        None => Some(st.tags(tenant, req.cost).await?),
        Some(_) => None,
    };
    let (lead, turn) = match st.limits.is_some() {
        false => {
            let fits = st.sem.used as u64 + a.weight as u64 <= st.sem.capacity as u64;
            let lead = match (fits, tags) {
                (true, Some(tags)) => st.would_lead(tenant, tags.start).await?,
                _ => false,
            };
            // A request that gave back an admission it could not use goes first.
            let turn = fits
                && match tags {
                    None => position == 0,
                    Some(_) => lead || req.at_head,
                };
            (lead, turn)
        }
        // With limits, as the reference model: the head is the first waiter not at its
        // ceiling, and a request within its tenant's floor goes first too.
        true => {
            st.ensure_held().await?;
            let t = tenant.map(Tenant::name);
            let lead = match tags {
                Some(tags) => st.would_lead_limited(tags.start).await?,
                None => false,
            };
            let first = match place {
                Some(_) => {
                    let queue = st.read_queue().await?;
                    let me = a.lease_id.to_string();
                    st.head_of(&queue).is_some_and(|i| queue[i].lease_id == me)
                }
                None => lead || req.at_head,
            };
            let turn = (first || st.below_floor(t, a.weight)) && st.may_grant(t, a.weight);
            (lead, turn)
        }
    };
    let mut window_at = None;
    if turn {
        let ask = RateRequest {
            cost: req.cost,
            max_wait: None,
            update: req.update,
        };
        // A tenant with a window ceiling (`docs/fair-shares.md`, "A ceiling on a share of
        // the windows"): its own limiter first, charging nothing.
        let t = tenant.map(Tenant::name);
        let own = match (t, st.limits_of(t).window_ceiling) {
            (Some(t), Some(pct)) => {
                let scaled = config.scaled(pct);
                if req.cost > scaled.max_cost() {
                    return Ok(Err(Error::InvalidInput(InvalidInput::Cost {
                        cost: req.cost,
                        max: scaled.max_cost(),
                    })));
                }
                let refused =
                    rate::tenant_refuses(&mut *st.rows, name, t, &scaled, req.cost).await?;
                Some((t, scaled, refused))
            }
            _ => None,
        };
        let decided = match &own {
            Some((t, _, Some(until))) => {
                // Capped until then: nothing charged, the reply's instant the later of the
                // tenant's and the shared limiter's, and the waiters behind may be woken.
                st.cap_window(t, Some(*until)).await?;
                window_at = match rate::peek(&mut *st.rows, name, config, &ask).await {
                    Ok(RateReply::Limited { retry_at, .. }) => Some(retry_at.max(*until)),
                    Ok(RateReply::Admitted { .. }) => Some(*until),
                    Err(e @ Error::RateMismatch { .. }) => return Ok(Err(e)),
                    Err(e) => return Err(e),
                };
                st.hand_off().await?;
                None
            }
            _ => Some(rate::acquire(&mut *st.rows, name, config, &ask).await),
        };
        match decided {
            None => {}
            Some(Ok(RateReply::Admitted { reservation, .. })) => {
                if let Some((t, scaled, None)) = &own {
                    st.cap_window(t, None).await?;
                    let charged =
                        rate::charge_tenant(&mut *st.rows, name, t, scaled, req.cost, reservation)
                            .await?;
                    if !charged {
                        return Err(corrupt(format!(
                            "tenant {t:?}'s own limiter on {name} refused in the step it admitted"
                        )));
                    }
                }
                match (place, tags) {
                    (Some((_, start)), _) => st.sem.vtime = st.sem.vtime.max(start),
                    // At the head by a give-back, the virtual time stays where the head is.
                    (None, Some(tags)) => st.take_tags(tenant, tags, lead).await?,
                    (None, None) => {}
                }
                if queued {
                    st.remove_waiter(a.lease_id).await?;
                }
                let lease = st
                    .grant(
                        a.lease_id,
                        a.weight,
                        a.ttl,
                        a.holder.clone(),
                        tenant.map(|t| t.name().to_string()),
                    )
                    .await?;
                // The waiters behind a head that was an admission get what still fits.
                st.hand_off().await?;
                return Ok(Ok(AdmitReply::Granted {
                    grant: Grant { lease, now },
                    reservation,
                }));
            }
            Some(Ok(RateReply::Limited { retry_at, .. })) => window_at = Some(retry_at),
            Some(Err(e @ Error::RateMismatch { .. })) => return Ok(Err(e)),
            Some(Err(e)) => return Err(e),
        }
    }
    let gate = db_int(window_at.map_or(0, |t| t.0))?;
    let lease_id = a.lease_id.to_string();
    if queued {
        st.rows.set_gate(&lease_id, gate).await?;
        return Ok(Ok(AdmitReply::Queued {
            position,
            window_at,
            now,
        }));
    }
    let Some(wait) = a.wait else {
        return Ok(Ok(AdmitReply::Refused {
            available: st.available(),
            queued: st.sem.queued(),
            window_at,
            now,
        }));
    };
    if st.sem.queued() >= wait.queue_cap as u64 {
        return Ok(Err(Error::QueueFull {
            name: name.to_string(),
            cap: wait.queue_cap,
        }));
    }
    let Some(tags) = tags else {
        return Err(corrupt("internal: a new waiter without tags"));
    };
    st.take_tags(tenant, tags, false).await?;
    let head = match req.at_head && st.sem.queued() > 0 {
        true => st.rows.head_key().await?,
        false => None,
    };
    // At the head: the head's tag and a seq below every queued one (`seq` stays unique).
    let (tag, seq) = match head {
        Some(head) => (head.tag, head.min_seq - 1),
        None => (db_int(tags.start)?, db_int(st.sem.next_seq)?),
    };
    let position = match head {
        Some(_) => 0,
        None => st.position_of(tenant, tag, seq).await?,
    };
    if head.is_none() {
        st.sem.next_seq = st.sem.next_seq.saturating_add(1);
    }
    st.rows
        .insert_waiter(&NewWaiter {
            tag,
            seq,
            lease_id: &lease_id,
            weight: a.weight.into(),
            holder: &a.holder,
            ttl: db_int(a.ttl.as_micros().min(u64::MAX as u128) as u64)?,
            enqueued_at: db_int(now.0)?,
            expires_at: db_int(now.plus(wait.waiter_ttl).0)?,
            gate: Some(gate),
            tenant: tenant.map(Tenant::name),
        })
        .await?;
    st.sem.enqueued += 1;
    Ok(Ok(AdmitReply::Queued {
        position,
        window_at,
        now,
    }))
}

pub async fn heartbeat(
    rows: &mut impl SemRows,
    lease: LeaseId,
    waiter_ttl: Duration,
) -> Result<Done<WaitReply>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((WaitReply::Gone, Vec::new()));
    };
    let now = st.now;
    let reply = if let Some(l) = st.holder(lease).await? {
        WaitReply::Granted(Grant { lease: l, now })
    } else if st.refresh_waiter(lease, now.plus(waiter_ttl)).await? {
        WaitReply::Waiting
    } else {
        WaitReply::Gone
    };
    Ok((reply, st.finish().await?))
}

/// A read-only answer to a woken waiter's heartbeat: its grant, if `lease` holds permits
/// that have not expired at `now`. Outside a write transaction this is what a full
/// [`heartbeat`] step would answer for such a lease (the step's purge removes only expired
/// holders, and its hand-offs add holders, never remove one); `None` means only that the
/// full step must decide (queued, expired, revoked or unknown).
pub async fn read_grant(
    rows: &mut impl SemRows,
    lease: LeaseId,
    now: StoreTime,
) -> Result<Option<Grant>> {
    let Some(row) = rows.holder(&lease.to_string()).await? else {
        return Ok(None);
    };
    let lease = lease_of_row(&row)?;
    Ok((lease.expires_at > now).then_some(Grant { lease, now }))
}

pub async fn cancel(rows: &mut impl SemRows, lease: LeaseId) -> Result<Done<CancelReply>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((CancelReply::NotFound, Vec::new()));
    };
    let reply = if st.remove_waiter(lease).await? {
        CancelReply::Dequeued
    } else if st.remove_holder(lease).await? {
        CancelReply::Released
    } else {
        CancelReply::NotFound
    };
    if reply != CancelReply::NotFound {
        // Removing the head of the queue, or freeing permits, may let the next in.
        st.hand_off().await?;
    }
    Ok((reply, st.finish().await?))
}

pub async fn release(rows: &mut impl SemRows, lease: LeaseId) -> Result<Done<bool>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((false, Vec::new()));
    };
    let held = st.remove_holder(lease).await?;
    st.hand_off().await?;
    Ok((held, st.finish().await?))
}

pub async fn renew(
    rows: &mut impl SemRows,
    lease: LeaseId,
    ttl: Duration,
) -> Result<Done<RenewReply>> {
    let Some(st) = Step::load(rows, None).await? else {
        return Ok((RenewReply::Gone, Vec::new()));
    };
    let now = st.now;
    let at = db_int(now.plus(ttl).0)?;
    let reply = match st.rows.renew_holder(&lease.to_string(), at).await? {
        Some(expires_at) => RenewReply::Renewed {
            expires_at: time_of(expires_at, "expires_at")?,
            now,
        },
        None => RenewReply::Gone,
    };
    Ok((reply, st.finish().await?))
}

/// The step's status: purge, hand off, then the snapshot (`None` without holders or
/// waiters). Stores first try the same answer from a snapshot read without the lock
/// (`snapshot.rs`, whose module docs list what this step changes and when it changes
/// nothing), and run this only when that read leaves it to the step.
pub async fn status(rows: &mut impl SemRows, name: &Name) -> Result<Done<Option<SemaphoreStatus>>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((None, Vec::new()));
    };
    let snap = st.snapshot(name).await?;
    let wakes = st.finish().await?;
    let snap = Some(snap).filter(|s| !(s.holders.is_empty() && s.queue.is_empty()));
    Ok((snap, wakes))
}

pub async fn resize(
    rows: &mut impl SemRows,
    name: &Name,
    capacity: u32,
) -> Result<Done<Result<u32>>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((Err(not_found(name)), Vec::new()));
    };
    if st.is_empty() {
        // Everything in it had expired: the purge is committed and the row deleted.
        return Ok((Err(not_found(name)), st.finish().await?));
    }
    let old = std::mem::replace(&mut st.sem.capacity, capacity);
    st.hand_off().await?;
    Ok((Ok(old), st.finish().await?))
}

pub async fn revoke(rows: &mut impl SemRows, lease: LeaseId) -> Result<Done<bool>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok((false, Vec::new()));
    };
    let held = st.remove_holder(lease).await?;
    if held {
        st.wakes.push(lease);
        st.hand_off().await?;
    }
    Ok((held, st.finish().await?))
}

/// An admission given back unused (`crate::admission::seam`): the lease released and its
/// charge returned to the name's limiter ([`rate::give_back`], `counted`: the limiter's row
/// counts admissions given back past their use-by instant) in one transaction, and to the
/// own limiter of the lease's tenant when the name has window ceilings (`docs/fair-shares.md`,
/// "A ceiling on a share of the windows"): the tenant is read before the release, and a
/// lease no longer held (revoked, expired) no longer names one. Without window ceilings,
/// the statements of a release and a give-back, no more.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn give_back<R: SemRows + TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    lease: LeaseId,
    g: &crate::seam::GiveBack,
    slack: u64,
    counted: bool,
) -> Result<Done<bool>> {
    let ((released, tenant), wakes) = release_from_tenant(rows, lease).await?;
    rate::give_back(rows, name, g, slack, counted && released).await?;
    if let Some(t) = &tenant {
        rate::give_back_tenant(rows, name, t, g, slack).await?;
    }
    Ok((released, wakes))
}

/// An admission's cost settled (`crate::admission::seam`): the lease released and the cost
/// settled on the name's limiter in one transaction, and on the own limiter of the lease's
/// tenant when the name has window ceilings (see [`give_back`]).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub async fn settle<R: SemRows + TenantLimiterRows>(
    rows: &mut R,
    name: &Name,
    lease: LeaseId,
    s: &crate::seam::Settlement,
    slack: u64,
) -> Result<Done<bool>> {
    let ((released, tenant), wakes) = release_from_tenant(rows, lease).await?;
    rate::settle(rows, name, s, released, slack).await?;
    if let Some(t) = &tenant {
        rate::settle_tenant(rows, name, t, s, released, slack).await?;
    }
    Ok((released, wakes))
}

/// [`release`], and the tenant of the lease it released if the name has window ceilings
/// (read before the release; `None` otherwise, and without reading it).
#[cfg(any(feature = "sqlite", feature = "mysql"))]
async fn release_from_tenant(
    rows: &mut impl SemRows,
    lease: LeaseId,
) -> Result<Done<(bool, Option<String>)>> {
    let Some(mut st) = Step::load(rows, None).await? else {
        return Ok(((false, None), Vec::new()));
    };
    let tenant = match st.has_window_ceilings() {
        true => st.holder(lease).await?.and_then(|l| l.tenant),
        false => None,
    };
    let held = st.remove_holder(lease).await?;
    st.hand_off().await?;
    let tenant = tenant.filter(|_| held);
    Ok(((held, tenant), st.finish().await?))
}

/// Removes the semaphore with its holders and waiters, without purging first (as the
/// model). Unreadable lease ids are skipped rather than failing: deleting is how an admin
/// clears a semaphore whose rows are damaged.
pub async fn delete(rows: &mut impl SemRows) -> Result<Done<bool>> {
    rows.lock_for_delete().await?;
    let holders = rows.drop_holders().await?;
    let waiters = rows.drop_waiters().await?;
    let wakes = holders
        .iter()
        .chain(&waiters)
        .filter_map(|s| s.parse().ok());
    let wakes: Wakes = wakes.collect();
    rows.drop_free_seats().await?;
    // Its tenants' tags too: a semaphore made again under this name starts them at 0.
    rows.drop_tenants().await?;
    // And the limits kept for the name.
    let limits = rows.drop_all_tenant_limits().await?;
    let existed = rows.drop_semaphore().await?;
    Ok((existed || limits > 0, wakes))
}

/// Sets (or, with [`TenantLimits::is_none`], removes) `tenant`'s limits on the name, then
/// hands off what they let in, as the reference model's `set_tenant_limits`: floors that
/// would add up above the capacity of a semaphore that has holders or waiters are
/// [`Error::InvalidInput`] and change nothing. The semaphore's row is locked first (created
/// as a placeholder of capacity 1 where the dialect needs a row to lock, and dropped again
/// at the end when idle), so no step of the name runs with the limits of before once this
/// one commits.
pub async fn set_tenant_limits(
    rows: &mut impl SemRows,
    name: &Name,
    tenant: &str,
    limits: TenantLimits,
) -> Result<Done<Result<()>>> {
    let mut st = Step::open(rows, Some(1))
        .await?
        .ok_or_else(|| corrupt("internal: semaphore not created"))?;
    let (mut map, mut capped) = st
        .limits
        .take()
        .map(|l| (l.by_tenant, l.capped))
        .unwrap_or_default();
    match limits.is_none() {
        true => {
            capped.remove(tenant);
            map.remove(tenant)
        }
        false => map.insert(tenant.to_string(), limits),
    };
    if st.loaded.is_some() && !st.is_empty() {
        let floors: u64 = map.values().map(|l| l.floor as u64).sum();
        if floors > st.sem.capacity as u64 {
            return Ok((
                Err(Error::InvalidInput(InvalidInput::Other(format!(
                    "the floors on {name} would add up to {floors}, above its capacity {}",
                    st.sem.capacity
                )))),
                Vec::new(),
            ));
        }
    }
    match limits.is_none() {
        true => st.rows.drop_tenant_limits(tenant).await?,
        false => {
            // The window-capped-until instant is kept (`save_tenant_limits` leaves it): the
            // tenant's own limiter decides again at its next turn either way.
            let row = LimitRow {
                tenant: tenant.to_string(),
                ceiling: limits.ceiling.map(i64::from),
                floor: limits.floor.into(),
                window_ceiling: limits.window_ceiling.map(i64::from),
                window_capped_until: capped.get(tenant).map(|t| db_int(t.0)).transpose()?,
            };
            st.rows.save_tenant_limits(&row).await?
        }
    }
    st.limits = (!map.is_empty()).then_some(Limits {
        by_tenant: map,
        held: None,
        capped,
    });
    if st.loaded.is_some() {
        st.purge_and_hand_off().await?;
    }
    Ok((Ok(()), st.finish().await?))
}

/// The tenants' limits of stored rows, checked: each tenant a tenant's name, each ceiling
/// and floor what [`TenantLimits::new`] takes, each window ceiling what
/// [`TenantLimits::with_window_ceiling`] takes.
pub fn tenant_limits_of(rows: Vec<LimitRow>) -> Result<BTreeMap<String, TenantLimits>> {
    Ok(limits_and_caps(rows)?.0)
}

/// [`tenant_limits_of`], and the window-capped-until instants of the rows that have one.
fn limits_and_caps(
    rows: Vec<LimitRow>,
) -> Result<(BTreeMap<String, TenantLimits>, HashMap<String, StoreTime>)> {
    let mut out = BTreeMap::new();
    let mut capped = HashMap::new();
    for row in rows {
        let Some(tenant) = tenant_of(&Some(row.tenant))? else {
            continue;
        };
        let ceiling = row.ceiling.map(|c| u32_of(c, "ceiling")).transpose()?;
        let floor = u32_of(row.floor, "floor")?;
        let window = row
            .window_ceiling
            .map(|w| {
                u8::try_from(w)
                    .map_err(|_| corrupt(format!("window ceiling = {w} is out of range")))
            })
            .transpose()?;
        let limits = TenantLimits::new(ceiling, floor)
            .and_then(|l| l.with_window_ceiling(window))
            .map_err(|e| corrupt(format!("tenant {tenant:?}'s limits: {e}")))?;
        if let Some(until) = row.window_capped_until {
            capped.insert(tenant.clone(), time_of(until, "window_capped_until")?);
        }
        out.insert(tenant, limits);
    }
    Ok((out, capped))
}

fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore \"{name}\" has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}

/// `value` as a database integer (a signed 64-bit one in every SQL store).
fn db_int(value: u64) -> Result<i64> {
    i64::try_from(value).map_err(|_| {
        Error::from(InvalidInput::Other(format!(
            "{value} does not fit a database integer (i64)"
        )))
    })
}

pub fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

fn u32_of(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is out of range")))
}

fn u64_of(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is negative")))
}

fn capacity_of(v: i64) -> Result<u32> {
    let c = u32_of(v, "capacity")?;
    if c == 0 || c > MAX_CAPACITY {
        return Err(corrupt(format!("capacity = {c} is out of range")));
    }
    Ok(c)
}

fn time_of(v: i64, what: &str) -> Result<StoreTime> {
    u64_of(v, what).map(StoreTime)
}

fn lease_of(s: &str) -> Result<LeaseId> {
    s.parse().map_err(|_| {
        corrupt(format!(
            "lease id {:?} is not 32 hex digits",
            super::truncate(s)
        ))
    })
}

pub fn lease_of_row(row: &HolderRow) -> Result<Lease> {
    let weight = u32_of(row.weight, "weight")?;
    Ok(Lease {
        lease_id: lease_of(&row.lease_id)?,
        weight,
        seats: decode_seats(&row.seats, weight)?,
        fence: u64_of(row.fence, "fence")?,
        holder: row.holder.clone(),
        acquired_at: time_of(row.acquired_at, "acquired_at")?,
        expires_at: time_of(row.expires_at, "expires_at")?,
        tenant: tenant_of(&row.tenant)?,
    })
}

pub fn waiter_of_row(row: &WaiterRow) -> Result<Waiter> {
    Ok(Waiter {
        lease_id: lease_of(&row.lease_id)?,
        weight: u32_of(row.weight, "weight")?,
        holder: row.holder.clone(),
        enqueued_at: time_of(row.enqueued_at, "enqueued_at")?,
        expires_at: time_of(row.expires_at, "expires_at")?,
        tenant: tenant_of(&row.tenant)?,
    })
}

/// A tenant read back: a name [`Tenant::new`] would take (NULL: none).
fn tenant_of(tenant: &Option<String>) -> Result<Option<String>> {
    match tenant {
        None => Ok(None),
        Some(t) if Tenant::new(t, 1).is_ok() => Ok(Some(t.clone())),
        Some(t) => Err(corrupt(format!(
            "tenant {:?} is not a tenant's name",
            super::truncate(t)
        ))),
    }
}
