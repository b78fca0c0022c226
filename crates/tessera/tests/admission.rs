//! Admission — permits and rate windows taken in one atomic step — on the stores that have
//! it: the memory store (the reference model, also on a clock the test moves), SQLite,
//! Redis, a Redis Cluster, MariaDB and PostgreSQL (`docs/admission.md`): all or nothing,
//! strict FIFO with plain waiters, the head told when
//! its windows admit it, a cancelled wait charging nothing, give-back, and the guarantee
//! where the user observes it: at the moment each call starts. A store without admission
//! answers `Error::Unsupported` (the server stores' tests).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera::backend::stores::MemoryBackend;
use tessera::backend::{Clock, GiveBack, ManualClock, Name};
use tessera::{Error, LeaseId, RateOptions, Semaphore, SemaphoreOptions, Store, StoreTime};
use tessera_testkit::servers::mysql::MariaDbServer;
use tessera_testkit::servers::postgres::PostgresServer;
use tessera_testkit::servers::redis::RedisServer;
use tessera_testkit::servers::redis_cluster::RedisCluster;

/// A private memory store on a clock the test moves.
fn manual_store() -> (Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(StoreTime(1_000_000_000_000)));
    let backend = MemoryBackend::with_clock(clock.clone());
    (Store::from_backend(Arc::new(backend), "memory://"), clock)
}

/// What a store of [`stores`] needs kept alive while it is used: its file's directory, or
/// its throwaway server.
type Keep = Option<Box<dyn std::any::Any + Send>>;

/// The stores with admission, each private to the test: memory, SQLite in a file of its
/// own, a throwaway Redis, a throwaway Redis Cluster (three primaries; a semaphore and the
/// limiter of its name share one slot), a throwaway MariaDB and a throwaway PostgreSQL.
async fn stores(test: &str) -> Vec<(Store, Keep)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}/admission.db", dir.path().display());
    let redis = RedisServer::start();
    // On this thread, which lives as long as the test: mariadbd dies with the thread that
    // started it (see `MariaDbServer::start`), and a blocking-pool thread exits when idle.
    let cluster = RedisCluster::start(false);
    let mariadb = MariaDbServer::start();
    let postgres = PostgresServer::start();
    vec![
        (
            Store::connect(&format!("memory://admission-{test}-{}", std::process::id()))
                .await
                .unwrap(),
            None,
        ),
        (Store::connect(&sqlite).await.unwrap(), Some(Box::new(dir))),
        (
            Store::connect(&redis.url()).await.unwrap(),
            Some(Box::new(redis)),
        ),
        (
            Store::connect(&cluster.url()).await.unwrap(),
            Some(Box::new(cluster)),
        ),
        (
            Store::connect(&mariadb.url(test)).await.unwrap(),
            Some(Box::new(mariadb)),
        ),
        (
            Store::connect(&postgres.url_with_schema(test))
                .await
                .unwrap(),
            Some(Box::new(postgres)),
        ),
    ]
}

async fn rate_used(store: &Store, name: &str) -> u64 {
    match store.rate_status(name).await.unwrap() {
        Some(s) => s.limits.iter().map(|l| l.used + l.reserved).max().unwrap(),
        None => 0,
    }
}

async fn held(store: &Store, name: &str) -> u32 {
    store.status(name).await.unwrap().map_or(0, |s| s.used)
}

#[tokio::test]
async fn a_refusal_for_permits_or_for_windows_charges_nothing_and_holds_nothing() {
    let (store, clock) = manual_store();
    let opts = RateOptions::default().margin(Duration::ZERO);
    let adm = store
        .admission("api")
        .permits(2)
        .rate_options(opts)
        .rate("3/s".parse().unwrap())
        .unwrap();

    let a = adm.try_acquire().await.unwrap().expect("first admitted");
    let b = adm.try_acquire().await.unwrap().expect("second admitted");
    assert_eq!(rate_used(&store, "api").await, 2);
    // No permit free: refused, and the windows are not charged for it.
    assert!(adm.try_acquire().await.unwrap().is_none());
    assert_eq!(rate_used(&store, "api").await, 2);
    assert_eq!(held(&store, "api").await, 2);

    a.release().await.unwrap();
    b.release().await.unwrap();
    let c = adm.try_acquire().await.unwrap().expect("third admitted");
    c.release().await.unwrap();
    assert_eq!(rate_used(&store, "api").await, 3);
    // Permits free, windows full: refused, and no permit is held for it.
    assert!(adm.try_acquire().await.unwrap().is_none());
    assert_eq!(held(&store, "api").await, 0);
    assert_eq!(rate_used(&store, "api").await, 3);

    // A second later the window has room again.
    clock.advance(Duration::from_millis(1_001));
    let d = adm
        .try_acquire()
        .await
        .unwrap()
        .expect("admitted in the next window");
    assert_eq!(d.admitted_at(), d.permit().lease().acquired_at);
    d.release().await.unwrap();
}

