//! The in-memory store (`memory://`): the reference model, and a real store for tasks of one
//! process. Its clock is the host's wall clock, or an injected [`tessera_core::clock::Clock`].
//!
//! `memory://` is one process-wide instance; `memory://NAME` is a separate named instance,
//! shared by every handle that connects with the same name.

mod ops;
mod rate;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use tessera_core::clock::{Clock, SystemClock};
use tessera_core::error::{Error, Result};
use tessera_core::model::*;
use tessera_core::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, Backend, Capabilities, GiveBack, RateConfig,
    Settlement,
};
use tessera_core::wake;

pub(crate) use ops::Model;

static INSTANCES: LazyLock<Mutex<HashMap<String, Arc<Mutex<Model>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
static RATE_INSTANCES: LazyLock<Mutex<HashMap<String, Arc<Mutex<rate::RateModel>>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The in-memory backend.
#[derive(Debug, Clone)]
pub struct MemoryBackend {
    model: Arc<Mutex<Model>>,
    /// Rate limiters (`rate.rs`), beside the semaphores: only an admission step touches
    /// both, locking `model` first.
    rate: Arc<Mutex<rate::RateModel>>,
    clock: Arc<dyn Clock>,
}

/// The instance name of a `memory://[NAME]` URL (empty: the process-wide instance).
pub(crate) fn parse_url(url: &str) -> Result<&str> {
    let rest = url
        .strip_prefix("memory://")
        .ok_or_else(|| Error::bad_store_url(url, "expected memory://[NAME]"))?;
    if !rest.is_empty() {
        Name::new(rest).map_err(|_| {
            Error::bad_store_url(
                url,
                "the instance name after memory:// must be a valid name",
            )
        })?;
    }
    Ok(rest)
}

impl MemoryBackend {
    /// Connects to the instance named by a `memory://[NAME]` URL.
    pub fn connect(url: &str) -> Result<Self> {
        let rest = parse_url(url)?;
        let model = Arc::clone(
            INSTANCES
                .lock()
                .unwrap()
                .entry(rest.to_string())
                .or_default(),
        );
        let rate = Arc::clone(
            RATE_INSTANCES
                .lock()
                .unwrap()
                .entry(rest.to_string())
                .or_default(),
        );
        Ok(MemoryBackend {
            model,
            rate,
            clock: Arc::new(SystemClock),
        })
    }

    /// A fresh private instance driven by `clock` (for logic tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        MemoryBackend {
            model: Arc::default(),
            rate: Arc::default(),
            clock,
        }
    }

    /// Runs one atomic step and delivers its wake-ups after the lock is released: a granted
    /// waiter gets its grant with the wake-up, so it need not ask the store for it.
    fn run<R>(&self, f: impl FnOnce(&mut Model, StoreTime, &mut ops::Wakes) -> R) -> R {
        let mut wakes = Vec::new();
        let r = {
            let mut model = self.model.lock().unwrap();
            f(&mut model, self.clock.now(), &mut wakes)
        };
        for w in wakes {
            match w {
                ops::Wake::Granted(grant) => wake::notify_grant(grant),
                ops::Wake::Ended(id) | ops::Wake::Turn(id) => wake::notify(id),
            }
        }
        r
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        self.run(|m, now, w| m.acquire(name, capacity, req, now, w))
    }
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        Ok(self.run(|m, now, w| m.heartbeat(name, lease, waiter_ttl, now, w)))
    }
    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        Ok(self.run(|m, now, w| m.cancel(name, lease, now, w)))
    }
    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        Ok(self.run(|m, now, w| m.release(name, lease, now, w)))
    }
    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        Ok(self.run(|m, now, w| m.renew(name, lease, ttl, now, w)))
    }
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        Ok(self.run(|m, now, w| m.status(name, now, w)))
    }
    async fn list(&self) -> Result<Vec<String>> {
        Ok(self.model.lock().unwrap().list())
    }
    /// In this process: nothing to reach.
    async fn ping(&self) -> Result<()> {
        Ok(())
    }
    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        self.run(|m, now, w| m.resize(name, capacity, now, w))
    }
    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        Ok(self.run(|m, now, w| m.revoke(name, lease, now, w)))
    }
    async fn delete(&self, name: &Name) -> Result<bool> {
        Ok(self.run(|m, _, w| m.delete(name, w)))
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::push()
            .with_fair_shares()
            .with_tenant_limits()
            .with_window_ceilings()
    }
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        self.run(|m, now, w| m.set_tenant_limits(name, tenant, limits, now, w))
    }
    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        Ok(self.model.lock().unwrap().tenant_limits(name))
    }
    /// A step is a few map operations under a lock: run at once, without a boxed future.
    fn acquire_now(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Option<Result<AcquireReply>> {
        Some(self.run(|m, now, w| m.acquire(name, capacity, req, now, w)))
    }
    fn release_now(&self, name: &Name, lease: LeaseId) -> Option<Result<bool>> {
        Some(Ok(self.run(|m, now, w| m.release(name, lease, now, w))))
    }
    /// From the state itself: the earliest expiry, on this process's clock.
    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        let at = self.model.lock().unwrap().next_expiry(name)?;
        Some(tokio::time::Instant::now() + at.since(self.clock.now()))
    }
    fn rate(&self) -> Option<&dyn tessera_core::seam::RateBackend> {
        Some(self)
    }
    fn admission(&self) -> Option<&dyn AdmissionBackend> {
        Some(self)
    }
}

#[async_trait]
impl AdmissionBackend for MemoryBackend {
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply> {
        self.run(|m, now, w| {
            let mut rate = self.rate.lock().unwrap();
            m.admit(&mut rate, name, capacity, config, req, now, w)
        })
    }
    async fn give_back(&self, name: &Name, lease: LeaseId, g: GiveBack) -> Result<bool> {
        self.run(|m, now, w| {
            let tenant = m.holder_tenant(name, lease);
            let released = m.release(name, lease, now, w);
            let mut rate = self.rate.lock().unwrap();
            rate.undo(name, g.reservation, g.at, now, true)?;
            if let Some(t) = tenant.as_deref().filter(|_| released) {
                rate.undo_tenant(name, t, g.reservation, g.at, now)?;
            }
            if g.expired && released {
                rate.count_expired(name, now)?;
            }
            Ok(released)
        })
    }
    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        self.run(|m, now, w| {
            let tenant = m.holder_tenant(name, lease);
            let released = m.release(name, lease, now, w);
            self.rate
                .lock()
                .unwrap()
                .settle(name, tenant.as_deref(), settlement, released, now)?;
            Ok(released)
        })
    }
}
