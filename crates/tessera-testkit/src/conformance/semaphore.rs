//! Semaphore conformance tests.

use std::collections::HashSet;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use tessera::backend::*;
use tessera::*;
use tokio::time::{timeout, Instant};

use super::*;
use crate::faults::Mode;
use crate::harness::{Harness, Need};

/// Never over-grant: 12 clients with random weights hammer a semaphore of 5, mixing waits,
/// tries, timeouts and dropped futures; every holder checks on entry that the permits held
/// (counted in-process, incremented after the grant and decremented before the release)
/// never exceed the capacity and that no seat is held twice.
pub async fn never_over_grants_under_concurrency_and_cancellation(h: &Harness) {
    const CAP: u32 = 5;
    let name = unique("overgrant");
    let held = Arc::new(AtomicI64::new(0));
    let seats = Arc::new(Mutex::new(HashSet::new()));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for worker in 0..12u64 {
        let client = h.client().await;
        let (name, held, seats, fences) =
            (name.clone(), held.clone(), seats.clone(), fences.clone());
        tasks.push(tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &name, CAP, opts(2_000)).unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(worker);
            let mut grants = 0;
            for _ in 0..20 {
                let w = rng.random_range(1..=3);
                let permit = match rng.random_range(0..10) {
                    0..=5 => Some(sem.acquire_many(w).await.unwrap()),
                    6 | 7 => sem.try_acquire_many(w).await.unwrap(),
                    8 => {
                        let t = Duration::from_millis(rng.random_range(1..20));
                        sem.acquire_many_timeout(w, t).await.unwrap()
                    }
                    _ => {
                        // Drop the future at a random point.
                        let t = Duration::from_millis(rng.random_range(0..10));
                        timeout(t, sem.acquire_many(w))
                            .await
                            .ok()
                            .map(Result::unwrap)
                    }
                };
                let Some(permit) = permit else { continue };
                grants += 1;
                let now_held = held.fetch_add(w as i64, Ordering::SeqCst) + w as i64;
                assert!(
                    now_held <= CAP as i64,
                    "over-grant: {now_held} permits held of {CAP}"
                );
                {
                    let mut s = seats.lock().unwrap();
                    for &seat in permit.seats() {
                        assert!(seat < CAP, "seat {seat} out of range");
                        assert!(s.insert(seat), "seat {seat} held twice");
                    }
                }
                assert_eq!(permit.seats().len(), w as usize);
                fences.lock().unwrap().push(permit.fence());
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..3))).await;
                {
                    let mut s = seats.lock().unwrap();
                    for seat in permit.seats() {
                        s.remove(seat);
                    }
                }
                held.fetch_sub(w as i64, Ordering::SeqCst);
                if rng.random_bool(0.5) {
                    permit.release().await.unwrap();
                } else {
                    drop(permit);
                }
            }
            grants
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert!(
        total > 12,
        "only {total} grants: the test exercised too little"
    );
    let f = fences.lock().unwrap().clone();
    let unique_fences: HashSet<_> = f.iter().collect();
    assert_eq!(unique_fences.len(), f.len(), "a fence was reused");
    assert_drained(&h.client().await.store, &name).await;
}

/// FIFO: waiters that reached the store in order 0..5 are granted in that order.
pub async fn waiters_are_served_in_arrival_order(h: &Harness) {
    let name = unique("fifo");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 1, opts(5_000)).unwrap();
    let first = sem.acquire().await.unwrap();
    let free = async {
        first.release().await.unwrap();
    };
    let order = served_order(
        h,
        &admin.store,
        &name,
        5,
        free,
        |client, n, served| async move {
            let sem = Semaphore::new(&client.store, &n, 1, opts(5_000)).unwrap();
            let p = sem.acquire().await.unwrap();
            served();
            p.release().await.unwrap();
        },
    )
    .await;
    assert_eq!(order, [0, 1, 2, 3, 4]);
    assert_drained(&admin.store, &name).await;
}

/// Weighted head-of-line: a request for all 4 permits at the head is not overtaken by
/// requests for 1 behind it, even while single permits are free.
pub async fn large_acquire_is_not_starved_by_smaller_ones(h: &Harness) {
    let name = unique("hol");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 4, opts(5_000)).unwrap();
    let small: Vec<Permit> = vec![
        sem.acquire().await.unwrap(),
        sem.acquire().await.unwrap(),
        sem.acquire().await.unwrap(),
    ];
    let order = Arc::new(Mutex::new(Vec::new()));
    let spawn = |label: &'static str, w: u32, client: crate::harness::Client| {
        let (name, order) = (name.clone(), order.clone());
        tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &name, 4, opts(5_000)).unwrap();
            let p = sem.acquire_many(w).await.unwrap();
            order.lock().unwrap().push(label);
            tokio::time::sleep(Duration::from_millis(20)).await;
            p.release().await.unwrap();
        })
    };
    let big = spawn("big", 4, h.client().await);
    wait_queued(&admin.store, &name, 1).await;
    let mut smalls = Vec::new();
    for i in 0..3 {
        smalls.push(spawn("small", 1, h.client().await));
        wait_queued(&admin.store, &name, i + 2).await;
    }
    // One permit is free, yet nobody behind the big head may take it.
    let s = status(&admin.store, &name).await.unwrap();
    assert_eq!((s.used, s.available, s.queue.len()), (3, 1, 4));
    let mut small = small.into_iter();
    small.next().unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let s = status(&admin.store, &name).await.unwrap();
    assert_eq!(
        (s.used, s.queue.len()),
        (2, 4),
        "a small request overtook the big head"
    );
    for p in small {
        p.release().await.unwrap();
    }
    big.await.unwrap();
    for t in smalls {
        t.await.unwrap();
    }
    assert_eq!(order.lock().unwrap()[0], "big");
    assert_eq!(order.lock().unwrap().len(), 4);
    assert_drained(&admin.store, &name).await;
}

