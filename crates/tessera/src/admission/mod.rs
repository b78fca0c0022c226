//! The façade: [`Admission`], permits and rate windows taken in one atomic step, and the
//! [`Admitted`] ticket it returns. The design and its invariants are in `docs/admission.md`.
//!
//! An admission is granted only when, at one instant `t` of the store's clock, the permits are
//! free and every window admits the cost; then the lease is written and every window charged
//! at `t`, in the same step. A refusal, a timeout or a cancelled wait charges nothing and
//! holds nothing. Waiters share the semaphore's FIFO queue with plain acquires; the head is
//! granted as soon as both allow and sleeps to the instant its windows will allow when only
//! they block it.
//!
//! **Use-by.** The windows are enforced with the limiter's margin `m`: a call that starts at
//! most `m` after its admission counts inside the limits wherever the provider counts. An
//! [`Admitted`] knows its use-by instant (the send instant of the granted request plus `m`,
//! on this process's clock: never later than the store's `t + m`). `acquire` checks it right
//! before it returns; a ticket past it is given back (the permits released, the charge
//! returned while it is the limiter's latest) and the wait starts again at the head of the
//! queue. A caller that does more before the call checks [`Admitted::is_fresh`] again, as
//! `tessera run` does right before it starts the child ([`Admission::readmit_timeout`]).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::permit::Permit;
use crate::rate::limiter::{RateLimiter, RateOptions};
use crate::semaphore::admit::{Admit, Join, Windows};
use crate::semaphore::place::Watch;
use crate::semaphore::{QueuePlace, Semaphore, SemaphoreOptions};
use crate::store::Store;
use tessera_core::admission::seam::{self, GiveBack, Settlement};
use tessera_core::error::{InvalidInput, Result};
use tessera_core::model::{LeaseId, StoreTime};
use tessera_core::rate::spec::{RateSpec, DEFAULT_ADMISSION_MARGIN};

/// Permits of a semaphore and rate windows of the limiter of the same name, taken in one
/// atomic step (see the module docs). Built with [`Store::admission`].
///
/// ```
/// # tokio::runtime::Runtime::new().unwrap().block_on(async {
/// use std::time::Duration;
/// use tessera::Store;
///
/// let store = Store::connect("memory://").await?;
/// let sms = store
///     .admission("sms-api")
///     .permits(4)                       // at most 4 calls in flight
///     .rate("50/s".parse()?)?           // and at most 50 per second
///     .rate("1000/min".parse()?)?;      // and 1,000 per minute
/// if let Some(ticket) = sms.acquire_timeout(Duration::from_secs(5)).await? {
///     assert!(ticket.is_fresh());       // call the provider now, with ticket.fence()
///     ticket.release().await?;
/// }
/// # Ok::<(), tessera::Error>(()) }).unwrap();
/// ```
#[derive(Clone)]
pub struct Admission {
    semaphore: Semaphore,
    limiter: RateLimiter,
    weight: u32,
    cost: u32,
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("semaphore", &self.semaphore)
            .field("limiter", &self.limiter)
            .field("weight", &self.weight)
            .field("cost", &self.cost)
            .finish()
    }
}

/// Collects an admission's parts; [`AdmissionBuilder::rate`] makes it an [`Admission`].
#[derive(Debug, Clone)]
pub struct AdmissionBuilder {
    store: Store,
    name: String,
    capacity: u32,
    sem_opts: SemaphoreOptions,
    rate_opts: RateOptions,
}

impl Store {
    /// An admission over the semaphore and the rate limiter named `name` (see [`Admission`]):
    /// 1 permit unless [`AdmissionBuilder::permits`] says otherwise, and the limits given
    /// to [`AdmissionBuilder::rate`].
    pub fn admission(&self, name: &str) -> AdmissionBuilder {
        AdmissionBuilder {
            store: self.clone(),
            name: name.to_string(),
            capacity: 1,
            sem_opts: SemaphoreOptions::default(),
            rate_opts: RateOptions::default().default_margin(DEFAULT_ADMISSION_MARGIN),
        }
    }