#[tokio::test]
async fn every_limit_must_admit_and_a_mismatch_is_typed_and_changes_nothing() {
    let (store, _clock) = manual_store();
    let adm = store
        .admission("two")
        .permits(10)
        .rate("5/s".parse().unwrap())
        .unwrap()
        .rate("2/min".parse().unwrap())
        .unwrap();
    let mut kept = Vec::new();
    for _ in 0..2 {
        kept.push(
            adm.try_acquire()
                .await
                .unwrap()
                .expect("within both limits"),
        );
    }
    // 5/s has room, 2/min does not.
    assert!(adm.try_acquire().await.unwrap().is_none());
    assert_eq!(held(&store, "two").await, 2);

    let other = store
        .admission("two")
        .permits(10)
        .rate("7/s".parse().unwrap())
        .unwrap();
    let err = other.try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::RateMismatch { .. }), "{err}");
    assert_eq!(held(&store, "two").await, 2);
    let wrong_capacity = store
        .admission("two")
        .permits(3)
        .rate("5/s".parse().unwrap())
        .unwrap()
        .rate("2/min".parse().unwrap())
        .unwrap();
    let err = wrong_capacity.try_acquire().await.unwrap_err();
    assert!(matches!(err, Error::CapacityMismatch { .. }), "{err}");
    assert_eq!(rate_used(&store, "two").await, 2);
}

#[tokio::test]
async fn a_given_back_admission_returns_its_charge_and_its_permits() {
    let (store, _clock) = manual_store();
    let adm = store
        .admission("back")
        .permits(1)
        .rate("1/min".parse().unwrap())
        .unwrap();
    let t = adm.try_acquire().await.unwrap().expect("admitted");
    assert_eq!(rate_used(&store, "back").await, 1);
    assert!(t.give_back().await.unwrap());
    assert_eq!(rate_used(&store, "back").await, 0);
    assert_eq!(held(&store, "back").await, 0);
    // The slot it gave back is usable at once.
    let again = adm.try_acquire().await.unwrap().expect("the returned slot");
    let next = adm.try_acquire().await.unwrap();
    assert!(next.is_none(), "one permit, one call a minute");
    again.release().await.unwrap();
}

#[tokio::test]
async fn the_head_waits_for_its_windows_and_nobody_behind_it_is_served_first() {
    for (store, _dir) in stores("fifo").await {
        head_waits_for_its_windows(&store).await;
        store.close().await.unwrap();
    }
}

async fn head_waits_for_its_windows(store: &Store) {
    let opts = RateOptions::default().margin(Duration::ZERO);
    let adm = store
        .admission("fifo")
        .permits(4)
        .rate_options(opts)
        .rate("2/s".parse().unwrap())
        .unwrap();
    let first = adm.try_acquire().await.unwrap().unwrap();
    let first_at = first.admitted_at();
    let second = adm.try_acquire().await.unwrap().unwrap();
    first.release().await.unwrap();
    second.release().await.unwrap();

    // The windows are full for about a second: an admission waits at the head.
    let waiting = {
        let adm = adm.clone();
        tokio::spawn(async move {
            let t = adm.acquire_timeout(Duration::from_secs(5)).await.unwrap();
            (t.expect("admitted once the window moves"), Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = store.status("fifo").await.unwrap().unwrap();
    assert_eq!(
        status.queue.len(),
        1,
        "the admission waits in the queue ({})",
        store.url()
    );
    assert_eq!(status.used, 0, "and holds nothing while it waits");

    // Permits are free, but a plain acquire neither jumps the queue nor is served behind a
    // head that waits for its windows.
    let sem = Semaphore::new(store, "fifo", 4, SemaphoreOptions::default()).unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    let plain = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await.unwrap() })
    };
    let both_queued = async {
        while store.status("fifo").await.unwrap().unwrap().queue.len() < 2 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), both_queued)
        .await
        .expect("the plain acquire queues behind the admission");
    let (ticket, _) = waiting.await.unwrap();
    let permit = plain.await.unwrap();
    assert!(
        ticket.fence() < permit.fence(),
        "the plain waiter behind the head was served first"
    );
    // The step that granted the admission handed what still fits to the plain waiter behind
    // it, at the same instant (not at that waiter's next poll).
    assert_eq!(
        permit.lease().acquired_at,
        ticket.admitted_at(),
        "the plain waiter was not served by the admission's step ({})",
        store.url()
    );
    // Admitted no sooner than the window let it: a second after the first admission.
    assert!(ticket.admitted_at().as_micros() >= first_at.as_micros() + 1_000_000);
    ticket.release().await.unwrap();
    permit.release().await.unwrap();
}

#[tokio::test]
async fn a_timed_out_admission_leaves_the_queue_and_charges_nothing() {
    for (store, _dir) in stores("timeout").await {
        timed_out_admission_charges_nothing(&store).await;
        store.close().await.unwrap();
    }
}

async fn timed_out_admission_charges_nothing(store: &Store) {
    let adm = store
        .admission("timeout")
        .permits(1)
        .rate("1/min".parse().unwrap())
        .unwrap();
    let t = adm.try_acquire().await.unwrap().unwrap();
    t.release().await.unwrap();
    let late = adm
        .acquire_timeout(Duration::from_millis(200))
        .await
        .unwrap();
    assert!(late.is_none());
    assert_eq!(rate_used(store, "timeout").await, 1);
    let status = store.status("timeout").await.unwrap();
    assert!(status.is_none_or(|s| s.queue.is_empty() && s.used == 0));
}

/// The same on the stores with a real clock: minute windows, so the test's own pace cannot
/// move them.
#[tokio::test]
async fn a_refusal_charges_nothing_and_a_give_back_returns_the_charge_on_every_store() {
    for (store, _dir) in stores("refusal").await {
        let adm = store
            .admission("r")
            .permits(2)
            .rate("3/min".parse().unwrap())
            .unwrap();
        let a = adm.try_acquire().await.unwrap().expect("first");
        let b = adm.try_acquire().await.unwrap().expect("second");
        assert!(adm.try_acquire().await.unwrap().is_none(), "no permit free");
        assert_eq!(rate_used(&store, "r").await, 2, "{}", store.url());
        a.release().await.unwrap();
        assert!(b.give_back().await.unwrap());
        assert_eq!(rate_used(&store, "r").await, 1, "{}", store.url());
        let c = adm.try_acquire().await.unwrap().expect("the returned slot");
        let d = adm.try_acquire().await.unwrap().expect("the third");
        c.release().await.unwrap();
        d.release().await.unwrap();
        assert!(adm.try_acquire().await.unwrap().is_none(), "windows full");
        assert_eq!(held(&store, "r").await, 0, "{}", store.url());
        assert_eq!(rate_used(&store, "r").await, 3, "{}", store.url());
        store.close().await.unwrap();
    }
}