/// `try_acquire` answers "no" while anyone waits, even if enough permits are free.
pub async fn try_acquire_does_not_jump_the_queue(h: &Harness) {
    let name = unique("try");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 2, opts(5_000)).unwrap();
    let held = sem.acquire().await.unwrap();
    let client = h.client().await;
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let sem = Semaphore::new(&client.store, &n, 2, opts(5_000)).unwrap();
        sem.acquire_many(2).await.unwrap()
    });
    wait_queued(&admin.store, &name, 1).await;
    assert!(sem.try_acquire().await.unwrap().is_none());
    let s = status(&admin.store, &name).await.unwrap();
    assert_eq!(
        (s.used, s.available, s.queue.len()),
        (1, 1, 1),
        "the try changed the store"
    );
    held.release().await.unwrap();
    let p = waiter.await.unwrap();
    assert_eq!(p.seats(), &[0, 1]);
    p.release().await.unwrap();
    assert!(sem.try_acquire().await.unwrap().is_some());
    assert_drained(&admin.store, &name).await;
}

/// A lease nobody renews or releases (its holder froze or crashed) comes back by its TTL.
pub async fn abandoned_lease_comes_back_within_its_ttl(h: &Harness) {
    let name = unique("abandoned");
    let client = h.client().await;
    let backend = client.store.backend();
    let ttl = Duration::from_millis(400);
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 2,
        ttl,
        holder: "frozen".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    let nm = Name::new(&name).unwrap();
    let AcquireReply::Granted(g) = backend.acquire(&nm, 2, &req).await.unwrap() else {
        panic!("not granted")
    };
    let sem = Semaphore::new(&client.store, &name, 2, opts(5_000)).unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    let p = sem
        .acquire_many_timeout(2, ttl + Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the abandoned permit did not come back");
    assert!(
        p.lease().acquired_at >= g.lease.expires_at,
        "granted before the old lease expired"
    );
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// A holder process killed with SIGKILL gives its permit back within its TTL (stores shared
/// across processes only).
pub async fn killed_holder_process_gives_its_permit_back_within_ttl(h: &Harness) {
    if h.skip_unless(Need::MultiProcess) {
        return;
    }
    let name = unique("sigkill");
    let ttl = Duration::from_secs(1);
    let mut child = crate::hold::spawn_holder(h.url(), &name, 1, ttl).await;
    let client = h.client().await;
    let s = status(&client.store, &name).await.expect("the child holds");
    assert_eq!(s.holders.len(), 1);
    child.kill().await.unwrap();
    let sem = Semaphore::new(&client.store, &name, 1, opts(5_000)).unwrap();
    let p = sem
        .acquire_many_timeout(1, ttl + Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the killed holder's permit did not come back");
    assert!(p.lease().acquired_at >= s.holders[0].expires_at);
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// Keep-alive renews a lease across many TTLs; the holder keeps it and `lost()` stays quiet.
pub async fn keep_alive_holds_a_lease_across_many_ttls(h: &Harness) {
    let name = unique("keepalive");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(300)).unwrap();
    let p = sem.acquire().await.unwrap();
    let first_expiry = p.expires_at();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(!p.is_lost());
    assert!(p.expires_at() > first_expiry.plus(Duration::from_millis(900)));
    assert!(p.valid_until() > Instant::now());
    let other = h.client().await;
    let sem2 = Semaphore::new(&other.store, &name, 1, opts(300)).unwrap();
    assert!(sem2.try_acquire().await.unwrap().is_none());
    assert!(
        p.release().await.unwrap(),
        "the lease was not held any more"
    );
    assert_drained(&client.store, &name).await;
}

/// An admin revoke makes the holder's `lost()` fire; the revoked lease is then free.
pub async fn lost_fires_on_revoke(h: &Harness) {
    let name = unique("revoke");
    let holder = h.client().await;
    let sem = Semaphore::new(&holder.store, &name, 1, opts(3_000)).unwrap();
    let p = sem.acquire().await.unwrap();
    let admin = h.client().await;
    assert!(admin
        .store
        .revoke(&name, &p.lease_id().to_string())
        .await
        .unwrap());
    assert!(!admin
        .store
        .revoke(&name, &p.lease_id().to_string())
        .await
        .unwrap());
    let reason = timeout(Duration::from_secs(5), p.lost())
        .await
        .expect("lost() did not fire");
    assert_eq!(reason, LossReason::Gone);
    assert!(p.is_lost());
    assert!(!p.release().await.unwrap());
    assert!(sem.try_acquire().await.unwrap().is_some());
}

async fn renewals_break(h: &Harness, mode: Mode) {
    let name = unique("renewfail");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(900)).unwrap();
    let p = sem.acquire().await.unwrap();
    client.faults.renew(mode);
    lost_in_time(&h.client().await.store, &name, p, Duration::from_secs(5)).await;
}

/// `p`'s `lost()` fires within `within`, for failing renewals, before the lease could have
/// expired.
async fn lost_in_time(store: &Store, name: &str, p: Permit, within: Duration) {
    let reason = timeout(within, p.lost())
        .await
        .expect("lost() did not fire in time");
    let fired = Instant::now();
    assert!(
        matches!(reason, LossReason::RenewalsFailing(_)),
        "{reason:?}"
    );
    assert!(
        fired < p.valid_until(),
        "lost() fired after the lease could have expired"
    );
    // The store still had the lease when lost() fired: nobody else could be in yet.
    let s = status(store, name).await.expect("the lease had expired");
    assert!(s.holders.iter().any(|l| l.lease_id == p.lease_id()));
}

/// When renewals fail, `lost()` fires before the lease could expire.
pub async fn lost_fires_before_expiry_when_renewals_fail(h: &Harness) {
    renewals_break(h, Mode::Fail).await
}

/// When renewals never answer (a black-holed connection), `lost()` fires before the lease
/// could expire.
pub async fn lost_fires_before_expiry_when_renewals_hang(h: &Harness) {
    renewals_break(h, Mode::Hang).await
}

/// Deleting the semaphore makes its holders' `lost()` fire.
pub async fn lost_fires_when_the_semaphore_is_deleted(h: &Harness) {
    let name = unique("deleted");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 2, opts(3_000)).unwrap();
    let p = sem.acquire().await.unwrap();
    assert!(h.client().await.store.delete(&name).await.unwrap());
    let reason = timeout(Duration::from_secs(5), p.lost())
        .await
        .expect("lost() did not fire");
    assert_eq!(reason, LossReason::Gone);
    assert!(!h.client().await.store.delete(&name).await.unwrap());
}

/// After `lost()`, the keep-alive stops for good: when the store comes back it does not
/// renew the lease, which then expires.
pub async fn lost_lease_is_not_renewed_again(h: &Harness) {
    let name = unique("norevive");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(600)).unwrap();
    let p = sem.acquire().await.unwrap();
    client.faults.renew(Mode::Fail);
    timeout(Duration::from_secs(5), p.lost())
        .await
        .expect("lost() did not fire");
    client.faults.renew(Mode::Normal);
    let other = h.client().await;
    let sem2 = Semaphore::new(&other.store, &name, 1, opts(600)).unwrap();
    let q = sem2
        .acquire_many_timeout(1, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the lost lease was renewed after its loss");
    drop(p);
    q.release().await.unwrap();
}

/// Release and renew name the lease; retrying them is harmless; an acquire retried with the
/// same lease id returns the same grant.
pub async fn release_renew_and_acquire_retries_are_idempotent(h: &Harness) {
    let name = Name::new(unique("idem")).unwrap();
    let client = h.client().await;
    let b = client.store.backend();
    let ttl = Duration::from_secs(5);
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl,
        holder: "t".into(),
        wait: Some(WaitSpec {
            waiter_ttl: Duration::from_secs(2),
            queue_cap: 10,
        }),
        tenant: None,
        first_send: false,
    };
    let AcquireReply::Granted(g1) = b.acquire(&name, 3, &req).await.unwrap() else {
        panic!()
    };
    let AcquireReply::Granted(g2) = b.acquire(&name, 3, &req).await.unwrap() else {
        panic!()
    };
    assert_eq!(g1.lease.fence, g2.lease.fence);
    assert_eq!(g1.lease.seats, g2.lease.seats);
    assert_eq!(status(&client.store, name.as_str()).await.unwrap().used, 1);
    assert!(matches!(
        b.renew(&name, req.lease_id, ttl).await.unwrap(),
        RenewReply::Renewed { .. }
    ));
    assert!(matches!(
        b.renew(&name, req.lease_id, ttl).await.unwrap(),
        RenewReply::Renewed { .. }
    ));
    assert!(b.release(&name, req.lease_id).await.unwrap());
    assert!(!b.release(&name, req.lease_id).await.unwrap());
    assert_eq!(
        b.renew(&name, req.lease_id, ttl).await.unwrap(),
        RenewReply::Gone
    );
    assert_eq!(
        b.cancel(&name, req.lease_id).await.unwrap(),
        CancelReply::NotFound
    );
    assert!(!b.release(&name, LeaseId::random()).await.unwrap());
    assert_drained(&client.store, name.as_str()).await;
}