    /// Gives back an admission this process holds no ticket for (a `tessera serve`
    /// client's), named by its lease id and by the `reservation` and instant `at` its
    /// answer carried: the permits are released and, while it is the limiter's latest
    /// charge, the charge is returned to every window. With `expired` (the ticket came past
    /// its use-by instant) it is counted as expired unused, by the store
    /// ([`RateStatus::expired_unused`](crate::RateStatus)) and in
    /// `tessera_admissions_expired_total`, once: only if the lease was still held, which
    /// the answer says (`true`).
    /// [`Error::Unsupported`](crate::Error::Unsupported) on a store without admission.
    pub async fn give_back_admission(
        &self,
        name: &str,
        lease_id: LeaseId,
        give_back: GiveBack,
    ) -> Result<bool> {
        let name = tessera_core::model::Name::new(name)?;
        let backend = self.backend().admission().ok_or_else(|| {
            tessera_core::error::Error::Unsupported(format!(
                "admission is not available on {} yet",
                self.url()
            ))
        })?;
        give_back_by_id(backend, &name, lease_id, give_back).await
    }
}

/// Gives back the admission `lease` through the store's step and, if it was `expired` and
/// the step released the lease, counts it in `tessera_admissions_expired_total`: the one
/// place a give-back by lease id (an HTTP client's, a readmit's) is counted, and counted as
/// the store counts it, so a give-back sent twice counts once.
async fn give_back_by_id(
    backend: &dyn seam::AdmissionBackend,
    name: &tessera_core::model::Name,
    lease: LeaseId,
    give_back: GiveBack,
) -> Result<bool> {
    let held = backend.give_back(name, lease, give_back).await?;
    if give_back.expired && held {
        crate::telemetry::admission_expired(name);
    }
    Ok(held)
}

impl AdmissionBuilder {
    /// The semaphore's capacity: how many may hold an admission at once (default 1).
    pub fn permits(mut self, capacity: u32) -> Self {
        self.capacity = capacity;
        self
    }
    /// The semaphore's options (lease TTL, holder label, queue cap, waiter TTL).
    pub fn semaphore_options(mut self, opts: SemaphoreOptions) -> Self {
        self.sem_opts = opts;
        self
    }
    /// The limiter's options (mode, margin, update). The margin is also the admission's
    /// use-by time; unset, it is [`DEFAULT_ADMISSION_MARGIN`] (100 ms, or the shortest
    /// period if that is shorter) in exact mode, not the plain limiter's 20 ms: a name that
    /// an admission and a plain [`RateLimiter`] share needs one margin set on both (else
    /// [`Error::RateMismatch`](crate::Error::RateMismatch) names the two).
    pub fn rate_options(mut self, opts: RateOptions) -> Self {
        self.rate_opts = opts.default_margin(DEFAULT_ADMISSION_MARGIN);
        self
    }
    /// The first limit; add more with [`Admission::rate`]. Checks every input (typed
    /// errors, nothing sent); a store without admission fails with
    /// [`Error::Unsupported`](crate::Error::Unsupported).
    pub fn rate(self, limit: RateSpec) -> Result<Admission> {
        Admission::new(self, vec![limit])
    }
}

impl Admission {
    fn new(b: AdmissionBuilder, limits: Vec<RateSpec>) -> Result<Admission> {
        let semaphore = Semaphore::new(&b.store, &b.name, b.capacity, b.sem_opts.clone())?;
        semaphore.admission_backend()?;
        let limiter = RateLimiter::new(&b.store, &b.name, &limits, b.rate_opts.clone())?;
        Ok(Admission {
            semaphore,
            limiter,
            weight: 1,
            cost: 1,
        })
    }

    /// Adds a limit (all of them must admit the cost; at most [`crate::MAX_LIMITS`]).
    pub fn rate(self, limit: RateSpec) -> Result<Admission> {
        let mut limits = self.limiter.config().limits().to_vec();
        limits.push(limit);
        let limiter = RateLimiter::new(
            self.semaphore.store(),
            self.semaphore.name(),
            &limits,
            self.limiter.options().clone(),
        )?;
        Ok(Admission { limiter, ..self })
    }

    /// Permits each admission takes (default 1; 1 ..= capacity).
    pub fn weight(self, weight: u32) -> Result<Admission> {
        if weight == 0 || weight > self.semaphore.capacity() {
            return Err(InvalidInput::Weight {
                weight,
                capacity: self.semaphore.capacity(),
            }
            .into());
        }
        Ok(Admission { weight, ..self })
    }

    /// Cost each admission charges to every window (default 1).
    pub fn cost(self, cost: u32) -> Result<Admission> {
        self.limiter.check_cost(cost)?;
        Ok(Admission { cost, ..self })
    }

