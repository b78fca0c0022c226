//! The embedded SQLite store (work in progress).

use std::time::Duration;

use async_trait::async_trait;

use crate::error::{redact_url, InvalidInput, Result};
use crate::model::*;
use crate::store::{Backend, Waking};

/// SQLite backend.
#[derive(Debug)]
pub struct SqliteBackend;

impl SqliteBackend {
    /// Connects to a `sqlite:///path` URL.
    pub async fn connect(url: &str) -> Result<Self> {
        Err(InvalidInput::StoreUrl { url: redact_url(url), reason: "sqlite is not built yet".into() }.into())
    }
}

#[async_trait]
impl Backend for SqliteBackend {
    async fn acquire(&self, _: &Name, _: u32, _: &AcquireRequest) -> Result<AcquireReply> { unimplemented!() }
    async fn heartbeat(&self, _: &Name, _: LeaseId, _: Duration) -> Result<WaitReply> { unimplemented!() }
    async fn cancel(&self, _: &Name, _: LeaseId) -> Result<CancelReply> { unimplemented!() }
    async fn release(&self, _: &Name, _: LeaseId) -> Result<bool> { unimplemented!() }
    async fn renew(&self, _: &Name, _: LeaseId, _: Duration) -> Result<RenewReply> { unimplemented!() }
    async fn status(&self, _: &Name) -> Result<Option<SemaphoreStatus>> { unimplemented!() }
    async fn list(&self) -> Result<Vec<String>> { unimplemented!() }
    async fn resize(&self, _: &Name, _: u32) -> Result<u32> { unimplemented!() }
    async fn revoke(&self, _: &Name, _: LeaseId) -> Result<bool> { unimplemented!() }
    async fn delete(&self, _: &Name) -> Result<bool> { unimplemented!() }
    fn waking(&self) -> Waking { Waking::Poll { min: Duration::from_millis(2), max: Duration::from_millis(50) } }
}