/// Dropped and timed-out acquires leave no holder and no waiter behind.
pub async fn dropped_and_timed_out_acquires_leak_nothing(h: &Harness) {
    let name = unique("cancel");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 2, opts(5_000)).unwrap();
    let held = sem.acquire_many(2).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..16u64 {
        let client = h.client().await;
        let n = name.clone();
        tasks.push(tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &n, 2, opts(5_000)).unwrap();
            let t = Duration::from_millis(5 + (i * 7) % 40);
            if i % 2 == 0 {
                sem.acquire_many_timeout(1 + (i % 2) as u32, t)
                    .await
                    .unwrap()
                    .is_some()
            } else {
                timeout(t, sem.acquire()).await.is_ok()
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    held.release().await.unwrap();
    for t in tasks {
        let _granted = t.await.unwrap();
    }
    assert_drained(&admin.store, &name).await;
}

/// A grant that lands while the acquire is being cancelled is given back, not leaked.
pub async fn grant_racing_with_cancellation_is_given_back(h: &Harness) {
    let name = unique("race");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 1, opts(5_000)).unwrap();
    for round in 0..15u64 {
        let held = sem.acquire().await.unwrap();
        let client = h.client().await;
        let n = name.clone();
        let waiter = tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &n, 1, opts(5_000)).unwrap();
            let p = sem.acquire().await.unwrap();
            std::future::pending::<()>().await;
            drop(p);
        });
        wait_queued(&admin.store, &name, 1).await;
        // Release and abort at nearly the same time, in varying order.
        if round % 2 == 0 {
            held.release().await.unwrap();
            tokio::time::sleep(Duration::from_micros(round * 150)).await;
            waiter.abort();
        } else {
            waiter.abort();
            held.release().await.unwrap();
        }
        assert_drained(&admin.store, &name).await;
    }
}

