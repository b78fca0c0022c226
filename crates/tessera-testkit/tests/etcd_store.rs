//! The etcd store beyond the shared conformance suite: the contract's expiry properties with
//! whole-second TTLs (etcd's leases; the suite's versions use 100 ms-scale TTLs), typed
//! errors for TTLs etcd cannot keep, and faults of a 3-member cluster: the leader killed,
//! a follower killed and restarted, history compacted under a waiting waiter.
//!
//! Every test starts its own throwaway etcd (a missing `etcd` fails it with the install
//! line). No assertion is on timing beyond "within the bound the contract names, plus
//! slack".

use std::time::Duration;

use tessera::backend::*;
use tessera::*;
use tessera_testkit::conformance::{assert_drained, handed_off, opts, status, unique, wait_queued};
use tessera_testkit::faults::Mode;
use tessera_testkit::harness::{Harness, StoreTraits};
use tessera_testkit::proxy::{Mode as ProxyMode, Proxy};
use tessera_testkit::servers::etcd::{EtcdCluster, EtcdTls, ELECTION_TIMEOUT_MS};
use tokio::time::{timeout, Instant};

const TTL: Duration = Duration::from_secs(2);

fn o(ttl: Duration) -> SemaphoreOptions {
    opts(ttl.as_millis() as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttls_etcd_cannot_keep_are_typed_errors() {
    let h = Harness::etcd();
    let c = h.client().await;
    let caps = c.store.backend().capabilities();
    assert_eq!(caps.min_ttl, Duration::from_secs(2));
    assert_eq!(caps.fence, FenceSource::Revision);
    assert_eq!(caps.hand_off, HandOff::NextStep);
    for ttl in [Duration::from_millis(500), Duration::from_secs(1)] {
        let e = Semaphore::new(&c.store, "ttl", 1, o(ttl)).unwrap_err();
        assert!(
            matches!(e, Error::InvalidInput(InvalidInput::Ttl { .. })),
            "{e}"
        );
    }
    // Within the range but not whole seconds: the message says why, not the range.
    let e = Semaphore::new(&c.store, "ttl", 1, o(Duration::from_millis(2_500))).unwrap_err();
    assert!(
        matches!(e, Error::InvalidInput(InvalidInput::TtlStep { .. })),
        "{e}"
    );
    assert!(e.to_string().contains("steps of 1s"), "{e}");
    let e = Semaphore::new(
        &c.store,
        "ttl",
        1,
        o(TTL).waiter_ttl(Duration::from_secs(1)),
    )
    .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    assert!(Semaphore::new(&c.store, "ttl", 1, o(TTL)).is_ok());
    assert!(c.store.list().await.unwrap().is_empty());
}

/// etcd refuses a transaction of more than 128 compares or operations (`--max-txn-ops`),
/// and a grant compares every seat it takes: a weight above the store's limit is a typed
/// error that changes nothing (before, etcd's "too many operations in txn request" came
/// back as a store error), and the limit itself is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_weight_above_what_one_transaction_can_grant_is_a_typed_error() {
    let h = Harness::etcd();
    let c = h.client().await;
    let max = c.store.backend().capabilities().max_weight;
    assert_eq!(max, 122);
    let name = unique("heavy");
    let sem = Semaphore::new(&c.store, &name, 300, o(TTL)).unwrap();
    let e = sem.acquire_many(max + 1).await.unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidInput(InvalidInput::WeightAboveStoreLimit {
                weight: 123,
                max: 122
            })
        ),
        "{e}"
    );
    assert!(c.store.list().await.unwrap().is_empty(), "nothing changed");
    let p = sem.acquire_many(max).await.unwrap();
    assert_eq!(p.seats(), (0..max).collect::<Vec<_>>());
    // Into a queue that is not empty: the transaction that writes the record (and reads
    // the count, the seats and the tail) fits etcd's limit too.
    let q = sem.acquire_many(max).await.unwrap();
    assert_eq!(q.seats(), (max..2 * max).collect::<Vec<_>>());
    q.release().await.unwrap();
    p.release().await.unwrap();
}

/// A release whose hand-off would not fit one transaction: the releaser frees seats 50–149
/// while the head of the queue takes seats 0–99, so the transaction would delete 50 seats
/// and write 100 (152 operations, above etcd's 128). The grant is ended alone and the head
/// grants itself; before, the release failed and the permits waited for the lease's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_too_large_to_hand_off_in_its_transaction_still_frees_and_hands_off() {
    let h = Harness::etcd();
    let c = h.client().await;
    let name = unique("large");
    let ttl = Duration::from_secs(30);
    let sem = Semaphore::new(&c.store, &name, 250, o(ttl)).unwrap();
    let d = sem.acquire_many(50).await.unwrap();
    let a = sem.acquire_many(100).await.unwrap();
    let b = sem.acquire_many(100).await.unwrap();
    assert_eq!((d.seats()[0], a.seats()[0], b.seats()[0]), (0, 50, 150));
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(100).await })
    };
    wait_queued(&c.store, &name, 1).await;
    d.release().await.unwrap();
    assert!(a.release().await.unwrap(), "the release found its lease");
    let got = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the head was granted within a third of the TTL")
        .unwrap()
        .unwrap();
    assert_eq!(got.seats(), (0..100).collect::<Vec<_>>());
    got.release().await.unwrap();
    b.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_never_appears_in_errors() {
    let h = Harness::etcd();
    let url = h.url().replace("etcd://", "etcd://someone:hunter2@");
    // Auth is off on the test cluster: etcd refuses to authenticate anyone.
    let e = Store::connect(&url).await.unwrap_err();
    assert!(!e.to_string().contains("hunter2"), "{e}");
    assert!(!format!("{e:?}").contains("hunter2"), "{e:?}");
    let e = Store::connect("etcd://u:hunter2@127.0.0.1:1/x?ca=/none")
        .await
        .unwrap_err();
    assert!(
        e.is_invalid_input() && !e.to_string().contains("hunter2"),
        "{e}"
    );
}

/// A port where nothing listens: a connection error in the shape of every server store (as
/// Redis words it), naming the URL with its password masked, in words: it was a debug dump
/// of the gRPC layers (`source: tonic::transport::Error(Transport, ConnectError(…`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url_and_asks_whether_the_server_runs() {
    let port = tessera_testkit::servers::free_port();
    // (The listener is closed again here: nothing listens on the port.)
    for url in [
        format!("etcd://127.0.0.1:{port}"),
        format!("etcd://app:hunter2-secret@127.0.0.1:{port}/x"),
    ] {
        let e = Store::connect(&url).await.unwrap_err();
        assert!(e.is_connection(), "{e:?}");
        let text = e.to_string();
        assert_eq!(
            text,
            format!(
                "store error (connection): etcd: tcp connect error: Connection refused (os \
                 error 111) (nothing accepts connections at {}: is the server running, on \
                 this host and port?)",
                url.replace("hunter2-secret", "***")
            )
        );
        assert!(!format!("{e:?}").contains("hunter2-secret"), "{e:?}");
    }
}

