//! Shorthands for tests that call a store's seam (`tessera::backend`) directly: a TTL that
//! never runs out during a test, a name from a literal and an acquire request.

use std::time::Duration;

use tessera::backend::{AcquireRequest, Name, WaitSpec};
use tessera::LeaseId;

/// A TTL no test outlives: for leases and waiters on a store with its own clock.
pub const LONG: Duration = Duration::from_secs(3600);

/// The name `s`, which must be valid.
pub fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}

/// An acquire of `weight` permits for lease `id` with `ttl`, held by `test/<weight>`;
/// `wait` is `(waiter TTL, queue cap)` for a request that queues when no permit is free.
pub fn req(
    id: LeaseId,
    weight: u32,
    ttl: Duration,
    wait: Option<(Duration, u32)>,
) -> AcquireRequest {
    AcquireRequest {
        lease_id: id,
        weight,
        ttl,
        holder: format!("test/{weight}"),
        wait: wait.map(|(waiter_ttl, queue_cap)| WaitSpec {
            waiter_ttl,
            queue_cap,
        }),
        tenant: None,
    }
}
