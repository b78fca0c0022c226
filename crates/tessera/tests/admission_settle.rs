//! Settle (`docs/admission.md`, invariant 6) on the stores whose step runs on the server —
//! Redis (`settle.lua`), a Redis Cluster and PostgreSQL (`tessera_settle`) — against the
//! memory store, the reference: the same admissions and settles, in exact and smooth mode,
//! answer the same at every step (held or not, what every window counts, what is admitted
//! next), a settle's release hands the permits to a waiter, and the exact-mode log holds the
//! running totals `engine::settle` leaves (a block lowered and every later entry moved down,
//! a block given back whole removed, an excess appended). The clock is real: the windows are
//! minutes, so nothing leaves them while the test runs, and smooth mode's `used` moves only
//! once a whole emission interval (6 s) has passed.
#![cfg(all(feature = "memory", feature = "redis", feature = "postgres"))]

use std::time::Duration;

use tessera::backend::{Name, Settlement};
use tessera::{Admitted, LeaseId, RateMode, RateOptions, Store};
use tessera_testkit::servers::postgres::PostgresServer;
use tessera_testkit::servers::redis::RedisServer;
use tessera_testkit::servers::redis_cluster::RedisCluster;

/// Every limit's count (used and reserved) of limiter `name`.
async fn used(store: &Store, name: &str) -> Vec<u64> {
    match store.rate_status(name).await.unwrap() {
        Some(s) => s.limits.iter().map(|l| l.used + l.reserved).collect(),
        None => vec![],
    }
}

/// A settle through the seam for a lease that is not held (a settle sent twice, or after the
/// lease expired), naming `ticket`'s charge.
async fn settle_not_held(store: &Store, name: &str, ticket: &Admitted, actual: u32) -> bool {
    store
        .backend()
        .admission()
        .expect("admission")
        .settle(
            &Name::new(name).unwrap(),
            LeaseId::random(),
            &Settlement {
                reservation: ticket.reservation(),
                at: ticket.admitted_at(),
                charged: ticket.cost(),
                actual,
            },
        )
        .await
        .unwrap()
}

/// The exact-mode sequence on limiter `x`; what each step answered, in order.
async fn exact(store: &Store) -> Vec<String> {
    let mut seen = Vec::new();
    let adm = store
        .admission("x")
        .permits(3)
        .rate("10/min".parse().unwrap())
        .unwrap()
        .rate("20/2min".parse().unwrap())
        .unwrap();
    let cost = |c: u32| adm.clone().cost(c).unwrap();
    let a = cost(3).try_acquire().await.unwrap().expect("a");
    let b = cost(2).try_acquire().await.unwrap().expect("b");
    let c = cost(1).try_acquire().await.unwrap().expect("c");
    seen.push(format!("admitted a b c: {:?}", used(store, "x").await));
    // An older block given back in part: the entries after it move down.
    seen.push(format!(
        "a 3->1: {} {:?}",
        a.settle(1).await.unwrap(),
        used(store, "x").await
    ));
    // An excess: appended at the step's instant.
    seen.push(format!(
        "c 1->4: {} {:?}",
        c.settle(4).await.unwrap(),
        used(store, "x").await
    ));
    // A block given back whole: it goes.
    seen.push(format!(
        "b 2->0: {} {:?}",
        b.settle(0).await.unwrap(),
        used(store, "x").await
    ));
    let d = cost(3).try_acquire().await.unwrap().expect("d");
    seen.push(format!(
        "d, then 3 more: {} {:?}",
        cost(3).try_acquire().await.unwrap().is_some(),
        used(store, "x").await
    ));
    let e = cost(2).try_acquire().await.unwrap().expect("e");
    seen.push(format!("e: {:?}", used(store, "x").await));
    // Not held: nothing given back, an excess still charged (past the limit: the call was
    // made).
    seen.push(format!(
        "e not held 2->0: {} {:?}",
        settle_not_held(store, "x", &e, 0).await,
        used(store, "x").await
    ));
    seen.push(format!(
        "e not held 2->3: {} {:?}",
        settle_not_held(store, "x", &e, 3).await,
        used(store, "x").await
    ));
    seen.push(format!(
        "d 3->0: {} {:?}",
        d.settle(0).await.unwrap(),
        used(store, "x").await
    ));
    seen.push(format!(
        "1 more: {} {:?}",
        cost(1).try_acquire().await.unwrap().is_some(),
        used(store, "x").await
    ));
    e.release().await.unwrap();
    seen
}

/// The log's running totals after [`exact`]: [1, 2, 5, 7, 8] and the admission of 1 more.
/// (a 3 → 1; b's block gone; c's 1 and its excess 3; d's block gone; e's 2 and the excess 1;
/// then 1.)
const EXACT_LOG: &[u64] = &[1, 2, 5, 7, 8, 9];