    /// The name of the semaphore and of the limiter.
    pub fn name(&self) -> &str {
        self.semaphore.name()
    }

    /// The limiter of the windows (its status shows what they count).
    pub fn limiter(&self) -> &RateLimiter {
        &self.limiter
    }

    /// The use-by time of every admission: the limiter's margin.
    pub fn margin(&self) -> Duration {
        self.limiter.config().margin()
    }

    /// Admits at once if the permits are free, nobody waits, and every window admits the
    /// cost; `Ok(None)` otherwise, with nothing held and nothing charged.
    pub async fn try_acquire(&self) -> Result<Option<Admitted>> {
        match self.attempt(false, Join::Tail, None, None).await? {
            Admit::Granted {
                permit,
                reservation,
                sent,
            } => Ok(Some(self.ticket(permit, reservation, sent))),
            Admit::Refused | Admit::TimedOut => Ok(None),
        }
    }

    /// Waits in the queue until admitted.
    pub async fn acquire(&self) -> Result<Admitted> {
        match self.wait(None, None, None).await? {
            Some(t) => Ok(t),
            None => unreachable!("an admission without a deadline returns a ticket or an error"),
        }
    }

    /// Waits at most `timeout` (`Duration::MAX`: as long as it takes); `Ok(None)` if not
    /// admitted in time (nothing held, nothing charged, the queue place given up).
    pub async fn acquire_timeout(&self, timeout: Duration) -> Result<Option<Admitted>> {
        self.wait(Instant::now().checked_add(timeout), None, None)
            .await
    }

    /// Waits at most `timeout`, as [`Admission::acquire_timeout`], and while queued
    /// publishes its place and expected wait on `place` (see [`QueuePlace`]; the head
    /// learns from its store when its windows admit it). The last place published stays when
    /// the wait ends (after a timeout: where it stood). The place is read with one status call of the semaphore every
    /// [`READ_EVERY`](crate::READ_EVERY) while it waits.
    pub async fn acquire_watching(
        &self,
        timeout: Duration,
        place: &tokio::sync::watch::Sender<Option<QueuePlace>>,
    ) -> Result<Option<Admitted>> {
        let watch = Watch::new(place).with_windows(self.cost);
        tokio::select! {
            r = self.wait(Instant::now().checked_add(timeout), None, Some(&watch)) => r,
            never = watch.run(self.semaphore.store().backend().as_ref(), self.semaphore.config_name()) => match never {},
        }
    }

    /// Gives back a ticket that was not used before its use-by instant (see the module docs)
    /// and waits again, first in the queue, for at most `timeout`. With a zero `timeout`
    /// (a try whose ticket went stale on its way), one more try, first in the queue: a ticket
    /// late again is given back too, and the answer is `Ok(None)`.
    pub async fn readmit_timeout(
        &self,
        late: Admitted,
        timeout: Duration,
    ) -> Result<Option<Admitted>> {
        let deadline = Instant::now().checked_add(timeout);
        if timeout.is_zero() {
            late.give_back().await?;
            return self.again(true, deadline, true).await;
        }
        self.wait(deadline, Some(late), None).await
    }

    /// [`Admission::readmit_timeout`] for an admission this process holds no ticket for: a
    /// `tessera serve` client's, named by its lease id, reservation and admission instant.
    /// Gives it back and waits again for at most `timeout`: first in the queue if its lease
    /// was still held (the give-back earned the place), else at the tail.
    pub async fn give_back_and_readmit_timeout(
        &self,
        lease: LeaseId,
        reservation: u64,
        at: StoreTime,
        timeout: Duration,
    ) -> Result<Option<Admitted>> {
        let deadline = Instant::now().checked_add(timeout);
        let held = give_back_by_id(
            self.semaphore.admission_backend()?,
            self.semaphore.config_name(),
            lease,
            GiveBack {
                reservation,
                at,
                expired: true,
            },
        )
        .await?;
        self.again(held, deadline, timeout.is_zero()).await
    }

    /// Waits again after a give-back (first in the queue with `at_head`); with `once`, one
    /// try only, and a ticket late again is given back (`Ok(None)`).
    async fn again(
        &self,
        at_head: bool,
        deadline: Option<Instant>,
        once: bool,
    ) -> Result<Option<Admitted>> {
        let join = match at_head {
            true => Join::Head,
            false => Join::Tail,
        };
        if !once {
            return self.wait_joining(deadline, join, None).await;
        }
        match self.attempt(false, join, None, None).await? {
            Admit::Granted {
                permit,
                reservation,
                sent,
            } => self.fresh(permit, reservation, sent).await,
            Admit::Refused | Admit::TimedOut => Ok(None),
        }
    }