/// A lease nobody renews comes back by its (whole-second) TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_lease_comes_back_within_its_ttl() {
    let h = Harness::etcd();
    let name = unique("abandoned");
    let client = h.client().await;
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 2,
        ttl: TTL,
        holder: "frozen".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    let nm = Name::new(&name).unwrap();
    let sent = Instant::now();
    let AcquireReply::Granted(g) = client.store.backend().acquire(&nm, 2, &req).await.unwrap()
    else {
        panic!("not granted")
    };
    let sem = Semaphore::new(&client.store, &name, 2, o(TTL)).unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    let p = sem
        .acquire_many_timeout(2, TTL + Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the abandoned permit did not come back");
    assert!(sent.elapsed() >= TTL - Duration::from_millis(100));
    assert!(p.fence() > g.lease.fence);
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// A holder process killed with SIGKILL gives its permit back within its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_holder_process_gives_its_permit_back_within_ttl() {
    let h = Harness::etcd();
    let name = unique("sigkill");
    let mut child = tessera_testkit::hold::spawn_holder(h.url(), &name, 1, TTL).await;
    let client = h.client().await;
    let s = status(&client.store, &name).await.expect("the child holds");
    assert_eq!(s.holders.len(), 1);
    child.kill().await.unwrap();
    let sem = Semaphore::new(&client.store, &name, 1, o(TTL)).unwrap();
    let p = sem
        .acquire_many_timeout(1, TTL + Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the killed holder's permit did not come back");
    assert!(p.fence() > s.holders[0].fence);
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// Keep-alive renews a 2 s lease for several TTLs; nobody else gets in meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_a_lease_across_many_ttls() {
    let h = Harness::etcd();
    let name = unique("keepalive");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, o(TTL)).unwrap();
    let p = sem.acquire().await.unwrap();
    let first_expiry = p.expires_at();
    tokio::time::sleep(TTL * 3).await;
    assert!(!p.is_lost());
    assert!(p.expires_at() > first_expiry.plus(TTL));
    assert!(p.valid_until() > Instant::now());
    let other = h.client().await;
    let sem2 = Semaphore::new(&other.store, &name, 1, o(TTL)).unwrap();
    assert!(sem2.try_acquire().await.unwrap().is_none());
    assert!(
        p.release().await.unwrap(),
        "the lease was not held any more"
    );
    assert_drained(&client.store, &name).await;
}

/// When renewals fail or hang, `lost()` fires before the lease could expire, while etcd
/// still holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_expiry_when_renewals_fail_or_hang() {
    let h = Harness::etcd();
    for mode in [Mode::Fail, Mode::Hang] {
        let name = unique("renewfail");
        let client = h.client().await;
        let sem = Semaphore::new(&client.store, &name, 1, o(Duration::from_secs(3))).unwrap();
        let p = sem.acquire().await.unwrap();
        client.faults.renew(mode);
        let reason = timeout(Duration::from_secs(5), p.lost())
            .await
            .expect("lost() did not fire");
        assert!(
            matches!(reason, LossReason::RenewalsFailing(_)),
            "{reason:?}"
        );
        assert!(Instant::now() < p.valid_until());
        let other = h.client().await;
        let s = status(&other.store, &name).await.unwrap();
        assert!(s.holders.iter().any(|l| l.lease_id == p.lease_id()));
        drop(p);
    }
}

/// A waiter that stops heartbeating leaves the queue within its waiter TTL (its etcd lease
/// ends), and the permit goes to the live waiter behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_leaves_the_queue_within_its_ttl() {
    let h = Harness::etcd();
    let name = unique("deadwaiter");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, o(Duration::from_secs(5))).unwrap();
    let held = sem.acquire().await.unwrap();
    let dead = LeaseId::random();
    let nm = Name::new(&name).unwrap();
    let req = AcquireRequest {
        lease_id: dead,
        weight: 1,
        ttl: Duration::from_secs(5),
        holder: "dead".into(),
        wait: Some(WaitSpec {
            waiter_ttl: TTL,
            queue_cap: 10,
        }),
        tenant: None,
        first_send: false,
    };
    let r = client.store.backend().acquire(&nm, 1, &req).await.unwrap();
    assert_eq!(r, AcquireReply::Queued { position: 0 });
    let other = h.client().await;
    let n = name.clone();
    let live = tokio::spawn(async move {
        let sem = Semaphore::new(&other.store, &n, 1, o(Duration::from_secs(5))).unwrap();
        sem.acquire().await.unwrap()
    });
    wait_queued(&client.store, &name, 2).await;
    held.release().await.unwrap();
    let p = timeout(TTL + Duration::from_secs(5), live)
        .await
        .expect("the live waiter was not served")
        .unwrap();
    let b = client.store.backend();
    assert_eq!(b.heartbeat(&nm, dead, TTL).await.unwrap(), WaitReply::Gone);
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// Lease TTL and waiter TTL of the hand-off tests: a waiter's queue entry lives far shorter
/// than a lease.
const LONG_TTL: Duration = Duration::from_secs(30);
const WAITER_TTL: Duration = Duration::from_secs(2);

fn long() -> SemaphoreOptions {
    SemaphoreOptions::default()
        .ttl(LONG_TTL)
        .waiter_ttl(WAITER_TTL)
}

/// A waiter whose client died while it was queued (its sessions no longer kept alive) and
/// that a release then hands the lock to holds it only until its queue entry would have
/// ended, not for its 30 s lease TTL: the grant is provisional, on the etcd lease of the
/// waiter's queue entry, and the next waiter is served within the waiter TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_handed_the_permit_frees_it_within_its_waiter_ttl() {
    let h = Harness::etcd();
    let name = unique("deadhandoff");
    let nm = Name::new(&name).unwrap();
    let a = h.client().await;
    let sem = Semaphore::new(&a.store, &name, 1, long()).unwrap();
    let held = sem.acquire().await.unwrap();
    // Queued through a client of its own that does nothing more: it died right after.
    let dead_client = h.client().await;
    let dead = LeaseId::random();
    let req = AcquireRequest {
        lease_id: dead,
        weight: 1,
        ttl: LONG_TTL,
        holder: "dead".into(),
        wait: Some(WaitSpec {
            waiter_ttl: WAITER_TTL,
            queue_cap: 10,
        }),
        tenant: None,
        first_send: false,
    };
    let r = dead_client.store.backend().acquire(&nm, 1, &req).await;
    assert_eq!(r.unwrap(), AcquireReply::Queued { position: 0 });
    assert!(held.release().await.unwrap());
    let released = Instant::now();
    let st = status(&a.store, &name)
        .await
        .expect("the dead waiter was not handed the permit");
    let grant = st
        .holders
        .iter()
        .find(|l| l.lease_id == dead)
        .expect("the dead waiter was not handed the permit");
    assert!(
        grant.expires_at <= st.now.plus(WAITER_TTL),
        "the hand-off grant outlives its waiter's queue entry: now {}, expires {}",
        st.now,
        grant.expires_at
    );
    let b = h.client().await;
    let next = Semaphore::new(&b.store, &name, 1, long()).unwrap();
    let p = timeout(WAITER_TTL + Duration::from_secs(5), next.acquire())
        .await
        .expect("the permit stayed with the dead waiter past its waiter TTL")
        .unwrap();
    assert!(
        released.elapsed() < LONG_TTL / 2,
        "served {:?} after the release",
        released.elapsed()
    );
    assert!(p.fence() > grant.fence);
    assert!(p.release().await.unwrap());
    assert_drained(&a.store, &name).await;
}