/// Two operations that end the same lease at once (its release and a revoke, or the same
/// release sent twice, from two clients) free its permit once: afterwards the semaphore
/// counts only the other holder, and exactly one more permit can be taken. A step that read
/// the lease as held from before the other operation committed would free it twice, and the
/// next two acquires would both be granted beside the other holder.
pub async fn racing_ends_of_one_lease_free_its_permit_once(h: &Harness) {
    let name = Name::new(unique("ends")).unwrap();
    let first = h.client().await;
    let second = h.client().await;
    let sem = Semaphore::new(&first.store, name.as_str(), 2, opts(5_000)).unwrap();
    let other = sem.acquire().await.unwrap();
    let ttl = Duration::from_secs(5);
    for round in 0..48u64 {
        let lease = LeaseId::random();
        let req = AcquireRequest {
            lease_id: lease,
            weight: 1,
            ttl,
            holder: "raced".into(),
            wait: None,
            tenant: None,
            first_send: false,
        };
        let granted = first.store.backend().acquire(&name, 2, &req).await.unwrap();
        assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
        // Either end may start first, by 0 to 1.5 ms.
        let pause = Duration::from_micros((round / 4 % 6) * 300);
        let (release_pause, other_pause) = if round / 2 % 2 == 0 {
            (Duration::ZERO, pause)
        } else {
            (pause, Duration::ZERO)
        };
        let release = async {
            tokio::time::sleep(release_pause).await;
            first.store.backend().release(&name, lease).await.unwrap()
        };
        let other_end = async {
            tokio::time::sleep(other_pause).await;
            if round % 2 == 0 {
                second
                    .store
                    .revoke(name.as_str(), &lease.to_string())
                    .await
                    .unwrap()
            } else {
                second.store.backend().release(&name, lease).await.unwrap()
            }
        };
        let ended = tokio::join!(release, other_end);
        assert!(
            ended.0 != ended.1,
            "round {round}: exactly one end finds the lease held: {ended:?}"
        );
        let s = status(&first.store, name.as_str()).await.unwrap();
        assert_eq!(
            (s.used, s.holders.len()),
            (1, 1),
            "round {round}: after both ends: {s:?}"
        );
        let one = sem.try_acquire().await.unwrap().expect("a permit is free");
        assert!(
            sem.try_acquire().await.unwrap().is_none(),
            "round {round}: a third permit of two was granted"
        );
        one.release().await.unwrap();
    }
    other.release().await.unwrap();
    assert_drained(&first.store, name.as_str()).await;
}

/// A client that declares another capacity than the stored one gets a clear error; nothing
/// changes.
pub async fn capacity_mismatch_is_refused_and_changes_nothing(h: &Harness) {
    let name = unique("mismatch");
    let client = h.client().await;
    let two = Semaphore::new(&client.store, &name, 2, opts(5_000)).unwrap();
    let p = two.acquire().await.unwrap();
    let three = Semaphore::new(&client.store, &name, 3, opts(5_000)).unwrap();
    let before = status(&client.store, &name).await.unwrap();
    for r in [
        three.try_acquire().await.map(|_| ()),
        three.acquire().await.map(|_| ()),
    ] {
        let e = r.unwrap_err();
        assert!(e.is_capacity_mismatch(), "{e}");
        assert!(e.to_string().contains("resize"), "{e}");
    }
    let after = status(&client.store, &name).await.unwrap();
    assert_eq!(
        (before.capacity, before.used, before.holders),
        (after.capacity, after.used, after.holders)
    );
    assert!(after.queue.is_empty());
    p.release().await.unwrap();
}

/// Growing hands the new permits to the queue at once; shrinking never revokes and holds
/// grants back until the holders fit.
pub async fn resize_grows_to_the_queue_and_shrinks_without_revoking(h: &Harness) {
    let name = unique("resize");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 2, opts(5_000)).unwrap();
    let a = sem.acquire_many(2).await.unwrap();
    let client = h.client().await;
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let sem = Semaphore::new(&client.store, &n, 2, opts(5_000)).unwrap();
        sem.acquire().await.unwrap()
    });
    wait_queued(&admin.store, &name, 1).await;
    assert_eq!(admin.store.resize(&name, 3).await.unwrap(), 2);
    let b = joined(
        waiter,
        Duration::from_secs(5),
        "growing did not serve the queue",
    )
    .await;
    assert_eq!(b.seats(), &[2]);
    // Shrink to 1 while 3 are held: nobody is revoked.
    assert_eq!(sem.resize(1).await.unwrap(), 3);
    assert_eq!(sem.capacity(), 1);
    let s = status(&admin.store, &name).await.unwrap();
    assert_eq!(
        (s.capacity, s.used, s.available, s.holders.len()),
        (1, 3, 0, 2)
    );
    assert!(!a.is_lost() && !b.is_lost());
    assert!(sem.try_acquire().await.unwrap().is_none());
    let e = admin.store.resize(&name, 0).await.unwrap_err();
    assert!(e.is_invalid_input());
    assert!(admin
        .store
        .resize(&unique("nosuch"), 2)
        .await
        .unwrap_err()
        .is_not_found());
    drop(b);
    a.release().await.unwrap();
    let p = sem
        .acquire_many_timeout(1, Duration::from_secs(5))
        .await
        .unwrap()
        .expect("after shrink");
    assert_eq!(p.seats(), &[0]);
    p.release().await.unwrap();
    assert_drained(&admin.store, &name).await;
}

