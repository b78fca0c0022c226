//! Lock conformance tests; the exclusion test runs against both a [`Lock`] and a semaphore of
//! capacity 1.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tessera::*;

use super::*;
use crate::harness::Harness;

async fn exclusion(h: &Harness, as_lock: bool) {
    let name = unique("excl");
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let client = h.client().await;
        let (name, inside, entries) = (name.clone(), inside.clone(), entries.clone());
        tasks.push(tokio::spawn(async move {
            let lock = Lock::new(&client.store, &name, opts(3_000)).unwrap();
            let sem = Semaphore::new(&client.store, &name, 1, opts(3_000)).unwrap();
            let mut last_fence = 0;
            for _ in 0..8 {
                let g = if as_lock {
                    lock.lock().await
                } else {
                    sem.acquire().await
                }
                .unwrap();
                assert!(
                    !inside.swap(true, Ordering::SeqCst),
                    "two holders inside the lock"
                );
                assert_eq!(g.seats(), &[0]);
                assert!(g.fence() > last_fence);
                last_fence = g.fence();
                entries.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
                inside.store(false, Ordering::SeqCst);
                g.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(entries.load(Ordering::SeqCst), 48);
    assert_drained(&h.client().await.store, &name).await;
}

/// Mutual exclusion through the [`Lock`] API.
pub async fn lock_is_mutually_exclusive(h: &Harness) {
    exclusion(h, true).await
}

/// The same, through a semaphore of capacity 1.
pub async fn semaphore_of_one_is_mutually_exclusive(h: &Harness) {
    exclusion(h, false).await
}

/// `try_lock` and `lock_timeout` answer "no" while the lock is held and hold nothing after.
pub async fn lock_try_and_timeout_answer_without_holding(h: &Harness) {
    let name = unique("locktry");
    let a = h.client().await;
    let b = h.client().await;
    let la = Lock::new(&a.store, &name, opts(3_000)).unwrap();
    let lb = Lock::new(&b.store, &name, opts(3_000)).unwrap();
    let g = la.lock().await.unwrap();
    assert!(lb.try_lock().await.unwrap().is_none());
    assert!(lb
        .lock_timeout(Duration::from_millis(100))
        .await
        .unwrap()
        .is_none());
    let s = lb.status().await.unwrap();
    assert_eq!(s.holders.len(), 1);
    assert_eq!(s.holders[0].lease_id, g.lease_id());
    g.release().await.unwrap();
    let g2 = lb.try_lock().await.unwrap().expect("free lock");
    g2.release().await.unwrap();
    assert_drained(&a.store, &name).await;
}

/// Lock waiters are served in arrival order.
pub async fn lock_waiters_are_served_in_order(h: &Harness) {
    let name = unique("lockfifo");
    let admin = h.client().await;
    let lock = Lock::new(&admin.store, &name, opts(3_000)).unwrap();
    let g = lock.lock().await.unwrap();
    let free = async { drop(g) };
    let order = served_order(
        h,
        &admin.store,
        &name,
        4,
        free,
        |client, n, served| async move {
            let lock = Lock::new(&client.store, &n, opts(3_000)).unwrap();
            let g = lock.lock().await.unwrap();
            served();
            g.release().await.unwrap();
        },
    )
    .await;
    assert_eq!(order, [0, 1, 2, 3]);
}
