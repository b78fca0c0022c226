//! Fault injection at the store seam: a [`Backend`] wrapper whose operations can be made to
//! fail or hang, per operation kind, while the test runs.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tessera::backend::*;
use tessera::*;

/// What an operation does when it is called.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// Pass through to the store.
    Normal = 0,
    /// Fail at once with a connection error (the store is not touched).
    Fail = 1,
    /// Never answer (a black-holed connection; the store is not touched).
    Hang = 2,
}

/// The fault switches of one client.
#[derive(Debug, Default)]
pub struct Faults {
    renew: AtomicU8,
    all: AtomicU8,
}

impl Faults {
    /// Sets the mode of renewals.
    pub fn renew(&self, m: Mode) {
        self.renew.store(m as u8, Ordering::SeqCst);
    }
    /// Sets the mode of every operation.
    pub fn all(&self, m: Mode) {
        self.all.store(m as u8, Ordering::SeqCst);
    }
    fn mode(&self, renew: bool) -> u8 {
        let all = self.all.load(Ordering::SeqCst);
        if all != 0 {
            return all;
        }
        if renew {
            self.renew.load(Ordering::SeqCst)
        } else {
            0
        }
    }
}

/// A backend wrapper that obeys [`Faults`].
#[derive(Debug)]
pub struct FaultyBackend {
    inner: Arc<dyn Backend>,
    faults: Arc<Faults>,
}

impl FaultyBackend {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn Backend>, faults: Arc<Faults>) -> Self {
        FaultyBackend { inner, faults }
    }

    async fn gate(&self, renew: bool) -> Result<()> {
        match self.faults.mode(renew) {
            1 => Err(Error::Store {
                kind: StoreErrorKind::Connection,
                message: "injected fault: connection refused".into(),
            }),
            2 => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                unreachable!("a hung operation never answers")
            }
            _ => Ok(()),
        }
    }
}

#[async_trait]
impl Backend for FaultyBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        self.gate(false).await?;
        self.inner.acquire(name, capacity, req).await
    }
    async fn heartbeat(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<WaitReply> {
        self.gate(false).await?;
        self.inner.heartbeat(name, lease, ttl).await
    }
    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        self.gate(false).await?;
        self.inner.cancel(name, lease).await
    }
    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        self.gate(false).await?;
        self.inner.release(name, lease).await
    }
    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        self.gate(true).await?;
        self.inner.renew(name, lease, ttl).await
    }
    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        self.gate(false).await?;
        self.inner.status(name).await
    }
    async fn list(&self) -> Result<Vec<String>> {
        self.gate(false).await?;
        self.inner.list().await
    }
    async fn ping(&self) -> Result<()> {
        self.gate(false).await?;
        self.inner.ping().await
    }
    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        self.gate(false).await?;
        self.inner.resize(name, capacity).await
    }
    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        self.gate(false).await?;
        self.inner.revoke(name, lease).await
    }
    async fn delete(&self, name: &Name) -> Result<bool> {
        self.gate(false).await?;
        self.inner.delete(name).await
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        self.gate(false).await?;
        self.inner.set_tenant_limits(name, tenant, limits).await
    }
    async fn tenant_limits(
        &self,
        name: &Name,
    ) -> Result<std::collections::BTreeMap<String, TenantLimits>> {
        self.gate(false).await?;
        self.inner.tenant_limits(name).await
    }
    /// Forwarded while no fault is set; with one, `None` sends the call through `acquire`,
    /// which applies it.
    fn acquire_now(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Option<Result<AcquireReply>> {
        if self.faults.mode(false) != 0 {
            return None;
        }
        self.inner.acquire_now(name, capacity, req)
    }
    fn release_now(&self, name: &Name, lease: LeaseId) -> Option<Result<bool>> {
        if self.faults.mode(false) != 0 {
            return None;
        }
        self.inner.release_now(name, lease)
    }
    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        self.inner.next_expiry(name)
    }

    /// Rate steps pass through without faults.
    fn rate(&self) -> Option<&dyn RateBackend> {
        self.inner.rate()
    }
    /// Admission steps pass through without faults.
    fn admission(&self) -> Option<&dyn tessera::backend::AdmissionBackend> {
        self.inner.admission()
    }
    fn rate_unsupported(&self) -> Option<&'static str> {
        self.inner.rate_unsupported()
    }
}