/// Every impossible request gets a typed error at once and the store stays untouched.
pub async fn bad_inputs_get_typed_errors_and_change_nothing(h: &Harness) {
    let client = h.client().await;
    let store = &client.store;
    let before = store.list().await.unwrap();
    let invalid = |r: Result<()>| {
        let e = r.expect_err("accepted a bad input");
        assert!(e.is_invalid_input(), "not typed as invalid input: {e:?}");
    };
    let sem =
        |name: &str, cap: u32, o: SemaphoreOptions| Semaphore::new(store, name, cap, o).map(|_| ());
    invalid(sem("ok", 0, opts(1000)));
    invalid(sem("ok", MAX_CAPACITY + 1, opts(1000)));
    invalid(sem("", 1, opts(1000)));
    invalid(sem(&"n".repeat(129), 1, opts(1000)));
    for bad in ["a b", "-a", "a{b}", "a\nb", "ä", "a*b", "../x"] {
        invalid(sem(bad, 1, opts(1000)));
    }
    invalid(sem("ok", 1, opts(10)));
    invalid(sem(
        "ok",
        1,
        SemaphoreOptions::default().ttl(Duration::from_secs(48 * 3600)),
    ));
    invalid(sem(
        "ok",
        1,
        opts(1000).keep_alive(Duration::from_millis(600)),
    ));
    invalid(sem("ok", 1, opts(1000).queue_cap(0)));
    invalid(sem("ok", 1, opts(1000).holder("a\nb")));
    invalid(sem("ok", 1, opts(1000).holder("x".repeat(300))));
    invalid(sem("ok", 1, opts(1000).waiter_ttl(Duration::ZERO)));
    let name = unique("bad");
    let s = Semaphore::new(store, &name, 2, opts(1000)).unwrap();
    invalid(s.acquire_many(0).await.map(|_| ()));
    invalid(s.acquire_many(3).await.map(|_| ()));
    invalid(s.try_acquire_many(0).await.map(|_| ()));
    invalid(s.try_acquire_many(3).await.map(|_| ()));
    invalid(
        s.acquire_many_timeout(3, Duration::from_millis(1))
            .await
            .map(|_| ()),
    );
    invalid(store.revoke(&name, "not-a-lease").await.map(|_| ()));
    invalid(
        store
            .revoke("a b", &LeaseId::random().to_string())
            .await
            .map(|_| ()),
    );
    invalid(store.resize(&name, 0).await.map(|_| ()));
    invalid(store.status("").await.map(|_| ()));
    invalid(store.delete("a{b}").await.map(|_| ()));
    for url in [
        "",
        "nonsense",
        "sqlite:",
        "memory://bad name",
        "ftp://x",
        "redis+unknown://h",
    ] {
        let e = Store::connect(url).await.expect_err(url);
        assert!(e.is_invalid_input(), "{url}: {e:?}");
    }
    let e = Store::connect("nosuch://user:hunter2@host")
        .await
        .unwrap_err();
    assert!(!e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"));
    assert_eq!(
        store.list().await.unwrap(),
        before,
        "a refused request changed the store"
    );
    assert!(status(store, &name).await.is_none());
}

/// Fences strictly increase in grant order; seats are distinct, in `0..C`, `weight` of them.
pub async fn fences_increase_and_seats_are_distinct(h: &Harness) {
    let name = unique("fence");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 5, opts(5_000)).unwrap();
    let mut last = 0;
    for _ in 0..20 {
        let p = sem.acquire_many(2).await.unwrap();
        assert!(p.fence() > last, "fence {} after {last}", p.fence());
        last = p.fence();
        p.release().await.unwrap();
    }
    let a = sem.acquire_many(3).await.unwrap();
    let b = sem.acquire_many(2).await.unwrap();
    assert_eq!(a.seats(), &[0, 1, 2]);
    assert_eq!(b.seats(), &[3, 4]);
    assert!(b.fence() > a.fence());
    drop(a);
    let b_fence = b.fence();
    let c = sem.acquire_many(3).await.unwrap();
    assert_eq!(c.seats(), &[0, 1, 2], "the lowest free seats are reused");
    assert!(c.fence() > b_fence);
    drop((b, c));
    assert_drained(&client.store, &name).await;
}

/// Fences keep increasing after the semaphore is deleted and created again.
pub async fn fences_never_repeat_after_delete(h: &Harness) {
    let name = unique("fencedel");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(5_000)).unwrap();
    let p = sem.acquire().await.unwrap();
    let old = p.fence();
    assert!(client.store.delete(&name).await.unwrap());
    let q = sem.acquire().await.unwrap();
    assert!(q.fence() > old);
    let newer = q.fence();
    q.release().await.unwrap();
    assert_drained(&client.store, &name).await;
    let r = sem.acquire().await.unwrap();
    assert!(r.fence() > newer);
    drop(p);
}

/// A full queue refuses newcomers with a typed error and changes nothing.
pub async fn queue_cap_is_enforced(h: &Harness) {
    let name = unique("qcap");
    let admin = h.client().await;
    let o = || opts(5_000).queue_cap(2);
    let sem = Semaphore::new(&admin.store, &name, 1, o()).unwrap();
    let held = sem.acquire().await.unwrap();
    let mut waiters = Vec::new();
    for i in 0..2 {
        let client = h.client().await;
        let n = name.clone();
        waiters.push(tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &n, 1, o()).unwrap();
            sem.acquire().await.unwrap().release().await.unwrap();
        }));
        wait_queued(&admin.store, &name, i + 1).await;
    }
    let e = sem.acquire().await.unwrap_err();
    assert!(e.is_queue_full(), "{e}");
    assert_eq!(status(&admin.store, &name).await.unwrap().queue.len(), 2);
    held.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_drained(&admin.store, &name).await;
}

