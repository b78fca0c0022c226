//! The lease keeper that renews every permit of a runtime: leases do not wait on each other,
//! revocations reach it at once, and it follows runtimes as they come and go.

use std::time::Duration;

use tessera::*;
use tessera_testkit::conformance::{opts, unique};
use tessera_testkit::faults::Mode;
use tessera_testkit::harness::Harness;
use tokio::time::{timeout, Instant};

/// Holds a permit across many TTLs and checks that it was renewed all along.
async fn stays_renewed(p: &Permit, ttl: Duration) {
    let first_expiry = p.expires_at();
    tokio::time::sleep(ttl * 5).await;
    assert!(!p.is_lost(), "{:?}", p.lease_id());
    assert!(p.expires_at() > first_expiry.plus(ttl * 3));
    assert!(p.valid_until() > Instant::now());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_renewal_delays_neither_another_lease_nor_its_own_loss() {
    let h = Harness::memory();
    let (hung, healthy) = (h.client().await, h.client().await);
    let name = unique("hung");
    let a = Semaphore::new(&hung.store, &name, 2, opts(900))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let b = Semaphore::new(&healthy.store, &name, 2, opts(300))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    hung.faults.renew(Mode::Hang);
    let lost = async {
        timeout(Duration::from_secs(5), a.lost())
            .await
            .map(|r| (r, Instant::now()))
    };
    let (lost, ()) = tokio::join!(lost, stays_renewed(&b, Duration::from_millis(300)));
    let (reason, fired) = lost.expect("lost() did not fire while renewals hung");
    assert!(
        matches!(reason, LossReason::RenewalsFailing(_)),
        "{reason:?}"
    );
    assert!(
        fired < a.valid_until(),
        "lost() fired after the lease could have expired"
    );
    assert!(b.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revocation_reaches_the_holder_before_its_next_renewal() {
    let h = Harness::memory();
    let holder = h.client().await;
    let name = unique("revoked");
    // Renewals every 10 s: a loss within 2 s came from the pushed revocation.
    let p = Semaphore::new(&holder.store, &name, 1, opts(30_000))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let admin = h.client().await;
    assert!(admin
        .store
        .revoke(&name, &p.lease_id().to_string())
        .await
        .unwrap());
    let reason = timeout(Duration::from_secs(2), p.lost())
        .await
        .expect("the revocation did not reach the holder");
    assert_eq!(reason, LossReason::Gone);
}

#[test]
fn permits_are_kept_alive_in_each_runtime_after_an_earlier_one_ended() {
    let h = Harness::memory();
    let name = unique("runtimes");
    let ttl = Duration::from_millis(300);
    // Each round's permit outlives its runtime (and that runtime's keeper): it is no longer
    // renewed, so the next round gets the permit once the lease expires, and must find a
    // keeper that renews it.
    let mut outlived = Vec::new();
    for round in 0..3 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let p = runtime.block_on(async {
            let client = h.client().await;
            let sem = Semaphore::new(&client.store, &name, 1, opts(300)).unwrap();
            let p = timeout(Duration::from_secs(5), sem.acquire())
                .await
                .unwrap_or_else(|_| panic!("round {round}: the old lease did not expire"))
                .unwrap();
            stays_renewed(&p, ttl).await;
            p
        });
        drop(runtime);
        outlived.push(p);
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_keeper_ends_without_leases_and_comes_back_with_the_next_one() {
    let h = Harness::memory();
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &unique("idle"), 1, opts(300)).unwrap();
    let alive = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    assert_eq!(alive(), 0);
    let p = sem.acquire().await.unwrap();
    assert_eq!(alive(), 1, "one keeper task");
    let q = Semaphore::new(&client.store, &unique("idle"), 1, opts(300))
        .unwrap()
        .acquire()
        .await
        .unwrap();
    assert_eq!(alive(), 1, "still one keeper task for two leases");
    assert!(p.release().await.unwrap());
    assert!(q.release().await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(alive(), 0, "the keeper outlived the leases");
    let p = sem.acquire().await.unwrap();
    stays_renewed(&p, Duration::from_millis(300)).await;
    assert!(p.release().await.unwrap());
}

/// A process that does not run past its lease (SIGSTOP, suspend; here: the runtime's only
/// thread blocked) is told that it stalled, not that the store failed to answer.
#[tokio::test(flavor = "current_thread")]
async fn a_holder_that_stalled_past_its_lease_is_told_it_stalled() {
    let h = Harness::memory();
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &unique("stalled"), 1, opts(300)).unwrap();
    let p = sem.acquire().await.unwrap();
    // Nothing of this process runs for three TTLs.
    std::thread::sleep(Duration::from_millis(900));
    let reason = timeout(Duration::from_secs(5), p.lost())
        .await
        .expect("lost() did not fire after the stall");
    match reason {
        LossReason::Stalled(d) => assert!(d >= Duration::from_millis(500), "{d:?}"),
        other => panic!("the loss blamed something else: {other}"),
    }
    assert!(reason.to_string().contains("did not run"), "{reason}");
}

/// A lease handed to another process ([`Permit::detach`], sent as JSON, then
/// [`Semaphore::adopt`] on another store handle) keeps its id, fence and seats, is renewed
/// from there across several TTLs, is never granted to anyone else meanwhile, and is released
/// by its new holder; the old holder's `lost()` never fires. A lease the store no longer
/// holds cannot be adopted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detached_lease_is_adopted_elsewhere_without_a_gap_or_a_second_grant() {
    let redis = tessera_testkit::servers::redis::RedisServer::start();
    for h in [Harness::sqlite(), Harness::redis_at(&redis.url(), "adopt")] {
        let (a, b, c) = (h.client().await, h.client().await, h.client().await);
        let name = unique("handed");
        let ttl = Duration::from_millis(600);
        let sem = |client: &tessera_testkit::harness::Client| {
            Semaphore::new(&client.store, &name, 1, opts(600)).unwrap()
        };
        let held = sem(&a).acquire().await.unwrap();
        let (fence, seats) = (held.fence(), held.seats().to_vec());
        let lost = held.lost();
        let wire = serde_json::to_string(&held.detach().expect("held")).unwrap();

        let lease: Lease = serde_json::from_str(&wire).unwrap();
        let adopted = sem(&b).adopt(lease.clone()).await.unwrap();
        assert_eq!(
            (adopted.lease_id(), adopted.fence(), adopted.seats()),
            (lease.lease_id, fence, &seats[..])
        );
        assert!(
            sem(&c).try_acquire().await.unwrap().is_none(),
            "granted twice"
        );
        stays_renewed(&adopted, ttl).await;
        assert!(
            sem(&c).try_acquire().await.unwrap().is_none(),
            "granted twice"
        );
        assert!(
            timeout(Duration::from_millis(10), lost).await.is_err(),
            "the old holder was told it lost the lease"
        );

        assert!(adopted.release().await.unwrap());
        let next = sem(&c).try_acquire().await.unwrap().expect("released");
        assert!(next.fence() > fence);
        let err = sem(&b).adopt(lease).await.unwrap_err();
        assert!(matches!(err, Error::Lost(LossReason::Gone)), "{err}");
        next.release().await.unwrap();
    }
}