/// Settle (`docs/admission.md`, invariant 6), on every store: a smaller actual cost gives the
/// difference back to every window, a larger one charges the excess (a later admission
/// waits for it), the permits are released in the same step, and a cost out of range is a
/// typed error that changes nothing.
#[tokio::test]
async fn a_settled_admission_charges_what_the_call_cost_on_every_store() {
    for (store, _keep) in stores("settle").await {
        let url = store.url().to_string();
        let adm = store
            .admission("s")
            .permits(2)
            .rate("10/min".parse().unwrap())
            .unwrap()
            .rate("12/2min".parse().unwrap())
            .unwrap()
            .cost(4)
            .unwrap();
        let a = adm.try_acquire().await.unwrap().expect("first");
        assert_eq!(a.cost(), 4);
        assert_eq!(rate_used(&store, "s").await, 4, "{url}");
        assert!(a.settle(1).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 1, "{url}: 3 given back");
        assert_eq!(held(&store, "s").await, 0, "{url}: released by the settle");

        let b = adm.try_acquire().await.unwrap().expect("second");
        let err = adm
            .try_acquire()
            .await
            .unwrap()
            .expect("third")
            .settle(tessera::MAX_RATE_COUNT + 1)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{url}: {err}");
        assert_eq!(rate_used(&store, "s").await, 9, "{url}: nothing settled");
        assert!(b.settle(5).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 10, "{url}: 1 more charged");
        // The excess counts: the window is full, so a later admission waits for it.
        let one = adm.clone().cost(1).unwrap();
        assert!(one.try_acquire().await.unwrap().is_none(), "{url}: full");
        assert_eq!(rate_used(&store, "s").await, 10, "{url}");
        // Settling at the estimate changes nothing.
        store.delete_rate_limiter("s").await.unwrap();
        let c = adm.try_acquire().await.unwrap().expect("after the reset");
        assert!(c.settle(4).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 4, "{url}");
        // A settle of 0: the call cost nothing.
        let d = adm.try_acquire().await.unwrap().expect("fourth");
        assert!(d.settle(0).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 4, "{url}");
        assert_eq!(held(&store, "s").await, 0, "{url}");
        // A give-back from an admission with later ones after it: theirs move down with it,
        // and the windows then admit exactly what is left.
        store.delete_rate_limiter("s").await.unwrap();
        let e = adm.try_acquire().await.unwrap().expect("fifth");
        let f = adm.try_acquire().await.unwrap().expect("sixth");
        assert!(e.settle(1).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 5, "{url}");
        assert!(f.settle(2).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "s").await, 3, "{url}");
        let seven = adm.clone().cost(7).unwrap().try_acquire().await.unwrap();
        let seven = seven.unwrap_or_else(|| panic!("{url}: 7 of 10 left"));
        assert!(
            one.try_acquire().await.unwrap().is_none(),
            "{url}: full again"
        );
        seven.release().await.unwrap();
        let status = store.rate_status("s").await.unwrap().unwrap();
        let used: Vec<u64> = status.limits.iter().map(|l| l.used + l.reserved).collect();
        assert_eq!(used, [10, 10], "{url}");
        store.close().await.unwrap();
    }
}

/// Settle in smooth mode, on every store: a give-back only while the admission is the
/// limiter's latest, an excess always (`used` counts the units still draining, 6 s each).
#[tokio::test]
async fn a_smooth_settle_gives_back_only_to_the_latest_admission_on_every_store() {
    use tessera::RateMode;
    for (store, _keep) in stores("smooth").await {
        let url = store.url().to_string();
        let adm = store
            .admission("m")
            .permits(3)
            .rate_options(RateOptions::default().mode(RateMode::Smooth { burst: 4 }))
            .rate("10/min".parse().unwrap())
            .unwrap();
        let cost = |c| adm.clone().cost(c).unwrap();
        let a = cost(3).try_acquire().await.unwrap().expect("a");
        assert_eq!(rate_used(&store, "m").await, 3, "{url}");
        assert!(a.settle(1).await.unwrap(), "{url}");
        assert_eq!(
            rate_used(&store, "m").await,
            1,
            "{url}: the latest gives back"
        );
        let b = cost(2).try_acquire().await.unwrap().expect("b");
        let c = cost(1).try_acquire().await.unwrap().expect("c");
        assert_eq!(rate_used(&store, "m").await, 4, "{url}");
        assert!(b.settle(0).await.unwrap(), "{url}");
        assert_eq!(
            rate_used(&store, "m").await,
            4,
            "{url}: b is not the latest"
        );
        assert!(c.settle(0).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "m").await, 3, "{url}: c is");
        let d = cost(1).try_acquire().await.unwrap().expect("d");
        assert!(d.settle(3).await.unwrap(), "{url}");
        assert_eq!(rate_used(&store, "m").await, 6, "{url}: 2 more");
        assert_eq!(held(&store, "m").await, 0, "{url}");
        store.close().await.unwrap();
    }
}

