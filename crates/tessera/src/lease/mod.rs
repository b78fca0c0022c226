//! Keeping a granted lease: the [`Permit`](permit::Permit) a caller holds, and the keeper
//! that renews it in the background and notices its loss. Below the semaphore, which
//! acquires leases, and above the connection engine (`crate::conn`) they are held through.

pub(crate) mod keeper;
pub(crate) mod permit;

use std::time::Duration;

use crate::telemetry::SemMetrics;
use tessera_core::model::Name;

/// A semaphore's validated configuration, shared by the semaphore handle, its waits and its
/// permits (the lease keeper reads the name, TTL and keep-alive interval).
#[derive(Debug)]
pub(crate) struct SemaphoreConfig {
    pub(crate) name: Name,
    pub(crate) ttl: Duration,
    pub(crate) keep_alive: Duration,
    pub(crate) holder: String,
    pub(crate) queue_cap: u32,
    pub(crate) waiter_ttl: Duration,
    pub(crate) tenant: Option<tessera_core::model::Tenant>,
    /// Its metric handles (`crate::telemetry`).
    pub(crate) metrics: SemMetrics,
}