/// Queues a waiter on `name` (a lock, held by someone else) that never heartbeats, as one
/// that died right after it was queued; returns its lease id.
async fn queue_dead_waiter(
    store: &Store,
    name: &Name,
    ttl: Duration,
    waiter_ttl: Duration,
) -> LeaseId {
    let dead = LeaseId::random();
    let req = AcquireRequest {
        lease_id: dead,
        weight: 1,
        ttl,
        holder: "dead".into(),
        wait: Some(WaitSpec {
            waiter_ttl,
            queue_cap: 10,
        }),
        tenant: None,
        first_send: false,
    };
    let r = store.backend().acquire(name, 1, &req).await.unwrap();
    assert_eq!(r, AcquireReply::Queued { position: 0 });
    dead
}

/// A waiter that stops heartbeating (it died) leaves the queue within its waiter TTL, and
/// the permit goes to the next live waiter.
pub async fn dead_waiter_leaves_the_queue_within_its_ttl(h: &Harness) {
    let name = unique("deadwaiter");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(5_000)).unwrap();
    let held = sem.acquire().await.unwrap();
    let nm = Name::new(&name).unwrap();
    let dead = queue_dead_waiter(
        &client.store,
        &nm,
        Duration::from_secs(5),
        Duration::from_millis(300),
    )
    .await;
    let other = h.client().await;
    let n = name.clone();
    let live = tokio::spawn(async move {
        let sem = Semaphore::new(&other.store, &n, 1, opts(5_000)).unwrap();
        sem.acquire().await.unwrap()
    });
    wait_queued(&client.store, &name, 2).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    held.release().await.unwrap();
    let p = timeout(Duration::from_secs(5), live)
        .await
        .expect("the live waiter was not served")
        .unwrap();
    let b = client.store.backend();
    assert_eq!(
        b.heartbeat(&nm, dead, Duration::from_secs(1))
            .await
            .unwrap(),
        WaitReply::Gone
    );
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// A waiter that died in the queue and is then handed the permit holds it only until its
/// queue entry would have expired, not for its lease TTL: the hand-off grant is provisional
/// until renewed, so the next waiter is served within the dead one's waiter TTL.
pub async fn a_dead_waiter_handed_the_permit_frees_it_within_its_waiter_ttl(h: &Harness) {
    let name = unique("deadhandoff");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(5_000)).unwrap();
    let held = sem.acquire().await.unwrap();
    let nm = Name::new(&name).unwrap();
    let waiter_ttl = Duration::from_secs(3);
    let dead = queue_dead_waiter(&client.store, &nm, Duration::from_secs(120), waiter_ttl).await;
    let b = client.store.backend();
    // Its heartbeats stop here. The release hands it the permit while its entry still lives.
    assert!(held.release().await.unwrap());
    let st = status(&client.store, &name)
        .await
        .expect("the semaphore is empty: the dead waiter was not handed the permit");
    let lease = st
        .holders
        .iter()
        .find(|l| l.lease_id == dead)
        .expect("the dead waiter was not handed the permit");
    assert!(
        lease.expires_at <= lease.acquired_at.plus(waiter_ttl),
        "a hand-off grant runs past its waiter's entry: acquired {}, expires {}",
        lease.acquired_at,
        lease.expires_at
    );
    // The next waiter is served once the entry's time is up, long before the lease TTL.
    let other = h.client().await;
    let next = Semaphore::new(&other.store, &name, 1, opts(5_000)).unwrap();
    let p = timeout(waiter_ttl * 5, next.acquire())
        .await
        .expect("the permit stayed with the dead waiter past its waiter TTL")
        .unwrap();
    assert_eq!(
        b.heartbeat(&nm, dead, waiter_ttl).await.unwrap(),
        WaitReply::Gone
    );
    assert!(p.release().await.unwrap());
    assert_drained(&client.store, &name).await;
}

/// Client `a` holds the one permit of `name` and releases it to client `b`, which waited
/// for it; returns `b`'s permit (handed off while `b` waited) and `b`.
pub async fn handed_off(
    a: &crate::harness::Client,
    b: crate::harness::Client,
    name: &str,
    o: impl Fn() -> SemaphoreOptions + Send + 'static,
) -> (Permit, crate::harness::Client) {
    let sem = Semaphore::new(&a.store, name, 1, o()).unwrap();
    let held = sem.acquire().await.unwrap();
    let n = name.to_string();
    let waiting = tokio::spawn(async move {
        let sem = Semaphore::new(&b.store, &n, 1, o()).unwrap();
        (sem.acquire().await.unwrap(), b)
    });
    wait_queued(&a.store, name, 1).await;
    assert!(held.release().await.unwrap());
    joined(
        waiting,
        Duration::from_secs(10),
        "the waiter was not handed the permit",
    )
    .await
}

