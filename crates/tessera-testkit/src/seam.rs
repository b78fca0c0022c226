//! Shorthands for tests that call a store's seam (`tessera::backend`) directly: a TTL that
//! never runs out during a test, a name from a literal and an acquire request; and the seam
//! tests every store on its own clock (the SQL servers) runs alike.

use std::time::Duration;

use tessera::backend::{
    AcquireReply, AcquireRequest, Backend, Name, RenewReply, WaitReply, WaitSpec,
};
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
        first_send: false,
    }
}

/// A holder whose lease ran out and a waiter whose heartbeat ran out are purged by the next
/// step, which hands the permit to the waiter behind them; the expired lease cannot be
/// renewed, and once the last lease is released `db` holds nothing for the semaphore.
pub async fn expired_holders_and_waiters_are_purged(db: &dyn Backend) {
    let n = name("expiry");
    let (a, b, c) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    let short = Duration::from_millis(300);
    assert!(matches!(
        db.acquire(&n, 1, &req(a, 1, short, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        db.acquire(&n, 1, &req(c, 1, LONG, Some((short, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert_eq!(
        db.acquire(&n, 1, &req(b, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 1 }
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The next step purges A (expired) and C (heartbeat expired) and hands the permit to B.
    match db.heartbeat(&n, b, LONG).await.unwrap() {
        WaitReply::Granted(g) => assert_eq!(g.lease.seats, vec![0]),
        other => panic!("B not granted: {other:?}"),
    }
    assert_eq!(db.heartbeat(&n, c, LONG).await.unwrap(), WaitReply::Gone);
    assert_eq!(db.renew(&n, a, LONG).await.unwrap(), RenewReply::Gone);
    assert!(db.release(&n, b).await.unwrap());
    assert!(db.status(&n).await.unwrap().is_none());
}

/// When the step has something to do at the status's instant, the status is the step's: an
/// expired holder is purged and its permit handed to the waiter, which the status then shows
/// as the holder (and whose heartbeat finds it granted).
pub async fn status_of_an_expired_holder_is_the_steps_hand_off(db: &dyn Backend) {
    let n = name("due");
    let (a, w) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        db.acquire(&n, 1, &req(a, 1, Duration::from_millis(300), None))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        db.acquire(&n, 1, &req(w, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = db.status(&n).await.unwrap().unwrap();
    let holders: Vec<_> = status
        .holders
        .iter()
        .map(|h| (h.lease_id, h.weight))
        .collect();
    assert_eq!(holders, vec![(w, 1)], "{status:?}");
    assert!(status.queue.is_empty(), "{status:?}");
    assert_eq!((status.used, status.available), (1, 0));
    assert!(matches!(
        db.heartbeat(&n, w, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
}