/// A live waiter handed the lock keeps it past its waiter TTL: its first renewal moves the
/// grant to its session of the lease TTL, keeping the fence. After the move the grant is
/// still one: a revoke by another client ends it and its holder hears of it, the next grant
/// gets a higher fence, and nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_permit_is_kept_past_its_waiter_ttl_with_its_fence() {
    let h = Harness::etcd();
    let name = unique("provisional");
    let (a, b) = (h.client().await, h.client().await);
    let (p, _b) = handed_off(&a, b, &name, long).await;
    let fence = p.fence();
    assert!(
        p.lease().expires_at
            <= p.lease()
                .acquired_at
                .plus(WAITER_TTL + Duration::from_secs(1)),
        "the hand-off grant is not provisional: {:?}",
        p.lease()
    );
    tokio::time::sleep(WAITER_TTL * 2).await;
    assert!(!p.is_lost(), "lost: {:?}", p.lost().await);
    let st = status(&a.store, &name).await.expect("the lease ended");
    let lease = st
        .holders
        .iter()
        .find(|l| l.lease_id == p.lease_id())
        .expect("the handed-off lease ended");
    assert_eq!(lease.fence, fence, "the move changed the fence");
    assert!(
        lease.expires_at >= st.now.plus(LONG_TTL / 2),
        "not moved to the lease TTL: now {}, expires {}",
        st.now,
        lease.expires_at
    );
    assert!(p.valid_until() > Instant::now() + LONG_TTL / 2);
    // Ended by another client after the move: the holder is told, the lock is free.
    assert!(a
        .store
        .revoke(&name, &p.lease_id().to_string())
        .await
        .unwrap());
    let reason = timeout(LONG_TTL / 3 + Duration::from_secs(5), p.lost())
        .await
        .expect("the revoked holder was not told");
    assert_eq!(reason, LossReason::Gone);
    let sem_a = Semaphore::new(&a.store, &name, 1, long()).unwrap();
    let again = sem_a.acquire().await.unwrap();
    assert!(again.fence() > fence);
    assert!(again.release().await.unwrap());
    assert_drained(&a.store, &name).await;
}

/// A hand-off grant whose renewals fail is never moved to the lease TTL: `lost()` fires
/// before its provisional expiry, while etcd still has the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_a_hand_off_grant_expires_when_renewals_fail() {
    let h = Harness::etcd();
    let name = unique("provisional-lost");
    let (a, b) = (h.client().await, h.client().await);
    b.faults.renew(Mode::Fail);
    let (p, _b) = handed_off(&a, b, &name, long).await;
    let sem_a = Semaphore::new(&a.store, &name, 1, long()).unwrap();
    let reason = timeout(WAITER_TTL * 2, p.lost())
        .await
        .expect("lost() did not fire before the provisional grant could end");
    assert!(
        matches!(reason, LossReason::RenewalsFailing(_)),
        "{reason:?}"
    );
    assert!(Instant::now() < p.valid_until());
    let st = status(&a.store, &name).await.expect("the lease had ended");
    assert!(st.holders.iter().any(|l| l.lease_id == p.lease_id()));
    // Nobody renews it: the lock is free again within the waiter TTL, not the lease TTL.
    let again = timeout(WAITER_TTL + Duration::from_secs(5), sem_a.acquire())
        .await
        .expect("the provisional grant outlived its waiter TTL")
        .unwrap();
    assert!(again.release().await.unwrap());
}

/// Four clients pass a lock on to each other 200 times, with heartbeats 7.5 s apart: every
/// waiter is woken by its watch, none waits for its heartbeat. A watch opened after the
/// snapshot its waiter read misses what happened in between unless the waiter reads again
/// (`notify.rs`); without that, a hand-off in the gap left its waiter asleep until the next
/// heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_lock_wakes_every_waiter_without_its_heartbeat() {
    let h = Harness::etcd();
    let name = unique("busy");
    let slow_beats = || {
        SemaphoreOptions::default()
            .ttl(LONG_TTL)
            .waiter_ttl(LONG_TTL)
    };
    let mut clients = Vec::new();
    for _ in 0..4 {
        let c = h.client().await;
        let n = name.clone();
        clients.push(tokio::spawn(async move {
            let sem = Semaphore::new(&c.store, &n, 1, slow_beats()).unwrap();
            for i in 0..50 {
                let p = sem
                    .acquire_many_timeout(1, Duration::from_secs(5))
                    .await
                    .unwrap()
                    .unwrap_or_else(|| panic!("acquire {i} waited for its heartbeat"));
                assert!(p.release().await.unwrap());
            }
            c
        }));
    }
    let mut last = None;
    for c in clients {
        last = Some(c.await.unwrap());
    }
    assert_drained(&last.unwrap().store, &name).await;
}

/// A cancel that did not finish (dropped at once here; in production, the clean-up's bound
/// during an outage, after which `tessera run` rejoined the queue) left the waiting record on
/// this client's waiter session, which the process's other waiter keeps alive: before, that
/// record stayed at the head for good (granted by the release, held by nobody) and the other
/// waiter never got in. The next call of the client finishes the cancel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_did_not_finish_leaves_no_ghost_at_the_head_of_the_queue() {
    let h = Harness::etcd();
    let name = unique("ghost");
    let c = h.client().await;
    let sem = Semaphore::new(&c.store, &name, 1, o(TTL)).unwrap();
    let held = sem.acquire().await.unwrap();
    let backend = c.store.backend();
    let nm = Name::new(&name).unwrap();
    let ghost = LeaseId::random();
    let req = AcquireRequest {
        lease_id: ghost,
        weight: 1,
        ttl: TTL,
        holder: "ghost".into(),
        wait: Some(WaitSpec {
            waiter_ttl: TTL,
            queue_cap: 100,
        }),
        tenant: None,
        first_send: false,
    };
    let queued = backend.acquire(&nm, 1, &req).await.unwrap();
    assert!(
        matches!(queued, AcquireReply::Queued { position: 0 }),
        "{queued:?}"
    );
    // The cancel is dropped at its first wait for the store.
    let _ = timeout(Duration::ZERO, backend.cancel(&nm, ghost)).await;
    let s2 = sem.clone();
    let waiter =
        tokio::spawn(async move { s2.acquire_many_timeout(1, Duration::from_secs(20)).await });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !status(&c.store, &name)
        .await
        .is_some_and(|s| s.queue.iter().any(|w| w.lease_id != ghost))
    {
        assert!(Instant::now() < deadline, "the waiter did not queue");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let p = waiter
        .await
        .unwrap()
        .unwrap()
        .expect("the waiter never got in behind the unfinished cancel's record");
    let s = status(&c.store, &name).await.unwrap();
    assert!(
        s.holders.iter().all(|l| l.lease_id != ghost)
            && s.queue.iter().all(|w| w.lease_id != ghost),
        "{s:?}"
    );
    p.release().await.unwrap();
    assert_drained(&c.store, &name).await;
}