/// A live waiter handed the permit keeps it past the provisional expiry of its grant: its
/// keeper renews the lease before half of it is gone, into a lease of the full TTL.
pub async fn a_handed_off_permit_is_kept_past_its_waiter_ttl(h: &Harness) {
    let name = unique("provisional");
    let (a, b) = (h.client().await, h.client().await);
    let waiter_ttl = Duration::from_secs(2);
    let ttl = Duration::from_secs(30);
    let o = move || SemaphoreOptions::default().ttl(ttl).waiter_ttl(waiter_ttl);
    let (p, _b) = handed_off(&a, b, &name, o).await;
    // The lease as granted (the keeper may have renewed it since).
    let (acquired, granted_until) = (p.lease().acquired_at, p.lease().expires_at);
    assert!(
        granted_until <= acquired.plus(waiter_ttl),
        "the hand-off grant is not provisional: acquired {acquired}, expires {granted_until}"
    );
    // Held across two waiter TTLs: renewed before its provisional expiry, then kept.
    tokio::time::sleep(waiter_ttl * 2).await;
    assert!(!p.is_lost(), "lost: {:?}", p.lost().await);
    let st = status(&a.store, &name).await.expect("the lease expired");
    let lease = st
        .holders
        .iter()
        .find(|l| l.lease_id == p.lease_id())
        .expect("the handed-off lease expired");
    assert!(
        lease.expires_at >= acquired.plus(ttl / 2),
        "not renewed to the full TTL: acquired {acquired}, expires {}",
        lease.expires_at
    );
    assert!(p.valid_until() > Instant::now() + ttl / 2);
    assert!(p.release().await.unwrap(), "the handed-off lease was lost");
    assert_drained(&a.store, &name).await;
}

/// A hand-off grant whose renewals fail: `lost()` fires before its provisional expiry, while
/// the store still has the lease, long before the lease TTL.
pub async fn lost_fires_before_a_hand_off_grant_expires_when_renewals_fail(h: &Harness) {
    let name = unique("provisional-lost");
    let (a, b) = (h.client().await, h.client().await);
    let waiter_ttl = Duration::from_secs(2);
    let o = move || {
        SemaphoreOptions::default()
            .ttl(Duration::from_secs(30))
            .waiter_ttl(waiter_ttl)
    };
    b.faults.renew(Mode::Fail);
    let (p, _b) = handed_off(&a, b, &name, o).await;
    lost_in_time(&a.store, &name, p, waiter_ttl * 2).await;
}

/// A release wakes the waiter at once; it does not sit until its next heartbeat (7.5 s with
/// these options).
pub async fn waiter_is_woken_without_waiting_for_its_heartbeat(h: &Harness) {
    let name = unique("push");
    let admin = h.client().await;
    let o = || {
        SemaphoreOptions::default()
            .ttl(Duration::from_secs(30))
            .waiter_ttl(Duration::from_secs(30))
    };
    let sem = Semaphore::new(&admin.store, &name, 1, o()).unwrap();
    for _ in 0..3 {
        let held = sem.acquire().await.unwrap();
        let client = h.client().await;
        let n = name.clone();
        let waiter = tokio::spawn(async move {
            let sem = Semaphore::new(&client.store, &n, 1, o()).unwrap();
            sem.acquire().await.unwrap()
        });
        wait_queued(&admin.store, &name, 1).await;
        // Give the waiter time to settle into its (long) heartbeat sleep.
        tokio::time::sleep(Duration::from_millis(200)).await;
        held.release().await.unwrap();
        let p = joined(
            waiter,
            Duration::from_secs(3),
            "the waiter was not woken by the release",
        )
        .await;
        p.release().await.unwrap();
    }
    assert_drained(&admin.store, &name).await;
}