/// A settle whose lease was lost (expired) gives nothing back, so a settle sent twice or
/// late never counts less than was used; its excess is still charged.
#[tokio::test]
async fn a_settle_after_the_lease_was_lost_gives_nothing_back_but_charges_an_excess() {
    let (store, clock) = manual_store();
    let adm = store
        .admission("lost")
        .permits(1)
        .semaphore_options(SemaphoreOptions::default().ttl(Duration::from_secs(1)))
        .rate("10/min".parse().unwrap())
        .unwrap()
        .cost(3)
        .unwrap();
    let a = adm.try_acquire().await.unwrap().expect("first");
    let b_late = {
        clock.advance(Duration::from_secs(2));
        assert_eq!(held(&store, "lost").await, 0, "expired");
        a.settle(0).await.unwrap()
    };
    assert!(!b_late, "the lease was gone");
    assert_eq!(rate_used(&store, "lost").await, 3, "nothing given back");
    let b = adm.try_acquire().await.unwrap().expect("second");
    clock.advance(Duration::from_secs(2));
    assert!(!b.settle(5).await.unwrap());
    assert_eq!(
        rate_used(&store, "lost").await,
        8,
        "the excess of 2 is charged"
    );
    // A lease this process has seen revoked: its excess is charged all the same.
    let c = adm.clone().cost(1).unwrap().try_acquire().await.unwrap();
    let c = c.expect("third, of cost 1");
    let id = c.lease_id().to_string();
    assert!(store.revoke("lost", &id).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), c.permit().lost())
        .await
        .expect("the holder sees the revoke");
    assert!(!c.settle(4).await.unwrap());
    assert_eq!(rate_used(&store, "lost").await, 12, "1 charged, 4 settled");
    store.close().await.unwrap();
}

/// The guarantee where the user observes it: tasks that start a call only while they hold a
/// fresh admission never have more than `C` calls in flight nor more than `N` starts in any
/// window of the limit's period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_started_under_admissions_keep_the_capacity_and_every_window() {
    for (store, _dir) in stores("observed").await {
        calls_keep_capacity_and_windows(&store).await;
        store.close().await.unwrap();
    }
}

