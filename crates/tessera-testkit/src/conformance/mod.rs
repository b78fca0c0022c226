//! The conformance suite: the contract (docs/contract.md) as tests, written once and run against
//! every store through a [`Harness`](crate::harness::Harness). A store plugs in with
//!
//! ```text
//! tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::sqlite());
//! ```
//!
//! Each test gets its own isolated store from the harness, so tests run in parallel. Tests
//! assert properties (never over-grant, FIFO, no leak), not timings; where the contract
//! names a bound ("within the TTL") the test waits for the bound plus a generous slack.

mod cleanup;
mod lock;
mod rate;
mod semaphore;

pub use cleanup::*;
pub use lock::*;
pub use rate::*;
pub use semaphore::*;

use std::future::Future;
use std::time::Duration;

use tessera::{Permit, Semaphore, SemaphoreOptions, SemaphoreStatus, Store};

/// A name no other test uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// Options with a TTL short enough for tests and long enough for a loaded 2-core machine.
pub fn opts(ttl_ms: u64) -> SemaphoreOptions {
    SemaphoreOptions::default()
        .ttl(Duration::from_millis(ttl_ms))
        .waiter_ttl(Duration::from_secs(2))
}

/// Polls `f` every 10 ms until it is true or `limit` passes; panics with `what` then.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    loop {
        if f().await {
            return;
        }
        if tokio::time::Instant::now() > end {
            panic!("not within {limit:?}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the task `waiter` returned, once it ends within `limit`; panics (failing the test)
/// naming `what` was awaited if it does not, or if the task panicked.
pub async fn joined<T>(waiter: tokio::task::JoinHandle<T>, limit: Duration, what: &str) -> T {
    tokio::time::timeout(limit, waiter)
        .await
        .unwrap_or_else(|_| panic!("not within {limit:?}: {what}"))
        .expect("the awaited task panicked")
}

/// The status of `name`, or an empty one.
pub async fn status(store: &Store, name: &str) -> Option<SemaphoreStatus> {
    store.status(name).await.expect("status")
}

/// Waits until the store holds nothing for `name` (every lease ended, every waiter gone).
pub async fn assert_drained(store: &Store, name: &str) {
    let n = name.to_string();
    // Both views, in one check: the clean-ups run in the background, and a store may show
    // the name in `list` until the step that ends its last lease has removed its row.
    eventually(
        &format!("{name} holds nothing and is not listed"),
        Duration::from_secs(5),
        || {
            let n = n.clone();
            async move {
                status(store, &n).await.is_none() && !store.list().await.unwrap().contains(&n)
            }
        },
    )
    .await;
}

/// Waits until `name` has `n` waiters queued.
pub async fn wait_queued(store: &Store, name: &str, n: usize) {
    let nm = name.to_string();
    eventually(
        &format!("{n} waiters queued on {name}"),
        Duration::from_secs(5),
        || {
            let nm = nm.clone();
            async move { status(store, &nm).await.is_some_and(|s| s.queue.len() == n) }
        },
    )
    .await;
}

/// The order in which `waiters` clients of `h` are served on `name`, which a holder of `admin`
/// holds: each waiter runs `wait` on its own client, one at a time until it is queued (so
/// they reach the store in order 0, 1, …); then `free` lets the holder go. `wait` takes the
/// grant, calls the `served` it is given, and gives the grant back.
pub async fn served_order<F, Fut>(
    h: &crate::harness::Harness,
    admin: &Store,
    name: &str,
    waiters: usize,
    free: impl Future<Output = ()>,
    wait: F,
) -> Vec<usize>
where
    F: Fn(crate::harness::Client, String, Box<dyn FnOnce() + Send>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let order = order.clone();
        let served = Box::new(move || order.lock().unwrap().push(i));
        tasks.push(tokio::spawn(wait(
            h.client().await,
            name.to_string(),
            served,
        )));
        wait_queued(admin, name, i + 1).await;
    }
    free.await;
    for t in tasks {
        t.await.unwrap();
    }
    let order = order.lock().unwrap().clone();
    order
}

/// The one permit of semaphore `name` (options `o`) handed from a holder of store `a` to a
/// waiter of store `b` (which may be `a`): `a` acquires, `b` queues behind it, `a` releases,
/// and `b` must be handed the permit `within`; the holder's release must find its lease.
/// Returns the waiter's permit. Panics (failing the test) otherwise.
pub async fn handed_within(
    a: &Store,
    b: &Store,
    name: &str,
    o: SemaphoreOptions,
    within: Duration,
) -> Permit {
    let sem = Semaphore::new(a, name, 1, o.clone()).unwrap();
    let held = sem.acquire().await.unwrap();
    let waiting = {
        let sem = Semaphore::new(b, name, 1, o).unwrap();
        tokio::spawn(async move { sem.acquire().await })
    };
    wait_queued(a, name, 1).await;
    assert!(held.release().await.unwrap(), "the holder's lease was lost");
    joined(waiting, within, "the waiter was not handed the permit")
        .await
        .unwrap()
}

/// [`handed_within`] 10 s with default options, then the waiter's release must find its
/// lease too.
pub async fn hand_off_between(a: &Store, b: &Store, name: &str) {
    let o = SemaphoreOptions::default();
    let next = handed_within(a, b, name, o, Duration::from_secs(10)).await;
    assert!(next.release().await.unwrap(), "the waiter's lease was lost");
}

/// Two clients of the store at `url` work as an application's would: a permit handed from
/// one to the other ([`hand_off_between`]) and a rate limiter's admission; then both close.
pub async fn serves_two_clients(url: &str) {
    let store = Store::connect(url).await.unwrap();
    let other = Store::connect(url).await.unwrap();
    hand_off_between(&store, &other, "two-clients").await;
    let limiter = store
        .rate_limiter("two-clients", &[tessera::RateSpec::per_second(5).unwrap()])
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap().is_admitted());
    store.close().await.unwrap();
    other.close().await.unwrap();
}