    /// The ticket of a grant if it is still fresh; a late one is given back (`None`).
    async fn fresh(
        &self,
        permit: Permit,
        reservation: u64,
        sent: Instant,
    ) -> Result<Option<Admitted>> {
        let ticket = self.ticket(permit, reservation, sent);
        if ticket.is_fresh() {
            return Ok(Some(ticket));
        }
        tracing::debug!(name = %self.name(), "admission past its use-by instant; given back");
        ticket.give_back().await?;
        Ok(None)
    }

    async fn attempt(
        &self,
        wait: bool,
        join: Join,
        deadline: Option<Instant>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Admit> {
        let windows = Windows {
            config: self.limiter.config(),
            cost: self.cost,
            update: self.limiter.updates(),
        };
        self.semaphore
            .admit_inner(self.weight, &windows, wait, join, deadline, watch)
            .await
    }

    /// Waits until admitted or `deadline`; with `late`, in the place of that admission,
    /// which is given back (see [`Join::Replacing`]).
    async fn wait(
        &self,
        deadline: Option<Instant>,
        late: Option<Admitted>,
        watch: Option<&Watch<'_>>,
    ) -> Result<Option<Admitted>> {
        let join = match late {
            Some(late) => self.replacing(late),
            None => Join::Tail,
        };
        self.wait_joining(deadline, join, watch).await
    }

    /// Joins the queue where `join` says; a ticket granted past its use-by instant waits
    /// again in its own place, at the head (see [`Join::Replacing`]).
    async fn wait_joining(
        &self,
        deadline: Option<Instant>,
        mut join: Join,
        watch: Option<&Watch<'_>>,
    ) -> Result<Option<Admitted>> {
        loop {
            match self.attempt(true, join, deadline, watch).await? {
                Admit::Granted {
                    permit,
                    reservation,
                    sent,
                } => {
                    let ticket = self.ticket(permit, reservation, sent);
                    if ticket.is_fresh() {
                        return Ok(Some(ticket));
                    }
                    join = self.replacing(ticket);
                    // A store that answers at once (memory) must not keep this task from
                    // yielding while it is late again and again.
                    tokio::task::yield_now().await;
                }
                Admit::TimedOut => return Ok(None),
                Admit::Refused => {
                    return Err(tessera_core::error::Error::Corrupt(
                        "the store refused a queued admission".to_string(),
                    ))
                }
            }
        }
    }

    /// The place of a ticket past its use-by instant, for the request that replaces it: its
    /// give-back, once that request is at the head of the queue.
    fn replacing(&self, late: Admitted) -> Join {
        let name = self.name().to_string();
        Join::Replacing(Box::pin(async move {
            tracing::debug!(%name, "admission past its use-by instant; given back");
            if let Err(e) = late.give_back().await {
                // Its permits then run out with their TTL, renewed by nobody.
                tracing::warn!(%name, error = %e, "giving back a late admission failed");
            }
        }))
    }

    fn ticket(&self, permit: Permit, reservation: u64, sent: Instant) -> Admitted {
        Admitted {
            at: permit.lease().acquired_at,
            permit,
            reservation,
            cost: self.cost,
            use_by: (!self.margin().is_zero()).then(|| sent + self.margin()),
        }
    }
}

/// An admission held: the permits (a [`Permit`], renewed in the background, released when
/// dropped) and the proof that every window was charged at [`Admitted::admitted_at`]. Use it
/// before [`Admitted::use_by`].
#[derive(Debug)]
pub struct Admitted {
    permit: Permit,
    at: StoreTime,
    reservation: u64,
    cost: u32,
    use_by: Option<Instant>,
}

impl Admitted {
    /// The permit (fence, seats, `lost()`).
    pub fn permit(&self) -> &Permit {
        &self.permit
    }
    /// The permit alone; the admission's charge stands.
    pub fn into_permit(self) -> Permit {
        self.permit
    }
    /// The fence token of the lease.
    pub fn fence(&self) -> u64 {
        self.permit.fence()
    }
    /// The lease id.
    pub fn lease_id(&self) -> LeaseId {
        self.permit.lease_id()
    }
    /// Names the windows' charge, for a give-back made elsewhere (`tessera serve`'s
    /// `give-back` takes it with [`Admitted::admitted_at`]).
    pub fn reservation(&self) -> u64 {
        self.reservation
    }
    /// The store instant at which the permits were granted and every window charged.
    pub fn admitted_at(&self) -> StoreTime {
        self.at
    }
    /// The last instant (this process's clock) at which a call still counts inside the
    /// windows: the admission instant plus the limiter's margin, read conservatively; `None`
    /// with a margin of 0.
    pub fn use_by(&self) -> Option<Instant> {
        self.use_by
    }
    /// Whether the use-by instant is still ahead (always, with a margin of 0: the limits
    /// are then kept at the admission instant only, and any delay before the call is the
    /// caller's to bound).
    pub fn is_fresh(&self) -> bool {
        self.use_by.is_none_or(|t| Instant::now() <= t)
    }
    /// The cost charged to every window at [`Admitted::admitted_at`].
    pub fn cost(&self) -> u32 {
        self.cost
    }
    /// Releases the permits; the charge stands (the call was made).
    pub async fn release(self) -> Result<bool> {
        self.permit.release().await
    }