/// Once every lease expired, the semaphore is idle and takes the next client's capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_semaphore_takes_the_capacity_of_the_next_client() {
    let h = Harness::etcd();
    let name = unique("idle");
    let client = h.client().await;
    let nm = Name::new(&name).unwrap();
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl: TTL,
        holder: "gone".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    assert!(matches!(
        client.store.backend().acquire(&nm, 2, &req).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let three = Semaphore::new(&client.store, &name, 3, o(TTL)).unwrap();
    assert!(three
        .try_acquire()
        .await
        .unwrap_err()
        .is_capacity_mismatch());
    let p = timeout(TTL + Duration::from_secs(5), async {
        loop {
            match three.try_acquire().await {
                Ok(Some(p)) => return p,
                Err(e) if e.is_capacity_mismatch() => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("the idle semaphore kept its old capacity");
    assert_eq!(status(&client.store, &name).await.unwrap().capacity, 3);
    p.release().await.unwrap();
}

/// The keys of semaphore `name` in the cluster (every key whose path holds `/sem/NAME#`).
fn keys_of(h: &mut Harness, name: &str) -> Vec<String> {
    let out = h
        .etcd_cluster()
        .unwrap()
        .ctl(&["get", "", "--prefix", "--keys-only"]);
    let tag = format!("/sem/{name}#");
    out.lines()
        .filter(|k| k.contains(&tag))
        .map(str::to_string)
        .collect()
}

/// Bounded state: a semaphore whose leases and waiters all end through a release, a cancel
/// (a timed-out wait) or a revoke leaves no key, its capacity key included; while any lease
/// or waiter is left, the capacity key stays, and the next acquire of the idle name may
/// declare another capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_nobody_holds_or_waits_on_leaves_no_key() {
    let mut h = Harness::etcd();
    let client = h.client().await;
    let name = unique("bounded");
    let sem = Semaphore::new(&client.store, &name, 2, o(TTL)).unwrap();

    // Two holders: the first release keeps the capacity, the second leaves nothing.
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    a.release().await.unwrap();
    let left = keys_of(&mut h, &name);
    assert!(left.iter().any(|k| k.ends_with("#cap")), "{left:?}");
    b.release().await.unwrap();
    assert_eq!(keys_of(&mut h, &name), Vec::<String>::new());
    assert!(status(&client.store, &name).await.is_none());

    // A waiter that times out behind a holder, then the holder's release.
    let held = sem.acquire_many(2).await.unwrap();
    assert!(sem
        .acquire_many_timeout(1, Duration::from_millis(300))
        .await
        .unwrap()
        .is_none());
    held.release().await.unwrap();
    assert_eq!(keys_of(&mut h, &name), Vec::<String>::new());

    // A revoked holder, and the idle name taking another capacity.
    let held = sem.acquire().await.unwrap();
    assert!(client
        .store
        .revoke(&name, &held.lease_id().to_string())
        .await
        .unwrap());
    assert_eq!(keys_of(&mut h, &name), Vec::<String>::new());
    let five = Semaphore::new(&client.store, &name, 5, o(TTL)).unwrap();
    let p = five
        .try_acquire()
        .await
        .unwrap()
        .expect("an idle name takes a new capacity");
    assert_eq!(status(&client.store, &name).await.unwrap().capacity, 5);
    p.release().await.unwrap();
    assert_eq!(keys_of(&mut h, &name), Vec::<String>::new());
}

/// Polls until semaphore `name` has no key left (at most `TTL` + 8 s); its keys then.
async fn wait_for_no_key(h: &mut Harness, name: &str) -> Vec<String> {
    let deadline = Instant::now() + TTL + Duration::from_secs(8);
    loop {
        let left = keys_of(h, name);
        if left.is_empty() || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Bounded state after a crash: the last holder of a semaphore killed without releasing
/// takes the capacity key with it when its etcd lease runs out (it stayed for good, before,
/// on a name nobody used again): a lone holder; one left alone by another's release; one
/// handed the lock by a release and settled by its first renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capacity_key_goes_with_the_last_lease_of_a_killed_holder() {
    let mut h = Harness::etcd();
    let url = h.url().to_string();
    let client = h.client().await;

    // Alone from the start.
    let name = unique("crash-alone");
    let mut child = tessera_testkit::hold::spawn_holder(&url, &name, 1, TTL).await;
    assert!(keys_of(&mut h, &name).iter().any(|k| k.ends_with("#cap")));
    child.kill().await.unwrap();
    assert_eq!(wait_for_no_key(&mut h, &name).await, Vec::<String>::new());

    // Left alone by another holder's release.
    let name = unique("crash-left");
    let sem = Semaphore::new(&client.store, &name, 2, o(TTL)).unwrap();
    let mine = sem.acquire().await.unwrap();
    let mut child = tessera_testkit::hold::spawn_holder(&url, &name, 2, TTL).await;
    mine.release().await.unwrap();
    child.kill().await.unwrap();
    assert_eq!(wait_for_no_key(&mut h, &name).await, Vec::<String>::new());

    // Handed the lock by a release, then settled (its first renewal moves it).
    let name = unique("crash-handed");
    let sem = Semaphore::new(&client.store, &name, 1, o(TTL)).unwrap();
    let mine = sem.acquire().await.unwrap();
    let child = tokio::spawn({
        let (url, name) = (url.clone(), name.clone());
        async move { tessera_testkit::hold::spawn_holder(&url, &name, 1, TTL).await }
    });
    wait_queued(&client.store, &name, 1).await;
    mine.release().await.unwrap();
    let mut child = child.await.unwrap();
    // Past its first renewal (100 ms after the grant).
    tokio::time::sleep(Duration::from_millis(500)).await;
    child.kill().await.unwrap();
    assert_eq!(wait_for_no_key(&mut h, &name).await, Vec::<String>::new());
    assert!(client.store.list().await.unwrap().is_empty());
}

/// Kills the leader while a holder holds and a waiter waits: the holder's release (retried
/// through the election) hands the lock to the waiter, fences keep increasing, nobody
/// overlaps, and the semaphore keeps granting on the two members left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_go_on_when_the_leader_is_killed() {
    let mut h = Harness::etcd_with(3);
    let name = unique("leaderkill");
    let a = h.client().await;
    let b = h.client().await;
    let sem_a = Semaphore::new(&a.store, &name, 1, o(Duration::from_secs(3))).unwrap();
    let sem_b = Semaphore::new(&b.store, &name, 1, o(Duration::from_secs(3))).unwrap();
    let first = sem_a.acquire().await.unwrap();
    let fence = first.fence();
    let waiter = tokio::spawn(async move { sem_b.acquire().await.map(|p| (p, sem_b)) });
    wait_queued(&a.store, &name, 1).await;
    let cluster = h.etcd_cluster().unwrap();
    let leader = cluster.leader();
    cluster.kill(leader);
    // The release may meet the election: retried until it lands (it is idempotent).
    let lease = first.lease_id().to_string();
    drop(first);
    let (second, sem_b) = timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was not served after the leader's loss")
        .unwrap()
        .unwrap();
    assert!(second.fence() > fence);
    let s = status(&a.store, &name).await.unwrap();
    assert_eq!(s.holders.len(), 1);
    assert_eq!(s.holders[0].lease_id, second.lease_id());
    assert_ne!(s.holders[0].lease_id.to_string(), lease);
    // Keeps granting on the majority left.
    let mut last = second.fence();
    second.release().await.unwrap();
    for _ in 0..5 {
        let p = sem_b.acquire().await.unwrap();
        assert!(p.fence() > last);
        last = p.fence();
        p.release().await.unwrap();
    }
    assert_drained(&a.store, &name).await;
}

/// A follower killed and restarted changes nothing for holders and waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_lost_and_restarted_changes_nothing() {
    let mut h = Harness::etcd_with(3);
    let name = unique("follower");
    let a = h.client().await;
    let sem = Semaphore::new(&a.store, &name, 2, o(Duration::from_secs(3))).unwrap();
    let p = sem.acquire().await.unwrap();
    let cluster = h.etcd_cluster().unwrap();
    let follower = (cluster.leader() + 1) % cluster.len();
    cluster.kill(follower);
    let mut last = p.fence();
    for _ in 0..5 {
        let q = sem.acquire().await.unwrap();
        assert!(q.fence() > last);
        last = q.fence();
        q.release().await.unwrap();
    }
    h.etcd_cluster().unwrap().restart(follower);
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !p.is_lost(),
        "the holder lost its lease to a follower's restart"
    );
    let q = sem.acquire().await.unwrap();
    assert!(q.fence() > last);
    q.release().await.unwrap();
    p.release().await.unwrap();
    assert_drained(&a.store, &name).await;
}

/// History compacted while a waiter waits, and its watch broken by a member restart: the
/// waiter re-reads, watches again from a live revision, and is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_served_after_compaction_and_a_broken_watch() {
    let mut h = Harness::etcd_with(1);
    let name = unique("compact");
    let a = h.client().await;
    let b = h.client().await;
    let sem_a = Semaphore::new(&a.store, &name, 1, o(Duration::from_secs(5))).unwrap();
    let sem_b = Semaphore::new(&b.store, &name, 1, o(Duration::from_secs(5))).unwrap();
    let first = sem_a.acquire().await.unwrap();
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    wait_queued(&a.store, &name, 1).await;
    // Churn on another semaphore moves the revision on, then compaction drops the history
    // the waiter's watch started from; the restart breaks every watch stream.
    let other = Semaphore::new(&a.store, &unique("churn"), 1, o(TTL)).unwrap();
    for _ in 0..20 {
        other.acquire().await.unwrap().release().await.unwrap();
    }
    let cluster = h.etcd_cluster().unwrap();
    cluster.compact();
    cluster.restart(0);
    first.release().await.unwrap();
    let p = timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter was not served after compaction")
        .unwrap()
        .unwrap();
    p.release().await.unwrap();
    assert_drained(&a.store, &name).await;
}

/// A 3-member cluster whose members the clients reach through one fault proxy each (in the
/// URL's order), under a random key prefix.
async fn proxied_cluster() -> (Harness, Vec<Proxy>) {
    let cluster = EtcdCluster::start(3);
    let mut proxies = Vec::new();
    for i in 0..cluster.len() {
        let member = ([127, 0, 0, 1], cluster.client_port(i)).into();
        proxies.push(Proxy::start(member).await.unwrap());
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let url = format!("etcd://{}/t{:08x}", hosts.join(","), rand::random::<u32>());
    let h = Harness::new("etcd://", url, StoreTraits::OWN_ETCD, Box::new(cluster));
    (h, proxies)
}

/// The clients' connections to the member they talk to (the URL's first) are black-holed:
/// packets dropped, nothing closed. Requests move to the next member, the holder's
/// keep-alives go on there (it keeps its lease through several TTLs), the waiter's watch
/// follows, and the release hands the permit to the waiter; fences keep increasing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_member_connection_fails_over_to_the_next_member() {
    let (h, proxies) = proxied_cluster().await;
    let name = unique("blackhole");
    let a = h.client().await;
    let b = h.client().await;
    let ttl = Duration::from_secs(6);
    let sem_a = Semaphore::new(&a.store, &name, 1, o(ttl)).unwrap();
    let sem_b = Semaphore::new(&b.store, &name, 1, o(ttl)).unwrap();
    let first = sem_a.acquire().await.unwrap();
    let fence = first.fence();
    let waiter = tokio::spawn(async move { sem_b.acquire().await.map(|p| (p, sem_b)) });
    wait_queued(&a.store, &name, 1).await;
    proxies[0].set(ProxyMode::Blackhole);
    tokio::time::sleep(ttl * 2).await;
    assert!(
        !first.is_lost(),
        "the holder lost its lease to a black-holed member connection"
    );
    assert!(first.valid_until() > Instant::now());
    first.release().await.unwrap();
    let (second, sem_b) = timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was not served after the black-hole")
        .unwrap()
        .unwrap();
    assert!(second.fence() > fence);
    let mut last = second.fence();
    second.release().await.unwrap();
    for _ in 0..3 {
        let p = sem_a.acquire().await.unwrap();
        assert!(p.fence() > last);
        last = p.fence();
        p.release().await.unwrap();
    }
    drop(sem_b);
    assert_drained(&a.store, &name).await;
    // A client started while the member is black-holed connects through the others.
    let c = h.client().await;
    let sem_c = Semaphore::new(&c.store, &name, 1, o(ttl)).unwrap();
    sem_c.acquire().await.unwrap().release().await.unwrap();
    proxies[0].set(ProxyMode::Pass);
}

/// `etcds://` against a member that serves clients over TLS only and asks them for a
/// certificate (`--client-cert-auth`), with a CA and certificates made for the test: the
/// semaphore works; without the client certificate, or without TLS, the client gets a
/// store error, not a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_custom_ca_and_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let tls = EtcdTls::generate(dir.path());
    let cluster = EtcdCluster::start_tls(1, &tls);
    let url = cluster
        .url()
        .replacen('?', &format!("/t{:08x}?", rand::random::<u32>()), 1);
    assert!(url.starts_with("etcds://"), "{url}");
    let store = Store::connect(&url).await.unwrap();
    let name = unique("tls");
    let sem = Semaphore::new(&store, &name, 1, o(TTL)).unwrap();
    let p = sem.acquire().await.unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    p.release().await.unwrap();
    assert_drained(&store, &name).await;

    let no_cert = format!(
        "etcds://127.0.0.1:{}/x?ca={}",
        cluster.client_port(0),
        tls.ca.display()
    );
    let plain = format!("etcd://127.0.0.1:{}/x", cluster.client_port(0));
    for bad in [no_cert, plain] {
        let e = timeout(Duration::from_secs(30), Store::connect(&bad))
            .await
            .unwrap_or_else(|_| panic!("{bad}: no answer"))
            .unwrap_err();
        assert!(matches!(e, Error::Store { .. }), "{bad}: {e}");
    }
}