/// Expands to one `#[tokio::test]` per conformance test, each with a fresh harness from
/// `$harness` (an expression evaluated per test). `@whole_seconds $harness` expands only to
/// the tests that hold with TTLs of whole seconds, at least 2 s (for etcd, whose leases are
/// that coarse); the others check expiry bounds at the 100 ms scale.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@whole_seconds $harness);
        $crate::conformance_tests!(@each $harness;
            abandoned_lease_comes_back_within_its_ttl,
            killed_holder_process_gives_its_permit_back_within_ttl,
            keep_alive_holds_a_lease_across_many_ttls,
            lost_fires_before_expiry_when_renewals_fail,
            lost_fires_before_expiry_when_renewals_hang,
            lost_lease_is_not_renewed_again,
            idle_semaphore_takes_the_capacity_of_the_next_client,
            bad_inputs_get_typed_errors_and_change_nothing,
            dead_waiter_leaves_the_queue_within_its_ttl,
            a_dead_waiter_handed_the_permit_frees_it_within_its_waiter_ttl,
            a_handed_off_permit_is_kept_past_its_waiter_ttl,
            lost_fires_before_a_hand_off_grant_expires_when_renewals_fail,
            nothing_is_left_behind_by_a_process_that_exits,
        );
    };
    (@whole_seconds $harness:expr) => {
        $crate::conformance_tests!(@each $harness;
            never_over_grants_under_concurrency_and_cancellation,
            waiters_are_served_in_arrival_order,
            large_acquire_is_not_starved_by_smaller_ones,
            try_acquire_does_not_jump_the_queue,
            lost_fires_on_revoke,
            lost_fires_when_the_semaphore_is_deleted,
            release_renew_and_acquire_retries_are_idempotent,
            dropped_and_timed_out_acquires_leak_nothing,
            grant_racing_with_cancellation_is_given_back,
            racing_ends_of_one_lease_free_its_permit_once,
            capacity_mismatch_is_refused_and_changes_nothing,
            resize_grows_to_the_queue_and_shrinks_without_revoking,
            fences_increase_and_seats_are_distinct,
            fences_never_repeat_after_delete,
            queue_cap_is_enforced,
            waiter_rides_out_a_store_blip_shorter_than_its_ttl,
            acquire_is_retried_through_a_store_blip,
            waiter_is_woken_without_waiting_for_its_heartbeat,
            an_expired_lease_reaches_the_waiter_without_waiting_for_its_heartbeat,
            nothing_is_left_after_all_leases_end,
            ping_answers_and_changes_nothing,
            close_releases_every_held_permit_and_tells_its_holder,
            lock_is_mutually_exclusive,
            semaphore_of_one_is_mutually_exclusive,
            lock_try_and_timeout_answer_without_holding,
            lock_waiters_are_served_in_order,
        );
    };
    (@each $harness:expr; $($test:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                let harness = $harness;
                $crate::conformance::$test(&harness).await;
            }
        )*
    };
}