/// A permit freed by a lease that expired (its holder died) reaches the waiter at the
/// expiry: the waiter does not sit until its next heartbeat (7.5 s with these options), which
/// on a store that purges expiries only in steps used to be the only step after the expiry.
pub async fn an_expired_lease_reaches_the_waiter_without_waiting_for_its_heartbeat(h: &Harness) {
    let name = unique("expiry");
    let client = h.client().await;
    let ttl = Duration::from_secs(2);
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl,
        holder: "dead".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    let nm = Name::new(&name).unwrap();
    let AcquireReply::Granted(g) = client.store.backend().acquire(&nm, 1, &req).await.unwrap()
    else {
        panic!("not granted")
    };
    let o = SemaphoreOptions::default()
        .ttl(Duration::from_secs(30))
        .waiter_ttl(Duration::from_secs(30));
    let sem = Semaphore::new(&client.store, &name, 1, o).unwrap();
    let p = sem
        .acquire_many_timeout(1, ttl + Duration::from_secs(3))
        .await
        .unwrap()
        .expect("the expired lease's permit did not reach the waiter before its heartbeat");
    assert!(p.lease().acquired_at >= g.lease.expires_at);
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// After every lease has ended and every waiter left, the store holds nothing for the name.
pub async fn nothing_is_left_after_all_leases_end(h: &Harness) {
    let name = unique("empty");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 3, opts(5_000)).unwrap();
    let a = sem.acquire_many(3).await.unwrap();
    let timed_out = sem
        .acquire_many_timeout(1, Duration::from_millis(50))
        .await
        .unwrap();
    assert!(timed_out.is_none());
    let b = sem.try_acquire().await.unwrap();
    assert!(b.is_none());
    assert!(client.store.list().await.unwrap().contains(&name));
    a.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// `Store::ping` answers on a healthy store and changes nothing: the holders and the queue
/// read the same before and after many pings, and no name appears. Cut off from the store
/// (the harness's faults), it fails or does not answer.
pub async fn ping_answers_and_changes_nothing(h: &Harness) {
    let name = unique("ping");
    // The holder and the waiter on a client of their own: the faults below are the pinging
    // client's only (a waiter's heartbeat caught by `Hang` would never come back).
    let admin = h.client().await;
    let client = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 1, opts(10_000)).unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = {
        let sem = Semaphore::new(&admin.store, &name, 1, opts(10_000)).unwrap();
        tokio::spawn(async move { sem.acquire().await })
    };
    wait_queued(&client.store, &name, 1).await;
    let before = status(&client.store, &name).await.unwrap();
    let listed = client.store.list().await.unwrap();
    for _ in 0..20 {
        client.store.ping().await.unwrap();
    }
    let after = status(&client.store, &name).await.unwrap();
    // Lease, fence and seats (the keep-alive may have moved the expiry meanwhile).
    let holders = |s: &SemaphoreStatus| {
        s.holders
            .iter()
            .map(|l| (l.lease_id, l.fence, l.seats.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(holders(&after), holders(&before));
    assert_eq!(
        after.queue.iter().map(|w| w.lease_id).collect::<Vec<_>>(),
        before.queue.iter().map(|w| w.lease_id).collect::<Vec<_>>()
    );
    assert_eq!(client.store.list().await.unwrap(), listed);

    client.faults.all(Mode::Fail);
    let e = client.store.ping().await.unwrap_err();
    assert!(e.is_connection(), "{e}");
    client.faults.all(Mode::Hang);
    let hung = tokio::time::timeout(Duration::from_millis(200), client.store.ping()).await;
    assert!(hung.is_err(), "a black-holed store does not answer a ping");
    client.faults.all(Mode::Normal);
    client.store.ping().await.unwrap();

    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    next.release().await.unwrap();
    assert_drained(&admin.store, &name).await;
}

/// A waiter whose store calls fail for less than its waiter TTL keeps its place and is
/// served; one whose calls keep failing past it gets the error (and holds nothing).
pub async fn waiter_rides_out_a_store_blip_shorter_than_its_ttl(h: &Harness) {
    let name = unique("blip");
    let admin = h.client().await;
    let sem = Semaphore::new(&admin.store, &name, 1, opts(5_000)).unwrap();
    let held = sem.acquire().await.unwrap();
    let client = h.client().await;
    let faults = Arc::clone(&client.faults);
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let sem = Semaphore::new(&client.store, &n, 1, opts(5_000)).unwrap();
        sem.acquire().await
    });
    wait_queued(&admin.store, &name, 1).await;
    faults.all(Mode::Fail);
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    faults.all(Mode::Normal);
    let p = joined(
        waiter,
        Duration::from_secs(5),
        "the waiter was not served after the blip",
    )
    .await
    .expect("the blip ended the wait");
    p.release().await.unwrap();

    // A fault longer than the waiter TTL (2 s in these options) ends the wait with the error.
    let held = sem.acquire().await.unwrap();
    let client = h.client().await;
    let faults = Arc::clone(&client.faults);
    let n = name.clone();
    let waiter = tokio::spawn(async move {
        let sem = Semaphore::new(&client.store, &n, 1, opts(5_000)).unwrap();
        sem.acquire().await.map(|p| p.fence())
    });
    wait_queued(&admin.store, &name, 1).await;
    faults.all(Mode::Fail);
    let e = joined(
        waiter,
        Duration::from_secs(10),
        "a lasting fault did not end the wait",
    )
    .await
    .unwrap_err();
    assert!(e.is_connection(), "{e}");
    held.release().await.unwrap();
    assert_drained(&admin.store, &name).await;
}

/// Once every lease of a semaphore has expired, it is idle as if it did not exist: a client
/// declaring another capacity is served with it instead of getting a mismatch.
pub async fn idle_semaphore_takes_the_capacity_of_the_next_client(h: &Harness) {
    let name = unique("idlecap");
    let client = h.client().await;
    let nm = Name::new(&name).unwrap();
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl: Duration::from_millis(200),
        holder: "gone".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    let r = client.store.backend().acquire(&nm, 2, &req).await.unwrap();
    assert!(matches!(r, AcquireReply::Granted(_)));
    // While the lease lives, another capacity is refused.
    let three = Semaphore::new(&client.store, &name, 3, opts(5_000)).unwrap();
    assert!(three
        .try_acquire()
        .await
        .unwrap_err()
        .is_capacity_mismatch());
    tokio::time::sleep(Duration::from_millis(400)).await;
    let p = three
        .try_acquire()
        .await
        .unwrap()
        .expect("the idle semaphore refused");
    let s = status(&client.store, &name).await.unwrap();
    assert_eq!((s.capacity, s.used), (3, 1));
    p.release().await.unwrap();
    assert_drained(&client.store, &name).await;
}

/// An acquire whose first request fails with a transient fault (the connection dropped) is
/// retried under the same lease id and served once the store answers; a fault that lasts past
/// the waiter TTL ends it with the error, holding nothing.
pub async fn acquire_is_retried_through_a_store_blip(h: &Harness) {
    let name = unique("acqblip");
    let admin = h.client().await;
    let client = h.client().await;
    let faults = Arc::clone(&client.faults);
    faults.all(Mode::Fail);
    let n = name.clone();
    let store = client.store.clone();
    let waiter = tokio::spawn(async move {
        let sem = Semaphore::new(&store, &n, 1, opts(5_000)).unwrap();
        sem.acquire().await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        status(&admin.store, &name).await.is_none(),
        "a failing client reached the store"
    );
    faults.all(Mode::Normal);
    let p = joined(
        waiter,
        Duration::from_secs(5),
        "the acquire was not retried after the blip",
    )
    .await
    .expect("the blip ended the acquire");
    assert_eq!(status(&admin.store, &name).await.unwrap().holders.len(), 1);
    p.release().await.unwrap();

    // A fault longer than the waiter TTL (2 s in these options): the error, nothing held.
    faults.all(Mode::Fail);
    let sem = Semaphore::new(&client.store, &name, 1, opts(5_000)).unwrap();
    let e = timeout(Duration::from_secs(10), sem.acquire())
        .await
        .expect("a lasting fault did not end the acquire")
        .unwrap_err();
    assert!(e.is_connection(), "{e}");
    faults.all(Mode::Normal);
    assert_drained(&admin.store, &name).await;
}