/// etcd's user/password auth: the right password works; a wrong one is a typed error
/// (`is_auth`) at connect that never shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_password_auth_and_a_wrong_password() {
    let cluster = EtcdCluster::start(1);
    cluster.ctl(&["user", "add", "root:Right-pw-42", "--interactive=false"]);
    cluster.ctl(&["user", "grant-role", "root", "root"]);
    cluster.ctl(&["auth", "enable"]);
    let base = cluster.url();
    let good = format!(
        "{}/t{:08x}",
        base.replace("etcd://", "etcd://root:Right-pw-42@"),
        rand::random::<u32>()
    );
    let store = Store::connect(&good).await.unwrap();
    let name = unique("auth");
    let sem = Semaphore::new(&store, &name, 2, o(TTL)).unwrap();
    let p = sem.acquire().await.unwrap();
    p.release().await.unwrap();
    assert_drained(&store, &name).await;

    for secret in ["hunter2-wrong", "Right-pw-4"] {
        let bad = base.replace("etcd://", &format!("etcd://root:{secret}@"));
        let e = Store::connect(&bad).await.unwrap_err();
        assert!(e.is_auth(), "{e}");
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(!text.contains(secret), "{text}");
        }
        assert_eq!(
            e.to_string(),
            format!(
                "store error (auth): etcd: etcdserver: authentication failed, invalid user ID \
                 or password (the server refused the credentials: check the user and password \
                 of {})",
                bad.replace(secret, "***")
            )
        );
    }
    let e = Store::connect(&base.replace("etcd://", "etcd://nobody:x@"))
        .await
        .unwrap_err();
    assert!(e.is_auth(), "{e}");
}

