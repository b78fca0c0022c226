//! The Redis store against a throwaway `redis-server` per test (a missing `redis-server` fails
//! the test with the install line). The store must behave like the reference model
//! (`memory://`) operation by operation (the test kit's differential test); Redis keeps its
//! own clock, so that test uses long TTLs and compares only what does not depend on the
//! clock, and expiry is tested separately with short real TTLs.
#![cfg(feature = "redis")]

use std::sync::Arc;
use std::time::Duration;

use tessera::backend::stores::RedisBackend;
use tessera::backend::*;
use tessera::*;
use tessera_testkit::conformance::{handed_within, joined, wait_queued};
use tessera_testkit::differential::{DiffClock, Differential, Seen};
use tessera_testkit::gathered::{ManyWaiters, SHORT};
use tessera_testkit::proxy::{Mode, Proxy};
use tessera_testkit::seam::{name, req, LONG};
use tessera_testkit::servers::redis::{bulk_strings, RedisServer};

async fn redis_backend(server: &RedisServer, prefix: &str) -> RedisBackend {
    RedisBackend::connect(&format!("{}?prefix={prefix}", server.url()))
        .await
        .unwrap()
}

/// The test kit's differential test against the reference model (long TTLs, times and fences
/// left out), and after every step: every key the step left behind carries an expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaves_like_the_memory_model_operation_by_operation() {
    let server = RedisServer::start();
    let mut seen = Seen::default();
    for seed in 0..6u64 {
        let prefix = format!("diff{seed}");
        let redis = redis_backend(&server, &prefix).await;
        let mut d = Differential::new(&redis, DiffClock::Server, seed);
        for _ in 0..400 {
            let what = d.step().await;
            let immortal = server.immortal_keys(&prefix);
            assert!(
                immortal.is_empty(),
                "{what} left keys without expiry: {immortal:?}"
            );
        }
        seen.add(&d);
    }
    seen.assert_every_answer_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holders_and_waiters_are_purged_and_the_queue_moves_on() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "expiry").await;
    let n = name("expiry");
    let (a, b, c) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    let short = Duration::from_millis(300);
    // A holds the only permit briefly; B waits with a long heartbeat TTL; C waits briefly.
    assert!(matches!(
        redis.acquire(&n, 1, &req(a, 1, short, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        redis
            .acquire(&n, 1, &req(c, 1, LONG, Some((short, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert_eq!(
        redis
            .acquire(&n, 1, &req(b, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 1 }
    );
    // Every key carries an expiry (bounded state). (A, the first holder, is the meta hash's
    // inline lease: holders and leases do not exist.)
    for suffix in ["meta", "queue", "waiters", "wexp"] {
        let ttl = server.command(&["PTTL", &format!("{{expiry:expiry}}:{suffix}")]);
        let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
        assert!(ms > 0, "{suffix} has no expiry: {ttl}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    // The next step purges A (expired) and C (heartbeat expired) and hands the permit to B.
    match redis.heartbeat(&n, b, LONG).await.unwrap() {
        WaitReply::Granted(g) => assert_eq!(g.lease.seats, vec![0]),
        other => panic!("B not granted: {other:?}"),
    }
    assert_eq!(redis.heartbeat(&n, c, LONG).await.unwrap(), WaitReply::Gone);
    assert_eq!(redis.renew(&n, a, LONG).await.unwrap(), RenewReply::Gone);
    assert!(redis.release(&n, b).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
    // Only the idle meta key remains (it keeps the fence), and it expires too: at least 10
    // minutes from now, and no later than the expiry the longest lease (or waiter) had set
    // it to (its TTL plus 10 s of grace and 10 s of slack).
    let keys = server.command(&["KEYS", "{expiry:*"]);
    assert_eq!(bulk_strings(&keys), ["{expiry:expiry}:meta"], "{keys}");
    let ttl = server.command(&["PTTL", "{expiry:expiry}:meta"]);
    let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
    assert!(
        (600_000..=LONG.as_millis() as i64 + 20_000).contains(&ms),
        "{ttl}"
    );
    let idle = server.command(&["HMGET", "{expiry:expiry}:meta", "used", "qlen", "lid"]);
    assert_eq!(bulk_strings(&idle), ["0", "0", ""], "{idle}");
    assert!(redis.list().await.unwrap().is_empty());
    assert!(
        !redis.delete(&n).await.unwrap(),
        "an idle state is nothing to delete"
    );
    // Reads of an idle state leave its expiry alone: polling status or list never keeps it.
    // (Its recorded deadline is set back too, as if it were due to move.)
    server.command(&["HSET", "{expiry:expiry}:meta", "deadline", "1"]);
    server.command(&["PEXPIRE", "{expiry:expiry}:meta", "5000"]);
    assert!(redis.status(&n).await.unwrap().is_none());
    assert!(redis.list().await.unwrap().is_empty());
    assert!(!redis.release(&n, b).await.unwrap());
    let ttl = server.command(&["PTTL", "{expiry:expiry}:meta"]);
    let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
    assert!((0..=5000).contains(&ms), "{ttl}");
}

/// The uncontended acquire and release (the W1 loop of `tessera bench`) touch the meta hash
/// alone: the lease lives inline, and the released state stays idle instead of being deleted
/// and created again. Every other operation on the same semaphore still sees the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncontended_acquire_and_release_touch_only_the_meta_hash() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "lean").await;
    let n = name("w1");
    acquire_release_once(&redis, &n).await;
    let before = server.command_calls();
    for _ in 0..100 {
        let id = LeaseId::random();
        let r = redis.acquire(&n, 2, &req(id, 1, LONG, None)).await.unwrap();
        assert!(matches!(r, AcquireReply::Granted(_)), "{r:?}");
        assert!(redis.release(&n, id).await.unwrap());
    }
    let after = server.command_calls();
    let mut delta: Vec<(String, u64)> = after
        .iter()
        .map(|(c, n)| (c.clone(), n - before.get(c).unwrap_or(&0)))
        .filter(|(c, n)| *n > 0 && c != "info")
        .collect();
    delta.sort();
    // TIME, HMGET and HSET per call, and at most one PEXPIRE of the idle state a minute.
    let expected = [("fcall", 200), ("hmget", 200), ("hset", 200), ("time", 200)];
    let expected: Vec<(String, u64)> = expected.iter().map(|(c, n)| (c.to_string(), *n)).collect();
    let pexpire = delta.iter().position(|(c, _)| c == "pexpire");
    if let Some(i) = pexpire {
        assert!(delta[i].1 <= 1, "{delta:?}");
        delta.remove(i);
    }
    assert_eq!(delta, expected);

    // The inline lease is a lease like any other: status, renew, a second holder, revoke.
    let (a, b) = (LeaseId::random(), LeaseId::random());
    redis.acquire(&n, 2, &req(a, 1, LONG, None)).await.unwrap();
    redis.acquire(&n, 2, &req(b, 1, LONG, None)).await.unwrap();
    let status = redis.status(&n).await.unwrap().unwrap();
    let mut ids: Vec<LeaseId> = status.holders.iter().map(|l| l.lease_id).collect();
    ids.sort();
    let mut both = vec![a, b];
    both.sort();
    assert_eq!(ids, both);
    assert_eq!(
        bulk_strings(&server.command(&["HGET", "{lean:w1}:meta", "lid"])),
        [a.to_string()]
    );
    assert!(matches!(
        redis.renew(&n, a, LONG).await.unwrap(),
        RenewReply::Renewed { .. }
    ));
    assert!(redis.revoke(&n, a).await.unwrap());
    assert_eq!(redis.renew(&n, a, LONG).await.unwrap(), RenewReply::Gone);
    assert!(redis.release(&n, b).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
}

/// A first send (a new lease id, sent once) joins the queue without looking its lease id up
/// as a retry would; a retry of it, marked as one, still finds the place the first made, and
/// a retry of a grant finds the grant: nothing is taken twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_skips_the_retry_lookups_and_a_retry_still_finds_its_place() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "first").await;
    let n = name("q");
    let holder = LeaseId::random();
    let mut held = req(holder, 1, LONG, Some((LONG, 100)));
    held.first_send = true;
    let granted = redis.acquire(&n, 1, &held).await.unwrap();
    assert!(matches!(granted, AcquireReply::Granted(_)), "{granted:?}");
    let hgets = || server.command_calls().get("hget").copied().unwrap_or(0);
    let enqueue = |first_send: bool| {
        let mut r = req(LeaseId::random(), 1, LONG, Some((LONG, 100)));
        r.first_send = first_send;
        r
    };
    let (head, retried, first) = (enqueue(true), enqueue(false), enqueue(true));
    let r = redis.acquire(&n, 1, &head).await.unwrap();
    assert!(
        matches!(r, AcquireReply::Queued { position: 0, .. }),
        "{r:?}"
    );
    let before = hgets();
    let r = redis.acquire(&n, 1, &retried).await.unwrap();
    assert!(
        matches!(r, AcquireReply::Queued { position: 1, .. }),
        "{r:?}"
    );
    let looked_up = hgets() - before;
    assert!(
        looked_up >= 1,
        "a marked retry looks its lease id up: {looked_up}"
    );
    let before = hgets();
    let r = redis.acquire(&n, 1, &first).await.unwrap();
    assert!(
        matches!(r, AcquireReply::Queued { position: 2, .. }),
        "{r:?}"
    );
    assert_eq!(hgets() - before, 0, "a first send looked its lease id up");

    // Retries, marked as such, of the first send and of the grant.
    let mut again = first.clone();
    again.first_send = false;
    let r = redis.acquire(&n, 1, &again).await.unwrap();
    assert!(
        matches!(r, AcquireReply::Queued { position: 2, .. }),
        "{r:?}"
    );
    held.first_send = false;
    match redis.acquire(&n, 1, &held).await.unwrap() {
        AcquireReply::Granted(g) => assert_eq!(g.lease.lease_id, holder),
        r => panic!("{r:?}"),
    }
    let status = redis.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders.len(), 1);
    assert_eq!(status.used, 1);
    assert_eq!(status.queue.len(), 3, "{status:?}");
    // The queue hands on in order.
    assert!(redis.release(&n, holder).await.unwrap());
    let status = redis.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, head.lease_id);
    assert_eq!(status.queue.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fences_never_regress_after_a_restart_without_persistence() {
    let mut server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let redis = store.backend().clone();
    let n = name("fenced");
    // Fifty waiters granted in one step (by a resize) push the fence ahead of the clock.
    let holder = LeaseId::random();
    redis
        .acquire(&n, 1, &req(holder, 1, LONG, None))
        .await
        .unwrap();
    let ids: Vec<LeaseId> = (0..50).map(|_| LeaseId::random()).collect();
    for id in &ids {
        redis
            .acquire(&n, 1, &req(*id, 1, LONG, Some((LONG, 100))))
            .await
            .unwrap();
    }
    redis.resize(&n, 51).await.unwrap();
    let status = redis.status(&n).await.unwrap().unwrap();
    let max = status.holders.iter().map(|l| l.fence).max().unwrap();
    assert_eq!(status.holders.len(), 51);

    server.restart();
    // The connection manager reconnects by itself; the first call may see the dropped link.
    let mut fence = None;
    for _ in 0..50 {
        match redis
            .acquire(&n, 51, &req(LeaseId::random(), 1, LONG, None))
            .await
        {
            Ok(AcquireReply::Granted(g)) => {
                fence = Some(g.lease.fence);
                break;
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => {
                assert!(e.is_transient(), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let fence = fence.expect("store back after restart");
    assert!(
        fence > max,
        "fence {fence} after restart is not above {max}"
    );
}

/// One acquire and one release on `redis`, then the state is gone.
async fn acquire_release_once(redis: &RedisBackend, n: &Name) {
    let id = LeaseId::random();
    let r = redis.acquire(n, 2, &req(id, 1, LONG, None)).await.unwrap();
    assert!(matches!(r, AcquireReply::Granted(_)), "{r:?}");
    assert!(redis.release(n, id).await.unwrap());
    assert!(redis.status(n).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_are_function_calls_and_survive_function_flush() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "flush").await;
    let n = name("flushed");
    let id = LeaseId::random();
    redis.acquire(&n, 2, &req(id, 1, LONG, None)).await.unwrap();
    assert_eq!(redis.list().await.unwrap(), vec!["flushed".to_string()]);
    let before = server.command_calls();
    assert!(server.command(&["FUNCTION", "FLUSH"]).starts_with("+OK"));
    assert!(redis.release(&n, id).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
    assert!(redis.list().await.unwrap().is_empty());
    acquire_release_once(&redis, &n).await;
    let after = server.command_calls();
    let delta = |c: &str| after.get(c).unwrap_or(&0) - before.get(c).unwrap_or(&0);
    // The release after the flush found no function, loaded the library once and was sent
    // again; then every step was one FCALL and no script ran (the list asked the status of
    // the idle state it found).
    assert_eq!(delta("function|load"), 1, "{after:?}");
    assert_eq!(delta("fcall"), 2 + 1 + 1 + 3, "{after:?}");
    assert_eq!(delta("evalsha") + delta("eval"), 0, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_refuses_new_permits_but_holders_renew_report_and_release() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "oom").await;
    let n = name("full");
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    let waiting = Some((LONG, 10));
    let r = redis.acquire(&n, 1, &req(holder, 1, LONG, None)).await;
    assert!(matches!(r, Ok(AcquireReply::Granted(_))), "{r:?}");
    let r = redis.acquire(&n, 1, &req(waiter, 1, LONG, waiting)).await;
    assert!(
        matches!(r, Ok(AcquireReply::Queued { position: 0 })),
        "{r:?}"
    );

    // Redis is full and evicts nothing.
    for (k, v) in [("maxmemory-policy", "noeviction"), ("maxmemory", "1")] {
        assert!(server.command(&["CONFIG", "SET", k, v]).starts_with("+OK"));
    }
    // What would add state is refused, and nothing changes.
    let r = redis
        .acquire(&n, 1, &req(LeaseId::random(), 1, LONG, waiting))
        .await;
    assert!(
        matches!(&r, Err(e) if e.to_string().contains("OOM")),
        "{r:?}"
    );
    let other = name("other");
    let r = redis
        .acquire(&other, 1, &req(LeaseId::random(), 1, LONG, None))
        .await;
    assert!(r.is_err(), "{r:?}");
    // Holders and waiters keep what they have, status answers, and a release hands off.
    let r = redis.renew(&n, holder, LONG).await;
    assert!(matches!(r, Ok(RenewReply::Renewed { .. })), "{r:?}");
    assert_eq!(
        redis.heartbeat(&n, waiter, LONG).await.unwrap(),
        WaitReply::Waiting
    );
    let status = redis.status(&n).await.unwrap().expect("state");
    assert_eq!((status.used, status.queue.len()), (1, 1), "{status:?}");
    assert!(redis.release(&n, holder).await.unwrap());
    let r = redis.heartbeat(&n, waiter, LONG).await;
    assert!(matches!(r, Ok(WaitReply::Granted(_))), "{r:?}");
    assert!(redis.release(&n, waiter).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
    assert!(redis.status(&other).await.unwrap().is_none());

    assert!(server
        .command(&["CONFIG", "SET", "maxmemory", "0"])
        .starts_with("+OK"));
    acquire_release_once(&redis, &n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_functions_operations_are_scripts_and_survive_script_flush() {
    let server = RedisServer::start();
    // A user that may neither call nor load functions (as on a server without them).
    server.command(&[
        "ACL",
        "SETUSER",
        "scripts",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-fcall",
        "-function",
    ]);
    let url = server.url().replace("redis://", "redis://scripts:pw@");
    let redis = RedisBackend::connect(&format!("{url}?prefix=s"))
        .await
        .unwrap();
    let n = name("scripted");
    acquire_release_once(&redis, &n).await;
    let id = LeaseId::random();
    redis.acquire(&n, 2, &req(id, 1, LONG, None)).await.unwrap();
    assert!(server.command(&["SCRIPT", "FLUSH"]).starts_with("+OK"));
    assert!(redis.release(&n, id).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
    let calls = server.command_calls();
    assert!(calls.get("evalsha").copied().unwrap_or(0) >= 5, "{calls:?}");
    // Refused once, then never sent again.
    assert_eq!(calls.get("fcall").copied().unwrap_or(0), 0, "{calls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_scripts_returns_to_functions_once_they_are_allowed() {
    let server = RedisServer::start();
    let user = |grants: &[&str]| {
        let mut words = vec!["ACL", "SETUSER", "late"];
        words.extend_from_slice(grants);
        assert!(server.command(&words).starts_with("+OK"));
    };
    user(&["on", ">pw", "~*", "&*", "+@all", "-fcall", "-function"]);
    let url = server.url().replace("redis://", "redis://late:pw@");
    let redis = RedisBackend::connect(&format!("{url}?prefix=late"))
        .await
        .unwrap()
        .with_functions_retry(Duration::from_millis(200));
    let n = name("late");
    acquire_release_once(&redis, &n).await;
    let before = server.command_calls();
    assert!(
        before.get("evalsha").copied().unwrap_or(0) >= 3,
        "{before:?}"
    );

    // An administrator widens the ACL; within the retry interval the client is back on the
    // function library (it loads it itself, now that it may).
    user(&["+fcall", "+function"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    acquire_release_once(&redis, &n).await;
    acquire_release_once(&redis, &n).await;
    let after = server.command_calls();
    let delta = |c: &str| after.get(c).unwrap_or(&0) - before.get(c).unwrap_or(&0);
    assert_eq!(delta("function|load"), 1, "{after:?}");
    assert!(delta("fcall") >= 6, "{after:?}");
    assert_eq!(delta("evalsha") + delta("eval"), 0, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_data_under_a_tessera_key_is_corrupt_not_a_panic() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "foreign").await;
    let n = name("odd");
    server.command(&["HSET", "{foreign:odd}:meta", "cap", "2", "used", "x"]);
    let e = redis
        .acquire(&n, 2, &req(LeaseId::random(), 1, LONG, None))
        .await
        .unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    server.command(&["DEL", "{foreign:odd}:meta"]);
    server.command(&["SET", "{foreign:odd}:holders", "not a zset"]);
    // The first lease lives inline in the meta hash, the second in the leases hash: garbage
    // in either is corrupt.
    let (first, second) = (LeaseId::random(), LeaseId::random());
    redis
        .acquire(&n, 2, &req(first, 1, LONG, None))
        .await
        .unwrap();
    redis
        .acquire(&n, 2, &req(second, 1, LONG, None))
        .await
        .unwrap();
    server.command(&[
        "HSET",
        "{foreign:odd}:leases",
        &second.to_string(),
        "garbage",
    ]);
    let e = redis.status(&n).await.unwrap_err();
    assert!(e.is_corrupt(), "{e}");
    for (field, garbage) in [("lrec", "garbage"), ("lexp", "soon")] {
        let n = name(field);
        redis
            .acquire(&n, 2, &req(LeaseId::random(), 1, LONG, None))
            .await
            .unwrap();
        server.command(&["HSET", &format!("{{foreign:{field}}}:meta"), field, garbage]);
        let e = redis.status(&n).await.unwrap_err();
        assert!(e.is_corrupt(), "{field}: {e}");
    }
}

fn patient() -> SemaphoreOptions {
    // Heartbeats every min(60 s / 3, 60 s / 4) = 15 s: a grant seen within 5 s came by push.
    SemaphoreOptions::default()
        .ttl(Duration::from_secs(60))
        .waiter_ttl(Duration::from_secs(60))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_push_before_its_first_heartbeat() {
    let server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let other = Store::connect(&server.url()).await.unwrap();
    // The grant must arrive by push, before the first heartbeat (15 s).
    let five = Duration::from_secs(5);
    let permit = handed_within(&store, &other, "pushed", patient(), five).await;
    assert_eq!(permit.seats(), &[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscriber_connection_still_ends_in_a_grant() {
    let server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let sem = Semaphore::new(&store, "killed", 1, patient()).unwrap();
    let sem2 = sem.clone();
    let held = sem.acquire().await.unwrap();
    let waiter = tokio::spawn(async move { sem2.acquire().await });
    wait_queued(&store, "killed", 1).await;
    let killed = server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed.starts_with(":1"), "{killed}");
    held.release().await.unwrap();
    let permit = joined(
        waiter,
        Duration::from_secs(5),
        "granted before the first heartbeat despite the lost subscription",
    )
    .await
    .unwrap();
    assert_eq!(permit.seats(), &[0]);
    // The subscriber is back: the next hand-off arrives by push again.
    let sem3 = sem.clone();
    let waiter = tokio::spawn(async move { sem3.acquire().await });
    wait_queued(&store, "killed", 1).await;
    drop(permit);
    let _permit = joined(
        waiter,
        Duration::from_secs(5),
        "pushed after resubscription",
    )
    .await
    .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_holder_is_told_through_lost() {
    let server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let sem = Semaphore::new(&store, "revoked", 2, patient()).unwrap();
    let permit = sem.acquire().await.unwrap();
    assert!(store
        .revoke("revoked", &permit.lease_id().to_string())
        .await
        .unwrap());
    tokio::time::timeout(Duration::from_secs(5), permit.lost())
        .await
        .expect("lost() fires on the pushed revocation, long before a renewal (20 s)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_holders_and_ten_thousand_waiters_on_one_semaphore() {
    let server = RedisServer::start();
    let redis = Arc::new(redis_backend(&server, "big").await);
    let n = name("big");
    const N: usize = 10_000;
    let holders: Vec<LeaseId> = (0..N).map(|_| LeaseId::random()).collect();
    let waiters: Vec<LeaseId> = (0..N).map(|_| LeaseId::random()).collect();
    for chunk in holders.chunks(200) {
        let replies = futures::future::join_all(chunk.iter().map(|id| {
            let (redis, n, r) = (&redis, &n, req(*id, 1, LONG, None));
            async move { redis.acquire(n, N as u32, &r).await }
        }))
        .await;
        assert!(replies
            .iter()
            .all(|r| matches!(r, Ok(AcquireReply::Granted(_)))));
    }
    for chunk in waiters.chunks(200) {
        let replies = futures::future::join_all(chunk.iter().map(|id| {
            let (redis, n) = (&redis, &n);
            let r = req(*id, 1, LONG, Some((LONG, 2 * N as u32)));
            async move { redis.acquire(n, N as u32, &r).await }
        }))
        .await;
        assert!(replies
            .iter()
            .all(|r| matches!(r, Ok(AcquireReply::Queued { .. }))));
    }
    // With both sets full, single steps still work and hand off in FIFO order. (Requests
    // were sent concurrently, so the store's arrival order is read back from the status.)
    let before = redis.status(&n).await.unwrap().unwrap();
    let victim = &before.holders[17];
    let (head, second) = (before.queue[0].lease_id, before.queue[1].lease_id);
    assert!(redis.release(&n, victim.lease_id).await.unwrap());
    match redis.heartbeat(&n, head, LONG).await.unwrap() {
        WaitReply::Granted(g) => assert_eq!(g.lease.seats, victim.seats),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        redis.heartbeat(&n, second, LONG).await.unwrap(),
        WaitReply::Waiting
    );
    let s = redis.status(&n).await.unwrap().unwrap();
    assert_eq!(
        (s.holders.len(), s.queue.len(), s.used),
        (N, N - 1, N as u32)
    );
    assert_eq!(s.queue[0].lease_id, second);
    assert!(redis.delete(&n).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_expiring_by_the_thousand_are_purged_in_bounded_steps_that_keep_the_queue_moving() {
    let server = RedisServer::start();
    let url = format!("{}?prefix=mass", server.url());
    let redis = Arc::new(RedisBackend::connect(&url).await.unwrap());
    let n = name("mass");
    const N: u32 = 1000;
    const STEP: u64 = 256; // PURGE_LIMIT in prelude.lua
    let short = Duration::from_secs(1);
    let ids: Vec<LeaseId> = (0..N).map(|_| LeaseId::random()).collect();
    for chunk in ids.chunks(200) {
        let replies = futures::future::join_all(chunk.iter().map(|id| {
            let (redis, n, r) = (&redis, &n, req(*id, 1, short, None));
            async move { redis.acquire(n, N, &r).await }
        }))
        .await;
        assert!(replies
            .iter()
            .all(|r| matches!(r, Ok(AcquireReply::Granted(_)))));
    }
    // A waiter for 300 permits through the public API, whose own heartbeat comes only every
    // 15 s: more than one step's purge must free before it fits.
    let store = Store::connect(&url).await.unwrap();
    let sem = Semaphore::new(&store, "mass", N, patient()).unwrap();
    let waiter = tokio::spawn(async move { sem.acquire_many(300).await });
    wait_queued(&store, "mass", 1).await;
    // In the holders set, and the inline lease of the meta hash (the first grant's).
    let holders = || -> u64 {
        let reply = server.command(&["ZCARD", "{mass:mass}:holders"]);
        let set: u64 = reply.trim().trim_start_matches(':').parse().unwrap();
        let inline = server.command(&["HGET", "{mass:mass}:meta", "lid"]);
        set + u64::from(bulk_strings(&inline).iter().any(|id| !id.is_empty()))
    };
    assert_eq!(holders(), N as u64);

    tokio::time::sleep(short + Duration::from_millis(300)).await;
    // One step purges one batch only, and wakes the head of the queue, whose heartbeat
    // purges the next batch and is granted: the queue does not wait for its own heartbeat.
    let status = redis.status(&n).await.unwrap();
    assert!(status.is_some());
    let permit = joined(
        waiter,
        Duration::from_secs(5),
        "the waiter is woken by the purge, before its first heartbeat (15 s)",
    )
    .await
    .unwrap();
    assert_eq!(permit.weight(), 300);
    // A few steps so far (the status, the waiter's heartbeats as each purge woke it, its
    // grant): how many depends on the machine's timing, so the bound is checked step by
    // step below. The rest is still to purge, and counts as used until then.
    let mut left = holders();
    assert!(left < N as u64, "{left} holders left: nothing purged");
    // Every further step purges one batch at most, until only the waiter's lease is left.
    while left > 1 {
        redis.status(&n).await.unwrap();
        let now = holders();
        assert!(
            now < left && left - now <= STEP,
            "one step took {left} holders to {now}"
        );
        left = now;
    }
    let s = redis.status(&n).await.unwrap().unwrap();
    assert_eq!((s.used, s.holders.len()), (300, 1));
    permit.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiters_by_the_thousand_leave_in_bulk_batches() {
    let server = RedisServer::start();
    let redis = Arc::new(redis_backend(&server, "dead").await);
    let n = name("dead");
    const W: u64 = 5000;
    // PURGE_WAITERS in prelude.lua.
    const STEP: u64 = 4096;
    // Long enough that the first waiter is still queued when the last joins, on a machine
    // busy enough to take seconds over the 5,000 acquires (a 1 s TTL let the later steps
    // purge the first waiters before the count: 2,750 of 5,000 once in CI).
    const WAITER_TTL: Duration = Duration::from_secs(10);
    let holder = LeaseId::random();
    redis
        .acquire(&n, 1, &req(holder, 1, LONG, None))
        .await
        .unwrap();
    let waiters: Vec<LeaseId> = (0..W).map(|_| LeaseId::random()).collect();
    for chunk in waiters.chunks(250) {
        let replies = futures::future::join_all(chunk.iter().map(|id| {
            let (redis, n) = (&redis, &n);
            let r = req(*id, 1, LONG, Some((WAITER_TTL, W as u32)));
            async move { redis.acquire(n, 1, &r).await }
        }))
        .await;
        assert!(replies
            .iter()
            .all(|r| matches!(r, Ok(AcquireReply::Queued { .. }))));
    }
    let queued = || -> u64 {
        let reply = server.command(&["ZCARD", "{dead:dead}:queue"]);
        reply.trim().trim_start_matches(':').parse().unwrap()
    };
    assert_eq!(queued(), W);
    // Nobody heartbeats: every waiter is dead after its TTL.
    tokio::time::sleep(WAITER_TTL + Duration::from_millis(300)).await;
    let s = redis.status(&n).await.unwrap().unwrap();
    assert_eq!(queued(), W - STEP);
    assert_eq!(s.queue.len() as u64, W - STEP);
    let s = redis.status(&n).await.unwrap().unwrap();
    assert_eq!((queued(), s.queue.len(), s.used), (0, 0, 1));
    assert!(redis.release(&n, holder).await.unwrap());
    assert!(redis.status(&n).await.unwrap().is_none());
}

/// A line of calls that lasts longer than the response timeout is no fault while the server
/// answers, and keep-alives do not wait at its end. Through a proxy that holds every chunk
/// for 50 ms (at most 16 KB per 50 ms reach the server), 6,000 acquires sent at once take
/// about 7 s to get there, past the 5 s response timeout: every one gets its answer (one
/// grant, the rest no permit), and a renewal sent once the line formed answers before most
/// of them. (Before the lines, the calls handed over past the first 5 s failed with
/// "redis: timed out", as 5,574 of 10,000 acquires did in a CI run on a Cluster; and a
/// renewal would have queued behind every one of them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_line_longer_than_the_response_timeout_is_no_fault_and_keep_alives_pass_it() {
    const N: usize = 6000;
    let server = RedisServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap())
        .await
        .unwrap();
    let redis = Arc::new(
        RedisBackend::connect(&format!("redis://{}?prefix=line", proxy.addr()))
            .await
            .unwrap(),
    );
    let (held, crowd) = (name("held"), name("crowd"));
    let holder = LeaseId::random();
    assert!(matches!(
        redis
            .acquire(&held, 1, &req(holder, 1, LONG, None))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
    proxy.set(Mode::Delay(50));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let line = tokio::spawn({
        let (redis, done) = (redis.clone(), done.clone());
        async move {
            futures::future::join_all((0..N).map(|_| {
                let (redis, crowd, done) = (&redis, &crowd, &done);
                async move {
                    let r = redis
                        .acquire(crowd, 1, &req(LeaseId::random(), 1, LONG, None))
                        .await;
                    done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    r
                }
            }))
            .await
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let renewed = redis.renew(&held, holder, LONG).await.unwrap();
    let answered_before = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(matches!(renewed, RenewReply::Renewed { .. }));
    let replies = line.await.unwrap();
    let failed: Vec<_> = replies.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(
        failed.is_empty(),
        "{} of {N} acquires failed, the first: {}",
        failed.len(),
        failed[0]
    );
    let granted = replies
        .iter()
        .filter(|r| matches!(r, Ok(AcquireReply::Granted(_))))
        .count();
    assert_eq!(granted, 1);
    assert!(
        answered_before < N / 2,
        "the renewal answered after {answered_before} of the {N} acquires ahead of it"
    );
}

/// Heartbeats of many waiters of one semaphore sent at once go to Redis gathered into a few
/// calls of the heartbeat function, and each gets what a heartbeat alone gets
/// (`tessera_testkit::gathered`), its queue entry renewed by its own waiter TTL; a lone
/// heartbeat is one call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_gathered_in_one_call_answer_as_each_alone() {
    let server = RedisServer::start();
    let redis = redis_backend(&server, "beats").await;
    let many = ManyWaiters::queue(&redis).await;
    let before = redis.heartbeat_calls();
    many.heartbeat_all(&redis).await;
    let calls = redis.heartbeat_calls() - before;
    assert!(
        calls <= 10,
        "{} heartbeats took {calls} calls",
        many.beats()
    );
    // Each entry was renewed by its own waiter TTL (queued with 5 s; even ones asked for an
    // hour): the waiters' expiries, in µs, against the server's clock.
    let time = server.command(&["TIME"]);
    let now_s: u64 = time.lines().nth(2).unwrap().trim().parse().unwrap();
    let beyond = (now_s + 600) * 1_000_000;
    let count = |min: &str, max: &str| -> String {
        server
            .command(&["ZCOUNT", "{beats:many}:wexp", min, max])
            .trim()
            .trim_start_matches(':')
            .to_string()
    };
    assert_eq!(
        (
            count(&beyond.to_string(), "+inf"),
            count("-inf", &format!("({beyond}"))
        ),
        ("30".into(), "30".into())
    );
    let before = redis.heartbeat_calls();
    assert_eq!(
        redis
            .heartbeat(&many.name, many.waiters[0], SHORT)
            .await
            .unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(redis.heartbeat_calls() - before, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicting_server_is_refused_on_request_and_passwords_stay_hidden() {
    let server =
        RedisServer::start_with(&["--maxmemory", "100mb", "--maxmemory-policy", "volatile-lru"]);
    // Default: a warning, the store works.
    let store = Store::connect(&server.url()).await.unwrap();
    assert!(store.status("x").await.unwrap().is_none());
    let e = Store::connect(&format!("{}?eviction=refuse", server.url()))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("maxmemory-policy"), "{e}");
    // A user whose ACL refuses CONFIG: the check is skipped, the store works.
    let acl = server.command(&[
        "ACL", "SETUSER", "app", "on", ">s3cret", "~*", "&*", "+@all", "-config",
    ]);
    assert!(acl.starts_with("+OK"), "{acl}");
    let url = format!(
        "redis://app:s3cret@127.0.0.1:{}?eviction=refuse",
        server.port()
    );
    let store = Store::connect(&url).await.unwrap();
    assert!(!format!("{store:?}").contains("s3cret"));
    let sem = store.semaphore("acl", 1).unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    // The least-privilege user documented in the module docs runs every operation.
    let words = "ACL SETUSER least on >pw resetkeys ~{tessera:* resetchannels &tessera:wake:* \
        -@all +evalsha +script|load +subscribe +ping +scan +config|get +time +hmget +hget +hset \
        +hdel +hgetall +zadd +zrem +zrange +zrangebyscore +zrank +zcard +del +get +set \
        +pexpire +publish";
    let words: Vec<&str> = words.split_whitespace().collect();
    assert!(server.command(&words).starts_with("+OK"));
    let url = format!("redis://least:pw@127.0.0.1:{}", server.port());
    let store = Store::connect(&url).await.unwrap();
    let opts = SemaphoreOptions::default().waiter_ttl(Duration::from_secs(60));
    let sem = Semaphore::new(&store, "least", 1, opts).unwrap();
    let held = sem.acquire().await.unwrap();
    let sem2 = sem.clone();
    let waiter = tokio::spawn(async move { sem2.acquire().await });
    wait_queued(&store, "least", 1).await;
    assert_eq!(store.list().await.unwrap(), vec!["least".to_string()]);
    held.release().await.unwrap();
    let p = joined(waiter, Duration::from_secs(5), "the waiter was granted")
        .await
        .unwrap();
    assert_eq!(store.resize("least", 2).await.unwrap(), 1);
    assert!(store
        .revoke("least", &p.lease_id().to_string())
        .await
        .unwrap());
    assert!(!store.delete("least").await.unwrap());
    // A wrong password: an error that never shows it.
    let url = format!("redis://user:hunter2@127.0.0.1:{}", server.port());
    let e = Store::connect(&url).await.unwrap_err();
    assert!(
        !e.to_string().contains("hunter2") && !format!("{e:?}").contains("hunter2"),
        "{e}"
    );
}

/// A release right after the server restarted: the connection it first uses is dead, and
/// the release is tried again on a new one rather than failing (the restarted server kept
/// nothing, so it answers "not held").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_a_restart_reaches_the_store() {
    let mut server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let opts = SemaphoreOptions::default().ttl(Duration::from_secs(3600));
    let sem = Semaphore::new(&store, "rr", 1, opts).unwrap();
    let permit = sem.acquire().await.unwrap();
    server.restart();
    assert!(!permit
        .release()
        .await
        .expect("the release reached the store"));
    let next = sem.try_acquire().await.unwrap();
    assert!(next.is_some(), "the permit is free");
    next.unwrap().release().await.unwrap();
}

/// Two mistakes in a URL that only the server reveals: a database number it does not have
/// is an invalid URL (nothing to retry), and `rediss://` against a plain port says that TLS
/// was expected, where redis-rs only times out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_mistakes_the_server_reveals_get_a_clear_error() {
    let server = RedisServer::start();
    let e = Store::connect(&format!("{}/99", server.url()))
        .await
        .expect_err("database 99 does not exist");
    assert!(
        matches!(e, Error::InvalidInput(InvalidInput::StoreUrl { .. })),
        "{e:?}"
    );
    assert!(e.to_string().contains("no database of that number"), "{e}");
    let tls = server.url().replacen("redis://", "rediss://", 1);
    let e = Store::connect(&tls).await.expect_err("no TLS on this port");
    assert!(e.to_string().contains("expects TLS on this port"), "{e}");
}

/// A port where nothing listens: a connection error that names the URL, password masked,
/// and asks whether the server runs there; no TLS hint, which is for a server that closed
/// the connection (redis-rs counts a refusal as a dropped connection).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url_and_gives_no_tls_hint() {
    let port = tessera_testkit::servers::free_port();
    // (The listener is closed again here: nothing listens on the port.)
    for scheme in ["redis", "rediss"] {
        let url = format!("{scheme}://:hunter2-secret@127.0.0.1:{port}");
        let e = Store::connect(&url).await.expect_err("nothing listens");
        let text = e.to_string();
        assert!(e.is_connection(), "{e:?}");
        assert!(text.contains("nothing accepts connections at"), "{text}");
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(!text.contains("hunter2-secret"), "{text}");
        assert!(!text.contains("TLS"), "{text}");
    }
}

/// Refused credentials: an auth error in the shape of a refused connection, the server's
/// words and a hint naming the URL with its password masked (it named no URL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_auth_error_naming_the_url() {
    let server = RedisServer::start();
    let reply = server.command(&["CONFIG", "SET", "requirepass", "Right-pw-42"]);
    assert!(reply.starts_with("+OK"), "{reply}");
    let port = server.port();
    let right = format!("redis://:Right-pw-42@127.0.0.1:{port}");
    Store::connect(&right).await.expect("the right password");
    for url in [
        format!("redis://:Wrong-pw-42@127.0.0.1:{port}"),
        format!("redis://app:Wrong-pw-42@127.0.0.1:{port}"),
    ] {
        let e = Store::connect(&url).await.unwrap_err();
        assert!(e.is_auth(), "{e:?}");
        let text = e.to_string();
        assert!(text.starts_with("store error (auth): redis: "), "{text}");
        let masked = url.replace("Wrong-pw-42", "***");
        assert!(
            text.ends_with(&format!(
                "(the server refused the credentials: check the user and password of {masked})"
            )),
            "{text}"
        );
        assert!(!format!("{text} {e:?}").contains("Wrong-pw-42"), "{e:?}");
    }
}