/// The smooth-mode sequence on limiter `y`; what each step answered, in order.
async fn smooth(store: &Store) -> Vec<String> {
    let mut seen = Vec::new();
    let adm = store
        .admission("y")
        .permits(3)
        .rate_options(RateOptions::default().mode(RateMode::Smooth { burst: 10 }))
        .rate("10/min".parse().unwrap())
        .unwrap();
    let cost = |c: u32| adm.clone().cost(c).unwrap();
    let a = cost(3).try_acquire().await.unwrap().expect("a");
    let b = cost(2).try_acquire().await.unwrap().expect("b");
    seen.push(format!("admitted a b: {:?}", used(store, "y").await));
    // Not the latest: the estimate stands.
    seen.push(format!(
        "a 3->1: {} {:?}",
        a.settle(1).await.unwrap(),
        used(store, "y").await
    ));
    // The latest: its pacing made again from the one before it.
    seen.push(format!(
        "b 2->0: {} {:?}",
        b.settle(0).await.unwrap(),
        used(store, "y").await
    ));
    let c = cost(2).try_acquire().await.unwrap().expect("c");
    seen.push(format!(
        "c 2->5: {} {:?}",
        c.settle(5).await.unwrap(),
        used(store, "y").await
    ));
    seen.push(format!(
        "3 more: {} {:?}",
        cost(3).try_acquire().await.unwrap().is_some(),
        used(store, "y").await
    ));
    let d = cost(2).try_acquire().await.unwrap().expect("d");
    seen.push(format!(
        "d not held 2->0: {} {:?}",
        settle_not_held(store, "y", &d, 0).await,
        used(store, "y").await
    ));
    seen.push(format!(
        "d 2->1: {} {:?}",
        d.settle(1).await.unwrap(),
        used(store, "y").await
    ));
    let e = cost(1).try_acquire().await.unwrap().expect("e");
    seen.push(format!(
        "e not held 1->3: {} {:?}",
        settle_not_held(store, "y", &e, 3).await,
        used(store, "y").await
    ));
    e.release().await.unwrap();
    seen
}

/// A settle's release hands the permit to the admission waiting for it, whose own step
/// charges its windows.
async fn hand_off(store: &Store) -> Vec<String> {
    let adm = store
        .admission("h")
        .permits(1)
        .rate("100/min".parse().unwrap())
        .unwrap();
    let first = adm.try_acquire().await.unwrap().expect("first");
    let waiting = {
        let adm = adm.clone();
        tokio::spawn(async move { adm.acquire_timeout(Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = first.settle(3).await.unwrap();
    let second = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("granted by the settle's hand-off");
    let seen = vec![format!("{held} {:?}", used(store, "h").await)];
    second.release().await.unwrap();
    seen
}

/// A block with more entries after it than one page of the Redis walk back from the log's
/// end (16): limiter `w`, an admission of 2 and 20 of 1 after it, then the first given back
/// whole.
async fn long_log(store: &Store) -> Vec<String> {
    let adm = store
        .admission("w")
        .permits(2)
        .rate("100/min".parse().unwrap())
        .unwrap();
    let first = adm.clone().cost(2).unwrap().try_acquire().await.unwrap();
    for _ in 0..20 {
        let t = adm.try_acquire().await.unwrap().expect("admitted");
        t.release().await.unwrap();
    }
    let held = first.expect("first").settle(0).await.unwrap();
    vec![format!(
        "long log 2->0: {held} {:?}",
        used(store, "w").await
    )]
}

/// The log's running totals after [`long_log`]: the 20 entries after the block moved down by
/// its 2.
fn long_log_totals() -> Vec<u64> {
    (1..=20).collect()
}

async fn all(store: &Store) -> Vec<String> {
    let mut seen = exact(store).await;
    seen.extend(long_log(store).await);
    seen.extend(smooth(store).await);
    seen.extend(hand_off(store).await);
    seen
}

async fn reference(test: &str) -> Vec<String> {
    let memory = Store::connect(&format!("memory://settle-{test}-{}", std::process::id()))
        .await
        .unwrap();
    let seen = all(&memory).await;
    memory.close().await.unwrap();
    seen
}

/// The running totals of a Redis log reply (`ZRANGE … 0 -1`: members `<t>:<P>`).
fn redis_totals(reply: &str) -> Vec<u64> {
    reply
        .lines()
        .filter_map(|l| l.split_once(':'))
        .filter_map(|(t, p)| (t.parse::<u64>().is_ok()).then(|| p.parse::<u64>().ok())?)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_admissions_on_redis_answer_as_the_memory_store() {
    let server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    assert_eq!(all(&store).await, reference("redis").await);
    let log = server.command(&["ZRANGE", "{tessera:x}:rate:log", "0", "-1"]);
    assert_eq!(redis_totals(&log), EXACT_LOG, "{log}");
    let log = server.command(&["ZRANGE", "{tessera:w}:rate:log", "0", "-1"]);
    assert_eq!(redis_totals(&log), long_log_totals(), "{log}");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_admissions_on_a_redis_cluster_answer_as_the_memory_store() {
    let cluster = RedisCluster::start(false);
    let store = Store::connect(&cluster.url()).await.unwrap();
    assert_eq!(all(&store).await, reference("cluster").await);
    let key = "{tessera:x}:rate:log";
    let log = cluster
        .primary_for(key)
        .command(&["ZRANGE", key, "0", "-1"]);
    assert_eq!(redis_totals(&log), EXACT_LOG, "{log}");
    store.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settled_admissions_on_postgres_answer_as_the_memory_store() {
    let server = PostgresServer::start();
    let store = Store::connect(&server.url_with_schema("settle"))
        .await
        .unwrap();
    assert_eq!(all(&store).await, reference("postgres").await);
    let log = server.psql(
        "SELECT string_agg(p::text, ',' ORDER BY p) FROM settle.tessera_rate_log WHERE name = 'x'",
    );
    let totals =
        |log: &str| -> Vec<u64> { log.split(',').map(|p| p.trim().parse().unwrap()).collect() };
    assert_eq!(totals(&log), EXACT_LOG, "{log}");
    let log = server.psql(
        "SELECT string_agg(p::text, ',' ORDER BY p) FROM settle.tessera_rate_log WHERE name = 'w'",
    );
    assert_eq!(totals(&log), long_log_totals(), "{log}");
    store.close().await.unwrap();
}