async fn calls_keep_capacity_and_windows(store: &Store) {
    const CAPACITY: usize = 3;
    const PER_WINDOW: usize = 10;
    const WINDOW: Duration = Duration::from_millis(500);
    let adm = store
        .admission("observed")
        .permits(CAPACITY as u32)
        .rate(format!("{PER_WINDOW}/500ms").parse().unwrap())
        .unwrap();
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let (adm, starts, in_flight, most) = (
            adm.clone(),
            Arc::clone(&starts),
            Arc::clone(&in_flight),
            Arc::clone(&most),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..4 {
                let t = adm.acquire().await.unwrap();
                if !t.is_fresh() {
                    t.give_back().await.unwrap();
                    continue;
                }
                starts.lock().unwrap().push(Instant::now());
                let now = in_flight.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                in_flight.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                t.release().await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut starts = starts.lock().unwrap().clone();
    starts.sort();
    assert!(
        starts.len() >= 30,
        "only {} calls started on {}",
        starts.len(),
        store.url()
    );
    assert!(most.load(std::sync::atomic::Ordering::SeqCst) <= CAPACITY);
    for (i, &s) in starts.iter().enumerate() {
        let inside = starts[i..].iter().take_while(|&&t| t < s + WINDOW).count();
        assert!(
            inside <= PER_WINDOW,
            "{inside} calls started within {WINDOW:?} of one another"
        );
    }
}

/// A try whose ticket is past its use-by (a margin of 1 µs: every ticket is) is taken again
/// once, first in the queue, by `readmit_timeout(.., 0)`; late again, it is given back too:
/// nothing held, nothing charged, nobody queued.
#[tokio::test]
async fn a_late_ticket_readmitted_without_a_wait_is_tried_once_and_leaves_nothing() {
    for (store, _keep) in stores("late").await {
        let adm = store
            .admission("late")
            .permits(1)
            .rate_options(RateOptions::default().margin(Duration::from_micros(1)))
            .rate("5/min".parse().unwrap())
            .unwrap();
        let t = adm.try_acquire().await.unwrap().expect("admitted");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(!t.is_fresh());
        let again = adm.readmit_timeout(t, Duration::ZERO).await.unwrap();
        assert!(again.is_none(), "a late ticket came back ({})", store.url());
        assert_eq!(held(&store, "late").await, 0, "{}", store.url());
        assert_eq!(rate_used(&store, "late").await, 0, "{}", store.url());
        let status = store.status("late").await.unwrap();
        assert!(status.is_none_or(|s| s.queue.is_empty()), "{}", store.url());
        store.close().await.unwrap();
    }
}

/// The store's count of admissions given back past their use-by instant.
async fn expired_unused(store: &Store, name: &str) -> Option<u64> {
    let status = store.rate_status(name).await.unwrap();
    status.and_then(|s| s.expired_unused)
}

/// Admissions given back past their use-by instant are counted by the store, in the
/// give-back's own step (`docs/admission.md`, "Use-by"), on every store with admission: a
/// fresh give-back counts nothing; a late ticket readmitted once counts itself and the late
/// ticket of the retry; a give-back of a lease no longer held (sent twice) counts nothing;
/// and the count outlives a give-back of the limiter's only admission.
#[tokio::test]
async fn admissions_given_back_past_their_use_by_are_counted_by_the_store() {
    for (store, _keep) in stores("expired").await {
        let url = store.url().to_string();
        let long = RateOptions::default().margin(Duration::from_secs(1));
        let fresh = store
            .admission("fresh")
            .permits(2)
            .rate_options(long)
            .rate("5/min".parse().unwrap())
            .unwrap();
        let kept = fresh.try_acquire().await.unwrap().expect("admitted");
        let t = fresh.try_acquire().await.unwrap().expect("admitted");
        assert!(t.is_fresh(), "{url}");
        assert!(t.give_back().await.unwrap());
        assert_eq!(expired_unused(&store, "fresh").await, Some(0), "{url}");
        kept.release().await.unwrap();

        // A margin of 1 µs: every ticket is late. The readmit gives back the late ticket,
        // tries once more, and gives back the retry's ticket, late too.
        let late = store
            .admission("expired")
            .permits(1)
            .rate_options(RateOptions::default().margin(Duration::from_micros(1)))
            .rate("5/min".parse().unwrap())
            .unwrap();
        let t = late.try_acquire().await.unwrap().expect("admitted");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert!(!t.is_fresh());
        let (lease, reservation, at) = (t.lease_id(), t.reservation(), t.admitted_at());
        assert!(late
            .readmit_timeout(t, Duration::ZERO)
            .await
            .unwrap()
            .is_none());
        assert_eq!(rate_used(&store, "expired").await, 0, "{url}");
        assert_eq!(expired_unused(&store, "expired").await, Some(2), "{url}");
        // The same give-back again, through the seam: the lease is not held, no count.
        let again = GiveBack {
            reservation,
            at,
            expired: true,
        };
        let name = Name::new("expired").unwrap();
        let seam = store.backend().admission().expect("admission");
        assert!(!seam.give_back(&name, lease, again).await.unwrap());
        assert!(!seam
            .give_back(&name, LeaseId::random(), again)
            .await
            .unwrap());
        assert_eq!(expired_unused(&store, "expired").await, Some(2), "{url}");
        assert_eq!(held(&store, "expired").await, 0, "{url}");
        store.close().await.unwrap();
    }
}

/// The count belongs to the limiter's state: it lasts at least one window (plus the margin)
/// after the latest expired give-back, and a limiter idle past that starts again at 0.
#[tokio::test]
async fn the_count_of_expired_admissions_is_forgotten_with_the_limiters_state() {
    let (store, clock) = manual_store();
    let adm = store
        .admission("idle")
        .permits(1)
        .rate("5/min".parse().unwrap())
        .unwrap();
    let t = adm.try_acquire().await.unwrap().expect("admitted");
    let seam = store.backend().admission().expect("admission");
    let g = GiveBack {
        reservation: t.reservation(),
        at: t.admitted_at(),
        expired: true,
    };
    let name = Name::new("idle").unwrap();
    assert!(seam.give_back(&name, t.lease_id(), g).await.unwrap());
    drop(t);
    assert_eq!(expired_unused(&store, "idle").await, Some(1));
    clock.advance(Duration::from_secs(59));
    assert_eq!(
        expired_unused(&store, "idle").await,
        Some(1),
        "within the window"
    );
    clock.advance(Duration::from_secs(2));
    assert_eq!(
        store.rate_status("idle").await.unwrap(),
        None,
        "idle past it"
    );
    let t = adm.try_acquire().await.unwrap().expect("admitted");
    assert_eq!(
        expired_unused(&store, "idle").await,
        Some(0),
        "a fresh state"
    );
    t.release().await.unwrap();
}

/// An admission that waits for permits behind a plain holder is granted by its own step
/// once the holder releases, charging its windows then: the release (on MySQL a stored
/// procedure, on Redis a script) wakes it and never grants it in its place, which would
/// leave its windows uncharged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_an_admission_waiting_for_permits_and_its_own_step_charges() {
    for (store, _keep) in stores("wake").await {
        let adm = store
            .admission("wake")
            .permits(1)
            .rate("10/min".parse().unwrap())
            .unwrap();
        let sem = Semaphore::new(&store, "wake", 1, SemaphoreOptions::default()).unwrap();
        let plain = sem.acquire().await.unwrap();
        let waiting = {
            let adm = adm.clone();
            tokio::spawn(async move { adm.acquire_timeout(Duration::from_secs(20)).await })
        };
        let queued = async {
            loop {
                let s = store.status("wake").await.unwrap();
                if s.is_some_and(|s| s.queue.len() == 1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), queued)
            .await
            .expect("the admission joins the queue");
        assert_eq!(rate_used(&store, "wake").await, 0, "{}", store.url());
        let plain_fence = plain.fence();
        plain.release().await.unwrap();
        let ticket = waiting
            .await
            .unwrap()
            .unwrap()
            .expect("admitted once released");
        assert!(ticket.fence() > plain_fence, "{}", store.url());
        assert_eq!(held(&store, "wake").await, 1, "{}", store.url());
        assert_eq!(rate_used(&store, "wake").await, 1, "{}", store.url());
        ticket.release().await.unwrap();
        store.close().await.unwrap();
    }
}

/// What a run of [`admissions_follow_the_model`] does, one step at a time.
#[derive(Debug, Clone)]
enum Step {
    /// A try of `weight` permits and `cost` in every window.
    Try { weight: u32, cost: u32 },
    /// Release the held ticket at this index (modulo how many are held).
    Release(usize),
    /// Give back the held ticket at this index (modulo how many are held).
    GiveBack(usize),
    /// Settle the held ticket at this index (modulo how many are held) at this cost.
    Settle(usize, u32),
    /// Move the store's clock.
    Advance(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (1..=3u32, 1..=2u32).prop_map(|(weight, cost)| Step::Try { weight, cost }),
        2 => any::<usize>().prop_map(Step::Release),
        1 => any::<usize>().prop_map(Step::GiveBack),
        2 => (any::<usize>(), 0..=4u32).prop_map(|(i, a)| Step::Settle(i, a)),
        2 => (1..=1_500u64).prop_map(Step::Advance),
        // Exactly a period, or half of one: a charge leaves its window at its time plus the
        // period, not a microsecond later.
        1 => prop_oneof![Just(500u64), Just(1_000)].prop_map(Step::Advance),
    ]
}

/// The reference model of an admission with capacity 4 and the limits 3/s and 5/2s (margin
/// 0, so each window is its period): a try is admitted exactly when the weight fits beside
/// what is held and every window, counting the charges younger than its period, has room
/// for the cost; a refusal charges nothing and holds nothing; a give-back releases and
/// returns the charge only while it is the latest charge not yet returned; a settle (the
/// lease still held) makes the charge the actual cost: less, its own charge lowered; more,
/// the excess charged at the settle's instant (while the limiter's state lives: a horizon,
/// 2 s, past its latest charge, also one given back since); either makes nothing undoable.
#[derive(Debug, Default)]
struct Model {
    held: Vec<(u32, u64)>,
    /// (admitted at, cost, ticket id)
    charges: Vec<(u64, u32, u64)>,
    latest: Option<u64>,
    /// The limiter's state lives until this instant: a horizon past every charge made,
    /// given back or not (a give-back leaves the state's lifetime as it was).
    alive_until: u64,
}

const LIMITS: [(u32, u64); 2] = [(3, 1_000_000), (5, 2_000_000)];

impl Model {
    fn in_window(&self, now: u64, period: u64) -> u64 {
        self.charges
            .iter()
            .filter(|(at, _, _)| at + period > now)
            .map(|(_, cost, _)| u64::from(*cost))
            .sum()
    }

    fn admits(&self, now: u64, weight: u32, cost: u32) -> bool {
        let used: u32 = self.held.iter().map(|(w, _)| w).sum();
        used + weight <= 4
            && LIMITS
                .iter()
                .all(|&(n, p)| self.in_window(now, p) + u64::from(cost) <= u64::from(n))
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// All or nothing, on the reference model, step by step: every try's answer, what is
    /// held and what every window counts match [`Model`].
    #[test]
    fn admissions_follow_the_model(steps in proptest::collection::vec(step(), 1..40)) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let (store, clock) = manual_store();
            let adm = store
                .admission("model")
                .permits(4)
                .semaphore_options(SemaphoreOptions::default().ttl(Duration::from_secs(86_400)))
                .rate_options(RateOptions::default().margin(Duration::ZERO))
                .rate("3/s".parse().unwrap())
                .unwrap()
                .rate("5/2s".parse().unwrap())
                .unwrap();
            let mut model = Model::default();
            let mut tickets = Vec::new();
            let mut next_id = 0u64;
            for s in steps {
                let now = clock.now().0;
                match s {
                    Step::Try { weight, cost } => {
                        let expected = model.admits(now, weight, cost);
                        let got = adm.clone().weight(weight).unwrap().cost(cost).unwrap()
                            .try_acquire().await.unwrap();
                        assert_eq!(got.is_some(), expected, "try {weight}/{cost} at {now}: {model:?}");
                        if let Some(t) = got {
                            next_id += 1;
                            model.held.push((weight, next_id));
                            model.charges.push((now, cost, next_id));
                            model.latest = Some(next_id);
                            model.alive_until = model.alive_until.max(now + 2_000_000);
                            tickets.push((t, next_id));
                        }
                    }
                    Step::Release(i) | Step::GiveBack(i) if !tickets.is_empty() => {
                        let (t, id) = tickets.remove(i % tickets.len());
                        model.held.retain(|&(_, h)| h != id);
                        if matches!(s, Step::GiveBack(_)) {
                            assert!(t.give_back().await.unwrap());
                            if model.latest == Some(id) {
                                model.charges.retain(|&(_, _, c)| c != id);
                                model.latest = None;
                            }
                        } else {
                            assert!(t.release().await.unwrap());
                        }
                    }
                    Step::Settle(i, actual) if !tickets.is_empty() => {
                        let (t, id) = tickets.remove(i % tickets.len());
                        model.held.retain(|&(_, h)| h != id);
                        let charged = t.cost();
                        assert!(t.settle(actual).await.unwrap());
                        // The limiter's state lives a horizon (2 s) past its latest
                        // charge, also one given back since; once it has gone, no window
                        // that can still decide holds the admission, and an excess is
                        // charged to none.
                        let alive = model.alive_until > now;
                        if actual > charged && alive {
                            model.charges.push((now, actual - charged, 0));
                            model.latest = None;
                            model.alive_until = model.alive_until.max(now + 2_000_000);
                        } else if actual < charged {
                            // Given back only while the charge is in a window that can
                            // still decide (younger than the horizon).
                            let c = model.charges.iter_mut().find(|c| c.2 == id).unwrap();
                            if c.0 + 2_000_000 > now {
                                c.1 = actual;
                                model.latest = None;
                            }
                        }
                    }
                    Step::Release(_) | Step::GiveBack(_) | Step::Settle(..) => {}
                    Step::Advance(ms) => clock.advance(Duration::from_millis(ms)),
                }
                let now = clock.now().0;
                let held_now: u32 = model.held.iter().map(|(w, _)| w).sum();
                assert_eq!(held(&store, "model").await, held_now);
                let status = store.rate_status("model").await.unwrap();
                for (i, &(_, period)) in LIMITS.iter().enumerate() {
                    let counted = status.as_ref().map_or(0, |s| s.limits[i].used + s.limits[i].reserved);
                    assert_eq!(counted, model.in_window(now, period), "window {i} at {now}: {model:?}");
                }
            }
            drop(tickets);
            store.close().await.unwrap();
        });
    }
}