/// etcd's auth tokens expire: a simple token `--auth-token-ttl` after its last use (300 s by
/// default), so a process that calls nothing for five minutes holds a dead token. A store left
/// idle past it, a holder that renews across it and a waiter that waits across it all go on:
/// the client authenticates again, and the caller never sees "invalid auth token".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_auth_token_is_renewed_not_reported() {
    let cluster = EtcdCluster::start_args(1, &["--auth-token-ttl", "2"]);
    cluster.ctl(&["user", "add", "root:Tok-pw-7", "--interactive=false"]);
    cluster.ctl(&["user", "grant-role", "root", "root"]);
    cluster.ctl(&["auth", "enable"]);
    let url = format!(
        "{}/t{:08x}",
        cluster.url().replace("etcd://", "etcd://root:Tok-pw-7@"),
        rand::random::<u32>()
    );
    let expire = Duration::from_secs(4);
    let store = Store::connect(&url).await.unwrap();
    let name = unique("token");
    let sem = Semaphore::new(&store, &name, 1, o(TTL)).unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();

    // Idle past the token's TTL, then every kind of call.
    tokio::time::sleep(expire).await;
    assert!(store.list().await.unwrap().is_empty());
    tokio::time::sleep(expire).await;
    let p = sem.acquire().await.unwrap();
    tokio::time::sleep(expire).await;
    assert!(sem.try_acquire().await.unwrap().is_none());

    // A waiter of another store waits across its token's expiry while the holder renews.
    let other = Store::connect(&url).await.unwrap();
    let sem2 = Semaphore::new(&other, &name, 1, o(TTL)).unwrap();
    let waiter = tokio::spawn(async move { sem2.acquire().await });
    wait_queued(&store, &name, 1).await;
    tokio::time::sleep(expire).await;
    assert!(p.release().await.unwrap(), "the holder's lease was lost");
    let q = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter was not served after its token expired")
        .unwrap()
        .unwrap();
    tokio::time::sleep(expire).await;
    assert!(q.release().await.unwrap(), "the waiter's lease was lost");
    assert_drained(&store, &name).await;
}

/// etcd over its space quota (`--quota-backend-bytes`, alarm NOSPACE) refuses every put
/// until an operator frees space and disarms the alarm. An acquire then fails at once with a
/// store error that says so (it used to wait out its whole wait and report "no permit", as
/// if the semaphore were taken); a holder still gives its permit back; once space is freed
/// and the alarm disarmed, acquires work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_out_of_space_is_a_plain_error_not_a_taken_semaphore() {
    let cluster = EtcdCluster::start_args(1, &["--quota-backend-bytes", "2000000"]);
    let url = format!("{}/t{:08x}", cluster.url(), rand::random::<u32>());
    let store = Store::connect(&url).await.unwrap();
    let name = unique("nospace");
    let sem = Semaphore::new(&store, &name, 1, o(TTL)).unwrap();
    let held = sem.acquire().await.unwrap();
    let waiting = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    wait_queued(&store, &name, 1).await;

    let value = "x".repeat(100_000);
    let full = (0..100).any(|i| {
        cluster
            .try_ctl(&["put", &format!("fill{i}"), &value])
            .is_err()
    });
    assert!(full, "the cluster never filled");
    assert!(cluster.ctl(&["alarm", "list"]).contains("NOSPACE"));

    let other = Semaphore::new(&store, &unique("nospace"), 1, o(TTL)).unwrap();
    let e = timeout(
        Duration::from_secs(10),
        other.acquire_many_timeout(1, Duration::from_secs(60)),
    )
    .await
    .expect("an acquire kept waiting on a full cluster")
    .unwrap_err();
    assert!(
        matches!(e, Error::Store { .. }) && !e.is_transient(),
        "{e:?}"
    );
    assert!(e.to_string().contains("NOSPACE"), "{e}");
    assert!(
        held.release().await.unwrap(),
        "the holder could not release"
    );
    let e = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter kept waiting on a full cluster")
        .unwrap()
        .unwrap_err();
    assert!(e.to_string().contains("NOSPACE"), "{e}");
    assert_drained(&store, &name).await;

    cluster.ctl(&["del", "fill", "--prefix"]);
    cluster.compact();
    cluster.ctl(&["defrag"]);
    cluster.ctl(&["alarm", "disarm"]);
    let p = timeout(Duration::from_secs(10), other.acquire())
        .await
        .expect("no grant after the alarm was disarmed")
        .unwrap();
    assert!(p.release().await.unwrap());
}

/// No rate limiter on etcd: a typed `Unsupported` error that says why (no clock readable in
/// a transaction), through the fault-injecting wrapper too; nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_is_unsupported_with_the_reason() {
    let h = Harness::etcd();
    let c = h.client().await;
    let limits = [RateSpec::per_second(5).unwrap()];
    let e = c.store.rate_limiter("api", &limits).unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("no clock"), "{e}");
    let e = c.store.rate_status("api").await.unwrap_err();
    assert!(e.to_string().contains("no clock"), "{e}");
    assert!(c.store.list().await.unwrap().is_empty());
}

/// The holder's process and the cluster's leader are killed at the same moment (3 members,
/// TTL 3 s). A new leader restarts every lease at its full TTL, so the dead holder's permit
/// comes back later than one TTL after the crash: within the documented bound of
/// 2 × TTL + 3 × election timeout (7.5 s here), measured from the kills to the waiter's
/// grant. Fences increase and nobody else holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holder_and_leader_give_the_permit_back_within_the_documented_bound() {
    let mut h = Harness::etcd_with(3);
    let name = unique("leaderttl");
    let ttl = Duration::from_secs(3);
    let mut holder = tessera_testkit::hold::spawn_holder(h.url(), &name, 1, ttl).await;
    let b = h.client().await;
    let fence = status(&b.store, &name).await.unwrap().holders[0].fence;
    let sem = Semaphore::new(&b.store, &name, 1, o(ttl)).unwrap();
    let waiter = tokio::spawn(async move {
        let p = sem.acquire().await;
        (p, Instant::now(), sem)
    });
    wait_queued(&b.store, &name, 1).await;
    let cluster = h.etcd_cluster().unwrap();
    let leader = cluster.leader();
    holder.kill().await.unwrap();
    let killed = Instant::now();
    cluster.kill(leader);
    let election = Duration::from_millis(ELECTION_TIMEOUT_MS);
    let bound = ttl * 2 + election * 3;
    let (p, granted, _sem) = timeout(bound + Duration::from_secs(20), waiter)
        .await
        .expect("the dead holder's permit never came back")
        .unwrap();
    let p = p.unwrap();
    let took = granted - killed;
    eprintln!(
        "leader change: the permit came back {} ms after the holder and the leader were killed \
         (TTL {} ms, election timeout {} ms, bound {} ms)",
        took.as_millis(),
        ttl.as_millis(),
        election.as_millis(),
        bound.as_millis()
    );
    assert!(
        took <= bound,
        "the permit came back after {took:?}, beyond the documented bound {bound:?}"
    );
    assert!(p.fence() > fence);
    let s = status(&b.store, &name).await.unwrap();
    assert_eq!(s.holders.len(), 1);
    assert_eq!(s.holders[0].lease_id, p.lease_id());
    p.release().await.unwrap();
    assert_drained(&b.store, &name).await;
}

/// The bytes etcd has sent to its gRPC clients (its `/metrics`, on the client port).
fn grpc_bytes_sent(cluster: &EtcdCluster) -> u64 {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            &format!("http://127.0.0.1:{}/metrics", cluster.client_port(0)),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "etcd's /metrics did not answer");
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("etcd_network_client_grpc_sent_bytes_total "))
        .expect("etcd_network_client_grpc_sent_bytes_total in /metrics");
    line.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64
}

