//! Heartbeats of many waiters of one semaphore sent at once, for the stores that gather them
//! into one call (PostgreSQL `tessera_heartbeat_many`, MySQL `tessera_v5_heartbeat_many`):
//! each must get exactly what a heartbeat of its own gets. Used by `postgres_store.rs` and
//! `mysql_store.rs`, which also count the calls and check the stored expiries.

use std::time::Duration;

use tessera::backend::{AcquireReply, AcquireRequest, Backend, Grant, Name, WaitReply, WaitSpec};
use tessera::LeaseId;

use crate::seam::LONG;

/// The waiter TTL the waiters queue with, and that odd ones heartbeat with.
pub const SHORT: Duration = Duration::from_secs(5);

/// How many waiters queue on the semaphore behind its holder.
pub const WAITERS: usize = 60;

/// A semaphore `many` of capacity 1, held, with [`WAITERS`] waiters, and a semaphore `other`
/// with a holder and a waiter.
pub struct ManyWaiters {
    pub name: Name,
    pub held: Grant,
    pub waiters: Vec<LeaseId>,
    pub other: Name,
    pub other_holder: LeaseId,
    pub other_waiter: LeaseId,
    pub unknown: LeaseId,
}

fn req(id: LeaseId, wait: Option<Duration>) -> AcquireRequest {
    AcquireRequest {
        lease_id: id,
        weight: 1,
        ttl: LONG,
        holder: "gathered".into(),
        wait: wait.map(|waiter_ttl| WaitSpec {
            waiter_ttl,
            queue_cap: 100,
        }),
        tenant: None,
        first_send: false,
    }
}

async fn grant(b: &dyn Backend, n: &Name) -> Grant {
    match b
        .acquire(n, 1, &req(LeaseId::random(), None))
        .await
        .unwrap()
    {
        AcquireReply::Granted(g) => g,
        other => panic!("the first acquire of {n} answered {other:?}"),
    }
}

async fn queue(b: &dyn Backend, n: &Name, waiter_ttl: Duration) -> LeaseId {
    let w = LeaseId::random();
    let reply = b.acquire(n, 1, &req(w, Some(waiter_ttl))).await.unwrap();
    assert!(matches!(reply, AcquireReply::Queued { .. }), "{reply:?}");
    w
}

impl ManyWaiters {
    /// Sets both semaphores up on `b`.
    pub async fn queue(b: &dyn Backend) -> ManyWaiters {
        let (name, other) = (Name::new("many").unwrap(), Name::new("other").unwrap());
        let held = grant(b, &name).await;
        let mut waiters = vec![];
        for _ in 0..WAITERS {
            waiters.push(queue(b, &name, SHORT).await);
        }
        let other_holder = grant(b, &other).await.lease.lease_id;
        let other_waiter = queue(b, &other, LONG).await;
        ManyWaiters {
            name,
            held,
            waiters,
            other,
            other_holder,
            other_waiter,
            unknown: LeaseId::random(),
        }
    }

    /// Queues one more waiter on `many`.
    pub async fn queue_one(&self, b: &dyn Backend, waiter_ttl: Duration) -> LeaseId {
        queue(b, &self.name, waiter_ttl).await
    }

    /// Sends, all at once: each waiter's heartbeat (even ones asking for an hour, odd ones
    /// for [`SHORT`]), then the holder's, an unknown lease's and the other semaphore's
    /// waiter's on `many`, then the other semaphore's holder's and waiter's on it; checks
    /// each answer is what a heartbeat alone gets.
    pub async fn heartbeat_all(&self, b: &dyn Backend) {
        let ttl = |i: usize| if i.is_multiple_of(2) { LONG } else { SHORT };
        let n = &self.name;
        let beats = self
            .waiters
            .iter()
            .enumerate()
            .map(|(i, &w)| (n, w, ttl(i)))
            .chain([
                (n, self.held.lease.lease_id, SHORT),
                (n, self.unknown, SHORT),
                (n, self.other_waiter, SHORT),
                (&self.other, self.other_holder, SHORT),
                (&self.other, self.other_waiter, SHORT),
            ])
            .collect::<Vec<_>>();
        let replies: Vec<WaitReply> =
            futures::future::join_all(beats.iter().map(|&(n, l, ttl)| b.heartbeat(n, l, ttl)))
                .await
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
        for (i, reply) in replies[..WAITERS].iter().enumerate() {
            assert_eq!(*reply, WaitReply::Waiting, "waiter {i}");
        }
        let holder = &replies[WAITERS];
        assert!(
            matches!(holder, WaitReply::Granted(g) if g.lease == self.held.lease),
            "the holder's heartbeat answered {holder:?}"
        );
        // An unknown lease and a waiter of another semaphore; that semaphore's holder and
        // waiter.
        assert_eq!(
            replies[WAITERS + 1..WAITERS + 3],
            [WaitReply::Gone, WaitReply::Gone][..]
        );
        let other = &replies[WAITERS + 3];
        assert!(
            matches!(other, WaitReply::Granted(g) if g.lease.lease_id == self.other_holder),
            "{other:?}"
        );
        assert_eq!(replies[WAITERS + 4], WaitReply::Waiting);
    }

    /// How many heartbeats [`ManyWaiters::heartbeat_all`] sends.
    pub fn beats(&self) -> usize {
        self.waiters.len() + 5
    }
}