/// The memory store, counting the admission steps and waiter heartbeats sent to it, and
/// saying it wakes waiters as `waking` does; as slow as a loaded server where asked.
#[derive(Debug)]
struct Counting {
    inner: MemoryBackend,
    waking: tessera::backend::Waking,
    admits: std::sync::atomic::AtomicU64,
    heartbeats: std::sync::atomic::AtomicU64,
    /// How long a request at the head (after a give-back) takes to reach the store.
    slow_at_head: Duration,
    /// How many grants of a waiting admission come back only after its use-by instant
    /// (a step of more than the 100 ms margin).
    late_grants: std::sync::atomic::AtomicU32,
}

impl Counting {
    fn new(clock: Arc<ManualClock>, waking: tessera::backend::Waking) -> Counting {
        Counting {
            inner: MemoryBackend::with_clock(clock),
            waking,
            admits: Default::default(),
            heartbeats: Default::default(),
            slow_at_head: Duration::ZERO,
            late_grants: Default::default(),
        }
    }
}

mod counting {
    use super::Counting;
    use async_trait::async_trait;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;
    use tessera::backend::*;
    use tessera::{LeaseId, Result, SemaphoreStatus};

    #[async_trait]
    impl Backend for Counting {
        async fn acquire(&self, n: &Name, c: u32, r: &AcquireRequest) -> Result<AcquireReply> {
            self.inner.acquire(n, c, r).await
        }
        async fn heartbeat(&self, n: &Name, l: LeaseId, ttl: Duration) -> Result<WaitReply> {
            self.heartbeats.fetch_add(1, Relaxed);
            self.inner.heartbeat(n, l, ttl).await
        }
        async fn cancel(&self, n: &Name, l: LeaseId) -> Result<CancelReply> {
            self.inner.cancel(n, l).await
        }
        async fn release(&self, n: &Name, l: LeaseId) -> Result<bool> {
            self.inner.release(n, l).await
        }
        async fn renew(&self, n: &Name, l: LeaseId, ttl: Duration) -> Result<RenewReply> {
            self.inner.renew(n, l, ttl).await
        }
        async fn status(&self, n: &Name) -> Result<Option<SemaphoreStatus>> {
            self.inner.status(n).await
        }
        async fn list(&self) -> Result<Vec<String>> {
            self.inner.list().await
        }
        async fn resize(&self, n: &Name, c: u32) -> Result<u32> {
            self.inner.resize(n, c).await
        }
        async fn revoke(&self, n: &Name, l: LeaseId) -> Result<bool> {
            self.inner.revoke(n, l).await
        }
        async fn delete(&self, n: &Name) -> Result<bool> {
            self.inner.delete(n).await
        }
        fn capabilities(&self) -> Capabilities {
            self.inner.capabilities().with_waking(self.waking)
        }
        fn rate(&self) -> Option<&dyn RateBackend> {
            self.inner.rate()
        }
        fn admission(&self) -> Option<&dyn AdmissionBackend> {
            Some(self)
        }
    }