/// Waiters that nothing can let in (a lock held, nobody leaving) heartbeat without reading
/// the queue: a waiter's place improves only through an event its watch reports, so while
/// its watch is quiet a heartbeat keeps the sessions alive and reads its own record. Before,
/// every heartbeat read every record of the semaphore, so N waiters in one process cost N²
/// records read per heartbeat interval: 100 waiters with a heartbeat a second read about
/// 10,000 records a second. Then the lock is released and every waiter is served in order,
/// woken by its watch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_waiters_heartbeat_without_reading_the_queue() {
    const WAITERS: usize = 100;
    let mut h = Harness::etcd_with(1);
    let name = unique("quiet");
    let c = h.client().await;
    // Waiter TTL 3 s: a heartbeat every second.
    let beats = || {
        SemaphoreOptions::default()
            .ttl(Duration::from_secs(6))
            .waiter_ttl(Duration::from_secs(3))
    };
    let sem = Semaphore::new(&c.store, &name, 1, beats()).unwrap();
    let held = sem.acquire().await.unwrap();
    let served = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let sem = Semaphore::new(&c.store, &name, 1, beats()).unwrap();
        let served = served.clone();
        waiters.push(tokio::spawn(async move {
            let p = sem.acquire().await.unwrap();
            served.lock().unwrap().push(i);
            assert!(p.release().await.unwrap());
        }));
        // In this order: each one queued before the next is sent.
        wait_queued(&c.store, &name, i + 1).await;
    }
    // Every waiter has had its first (full) heartbeat; then five more each.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cluster: &EtcdCluster = h.etcd_cluster().unwrap();
    let before = grpc_bytes_sent(cluster);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let sent = grpc_bytes_sent(cluster) - before;
    // A full read of the queue is over 10 kB here, so full reads would send about
    // 100 × 5 × 10 kB = 5 MB; a heartbeat on its own record, a few hundred bytes.
    let full_read = {
        let b = c.store.backend();
        let before = grpc_bytes_sent(cluster);
        b.heartbeat(
            &Name::new(&name).unwrap(),
            LeaseId::random(),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
        grpc_bytes_sent(cluster) - before
    };
    assert!(
        full_read > 10_000,
        "a full read sent only {full_read} bytes"
    );
    assert!(
        sent < 500 * full_read / 10,
        "{WAITERS} quiet waiters made etcd send {sent} bytes in 5 s (a full read: {full_read})"
    );
    assert_eq!(status(&c.store, &name).await.unwrap().queue.len(), WAITERS);
    held.release().await.unwrap();
    for w in waiters {
        timeout(Duration::from_secs(60), w)
            .await
            .expect("a waiter was not served")
            .unwrap();
    }
    assert_eq!(*served.lock().unwrap(), (0..WAITERS).collect::<Vec<_>>());
    assert_drained(&c.store, &name).await;
}

/// One counter of etcd's `/metrics` (the client port): the sum of every line that starts
/// with `prefix` (all label sets), e.g. `grpc_server_handled_total{grpc_method="Range"`.
fn etcd_metric(cluster: &EtcdCluster, prefix: &str) -> u64 {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            &format!("http://127.0.0.1:{}/metrics", cluster.client_port(0)),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "etcd's /metrics did not answer");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// etcd's unary requests served so far (`grpc_server_handled_total` of unary calls), of
/// `method` only or of all.
fn etcd_unary(cluster: &EtcdCluster, method: Option<&str>) -> u64 {
    let out = std::process::Command::new("curl")
        .args([
            "-sf",
            &format!("http://127.0.0.1:{}/metrics", cluster.client_port(0)),
        ])
        .output()
        .expect("curl");
    assert!(out.status.success(), "etcd's /metrics did not answer");
    let method = method.map(|m| format!("grpc_method=\"{m}\""));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| {
            l.starts_with("grpc_server_handled_total{") && l.contains("grpc_type=\"unary\"")
        })
        .filter(|l| method.as_ref().is_none_or(|m| l.contains(m.as_str())))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as u64)
        .sum()
}

/// [`etcd_unary`] once etcd has served what the watches of the waiters just queued send
/// after their joins returned: the count no longer moves between two reads 500 ms apart
/// (at most 30 s). A count taken too early can only be lower.
async fn etcd_unary_settled(cluster: &EtcdCluster, method: Option<&str>) -> u64 {
    let mut last = etcd_unary(cluster, method);
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = etcd_unary(cluster, method);
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// A join behind other waiters in a long queue (256 records or more) costs etcd two
/// requests: its own transaction (which writes the record and reads the counts, the seats
/// and the tail) and the one read its watch makes once started (the record the tail named
/// still waits, and neither record changed). Before, the join also read the tail's record
/// itself, before its watch: three requests for most joins when many join at once, one of
/// them made while the join held one of the client's joins in flight. 200 joins, 20 at a
/// time, onto a held lock with 300 waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_behind_waiters_costs_two_requests() {
    const JOINS: u64 = 200;
    let mut h = Harness::etcd_with(1);
    let c = h.client().await;
    let name = Name::new(unique("two-requests")).unwrap();
    let sem = Semaphore::new(&c.store, name.as_str(), 1, o(Duration::from_secs(60))).unwrap();
    let held = sem.acquire().await.unwrap();
    let b = c.store.backend().clone();
    let cluster: &EtcdCluster = h.etcd_cluster().unwrap();
    // A long queue first: every join below finds the tail naming a waiter.
    let _ = enqueue(&b, cluster, &name, 300).await;
    let all = etcd_unary_settled(cluster, None).await;
    let ranges = etcd_unary(cluster, Some("Range"));
    let _ = enqueue(&b, cluster, &name, JOINS as usize).await;
    let all = etcd_unary_settled(cluster, None).await - all;
    let ranges = etcd_unary(cluster, Some("Range")) - ranges;
    eprintln!("{JOINS} joins behind waiters: {all} unary requests, {ranges} of them ranges");
    // The holder's keeper may renew (a keep-alive and a read of its record) meanwhile.
    assert!(
        ranges <= 2,
        "{JOINS} joins made {ranges} range reads (the tail's record read by the join)"
    );
    assert!(
        all <= 2 * JOINS + 2,
        "{JOINS} joins behind waiters cost {all} etcd requests, more than 2 each"
    );
    assert_eq!(
        status(&c.store, name.as_str()).await.unwrap().queue.len(),
        JOINS as usize + 300
    );
    drop(held);
}

/// A client that found a queue long sends its next joins without the uncontended grant's
/// compare (which makes etcd read every record); when the queue emptied meanwhile, such an
/// acquire is still granted at once, with its seat and the capacity, and leaves no waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_onto_a_queue_found_long_that_emptied_is_granted() {
    let mut h = Harness::etcd_with(1);
    let c = h.client().await;
    let name = Name::new(unique("long-then-empty")).unwrap();
    let sem = Semaphore::new(&c.store, name.as_str(), 1, o(Duration::from_secs(60))).unwrap();
    let held = sem.acquire().await.unwrap();
    let b = c.store.backend().clone();
    let cluster: &EtcdCluster = h.etcd_cluster().unwrap();
    let _ = enqueue(&b, cluster, &name, 300).await;
    assert!(b.delete(&name).await.unwrap());
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl: Duration::from_secs(60),
        holder: "after".into(),
        wait: Some(WaitSpec {
            waiter_ttl: Duration::from_secs(60),
            queue_cap: 100_000,
        }),
        tenant: None,
        first_send: false,
    };
    let reply = b.acquire(&name, 1, &req).await.unwrap();
    let AcquireReply::Granted(grant) = reply else {
        panic!("an acquire onto an emptied queue answered {reply:?}");
    };
    assert_eq!(grant.lease.seats, vec![0]);
    let s = status(&c.store, name.as_str()).await.unwrap();
    assert_eq!((s.capacity, s.holders.len(), s.queue.len()), (1, 1, 0));
    assert!(b.release(&name, req.lease_id).await.unwrap());
    drop(held);
}