    /// Releases the permits and settles the charge to what the call actually cost, in one
    /// step (for costs known only afterwards: tokens of a reply, bytes sent). A larger
    /// `actual` charges the excess to every window now (later admissions wait for it); a
    /// smaller one gives the difference back, once, if the lease was still held (exact
    /// mode; smooth mode only while this admission is the limiter's latest). The windows
    /// never count less than was used. `true` if the lease was still held. `actual` may be
    /// 0 (the call cost nothing) up to [`crate::MAX_RATE_COUNT`]; past that the answer is
    /// [`InvalidInput::SettleCost`] with the permits released and the charge kept, as
    /// [`Admitted::release`] does. A ticket dropped or released unsettled keeps its charge. Stores without admission settle nothing and
    /// answer [`Error::Unsupported`](crate::Error::Unsupported) with the lease released.
    pub async fn settle(self, actual: u32) -> Result<bool> {
        if actual > tessera_core::rate::spec::MAX_RATE_COUNT {
            // As a release: the ticket is spent either way, so its permits go back now.
            self.release().await?;
            return Err(InvalidInput::SettleCost {
                actual,
                max: tessera_core::rate::spec::MAX_RATE_COUNT,
            }
            .into());
        }
        let name = self.permit.semaphore_name().clone();
        let conn = self.permit.conn().clone();
        let id = self.permit.lease_id();
        // A lease this process knows to be lost is settled all the same: the store gives
        // nothing back for it, but an excess was used and is charged.
        let lease_id = self.permit.detach().map_or(id, |l| l.lease_id);
        let backend = conn.backend();
        let settlement = Settlement {
            reservation: self.reservation,
            at: self.at,
            charged: self.cost,
            actual,
        };
        let settled = match backend.admission() {
            Some(admission) => admission.settle(&name, lease_id, &settlement).await,
            None => Err(tessera_core::error::Error::Unsupported(
                "admissions on this store".to_string(),
            )),
        };
        match settled {
            Ok(held) => Ok(held),
            // The permits must not wait for their TTL; the charge stands.
            Err(e) => {
                backend.release(&name, lease_id).await?;
                Err(e)
            }
        }
    }

    /// Gives the admission back unused: the permits are released and, while it is the
    /// limiter's latest charge, the charge is returned to every window. A ticket past its
    /// use-by instant is counted as expired unused, by the store
    /// ([`RateStatus::expired_unused`](crate::RateStatus)) and in
    /// `tessera_admissions_expired_total`. `true` if the lease was still held.
    pub async fn give_back(self) -> Result<bool> {
        let fresh = self.is_fresh();
        let name = self.permit.semaphore_name().clone();
        let conn = self.permit.conn().clone();
        let Some(lease) = self.permit.detach() else {
            return Ok(false);
        };
        let backend = conn.backend();
        let Some(admission) = backend.admission() else {
            return backend.release(&name, lease.lease_id).await;
        };
        if !fresh {
            crate::telemetry::admission_expired(&name);
        }
        let give_back = GiveBack {
            reservation: self.reservation,
            at: self.at,
            expired: !fresh,
        };
        match admission.give_back(&name, lease.lease_id, give_back).await {
            Ok(held) => Ok(held),
            // The charge stands; the permits must not wait for their TTL.
            Err(_) => backend.release(&name, lease.lease_id).await,
        }
    }
}