    #[async_trait]
    impl AdmissionBackend for Counting {
        async fn admit(
            &self,
            n: &Name,
            c: u32,
            config: &tessera::backend::RateConfig,
            r: &AdmitRequest,
        ) -> Result<AdmitReply> {
            self.admits.fetch_add(1, Relaxed);
            if r.at_head {
                tokio::time::sleep(self.slow_at_head).await;
            }
            let reply = self.inner.admission().unwrap().admit(n, c, config, r).await;
            let late = matches!(reply, Ok(AdmitReply::Granted { .. }))
                && r.acquire.wait.is_some()
                && self
                    .late_grants
                    .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                    .is_ok();
            if late {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            reply
        }
        async fn give_back(&self, n: &Name, l: LeaseId, g: GiveBack) -> Result<bool> {
            self.inner.admission().unwrap().give_back(n, l, g).await
        }
    }
}

/// On a store that pushes every turn, a queued admission keeps its place with waiter
/// heartbeats (gathered per semaphore on the server stores) and sends its whole step again
/// only every few heartbeats, or at each one while at the head: 2,000 queued admissions
/// re-sending their step at every heartbeat stalled PostgreSQL's queue behind its own
/// heartbeats. The queue still drains in order once permits free.
#[tokio::test(start_paused = true)]
async fn queued_admissions_keep_their_place_with_heartbeats_not_the_whole_step() {
    // 20 heartbeat intervals: the head sends its step at each, the four behind it at every
    // fourth; the rest are heartbeats.
    admissions_renew_their_place(tessera::backend::Waking::Push, 20 + 4 * 6, 4 * 12).await;
}

/// On a store that pushes but also polls (SQLite, MySQL / MariaDB), the same at each poll:
/// 2,000 queued admissions sending their whole step at every poll asked SQLite's one writer
/// for thousands of steps a second.
#[tokio::test(start_paused = true)]
async fn queued_admissions_renew_their_place_at_polls_not_the_whole_step() {
    // Polls at 5, 10, 20, 40, 80 ms, then every 100 ms: about 24 in 2 s. The head sends its
    // step at each, the four behind it at every fourth (without the change: 5 x 24 steps and
    // no heartbeat).
    let waking = tessera::backend::Waking::PushWithPoll {
        min: Duration::from_millis(5),
        max: Duration::from_millis(100),
    };
    admissions_renew_their_place(waking, 26 + 4 * 8, 4 * 15).await;
}

/// Five admissions queued behind a held permit for 2 s (heartbeat every 100 ms): at most
/// `most_steps` steps re-sent and at least `least_beats` heartbeats; then they drain in
/// order.
async fn admissions_renew_their_place(
    waking: tessera::backend::Waking,
    most_steps: u64,
    least_beats: u64,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let clock = Arc::new(ManualClock::new(StoreTime(1_000_000_000_000)));
    let backend = Arc::new(Counting::new(clock, waking));
    let store = Store::from_backend(backend.clone(), "memory://");
    // Heartbeat every 100 ms (a third of the waiter TTL).
    let opts = SemaphoreOptions::default().waiter_ttl(Duration::from_millis(300));
    let adm = store
        .admission("api")
        .permits(1)
        .semaphore_options(opts)
        .rate("1000/s".parse().unwrap())
        .unwrap();
    let first = adm.try_acquire().await.unwrap().expect("admitted");
    let (order, waiters) = queue_in_order(&adm, 5).await;
    let sent = backend.admits.load(Relaxed);
    assert_eq!(sent, 6, "one step each to queue");
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let steps = backend.admits.load(Relaxed) - sent;
    let beats = backend.heartbeats.load(Relaxed);
    assert!(
        steps <= most_steps,
        "{steps} steps re-sent, {beats} heartbeats"
    );
    assert!(
        beats >= least_beats,
        "{steps} steps re-sent, {beats} heartbeats"
    );
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

/// `n` admissions queued one after another (1 ms apart, paused time), each recording its
/// index in the returned order once admitted, then releasing.
async fn queue_in_order(
    adm: &tessera::Admission,
    n: usize,
) -> (Arc<Mutex<Vec<usize>>>, Vec<tokio::task::JoinHandle<()>>) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..n {
        let (adm, order) = (adm.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let a = adm.acquire().await.unwrap();
            order.lock().unwrap().push(i);
            a.release().await.unwrap();
        }));
        // Queued in this order.
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    (order, waiters)
}