/// What etcd did for one batch of enqueues.
#[derive(Debug, Clone, Copy)]
struct EtcdWork {
    bytes_sent: u64,
    requests: u64,
}

fn etcd_work(cluster: &EtcdCluster) -> EtcdWork {
    EtcdWork {
        bytes_sent: etcd_metric(cluster, "etcd_network_client_grpc_sent_bytes_total "),
        requests: etcd_metric(cluster, "grpc_server_handled_total{"),
    }
}

/// Queues `n` waiters on `name` (full) through the seam, `CONCURRENT` at a time, as one
/// process with thousands of waiters does; returns what etcd did for them.
async fn enqueue(
    b: &std::sync::Arc<dyn Backend>,
    cluster: &EtcdCluster,
    name: &Name,
    n: usize,
) -> EtcdWork {
    const CONCURRENT: usize = 20;
    let before = etcd_work(cluster);
    let mut left = n;
    while left > 0 {
        let k = left.min(CONCURRENT);
        left -= k;
        let replies = futures::future::join_all((0..k).map(|_| {
            let req = AcquireRequest {
                lease_id: LeaseId::random(),
                weight: 1,
                ttl: Duration::from_secs(60),
                holder: "queue".into(),
                wait: Some(WaitSpec {
                    waiter_ttl: Duration::from_secs(60),
                    queue_cap: 100_000,
                }),
                tenant: None,
                first_send: false,
            };
            async move { b.acquire(name, 1, &req).await }
        }))
        .await;
        for r in replies {
            assert!(
                matches!(r, Ok(AcquireReply::Queued { .. })),
                "an enqueue answered {r:?}"
            );
        }
    }
    let after = etcd_work(cluster);
    EtcdWork {
        bytes_sent: after.bytes_sent - before.bytes_sent,
        requests: after.requests - before.requests,
    }
}

/// Joining the queue costs etcd the same whatever the queue's length: no enqueue reads the
/// whole queue, and no waiter that joins wakes the waiters already queued to read it. Before,
/// each enqueue's transaction read every record of the semaphore (O(n) each, O(n²) in all),
/// so the chaos scenario that queues 10,000 waiters from one process (`s10-reclaim`) got 171
/// queued in 90 s. The same number of enqueues is sent onto a queue of 0, then of 400
/// waiters: etcd must not send much more for the second batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_a_long_queue_costs_what_joining_a_short_one_does() {
    const BATCH: usize = 200;
    let mut h = Harness::etcd_with(1);
    let c = h.client().await;
    let name = Name::new(unique("long-queue")).unwrap();
    let sem = Semaphore::new(&c.store, name.as_str(), 1, o(Duration::from_secs(60))).unwrap();
    let held = sem.acquire().await.unwrap();
    let b = c.store.backend().clone();
    let cluster: &EtcdCluster = h.etcd_cluster().unwrap();
    let first = enqueue(&b, cluster, &name, BATCH).await;
    let _ = enqueue(&b, cluster, &name, BATCH).await;
    let third = enqueue(&b, cluster, &name, BATCH).await;
    eprintln!(
        "{BATCH} enqueues onto 0 waiters: {first:?}; onto {}: {third:?}",
        2 * BATCH
    );
    assert!(
        third.bytes_sent < 2 * first.bytes_sent,
        "{BATCH} enqueues onto {} waiters made etcd send {} bytes, onto none {}",
        2 * BATCH,
        third.bytes_sent,
        first.bytes_sent
    );
    assert!(
        third.requests < 2 * first.requests,
        "{BATCH} enqueues onto {} waiters cost {} etcd requests, onto none {}",
        2 * BATCH,
        third.requests,
        first.requests
    );
    assert_eq!(
        status(&c.store, name.as_str()).await.unwrap().queue.len(),
        3 * BATCH
    );
    drop(held);
}

/// Polls `name`'s queue until it holds `n` waiters (at most 240 s: a bound, not a
/// measure).
async fn queued_at_last(store: &Store, name: &str, n: usize) {
    let mut last = None;
    for _ in 0..960 {
        last = status(store, name).await.map(|s| s.queue.len());
        if last == Some(n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{name}: {last:?} waiters queued, never {n}");
}

/// Thousands of waiters in one process share one watch stream: a waiter's arrival and
/// departure create and cancel watchers on it, and never open or reset an HTTP/2 stream.
/// Before, each waiter opened a stream of its own (3,000 here) and reset it when it left;
/// with thousands leaving at once, h2 closed the process's connection to etcd
/// (`too_many_internal_resets`) and every acquire under way failed with a store error
/// (`s10-reclaim` in docs/reliability.md). 3,000 waiters queue behind a held lock; 2,900 of
/// them leave at once (their acquires dropped); the 100 left are then granted one after
/// another, each acquire succeeding; etcd counts the Watch streams it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_waiters_share_one_watch_stream() {
    const WAITERS: usize = 3_000;
    const KEPT_EVERY: usize = 30;
    let mut h = Harness::etcd_with(1);
    let c = h.client().await;
    let cluster: &EtcdCluster = h.etcd_cluster().unwrap();
    let started =
        |c: &EtcdCluster| etcd_metric(c, "grpc_server_started_total{grpc_method=\"Watch\"");
    let streams_before = started(cluster);
    let name = unique("one-stream");
    let o = || {
        SemaphoreOptions::default()
            .ttl(Duration::from_secs(30))
            .waiter_ttl(Duration::from_secs(9))
    };
    let sem = Semaphore::new(&c.store, &name, 1, o()).unwrap();
    let held = sem.acquire().await.unwrap();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut kept = Vec::new();
    let mut leaving = Vec::new();
    for i in 0..WAITERS {
        let sem = Semaphore::new(&c.store, &name, 1, o()).unwrap();
        let served = served.clone();
        let task = tokio::spawn(async move {
            let p = sem.acquire().await.expect("an acquire failed");
            served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            assert!(p.release().await.unwrap());
        });
        if i % KEPT_EVERY == 0 {
            kept.push(task);
        } else {
            leaving.push(task);
        }
    }
    queued_at_last(&c.store, &name, WAITERS).await;
    let streams = etcd_metric(cluster, "etcd_debugging_mvcc_watch_stream_total ");
    let watchers = etcd_metric(cluster, "etcd_debugging_mvcc_watcher_total ");
    eprintln!("{WAITERS} waiters queued: {streams} watch streams, {watchers} watchers");
    assert!(
        streams <= 2,
        "{WAITERS} waiters of one process hold {streams} watch streams open"
    );
    // The 2,900 leave at once: each cancels its watchers and its record.
    for t in &leaving {
        t.abort();
    }
    for t in leaving {
        assert!(t.await.unwrap_err().is_cancelled());
    }
    queued_at_last(&c.store, &name, kept.len()).await;
    held.release().await.unwrap();
    for t in kept {
        t.await.expect("a waiter kept in the queue was not served");
    }
    assert_eq!(
        served.load(std::sync::atomic::Ordering::SeqCst),
        WAITERS / KEPT_EVERY
    );
    assert_drained(&c.store, &name).await;
    // The same client still serves (its connection was not closed under it).
    let p = sem.try_acquire().await.unwrap().expect("the lock is free");
    p.release().await.unwrap();
    let opened = started(cluster) - streams_before;
    eprintln!("Watch streams started during the test: {opened}");
    assert!(
        opened <= 2,
        "{WAITERS} waiters of one process made etcd start {opened} Watch streams"
    );
}