/// An admission granted past its use-by instant gives it back and waits again in its own
/// place, at the head: the admission queued behind it, which that give-back's hand-off wakes,
/// is not admitted first, however long the request at the head takes to arrive. (Given back
/// before the new request was sent, the one behind it was admitted in between: on MariaDB
/// under load, 1 run in 6.)
#[tokio::test(start_paused = true)]
async fn a_late_admission_keeps_its_place_at_the_head() {
    let clock = Arc::new(ManualClock::new(StoreTime(1_000_000_000_000)));
    let mut backend = Counting::new(clock, tessera::backend::Waking::Push);
    backend.slow_at_head = Duration::from_millis(20);
    backend.late_grants = 1.into();
    let store = Store::from_backend(Arc::new(backend), "memory://");
    let adm = store
        .admission("late")
        .permits(1)
        .rate("1000/min".parse().unwrap())
        .unwrap();
    let first = adm.try_acquire().await.unwrap().expect("admitted");
    let (order, waiters) = queue_in_order(&adm, 4).await;
    assert_eq!(store.status("late").await.unwrap().unwrap().queue.len(), 4);
    // Waiter 0's grant comes back late.
    first.release().await.unwrap();
    for w in waiters {
        w.await.unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3]);
    let rate = store.rate_status("late").await.unwrap().unwrap();
    assert_eq!(rate.expired_unused, Some(1), "{rate:?}");
}

/// On every store that pushes turns (memory, Redis, a Redis Cluster, PostgreSQL; SQLite and
/// MariaDB, which also poll), where most heartbeats or polls of a queued admission renew its
/// place alone: queued admissions that keep their place through several heartbeats (a
/// waiter TTL of 3 s: a heartbeat every second) are still queued in their order when permits
/// free, and each is admitted in turn, also one whose grant came back past its use-by
/// instant (on MariaDB under load; see `a_late_admission_keeps_its_place_at_the_head`).
#[tokio::test]
async fn queued_admissions_outlive_their_heartbeats_in_order_where_the_store_pushes() {
    let push = stores("beats").await.into_iter().filter(|(store, _)| {
        use tessera::backend::Waking;
        let waking = store.backend().capabilities().waking;
        waking == Waking::Push || matches!(waking, Waking::PushWithPoll { .. })
    });
    let runs = push.map(|(store, keep)| async move {
        let opts = SemaphoreOptions::default().waiter_ttl(Duration::from_secs(3));
        let adm = store
            .admission("beats")
            .permits(1)
            .semaphore_options(opts)
            .rate("1000/min".parse().unwrap())
            .unwrap();
        let first = adm.try_acquire().await.unwrap().expect("admitted");
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            let (adm, order) = (adm.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let a = adm.acquire().await.unwrap();
                order.lock().unwrap().push(i);
                a.release().await.unwrap();
            }));
            // Queued in this order.
            while store
                .status("beats")
                .await
                .unwrap()
                .map_or(0, |s| s.queue.len())
                <= i
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        // Five heartbeat intervals: three renewals and a step each, for the waiters behind
        // the head (positions 1 to 3).
        tokio::time::sleep(Duration::from_secs(5)).await;
        let queued = store.status("beats").await.unwrap().unwrap().queue.len();
        assert_eq!(queued, 4, "{}", store.url());
        first.release().await.unwrap();
        for w in waiters {
            w.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3], "{}", store.url());
        store.close().await.unwrap();
        drop(keep);
    });
    futures::future::join_all(runs).await;
}
