//! The PostgreSQL store against a throwaway server per test (`initdb` + `pg_ctl` from the
//! test kit; a missing PostgreSQL fails the test with the install line). The store must
//! behave like the reference model (`memory://`) operation by operation (the test kit's
//! differential test, on the server's clock: long TTLs, times and fences left out), and
//! survive the server's faults: restarts (fast and immediate), killed backends under a holder,
//! a waiter and the listener, a half-open listener connection, a read-only server or
//! database, a full disk (needs root: a tmpfs tablespace), and garbage in its rows.
#![cfg(feature = "postgres")]

use std::time::Duration;

use tessera::backend::stores::PostgresBackend;
use tessera::backend::*;
use tessera::*;
use tessera_testkit::conformance::joined;
use tessera_testkit::differential::{DiffClock, Differential, Seen};
use tessera_testkit::gathered::{ManyWaiters, SHORT};
use tessera_testkit::seam::{self, name, req, LONG};
use tessera_testkit::servers::fill_pool;
use tessera_testkit::servers::postgres::{PostgresServer, Shutdown};
use tessera_testkit::status_locks::{self, Blocker};

async fn backend(server: &PostgresServer, schema: &str) -> PostgresBackend {
    PostgresBackend::connect(&server.url_with_schema(schema))
        .await
        .unwrap()
}

/// An acquire of `sem` in a task of its own: a waiter while the permit is held.
fn queue_one(sem: &Semaphore) -> tokio::task::JoinHandle<Result<Permit>> {
    let sem = sem.clone();
    tokio::spawn(async move { sem.acquire().await })
}

/// The permit of a waiter started by [`queue_one`], once it is granted (within a minute).
async fn granted(waiter: tokio::task::JoinHandle<Result<Permit>>, why: &str) -> Permit {
    joined(waiter, Duration::from_secs(60), why).await.unwrap()
}

/// A holder of the only permit of `n` (capacity 1) and a waiter queued behind it, both with
/// hour-long TTLs.
async fn hold_and_queue(pg: &PostgresBackend, n: &Name) -> (LeaseId, LeaseId) {
    let (a, w) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        pg.acquire(n, 1, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(matches!(
        pg.acquire(n, 1, &req(w, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { .. }
    ));
    (a, w)
}

/// The URL of a client that stands for another process: it connects as another role, so its
/// backends share a listener (and a client id, a wake-up channel) of their own.
fn peer_url(server: &PostgresServer, schema: &str) -> String {
    server.psql(
        "DO $$ BEGIN CREATE ROLE peer SUPERUSER LOGIN; \
         EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    );
    format!(
        "postgres://peer@127.0.0.1:{}/postgres?schema={schema}",
        server.port()
    )
}

/// The only permit of semaphore `name` (capacity 1), held by a client of another process
/// ([`peer_url`]); the store is returned to keep it connected.
async fn peer_holder(server: &PostgresServer, schema: &str, name: &str) -> (Store, Permit) {
    let peer = Store::connect(&peer_url(server, schema)).await.unwrap();
    let held = Semaphore::new(&peer, name, 1, SemaphoreOptions::default())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    (peer, held)
}

/// A waiter of a new store on `url` is granted after a client of another process releases
/// the only permit of a semaphore in `schema`: the grant reaches it through this process's
/// listener, since its waiter TTL is an hour and its first heartbeat 20 minutes away.
async fn a_peers_release_wakes_a_waiter(
    server: &PostgresServer,
    url: &str,
    schema: &str,
    when: &str,
) {
    let store = Store::connect(url).await.unwrap();
    let opts = SemaphoreOptions::default().waiter_ttl(Duration::from_secs(3600));
    let sem = Semaphore::new(&store, "woken", 1, opts).unwrap();
    let (_peer, held) = peer_holder(server, schema, "woken").await;
    let waiter = queue_one(&sem);
    eventually(30, "the waiter is queued", || {
        server.psql(&format!("SELECT count(*) FROM {schema}.tessera_waiters")) == "1"
    })
    .await;
    held.release().await.unwrap();
    granted(waiter, &format!("woken by the push {when}"))
        .await
        .release()
        .await
        .unwrap();
    store.close().await.unwrap();
}

/// Polls `f` every 20 ms until it holds, for at most `secs`.
async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within {secs}s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The test kit's differential test against the reference model, and after every step: the
/// counters of every semaphore row and its tail (migration 12) equal what its holder and
/// waiter rows sum to (`enqueued - dequeued` waiters), every row has its tail and every tail
/// its row, the lesser of `purge_at` and the tail's `wait_purge_at` is at or before every
/// holder's and waiter's expiry (a step skips the purge before it), and `head_seq` at or
/// below every waiter's seq and at most the tail's `next_seq` (the hand-off looks for the
/// queue head from it up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaves_like_the_memory_model_operation_by_operation() {
    let server = PostgresServer::start();
    let mut seen = Seen::default();
    for seed in 0..4u64 {
        let schema = format!("diff{seed}");
        let pg = backend(&server, &schema).await;
        let mut d = Differential::new(&pg, DiffClock::Server, seed);
        for _ in 0..300 {
            let what = d.step().await;
            let wrong = server.psql(&format!(
                "SELECT count(*) + (SELECT count(*) FROM {schema}.tessera_tails t WHERE NOT EXISTS \
                   (SELECT 1 FROM {schema}.tessera_semaphores s WHERE s.name = t.name)) \
                 FROM {schema}.tessera_semaphores s LEFT JOIN {schema}.tessera_tails t ON t.name = s.name WHERE \
                 t.name IS NULL \
                 OR s.used <> coalesce((SELECT sum(weight) FROM {schema}.tessera_holders h WHERE h.name = s.name), 0) \
                 OR t.enqueued - s.dequeued <> (SELECT count(*) FROM {schema}.tessera_waiters w WHERE w.name = s.name) \
                 OR (s.used = 0 AND t.enqueued = s.dequeued) \
                 OR least(s.purge_at, t.wait_purge_at) > (SELECT min(h.expires_at) FROM {schema}.tessera_holders h WHERE h.name = s.name) \
                 OR least(s.purge_at, t.wait_purge_at) > (SELECT min(w.expires_at) FROM {schema}.tessera_waiters w WHERE w.name = s.name) \
                 OR s.head_seq > t.next_seq \
                 OR s.head_seq > (SELECT min(w.seq) FROM {schema}.tessera_waiters w WHERE w.name = s.name)"
            ));
            assert_eq!(
                wrong, "0",
                "{what} left a semaphore row out of step with its rows"
            );
        }
        seen.add(&d);
    }
    seen.assert_every_answer_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holders_and_waiters_are_purged_and_the_queue_moves_on() {
    let server = PostgresServer::start();
    let pg = backend(&server, "expiry").await;
    seam::expired_holders_and_waiters_are_purged(&pg).await;
}

/// A status reads one snapshot without the row lock when the step would change nothing
/// (`stores/sql/snapshot.rs`): while another session holds the semaphore's row with
/// `SELECT … FOR UPDATE` in an open transaction, it answers the holders and the queue.
/// Before, it was a step and waited for the row lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_answers_while_the_row_is_locked_by_another_session() {
    let server = PostgresServer::start();
    let pg = backend(&server, "locked").await;
    let lock = "SELECT * FROM locked.tessera_semaphores WHERE name = 'locked' FOR UPDATE";
    status_locks::semaphore_status_answers_while_locked(&pg, &name("locked"), async || {
        Blocker::postgres(&server.url(), lock).await
    })
    .await;
}

/// A limiter's status reads one snapshot without the row lock (`stores/sql/rate_snapshot.rs`):
/// while another session holds the limiter's row with `SELECT … FOR UPDATE` in an open
/// transaction, it answers. Before, it was `tessera_rate_status`, which waited for the row
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_status_answers_while_the_row_is_locked_by_another_session() {
    let server = PostgresServer::start();
    let pg = backend(&server, "ratelocked").await;
    let lock = "SELECT * FROM ratelocked.tessera_rate_limiters WHERE name = 'r' FOR UPDATE";
    status_locks::rate_status_answers_while_locked(&pg, &name("r"), async || {
        Blocker::postgres(&server.url(), lock).await
    })
    .await;
}

/// A limiter's status when something is due (a prune, an expiry) is the reference model's,
/// and so are the acquires after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_status_when_something_is_due_is_the_models() {
    let server = PostgresServer::start();
    let pg = backend(&server, "ratedue").await;
    status_locks::rate_status_when_something_is_due_is_the_models(&pg, &name("r"), async |d| {
        tokio::time::sleep(d).await
    })
    .await;
}

/// A limiter's status locks nothing and writes nothing, even with a prune due: the row keeps
/// its `xmax` (a `SELECT … FOR UPDATE` sets it to the locking transaction's id, so every
/// status that was `tessera_rate_status` changed it) and the log keeps the entry a prune
/// would delete (the next acquire deletes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_status_leaves_the_row_unlocked_and_the_log_unpruned() {
    let server = PostgresServer::start();
    let pg = backend(&server, "rateread").await;
    let n = name("r");
    let config = RateConfig::new(&["2/1s".parse().unwrap()], RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    pg.rate_acquire(&n, &config, &one).await.unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    pg.rate_acquire(&n, &config, &one).await.unwrap();
    // The first entry is older than the window: due to be pruned; the state lives on.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let read = || {
        server.psql(
            "SELECT xmax || ' ' || (SELECT count(*) FROM rateread.tessera_rate_log) \
             FROM rateread.tessera_rate_limiters WHERE name = 'r'",
        )
    };
    let before = read();
    assert!(before.ends_with(" 2"), "{before}");
    for _ in 0..5 {
        let status = pg.rate_status(&n).await.unwrap().expect("state");
        assert_eq!(status.limits[0].used, 1, "{status:?}");
    }
    assert_eq!(read(), before, "a status locked the row or pruned the log");
    pg.rate_acquire(&n, &config, &one).await.unwrap();
    assert!(read().ends_with(" 2"), "{}", read());
}

/// A status with nothing due locks nothing: the semaphore's row keeps its `xmax` (a
/// `SELECT … FOR UPDATE` sets it to the locking transaction's id, so every status that was a
/// step changed it) and no transaction id is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_with_nothing_due_leaves_the_row_unlocked() {
    let server = PostgresServer::start();
    let pg = backend(&server, "unlocked").await;
    let n = name("unlocked");
    hold_and_queue(&pg, &n).await;
    let xmax =
        || server.psql("SELECT xmax FROM unlocked.tessera_semaphores WHERE name = 'unlocked'");
    let before = xmax();
    for _ in 0..5 {
        let status = pg.status(&n).await.unwrap().unwrap();
        assert_eq!((status.used, status.queue.len()), (1, 1));
    }
    assert_eq!(xmax(), before, "a status locked the semaphore's row");
}

/// The status of an expired holder and a waiter is the step's hand-off (see the testkit's
/// `seam::status_of_an_expired_holder_is_the_steps_hand_off`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_an_expired_holder_and_a_waiter_is_the_steps_hand_off() {
    let server = PostgresServer::start();
    let pg = backend(&server, "due").await;
    seam::status_of_an_expired_holder_is_the_steps_hand_off(&pg).await;
}

/// Several processes (here: backends) migrating one schema at once run each migration once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_migrate_once() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("race");
    let connects: Vec<_> = (0..6)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PostgresBackend::connect(&url).await })
        })
        .collect();
    for c in connects {
        c.await.unwrap().unwrap();
    }
    assert_eq!(
        server.psql(
            "SELECT string_agg(version::text, ',' ORDER BY version) FROM race.tessera_migrations"
        ),
        "1,2,3,4,5,6,7,8,9,10,11,12"
    );
}

/// A grant made by another process reaches a waiter through NOTIFY on its own channel, also
/// after its listener's backend was killed (the listener reconnects and every waiter checks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_after_its_listener_backend_is_killed() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("wake");
    let store = Store::connect(&url).await.unwrap();
    let sem = Semaphore::new(&store, "w", 1, SemaphoreOptions::default()).unwrap();
    let (_peer, held) = peer_holder(&server, "wake", "w").await;
    let waiter = queue_one(&sem);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(server.terminate("tessera-listener") >= 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    let got = joined(waiter, Duration::from_secs(10), "the waiter was granted")
        .await
        .unwrap();
    got.release().await.unwrap();
    store.close().await.unwrap();
}

/// What reaches a waiter's wake-up channel up to a marker sent after the step under test:
/// notifications of different sessions arrive in commit order, so whatever the step
/// notified comes before the marker.
async fn heard_until_marker(
    server: &PostgresServer,
    channel: &mut sqlx::postgres::PgListener,
    name: &str,
) -> Vec<String> {
    server.psql(&format!("SELECT pg_notify('{name}', 'marker')"));
    let mut heard = Vec::new();
    loop {
        let n = tokio::time::timeout(Duration::from_secs(30), channel.recv())
            .await
            .expect("the marker arrives")
            .unwrap();
        if n.payload() == "marker" {
            return heard;
        }
        heard.push(n.payload().to_string());
    }
}

/// A release that grants a waiter of its own process hands the grant back in its reply and
/// wakes the waiter from it: nothing goes out on the waiter's channel. A release by another
/// process notifies the waiter on its channel, as does the two-argument release that builds
/// before migration 5 call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_its_own_process_grants_in_the_reply_and_notifies_others() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("local");
    let store = Store::connect(&url).await.unwrap();
    let opts = SemaphoreOptions::default().waiter_ttl(Duration::from_secs(3600));
    let sem = Semaphore::new(&store, "l", 1, opts).unwrap();
    let queued = |n: &'static str| {
        let server = &server;
        async move {
            eventually(30, "the waiter is queued", || {
                server.psql("SELECT count(*) FROM local.tessera_waiters") == n
            })
            .await
        }
    };

    // Same process: the grant travels in the release's reply.
    let held = sem.acquire().await.unwrap();
    let waiter = queue_one(&sem);
    queued("1").await;
    let channel_name = format!(
        "tessera_w{}",
        server.psql("SELECT client FROM local.tessera_waiters")
    );
    let mut channel = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    channel.listen(&channel_name).await.unwrap();
    held.release().await.unwrap();
    let got = granted(waiter, "its heartbeat is 20 minutes away").await;
    assert_eq!(
        heard_until_marker(&server, &mut channel, &channel_name).await,
        Vec::<String>::new(),
        "a grant to a waiter of the releasing process went out as a NOTIFY"
    );

    // Another process releases: the grant is notified on the waiter's channel.
    let waiter = queue_one(&sem);
    queued("1").await;
    let lease = server.psql("SELECT lease_id FROM local.tessera_waiters");
    let peer = PostgresBackend::connect(&peer_url(&server, "local"))
        .await
        .unwrap();
    assert!(peer.release(&name("l"), got.lease_id()).await.unwrap());
    let heard = heard_until_marker(&server, &mut channel, &channel_name).await;
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert!(heard[0].starts_with(&format!("{lease}\t")), "{heard:?}");
    let got = granted(waiter, "notified by another process").await;

    // The release of older builds: every grant is notified.
    let waiter = queue_one(&sem);
    queued("1").await;
    let lease = server.psql("SELECT lease_id FROM local.tessera_waiters");
    assert_eq!(
        server.psql(&format!(
            "SET search_path TO local; SELECT tessera_release('l', '{}')",
            got.lease_id()
        )),
        "t"
    );
    let heard = heard_until_marker(&server, &mut channel, &channel_name).await;
    assert_eq!(heard.len(), 1, "{heard:?}");
    assert!(heard[0].starts_with(&format!("{lease}\t")), "{heard:?}");
    let got = granted(waiter, "notified by the two-argument release").await;
    got.release().await.unwrap();
    store.close().await.unwrap();
}

/// Killing the pool's backends under a holder and a waiter: the holder keeps its lease (the
/// keeper renews on a new connection), the waiter is still served, nothing is over-granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_waiters_survive_killed_backends() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("kill");
    let store = Store::connect(&url).await.unwrap();
    let opts = SemaphoreOptions::default().ttl(Duration::from_secs(1));
    let sem = Semaphore::new(&store, "k", 1, opts).unwrap();
    let held = sem.acquire().await.unwrap();
    let waiter = queue_one(&sem);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        server.terminate("tessera");
    }
    // Across five kills (2 s, twice the TTL) the holder's lease stayed held.
    // The call right after a kill may meet the killed connection: a transient error.
    let mut status = None;
    for _ in 0..20 {
        match store.status("k").await {
            Ok(s) => {
                status = s;
                break;
            }
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
    }
    let status = status.expect("a status");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].lease_id, held.lease_id());
    assert!(!held.is_lost());
    held.release().await.unwrap();
    let got = joined(waiter, Duration::from_secs(10), "the waiter was granted")
        .await
        .unwrap();
    got.release().await.unwrap();
}

/// Every session terminated at once (as `pg_terminate_backend` of them all, a restart or a
/// network cut does): the first call meets a dead connection, and the idle ones are then
/// pinged before use, so the next call gets a live one. Without that, each of the four idle
/// connections failed one call in turn, which cost a renewing lease four retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_every_session_is_terminated_one_call_at_most_meets_a_dead_connection() {
    let server = PostgresServer::start();
    let pg = backend(&server, "cut").await;
    let n = name("cut");
    let open = || {
        server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tessera'")
            .parse::<usize>()
            .unwrap()
    };
    let (pg, n) = (&pg, &n);
    for round in 0..2 {
        // Four calls at once leave up to four idle connections, the backend's limit.
        fill_pool(4, open, move || async move {
            let (a, b, c, d) = tokio::join!(pg.status(n), pg.status(n), pg.status(n), pg.status(n));
            for r in [a, b, c, d] {
                assert!(r.unwrap().is_none());
            }
        })
        .await;
        assert!(server.terminate("tessera") >= 4, "round {round}");
        let mut failed = 0;
        for _ in 0..4 {
            match pg.status(n).await {
                Ok(s) => assert!(s.is_none()),
                Err(e) => {
                    assert!(e.is_transient(), "{e:?}");
                    failed += 1;
                }
            }
        }
        assert!(
            failed <= 1,
            "round {round}: {failed} of 4 calls failed after the kill"
        );
    }
}

/// A renewal or a heartbeat that meets a connection the server ended while it sat idle runs
/// again at once on a live one: a keep-alive never fails for a dead idle connection alone.
/// Before, the first renewal of each lease after `pg_terminate_backend` of every session
/// failed and waited the lease keeper's retry interval, which cost hand-off grants (granted
/// for what was left of their waiter's entry) their lease in the chaos runner's
/// `s9-client-kill`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keep_alive_that_meets_a_dead_idle_connection_goes_through_on_a_live_one() {
    let server = PostgresServer::start();
    let pg = backend(&server, "keepdead").await;
    let n = name("keepdead");
    let (holder, waiter) = hold_and_queue(&pg, &n).await;
    let open = || {
        server
            .psql("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tessera'")
            .parse::<usize>()
            .unwrap()
    };
    let (pg, n) = (&pg, &n);
    let fill = || {
        fill_pool(4, open, move || async move {
            let (a, b, c, d) = tokio::join!(pg.status(n), pg.status(n), pg.status(n), pg.status(n));
            for r in [a, b, c, d] {
                assert!(r.unwrap().is_some());
            }
        })
    };
    for round in 0..3 {
        fill().await;
        assert!(server.terminate("tessera") >= 4, "round {round}");
        let renewed = pg.renew(n, holder, LONG).await;
        assert!(
            matches!(renewed, Ok(RenewReply::Renewed { .. })),
            "round {round}: the renewal failed: {renewed:?}"
        );
        fill().await;
        assert!(server.terminate("tessera") >= 4, "round {round}");
        let beat = pg.heartbeat(n, waiter, LONG).await;
        assert!(
            matches!(beat, Ok(WaitReply::Waiting)),
            "round {round}: the heartbeat failed: {beat:?}"
        );
    }
}

/// Keep-alives have connections of their own: with every operation connection of a backend
/// waiting on a semaphore's row lock (and more operations queued for one), a holder's renewal
/// and a waiter's heartbeat on another semaphore still go through at once. Before, they
/// queued behind the operations: a process that queued thousands of acquires at once delayed
/// its own waiters' heartbeats past their TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alives_pass_operations_waiting_for_connections() {
    use sqlx::Connection;
    let server = PostgresServer::start();
    let pg = std::sync::Arc::new(backend(&server, "keep").await);
    let (kept, busy) = (name("kept"), name("busy"));
    let (holder, waiter) = hold_and_queue(&pg, &kept).await;
    hold_and_queue(&pg, &busy).await;
    let mut blocker = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::raw_sql("BEGIN; SELECT * FROM keep.tessera_semaphores WHERE name = 'busy' FOR UPDATE")
        .execute(&mut blocker)
        .await
        .unwrap();
    let blocked: Vec<_> = (0..6)
        .map(|_| {
            let (pg, busy) = (pg.clone(), busy.clone());
            tokio::spawn(async move {
                pg.acquire(&busy, 1, &req(LeaseId::random(), 1, LONG, None))
                    .await
            })
        })
        .collect();
    let waiting = || {
        server.psql(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tessera' \
             AND wait_event_type = 'Lock'",
        )
    };
    eventually(20, "four operations waiting on the row lock", || {
        waiting() == "4"
    })
    .await;
    let beat = tokio::time::timeout(Duration::from_secs(4), async {
        (
            pg.renew(&kept, holder, LONG).await,
            pg.heartbeat(&kept, waiter, LONG).await,
        )
    })
    .await
    .expect("the keep-alives waited behind the blocked operations");
    assert!(
        matches!(beat.0, Ok(RenewReply::Renewed { .. })),
        "{:?}",
        beat.0
    );
    assert_eq!(beat.1.unwrap(), WaitReply::Waiting);
    assert_eq!(waiting(), "4", "the operations were not blocked throughout");
    sqlx::raw_sql("COMMIT").execute(&mut blocker).await.unwrap();
    // The blocked tries end refused (or, on a machine slow enough, timed out): never granted.
    for op in blocked {
        match op.await.unwrap() {
            Ok(reply) => assert!(matches!(reply, AcquireReply::NoPermit { .. }), "{reply:?}"),
            Err(e) => assert!(e.is_transient(), "{e:?}"),
        }
    }
}

/// A restart (fast, then immediate: crash recovery) keeps every lease: PostgreSQL is durable,
/// and the clients reconnect by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_survive_fast_and_immediate_restarts() {
    let mut server = PostgresServer::start();
    let url = server.url_with_schema("restart");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("r");
    let a = LeaseId::random();
    let AcquireReply::Granted(first) = pg.acquire(&n, 2, &req(a, 1, LONG, None)).await.unwrap()
    else {
        panic!("not granted")
    };
    for mode in [Shutdown::Fast, Shutdown::Immediate] {
        server.restart_with(mode);
        // The first call on a pooled connection of the old server may fail; retry.
        let mut renewed = None;
        for _ in 0..50 {
            match pg.renew(&n, a, LONG).await {
                Ok(r) => {
                    renewed = Some(r);
                    break;
                }
                Err(e) => {
                    assert!(e.is_transient(), "{e:?}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
        assert!(
            matches!(renewed, Some(RenewReply::Renewed { .. })),
            "{mode:?}"
        );
    }
    let b = LeaseId::random();
    let AcquireReply::Granted(second) = pg.acquire(&n, 2, &req(b, 1, LONG, None)).await.unwrap()
    else {
        panic!("not granted")
    };
    assert!(second.lease.fence > first.lease.fence);
    assert_eq!(second.lease.seats, vec![1]);
    assert!(matches!(
        pg.acquire(&n, 2, &req(LeaseId::random(), 1, LONG, None))
            .await
            .unwrap(),
        AcquireReply::NoPermit { .. }
    ));
}

/// A read-only server refuses what writes with a clear error and grants nothing; once
/// writable again, everything works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_refuses_writes_and_grants_nothing() {
    let server = PostgresServer::start();
    let pg = backend(&server, "ro").await;
    let n = name("ro");
    server.set_read_only(true);
    // Existing sessions see the new default at their next transaction.
    let mut refused = None;
    for _ in 0..50 {
        match pg
            .acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
            .await
        {
            Err(e) => {
                refused = Some(e);
                break;
            }
            Ok(_) => {
                pg.delete(&n).await.ok();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    let e = refused.expect("a read-only server refused the acquire");
    assert!(e.to_string().contains("read-only"), "{e}");
    server.set_read_only(false);
    assert!(matches!(
        pg.acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
}

/// Garbage written into tessera's rows is a typed `Corrupt` error, never a panic and never a
/// grant beyond the capacity.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_rows_is_corrupt_never_a_panic_or_an_over_grant() {
    let server = PostgresServer::start();
    let pg = backend(&server, "bad").await;
    let n = name("g");
    let damage = [
        "UPDATE bad.tessera_semaphores SET capacity = -3",
        "UPDATE bad.tessera_semaphores SET used = -1",
        "UPDATE bad.tessera_semaphores SET seat_high = 99999999",
        "UPDATE bad.tessera_holders SET seats = '{7,7}'",
        "UPDATE bad.tessera_holders SET weight = 0",
        "UPDATE bad.tessera_holders SET lease_id = 'zz', expires_at = 0",
        "UPDATE bad.tessera_holders SET expires_at = 0, seats = '{-5}'",
        "UPDATE bad.tessera_waiters SET lease_id = 'not a lease'",
        "UPDATE bad.tessera_meta SET value = -1",
        "DELETE FROM bad.tessera_meta",
    ];
    for sql in damage {
        pg.delete(&n).await.unwrap();
        server.psql("INSERT INTO bad.tessera_meta VALUES ('fence_hwm', 0) ON CONFLICT DO NOTHING");
        server.psql("UPDATE bad.tessera_meta SET value = greatest(value, 0)");
        let (a, w) = hold_and_queue(&pg, &n).await;
        server.psql(sql);
        let mut granted = 0;
        for op in 0..4 {
            let r = match op {
                0 => pg.release(&n, a).await.map(|_| ()),
                1 => pg.heartbeat(&n, w, LONG).await.map(|r| {
                    granted += matches!(r, WaitReply::Granted(_)) as u32;
                }),
                2 => pg.status(&n).await.map(|_| ()),
                _ => pg
                    .acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
                    .await
                    .map(|r| granted += matches!(r, AcquireReply::Granted(_)) as u32),
            };
            if let Err(e) = r {
                assert!(e.is_corrupt(), "{sql}: op {op}: {e:?}");
            }
        }
        assert!(granted <= 1, "{sql}: {granted} grants on a capacity of 1");
    }
    // Delete clears a damaged semaphore.
    assert!(pg.delete(&n).await.is_ok());
}

/// A connection black-holed by the fault proxy fails the call within the response timeout
/// (typed, transient), and the store works again once the path heals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_black_holed_connection_times_out_and_recovers() {
    use tessera_testkit::proxy::{Mode, Proxy};
    let server = PostgresServer::start();
    let proxy = Proxy::start(format!("127.0.0.1:{}", server.port()).parse().unwrap())
        .await
        .unwrap();
    let url = format!("postgres://postgres@{}/postgres?schema=hole", proxy.addr());
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("h");
    let a = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 1, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    proxy.set(Mode::Blackhole);
    let e = pg.renew(&n, a, LONG).await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    proxy.set(Mode::Pass);
    let mut ok = false;
    for _ in 0..50 {
        if let Ok(RenewReply::Renewed { .. }) = pg.renew(&n, a, LONG).await {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ok, "renewals work again after the black hole");
    // The listener was black-holed too (a store of this process on the same URL shares it):
    // it noticed (a ping went unanswered) and was rebuilt, or it still works; either way a
    // grant by another process wakes a waiter whose heartbeat is 20 minutes away.
    a_peers_release_wakes_a_waiter(&server, &url, "hole", "after the black hole").await;
}

/// Drops the rate functions of migration 3 from `schema` (what a schema migrated by a build
/// before migration 3 lacks).
fn drop_rate_functions(server: &PostgresServer, schema: &str) {
    server.psql(&format!(
        "DO $$ DECLARE f regprocedure; BEGIN \
         FOR f IN SELECT p.oid::regprocedure FROM pg_proc p \
           JOIN pg_namespace n ON n.oid = p.pronamespace \
           WHERE n.nspname = '{schema}' AND p.proname LIKE 'tessera%rate%' \
         LOOP EXECUTE 'DROP FUNCTION ' || f; END LOOP; END $$"
    ));
    assert_eq!(
        server.psql(&format!(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
             WHERE n.nspname = '{schema}' AND p.proname LIKE 'tessera%rate%'"
        )),
        "0"
    );
}

fn versions(server: &PostgresServer, schema: &str) -> String {
    server.psql(&format!(
        "SELECT string_agg(version::text, ',' ORDER BY version) FROM {schema}.tessera_migrations"
    ))
}

/// A schema migrated by an older build gains what it lacks at the next connect: at version 1
/// (no rate tables) migrations 2 and 3; at version 2 (the tables, with state written by the
/// client-side step of that build, and no functions) migration 3, and the functions honour
/// the state already there. Running migrations 2 and 3 again over a schema that has their
/// tables and functions changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_schema_gains_the_rate_tables_and_functions_and_migrations_are_idempotent() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("old");
    drop(PostgresBackend::connect(&url).await.unwrap());
    drop_rate_functions(&server, "old");
    server.psql(
        "DROP TABLE old.tessera_rate_log, old.tessera_rate_limiters; \
         DELETE FROM old.tessera_migrations WHERE version >= 2",
    );
    assert_eq!(versions(&server, "old"), "1");
    // An hour's window: the admission below still binds at the end of the test.
    let limits = ["2/h".parse().unwrap()];
    let config = RateConfig::new(&limits, RateMode::Exact).unwrap();
    let cost2 = RateRequest {
        cost: 2,
        max_wait: None,
        update: false,
    };
    let n = name("upgraded");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "old"), "1,2,3,4,5,6,7,8,9,10,11,12");
    let at = match pg.rate_acquire(&n, &config, &cost2).await.unwrap() {
        RateReply::Admitted { at, .. } => at,
        other => panic!("{other:?}"),
    };
    let hour = 3_600_000_000;
    // Version 2 with state in its tables (the row and log the client-side step wrote in the
    // same columns), no functions: migration 3 installs them and they read that state.
    drop_rate_functions(&server, "old");
    server.psql("DELETE FROM old.tessera_migrations WHERE version >= 3");
    let v2 = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "old"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert!(matches!(
        v2.rate_acquire(&n, &config, &cost2).await.unwrap(),
        RateReply::Limited { retry_at, .. } if retry_at.0 == at.0 + hour
    ));
    // Versions 2 and 3 forgotten, tables and functions kept: both run again over them.
    server.psql("DELETE FROM old.tessera_migrations WHERE version >= 2");
    let again = PostgresBackend::connect(&url).await.unwrap();
    assert!(matches!(
        again.rate_acquire(&n, &config, &cost2).await.unwrap(),
        RateReply::Limited { retry_at, .. } if retry_at.0 == at.0 + hour
    ));
    assert_eq!(versions(&server, "old"), "1,2,3,4,5,6,7,8,9,10,11,12");
}

/// Heartbeats of many waiters of one semaphore that arrive together go to the server in a
/// few calls (`tessera_heartbeat_many`), and each waiter gets what a heartbeat of its own
/// gets (`tessera_testkit::gathered`), its queue entry renewed by its own waiter TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_gathered_in_one_call_answer_as_each_alone() {
    let server = PostgresServer::start();
    let pg = backend(&server, "beats").await;
    let many = ManyWaiters::queue(&pg).await;
    let before = pg.heartbeat_calls();
    many.heartbeat_all(&pg).await;
    let calls = pg.heartbeat_calls() - before;
    assert!(
        calls <= 10,
        "{} heartbeats took {calls} calls",
        many.beats()
    );
    // Each entry was renewed by its own waiter TTL (enqueued with 5 s).
    let renewed = |long: bool| {
        server.psql(&format!(
            "SELECT count(*) FROM beats.tessera_waiters WHERE name = 'many' \
             AND (expires_at - enqueued_at > 600000000) = {long}"
        ))
    };
    assert_eq!((renewed(true), renewed(false)), ("30".into(), "30".into()));
    // One lone heartbeat is a call of its own, sent at once.
    let before = pg.heartbeat_calls();
    assert_eq!(
        pg.heartbeat(&many.name, many.waiters[0], SHORT)
            .await
            .unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(pg.heartbeat_calls() - before, 1);
}

/// A schema whose step is older than this build's (a build of before step revisions: no
/// `tessera__step_revision()`, the hand-off granting a whole TTL) gets this build's step at
/// the next connect, without a migration: the tables' version stays where builds that know
/// the same tables read it, so they keep connecting beside this one (rolling upgrades).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_step_is_created_again_without_a_migration() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("step");
    drop(PostgresBackend::connect(&url).await.unwrap());
    let revision = || server.psql("SELECT step.tessera__step_revision()");
    let hand_off = || {
        server.psql(
            "SELECT prosrc LIKE '%lasts := least(h.ttl, h.expires_at - st.now_us)%' \
             FROM pg_proc WHERE proname = 'tessera__hand_off'",
        )
    };
    let settle = || server.psql("SELECT count(*) FROM pg_proc WHERE proname = 'tessera_settle'");
    assert_eq!(revision(), "11");
    assert_eq!(hand_off(), "t");
    assert_eq!(settle(), "1");
    server.psql(
        "DROP FUNCTION step.tessera__step_revision(); \
         DROP FUNCTION step.tessera_settle(text, text, bigint, bigint, bigint, bigint, text); \
         CREATE OR REPLACE FUNCTION step.tessera__hand_off(st step.tessera_step) \
         RETURNS step.tessera_step LANGUAGE plpgsql AS $$ BEGIN RETURN st; END $$",
    );
    assert_eq!(hand_off(), "f");
    assert_eq!(settle(), "0");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(revision(), "11");
    assert_eq!(hand_off(), "t");
    // Revision 5's function, created again with the step (a schema of revision 4 has none).
    assert_eq!(settle(), "1");
    assert_eq!(versions(&server, "step"), "1,2,3,4,5,6,7,8,9,10,11,12");
    // The step works: a hand-off grant runs until the waiter's entry would have expired.
    let n = name("again");
    let (a, b) = (LeaseId::random(), LeaseId::random());
    let long = Duration::from_secs(60);
    assert!(matches!(
        pg.acquire(&n, 1, &req(a, 1, long, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let waiter_ttl = Duration::from_secs(5);
    assert!(matches!(
        pg.acquire(&n, 1, &req(b, 1, long, Some((waiter_ttl, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { .. }
    ));
    assert!(pg.release(&n, a).await.unwrap());
    let WaitReply::Granted(g) = pg.heartbeat(&n, b, waiter_ttl).await.unwrap() else {
        panic!("the waiter was not handed the permit")
    };
    assert!(g.lease.expires_at <= g.lease.acquired_at.plus(waiter_ttl));
}

/// A schema at version 7 with waiters queued gains fair shares' tags (migration 8) at the
/// next connect: the waiters queued before keep their order (their tags start at 0) and later
/// arrivals, with a tenant or without, queue behind them; a process of an older build calls
/// `tessera_acquire` with its old arguments, which resolve to the new function as a request
/// without a tenant (the rolling upgrade of `docs/stores/postgres.md`, "Fair shares").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_queued_before_fair_shares_keep_their_order_and_an_older_call_is_fifo() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("pre");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("kept");
    let (a, w1) = hold_and_queue(&pg, &n).await;
    let w2 = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 1, &req(w2, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 1 }
    ));
    drop(pg);
    back_to_migration_11(&server, "pre");
    // What a build of migration 7 left: no tags, no tenants.
    server.psql(
        "ALTER TABLE pre.tessera_waiters DROP COLUMN tag, DROP COLUMN tenant; \
         ALTER TABLE pre.tessera_holders DROP COLUMN tenant; \
         ALTER TABLE pre.tessera_semaphores DROP COLUMN vtime, DROP COLUMN finish, \
           DROP COLUMN tenants; \
         DROP TABLE pre.tessera_tenants; \
         ALTER TYPE pre.tessera_step DROP ATTRIBUTE vtime, DROP ATTRIBUTE finish, \
           DROP ATTRIBUTE tenants; \
         DELETE FROM pre.tessera_migrations WHERE version >= 8",
    );
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "pre"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert!(pg.capabilities().fair_shares);
    let t = LeaseId::random();
    let mut tenant = req(t, 1, LONG, Some((LONG, 10)));
    tenant.tenant = Some(Tenant::new("billing", 3).unwrap());
    assert_eq!(
        pg.acquire(&n, 1, &tenant).await.unwrap(),
        AcquireReply::Queued { position: 2 }
    );
    let w3 = LeaseId::random();
    assert_eq!(
        pg.acquire(&n, 1, &req(w3, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 3 }
    );
    // An older build's call: nine arguments, no tenant.
    let old = LeaseId::random();
    assert_eq!(
        server.psql(&format!(
            "SET search_path TO pre; \
             SELECT outcome || ' ' || \"position\" FROM tessera_acquire('kept', 1, '{old}', \
             1, 3600000000, 'old', '', 3600000000, 10)"
        )),
        "queued 4"
    );
    let queue = |s: SemaphoreStatus| s.queue.iter().map(|w| w.lease_id).collect::<Vec<_>>();
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(queue(status), [w1, w2, t, w3, old]);
    // The hand-off follows that order.
    assert!(pg.release(&n, a).await.unwrap());
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, w1);
    assert_eq!(queue(status), [w2, t, w3, old]);
}

/// A schema at version 8 with a waiter queued gains the tenant on waiters and holders
/// (migration 9) at the next connect, while a process of the previous build stays connected:
/// its prepared statements, which name the previous columns, are planned again against the
/// new functions (dropped and created again with one more column) and keep working, its
/// tenant's waiter keeps its tenant, and the waiter queued before has none (the rolling
/// upgrade of `docs/stores/postgres.md`, "Fair shares").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connected_process_of_the_previous_build_keeps_working_across_migration_9() {
    use sqlx::{Connection, Row};
    let server = PostgresServer::start();
    let url = server.url_with_schema("nine");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("kept");
    let (a, w1) = hold_and_queue(&pg, &n).await;
    drop(pg);
    // What a build of migration 8 left: no tenant columns, and functions without the result
    // column `tenant` (here the heartbeat's, in its previous shape, answering 'waiting').
    server.psql(
        "ALTER TABLE nine.tessera_waiters DROP COLUMN tenant; \
         ALTER TABLE nine.tessera_holders DROP COLUMN tenant; \
         DROP FUNCTION nine.tessera_heartbeat(text, text, bigint); \
         CREATE FUNCTION nine.tessera_heartbeat(p_name text, p_lease text, p_ttl bigint) \
         RETURNS TABLE (outcome text, now_us bigint, weight bigint, seats int4[], \
           fence bigint, holder text, acquired_at bigint, expires_at bigint) \
         LANGUAGE sql AS $$ SELECT 'waiting'::text, 0::bigint, NULL::bigint, NULL::int4[], \
           NULL::bigint, NULL::text, NULL::bigint, NULL::bigint $$; \
         DELETE FROM nine.tessera_migrations WHERE version >= 9",
    );
    // The previous build's process: its statements, prepared (and cached) before the upgrade.
    let mut old = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::query("SET search_path TO nine")
        .execute(&mut old)
        .await
        .unwrap();
    async fn heartbeat(old: &mut sqlx::PgConnection, lease: LeaseId) -> String {
        sqlx::query(
            "SELECT outcome, now_us, weight, seats, fence, holder, acquired_at, expires_at \
             FROM tessera_heartbeat($1, $2, $3)",
        )
        .bind("kept")
        .bind(lease.to_string())
        .bind(3_600_000_000i64)
        .fetch_one(old)
        .await
        .unwrap()
        .get("outcome")
    }
    assert_eq!(heartbeat(&mut old, w1).await, "waiting");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "nine"), "1,2,3,4,5,6,7,8,9,10,11,12");
    // The previous build's acquire with a tenant: its columns, the new function.
    let t = LeaseId::random();
    let row = sqlx::query(
        "SELECT outcome, \"position\" FROM tessera_acquire($1, 1, $2, 1, 3600000000, 'old', \
         '', 3600000000, 10, 'billing', 2)",
    )
    .bind("kept")
    .bind(t.to_string())
    .fetch_one(&mut old)
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("outcome"), "queued");
    let status = pg.status(&n).await.unwrap().unwrap();
    let queue: Vec<_> = status
        .queue
        .iter()
        .map(|w| (w.lease_id, w.tenant.as_deref()))
        .collect();
    // The tenant starts at the virtual time, ahead of w1 (queued behind the holder's tag).
    assert_eq!(queue, [(t, Some("billing")), (w1, None)]);
    // The hand-off grants t; the cached heartbeat statement, planned again, reads it.
    assert!(pg.release(&n, a).await.unwrap());
    assert_eq!(heartbeat(&mut old, t).await, "granted");
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, t);
    assert_eq!(status.holders[0].tenant.as_deref(), Some("billing"));
    let WaitReply::Granted(g) = pg.heartbeat(&n, t, LONG).await.unwrap() else {
        panic!("the tenant's waiter was not handed the permit")
    };
    assert_eq!(g.lease.tenant.as_deref(), Some("billing"));
    // The waiter queued before the upgrade is granted without a tenant.
    assert!(pg.release(&n, t).await.unwrap());
    assert_eq!(heartbeat(&mut old, w1).await, "granted");
    let WaitReply::Granted(g) = pg.heartbeat(&n, w1, LONG).await.unwrap() else {
        panic!("w1 was not handed the permit")
    };
    assert_eq!(g.lease.tenant, None);
}

/// A schema at version 9 with a holder and a waiter gains tenants' ceilings and floors
/// (migration 10) at the next connect, while a process of the previous build stays connected:
/// the rows are kept, the table `tessera_limits` and the row's count `limits` come, and the
/// previous build's statements (no function changed its arguments or its result columns),
/// one of them cached before the upgrade, keep working against the new functions, whose
/// requests get the limits set after it (the rolling upgrade of `docs/stores/postgres.md`,
/// "Ceilings and floors").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connected_process_of_the_previous_build_keeps_working_across_migration_10() {
    use sqlx::{Connection, Row};
    let server = PostgresServer::start();
    let url = server.url_with_schema("ten");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("kept");
    let (a, w1) = hold_and_queue(&pg, &n).await;
    drop(pg);
    // What a build of migration 9 left: no limits (table, count, bound, index, state, set
    // function); its heartbeat here a stub of the same shape answering 'waiting'.
    server.psql(
        "DROP TABLE ten.tessera_limits; DROP INDEX ten.tessera_waiters_by_tenant; \
         DROP FUNCTION ten.tessera_set_tenant_limits(text, text, bigint, bigint, text, bigint); \
         ALTER TABLE ten.tessera_semaphores DROP COLUMN limits, DROP COLUMN tag_low; \
         ALTER TYPE ten.tessera_step DROP ATTRIBUTE limits, DROP ATTRIBUTE low, \
           DROP ATTRIBUTE lim_tenant, DROP ATTRIBUTE lim_ceiling, DROP ATTRIBUTE lim_floor, \
           DROP ATTRIBUTE lim_held, DROP ATTRIBUTE lim_window, DROP ATTRIBUTE lim_capped, \
           DROP ATTRIBUTE hit_tenant; \
         DROP FUNCTION ten.tessera_heartbeat(text, text, bigint); \
         CREATE FUNCTION ten.tessera_heartbeat(p_name text, p_lease text, p_waiter_ttl bigint) \
         RETURNS TABLE (outcome text, now_us bigint, weight bigint, seats int4[], \
           fence bigint, holder text, acquired_at bigint, expires_at bigint, tenant text) \
         LANGUAGE sql AS $$ SELECT 'waiting'::text, 0::bigint, NULL::bigint, NULL::int4[], \
           NULL::bigint, NULL::text, NULL::bigint, NULL::bigint, NULL::text $$; \
         DELETE FROM ten.tessera_migrations WHERE version >= 10",
    );
    // The previous build's process, its heartbeat statement prepared (and cached) before.
    let mut old = sqlx::PgConnection::connect(&server.url()).await.unwrap();
    sqlx::query("SET search_path TO ten")
        .execute(&mut old)
        .await
        .unwrap();
    async fn heartbeat(old: &mut sqlx::PgConnection, lease: LeaseId) -> String {
        sqlx::query(
            "SELECT outcome, now_us, weight, seats, fence, holder, acquired_at, expires_at, \
             tenant FROM tessera_heartbeat($1, $2, $3)",
        )
        .bind("kept")
        .bind(lease.to_string())
        .bind(3_600_000_000i64)
        .fetch_one(old)
        .await
        .unwrap()
        .get("outcome")
    }
    /// The previous build's acquire of capacity 3, with a tenant or (nine arguments) without.
    async fn acquire(old: &mut sqlx::PgConnection, lease: LeaseId, tenant: Option<&str>) -> String {
        let sql = match tenant {
            Some(_) => {
                "SELECT outcome FROM tessera_acquire($1, 3, $2, 1, 3600000000, 'old', '', \
                 3600000000, 10, $3, 1)"
            }
            None => {
                "SELECT outcome FROM tessera_acquire($1, 3, $2, 1, 3600000000, 'old', '', \
                 3600000000, 10)"
            }
        };
        let mut q = sqlx::query(sql).bind("kept").bind(lease.to_string());
        if let Some(t) = tenant {
            q = q.bind(t);
        }
        q.fetch_one(old).await.unwrap().get("outcome")
    }
    assert_eq!(heartbeat(&mut old, w1).await, "waiting");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "ten"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert!(pg.capabilities().tenant_limits);
    // The rows are kept.
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, a);
    assert_eq!(status.queue[0].lease_id, w1);
    let one = TenantLimits::new(Some(1), 0).unwrap();
    pg.set_tenant_limits(&n, "billing", one).await.unwrap();
    assert_eq!(
        server.psql("SELECT limits FROM ten.tessera_semaphores WHERE name = 'kept'"),
        "1"
    );
    assert_eq!(pg.tenant_limits(&n).await.unwrap()["billing"], one);
    // Three permits: w1 gets the second, billing's first request the third; its second
    // waits at its ceiling, and a request without a tenant (the old nine arguments) queues.
    assert_eq!(pg.resize(&n, 3).await.unwrap(), 1);
    assert_eq!(heartbeat(&mut old, w1).await, "granted");
    let (b1, b2, c) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    assert_eq!(acquire(&mut old, b1, Some("billing")).await, "granted");
    assert_eq!(acquire(&mut old, b2, Some("billing")).await, "queued");
    assert_eq!(acquire(&mut old, c, None).await, "queued");
    // A freed permit passes billing's capped waiter for the one behind it.
    assert!(pg.release(&n, a).await.unwrap());
    assert_eq!(heartbeat(&mut old, c).await, "granted");
    assert_eq!(heartbeat(&mut old, b2).await, "waiting");
    // Billing's own release lets its next one in.
    assert!(pg.release(&n, b1).await.unwrap());
    assert_eq!(heartbeat(&mut old, b2).await, "granted");
}

/// A tenant's own limiter under a window ceiling is saved with the configuration the
/// functions scale (`tessera__rate_scaled`): its text is `RateConfig::scaled(pct).encode()`,
/// and its counts, emission intervals and largest cost are the scaled configuration's, for
/// exact and smooth limits, with and without a margin, and limits that scaling makes equal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_functions_scale_limits_as_rate_config_scaled() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("scaled");
    drop(PostgresBackend::connect(&url).await.unwrap());
    let spec = |s: &str| s.parse::<RateSpec>().unwrap();
    let configs = [
        RateConfig::new(&[spec("10/min")], RateMode::Exact).unwrap(),
        RateConfig::new(&[spec("50/s"), spec("1000/min")], RateMode::Exact)
            .unwrap()
            .with_margin(Duration::from_secs(1))
            .unwrap(),
        RateConfig::new(&[spec("10/s"), spec("12/s")], RateMode::Exact).unwrap(),
        RateConfig::new(
            &[spec("10/s"), spec("300/min")],
            RateMode::Smooth { burst: 5 },
        )
        .unwrap()
        .with_margin(Duration::from_millis(20))
        .unwrap(),
    ];
    let list = |v: Vec<u64>| v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    for config in &configs {
        let n = list(
            config
                .limits()
                .iter()
                .map(|l| u64::from(l.count()))
                .collect(),
        );
        let l = list(
            config
                .limits()
                .iter()
                .map(|l| config.window_us(l))
                .collect(),
        );
        for pct in [1u8, 7, 20, 33, 50, 99, 100] {
            let scaled = config.scaled(pct);
            let windows: Vec<u64> = scaled
                .limits()
                .iter()
                .map(|l| scaled.window_us(l))
                .collect();
            let counts: Vec<u64> = scaled
                .limits()
                .iter()
                .map(|l| u64::from(l.count()))
                .collect();
            let intervals = windows
                .iter()
                .zip(&counts)
                .map(|(w, c)| w.div_ceil(*c))
                .collect();
            let want = format!(
                "{} {} {} {} {}",
                scaled.encode(),
                scaled.max_cost(),
                list(counts),
                list(windows),
                list(intervals)
            );
            let got = server.psql(&format!(
                "SET search_path TO scaled; \
                 SELECT concat_ws(' ', config, max_cost, array_to_string(n, ','), \
                   array_to_string(l, ','), array_to_string(t, ',')) \
                 FROM tessera__rate_scaled('{}', '{{{n}}}', '{{{l}}}', {}, {pct})",
                config.encode(),
                config.mode().burst()
            ));
            assert_eq!(got, want, "{} at {pct}%", config.encode());
        }
    }
}

/// A schema at version 10 with a holder, a waiter and a tenant's limits gains window ceilings
/// (migration 11) at the next connect: its rows and limits are kept, the two functions whose
/// arguments changed are replaced (no second one of either is left), a window ceiling set
/// then is kept and read back, and the previous build's call of `tessera_set_tenant_limits`
/// (five arguments) resolves to the new function.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_migration_10_gains_window_ceilings_keeping_its_rows() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("eleven");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("kept");
    let (a, w1) = hold_and_queue(&pg, &n).await;
    let one = TenantLimits::new(Some(1), 0).unwrap();
    pg.set_tenant_limits(&n, "billing", one).await.unwrap();
    drop(pg);
    // What a build of migration 10 left: no window ceilings (columns, state), and the rate
    // step and the set function with their previous arguments (stubs of the same shape).
    server.psql(
        "ALTER TABLE eleven.tessera_limits DROP COLUMN window_ceiling, \
           DROP COLUMN capped_until; \
         ALTER TYPE eleven.tessera_step DROP ATTRIBUTE lim_window, DROP ATTRIBUTE lim_capped, \
           DROP ATTRIBUTE hit_tenant; \
         DROP FUNCTION eleven.tessera__rate_step(text, text, bigint[], bigint[], bigint[], \
           bigint, bigint, bigint, boolean, boolean, bigint); \
         CREATE FUNCTION eleven.tessera__rate_step(p_name text, p_config text, p_n bigint[], \
           p_l bigint[], p_t bigint[], p_burst bigint, p_cost bigint, p_max_wait bigint, \
           p_update boolean, OUT outcome text, OUT at_us bigint, OUT now_us bigint, \
           OUT reservation bigint, OUT stored text) \
         LANGUAGE sql AS $$ SELECT 'limited'::text, 0::bigint, 0::bigint, NULL::bigint, \
           NULL::text $$; \
         DROP FUNCTION eleven.tessera_set_tenant_limits(text, text, bigint, bigint, text, \
           bigint); \
         CREATE FUNCTION eleven.tessera_set_tenant_limits(p_name text, p_tenant text, \
           p_ceiling bigint, p_floor bigint, p_client text) \
         RETURNS TABLE (outcome text, floors bigint, capacity bigint, grants text[]) \
         LANGUAGE sql AS $$ SELECT 'set'::text, NULL::bigint, NULL::bigint, NULL::text[] $$; \
         DELETE FROM eleven.tessera_migrations WHERE version >= 11",
    );
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "eleven"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert!(pg.capabilities().window_ceilings);
    assert_eq!(
        server.psql(
            "SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace \
             WHERE s.nspname = 'eleven' \
               AND p.proname IN ('tessera__rate_step', 'tessera_set_tenant_limits')"
        ),
        "2"
    );
    // The rows and the limits are kept.
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, a);
    assert_eq!(status.queue[0].lease_id, w1);
    assert_eq!(pg.tenant_limits(&n).await.unwrap()["billing"], one);
    let windowed = one.with_window_ceiling(Some(20)).unwrap();
    pg.set_tenant_limits(&n, "billing", windowed).await.unwrap();
    assert_eq!(pg.tenant_limits(&n).await.unwrap()["billing"], windowed);
    // The previous build's five arguments: the new function, keeping no window ceiling.
    assert_eq!(
        server.psql(
            "SET search_path TO eleven; \
             SELECT outcome FROM tessera_set_tenant_limits('kept', 'billing', 2, 0, '')"
        ),
        "set"
    );
    assert_eq!(
        pg.tenant_limits(&n).await.unwrap()["billing"],
        TenantLimits::new(Some(2), 0).unwrap()
    );
    // The step runs: the release hands the waiter queued before the permit.
    assert!(pg.release(&n, a).await.unwrap());
    assert!(matches!(
        pg.heartbeat(&n, w1, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
}

/// Limits set through one process's store are the name's, for every process: a second store
/// (another role: its own listener and wake-up channel) lists them and its requests get them,
/// also after the semaphore went idle; a raised ceiling set by the first wakes the second's
/// waiter at once; and what the second removes, the first no longer lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_store_sees_and_keeps_the_limits_a_first_one_set() {
    let server = PostgresServer::start();
    let first = Store::connect(&server.url_with_schema("two"))
        .await
        .unwrap();
    let second = Store::connect(&peer_url(&server, "two")).await.unwrap();
    assert!(second.backend().capabilities().tenant_limits);
    let one = TenantLimits::new(Some(1), 0).unwrap();
    first.set_tenant_limits("jobs", "batch", one).await.unwrap();
    assert_eq!(second.tenant_limits("jobs").await.unwrap()["batch"], one);
    let opts = SemaphoreOptions::default().tenant(Tenant::new("batch", 1).unwrap());
    let batch = Semaphore::new(&second, "jobs", 2, opts).unwrap();
    for _ in 0..2 {
        let p = batch.acquire().await.unwrap();
        assert!(
            batch.try_acquire().await.unwrap().is_none(),
            "at its ceiling"
        );
        p.release().await.unwrap();
        assert!(second.status("jobs").await.unwrap().is_none(), "idle");
    }
    let p = batch.acquire().await.unwrap();
    let waiter = queue_one(&batch);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while second
        .status("jobs")
        .await
        .unwrap()
        .is_none_or(|s| s.queue.is_empty())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let two = TenantLimits::new(Some(2), 0).unwrap();
    first.set_tenant_limits("jobs", "batch", two).await.unwrap();
    let q = granted(waiter, "the raised ceiling lets the waiter in").await;
    q.release().await.unwrap();
    p.release().await.unwrap();
    second
        .set_tenant_limits("jobs", "batch", TenantLimits::default())
        .await
        .unwrap();
    assert!(first.tenant_limits("jobs").await.unwrap().is_empty());
}

/// Admissions of a name with ceilings and floors answer as on the memory store (the
/// reference model), step by step: a tenant at its ceiling queues and does not hold back a
/// request behind it, a floor keeps its permit against others and grants its tenant at once,
/// a freed permit wakes the capped admission once its tenant is below its ceiling, and its
/// own step then grants it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_with_limits_answer_as_on_the_memory_store() {
    let server = PostgresServer::start();
    let pg = Store::connect(&server.url_with_schema("admlim"))
        .await
        .unwrap();
    let model = Store::connect(&format!("memory://admlim-{}", LeaseId::random()))
        .await
        .unwrap();
    let n = name("provider");
    let config = RateConfig::new(&["1000/s".parse().unwrap()], RateMode::Exact).unwrap();
    for s in [&pg, &model] {
        let bulk = TenantLimits::new(Some(1), 0).unwrap();
        s.set_tenant_limits("provider", "bulk", bulk).await.unwrap();
        let alerts = TenantLimits::new(None, 1).unwrap();
        s.set_tenant_limits("provider", "alerts", alerts)
            .await
            .unwrap();
    }
    let admit = |lease: LeaseId, tenant: Option<&str>| AdmitRequest {
        acquire: AcquireRequest {
            tenant: tenant.map(|t| Tenant::new(t, 1).unwrap()),
            ..req(lease, 1, LONG, Some((LONG, 10)))
        },
        cost: 1,
        update: false,
        at_head: false,
    };
    let answer = |r: AdmitReply| match r {
        AdmitReply::Granted { .. } => "granted".to_string(),
        AdmitReply::Queued { position, .. } => format!("queued {position}"),
        other => format!("{other:?}"),
    };
    let (x1, x2, y1, y2, z1) = (
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
    );
    let steps = [
        (x1, Some("bulk"), "granted"),
        (x2, Some("bulk"), "queued 0"),
        (y1, None, "granted"),
        (y2, None, "queued 1"),
        (z1, Some("alerts"), "granted"),
    ];
    for (lease, tenant, want) in steps {
        for s in [&pg, &model] {
            let adm = s.backend().admission().unwrap();
            let got = answer(
                adm.admit(&n, 3, &config, &admit(lease, tenant))
                    .await
                    .unwrap(),
            );
            assert_eq!(got, want, "{tenant:?}");
        }
    }
    // x1 goes: bulk is below its ceiling, its admission at the head is woken, not granted,
    // and y2 behind it waits; x2's own step grants it.
    for s in [&pg, &model] {
        assert!(s.backend().release(&n, x1).await.unwrap());
        let status = s.backend().status(&n).await.unwrap().unwrap();
        let queue: Vec<_> = status.queue.iter().map(|w| w.lease_id).collect();
        assert_eq!(queue, [x2, y2]);
        let adm = s.backend().admission().unwrap();
        let got = answer(
            adm.admit(&n, 3, &config, &admit(x2, Some("bulk")))
                .await
                .unwrap(),
        );
        assert_eq!(got, "granted");
        let mut holders: Vec<_> = s
            .backend()
            .status(&n)
            .await
            .unwrap()
            .unwrap()
            .holders
            .iter()
            .map(|h| h.lease_id)
            .collect();
        holders.sort();
        let mut want = vec![x2, y1, z1];
        want.sort();
        assert_eq!(holders, want);
    }
}

/// With limits a grant may pass the queue's least key and move the virtual time past tags
/// still queued; the row keeps the queue's lower bound (`tag_low`), so those waiters are still
/// found, also by the hand-off without limits once they are removed: here bulk's capped
/// waiter (tag 1000) is passed by requests without a tenant until `vtime` is 2000, then its
/// tenant's limits go and a release hands it the permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_passed_under_limits_are_still_found_after_the_limits_go() {
    let server = PostgresServer::start();
    let pg = backend(&server, "low").await;
    let n = name("passed");
    pg.set_tenant_limits(&n, "bulk", TenantLimits::new(Some(1), 0).unwrap())
        .await
        .unwrap();
    let ask = |lease: LeaseId, tenant: Option<&str>| AcquireRequest {
        tenant: tenant.map(|t| Tenant::new(t, 1).unwrap()),
        ..req(lease, 1, LONG, Some((LONG, 10)))
    };
    let granted = |r: AcquireReply| matches!(r, AcquireReply::Granted(_));
    let ids: Vec<LeaseId> = (0..5).map(|_| LeaseId::random()).collect();
    let [x1, x2, y1, y2, y3] = ids[..] else {
        unreachable!()
    };
    assert!(granted(
        pg.acquire(&n, 3, &ask(x1, Some("bulk"))).await.unwrap()
    ));
    assert!(!granted(
        pg.acquire(&n, 3, &ask(x2, Some("bulk"))).await.unwrap()
    ));
    assert!(granted(pg.acquire(&n, 3, &ask(y1, None)).await.unwrap()));
    assert!(granted(pg.acquire(&n, 3, &ask(y2, None)).await.unwrap()));
    assert!(!granted(pg.acquire(&n, 3, &ask(y3, None)).await.unwrap()));
    // y3 (tag 2000) passes the capped x2 (tag 1000).
    assert!(pg.release(&n, y1).await.unwrap());
    let row = || {
        server
            .psql("SELECT vtime || ' ' || coalesce(tag_low::text, '-') FROM low.tessera_semaphores")
    };
    assert_eq!(row(), "2000 1000");
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(
        status.queue.iter().map(|w| w.lease_id).collect::<Vec<_>>(),
        [x2]
    );
    pg.set_tenant_limits(&n, "bulk", TenantLimits::default())
        .await
        .unwrap();
    assert!(pg.release(&n, x1).await.unwrap());
    let status = pg.status(&n).await.unwrap().unwrap();
    assert!(status.queue.is_empty(), "{status:?}");
    assert!(status.holders.iter().any(|h| h.lease_id == x2));
    assert_eq!(row(), "2000 -");
}

/// Limits set while another process creates the semaphore's row: whichever commits first,
/// the row counts the limits and the next request gets them. `tessera_set_tenant_limits` on
/// a name without a row inserts a placeholder row (deleted again before its commit), so an
/// acquire that creates the row at the same time waits for it and then reads the limits, or
/// commits first and the set counts them on its row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_set_while_another_process_creates_the_row_are_kept_by_it() {
    let server = PostgresServer::start();
    let first = Store::connect(&server.url_with_schema("race"))
        .await
        .unwrap();
    let second = Store::connect(&peer_url(&server, "race")).await.unwrap();
    let one = TenantLimits::new(Some(1), 0).unwrap();
    let ask = |tenant: &str| AcquireRequest {
        tenant: Some(Tenant::new(tenant, 1).unwrap()),
        ..req(LeaseId::random(), 1, LONG, None)
    };
    let granted = |r: AcquireReply| matches!(r, AcquireReply::Granted(_));
    for i in 0..40 {
        let n = name(&format!("r{i}"));
        let r = ask("t");
        let (set, got) = tokio::join!(
            first.set_tenant_limits(n.as_str(), "t", one),
            second.backend().acquire(&n, 3, &r)
        );
        set.unwrap();
        assert!(granted(got.unwrap()), "{n}: the first request of t");
        // t is at its ceiling, whichever came first.
        let again = second.backend().acquire(&n, 3, &ask("t")).await.unwrap();
        assert!(
            !granted(again),
            "{n}: t's second request passed its ceiling"
        );
    }
    assert_eq!(
        server.psql(
            "SELECT count(*) FROM race.tessera_semaphores s \
             WHERE s.limits <> (SELECT count(*) FROM race.tessera_limits l WHERE l.name = s.name)"
        ),
        "0"
    );
}

/// The plans of the step's lookups cannot walk a semaphore's dead rows: every session of the
/// store plans with sequential scans off, the expiry indexes are partial (no lookup of a
/// lease or of the queue head may use them), the waiters' unique key leads with the lease id
/// and the queue head is read through the index of its order, `(name, tag, seq)`. Checked on the
/// plans PostgreSQL makes for those lookups while the tables are empty, as a session of the
/// store makes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_by_lease_and_queue_head_plan_on_their_own_keys() {
    let server = PostgresServer::start();
    let pg = backend(&server, "plans").await;
    let n = name("p");
    let (a, w) = hold_and_queue(&pg, &n).await;
    // Plans as a store session makes them (its options), after an ANALYZE of nearly empty
    // tables, generic (as PL/pgSQL's cached plans become).
    let plan = |sql: &str| {
        server.psql(&format!(
            "SET search_path TO plans; SET enable_seqscan = off; ANALYZE; \
             SET plan_cache_mode = force_generic_plan; PREPARE q AS {sql}; \
             EXPLAIN (COSTS OFF) EXECUTE q('p', '{a}')"
        ))
    };
    let holder = plan("SELECT * FROM tessera_holders WHERE name = $1 AND lease_id = $2");
    assert!(holder.contains("using tessera_holders_pkey"), "{holder}");
    let waiter = plan(
        "UPDATE tessera_waiters SET expires_at = expires_at WHERE name = $1 AND lease_id = $2",
    );
    assert!(
        waiter.contains("using tessera_waiters_lease_key"),
        "{waiter}"
    );
    // The queue head in start-tag order (migration 8), from the virtual time up.
    let head = plan(
        "SELECT seq FROM tessera_waiters WHERE name = $1 AND tag >= length($2) \
         ORDER BY tag, seq LIMIT 1",
    );
    assert!(head.contains("using tessera_waiters_by_tag"), "{head}");
    assert!(!head.contains("Sort"), "{head}");
    // The purge still finds expired rows through the expiry index.
    let purge = plan(
        "SELECT lease_id FROM tessera_holders WHERE name = $1 AND expires_at <= length($2) \
         ORDER BY expires_at LIMIT 256",
    );
    assert!(purge.contains("using tessera_holders_by_expiry"), "{purge}");
    assert!(pg.release(&n, a).await.unwrap());
    assert!(pg.release(&n, w).await.unwrap());
}

/// A schema at version 3 holding live state gains migrations 4 (the `purge_at` bound) and 5
/// (grants in a release's reply) at the next connect: rows written before it get a bound of 0, so the first step purges what has
/// expired since (here: a holder whose lease ran out, whose permit the queue head then gets),
/// and the migrations run again over themselves harmlessly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_3_schema_with_live_state_gains_the_lean_step() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("v3");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("upgraded");
    let (a, b, w) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    for lease in [a, b] {
        assert!(matches!(
            pg.acquire(&n, 2, &req(lease, 1, LONG, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
    assert_eq!(
        pg.acquire(&n, 2, &req(w, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    drop(pg);
    // What a build before migration 4 left: no bound, and (since) a lease that ran out.
    server.psql(
        "ALTER TABLE v3.tessera_semaphores DROP COLUMN purge_at; \
         ALTER TYPE v3.tessera_step DROP ATTRIBUTE purge_at, DROP ATTRIBUTE local_client, \
             DROP ATTRIBUTE local_grants; \
         DELETE FROM v3.tessera_migrations WHERE version >= 4",
    );
    server.psql(&format!(
        "UPDATE v3.tessera_holders SET expires_at = 1 WHERE lease_id = '{a}'"
    ));
    assert_eq!(versions(&server, "v3"), "1,2,3");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "v3"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert_eq!(
        server.psql("SELECT purge_at FROM v3.tessera_semaphores"),
        "0"
    );
    match pg.heartbeat(&n, w, LONG).await.unwrap() {
        WaitReply::Granted(g) => assert_eq!(g.lease.seats, vec![0]),
        other => panic!("{other:?}"),
    }
    assert!(!pg.release(&n, a).await.unwrap());
    // Migrations 4 and 5 forgotten, their columns kept: they run again over themselves.
    server.psql("DELETE FROM v3.tessera_migrations WHERE version >= 4");
    let again = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "v3"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert!(again.release(&n, b).await.unwrap());
    assert!(again.release(&n, w).await.unwrap());
    assert_eq!(
        server.psql("SELECT count(*) FROM v3.tessera_semaphores"),
        "0"
    );
}

fn is_busy(e: &Error) -> bool {
    matches!(
        e,
        Error::Store {
            kind: StoreErrorKind::Busy,
            ..
        }
    )
}

/// The database's default made read-only (`ALTER DATABASE … SET
/// default_transaction_read_only`, which only new sessions read): every operation and rate
/// step fails with a typed transient error (SQLSTATE 25006 is `Busy`), nothing is granted,
/// and once the default is lifted the store works again by itself: a session that met the
/// fault is not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_database_is_a_transient_fault_that_grants_nothing_and_passes() {
    let server = PostgresServer::start();
    let pg = backend(&server, "rodb").await;
    let n = name("rodb");
    let a = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 1, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let limits = ["5/s".parse().unwrap()];
    let config = RateConfig::new(&limits, RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    let r = name("rodb-rate");
    server.psql("ALTER DATABASE postgres SET default_transaction_read_only = on");
    // Sessions read the database's defaults when they start: end the store's sessions.
    assert!(server.terminate("tessera") >= 1);
    // A call may first meet a killed session (a connection error); then only new sessions.
    let mut read_only = 0;
    for _ in 0..8 {
        let e = pg
            .acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
            .await
            .expect_err("an acquire on a read-only database");
        assert!(e.is_transient(), "{e:?}");
        read_only += usize::from(is_busy(&e));
        let e = pg.rate_acquire(&r, &config, &one).await.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        read_only += usize::from(is_busy(&e));
        let e = pg.release(&n, a).await.unwrap_err();
        assert!(e.is_transient(), "{e:?}");
        read_only += usize::from(is_busy(&e));
    }
    assert!(
        read_only >= 20,
        "{read_only} of 24 calls met the read-only database"
    );
    server.psql(
        "BEGIN READ WRITE; \
         ALTER DATABASE postgres SET default_transaction_read_only = off; COMMIT",
    );
    // Lifted: new sessions are writable, and every session that met the fault was closed
    // (a session keeps the defaults it started with), so the next call works. Nothing was
    // granted meanwhile: A still holds the only permit.
    let b = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 1, &req(b, 1, LONG, None)).await.unwrap(),
        AcquireReply::NoPermit { .. }
    ));
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].lease_id, a);
    assert!(pg.release(&n, a).await.unwrap());
    assert!(matches!(
        pg.acquire(&n, 1, &req(b, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(matches!(
        pg.rate_acquire(&r, &config, &one).await.unwrap(),
        RateReply::Admitted { .. }
    ));
}

/// A tmpfs of 2 MiB mounted for a tablespace, unmounted on drop. Needs root: without it
/// the test that uses it fails (it does not skip).
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount() -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let run = |program: &str, args: &[&str]| {
            let out = std::process::Command::new(program)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("{program}: {e}"));
            assert!(
                out.status.success(),
                "{program} {args:?} failed (the database-full test needs root to mount a \
                 tmpfs): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let mnt = dir.path().to_str().unwrap();
        run("mount", &["-t", "tmpfs", "-o", "size=2m", "tmpfs", mnt]);
        let pg = format!("{mnt}/pg");
        std::fs::create_dir(&pg).unwrap();
        // The server runs as `postgres` when the tests run as root (see the test kit).
        run("chown", &["postgres", &pg]);
        SmallDisk { dir }
    }

    fn tablespace_dir(&self) -> String {
        format!("{}/pg", self.dir.path().display())
    }

    /// Fills what is left of the disk with a file of ours.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.dir.path().join("filler")).unwrap();
        let block = vec![0u8; 64 * 1024];
        loop {
            match f.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(28), "{e}"); // ENOSPC
                    break;
                }
            }
        }
        let _ = f.sync_all();
    }

    fn free(&self) {
        std::fs::remove_file(self.dir.path().join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .args(["-l", self.dir.path().to_str().unwrap()])
            .status();
    }
}

/// tessera's tables on a full disk (a tablespace on a full tmpfs; the WAL elsewhere, as a
/// full data volume leaves it): an acquire and a rate step fail with a typed transient error
/// (class 53 is `Busy`), nothing is granted, and once space is freed the store works again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_is_a_transient_fault_that_grants_nothing_and_passes() {
    // Declared first, dropped last: unmounted after the server stopped.
    let disk = SmallDisk::mount();
    let server = PostgresServer::start();
    let pg = backend(&server, "full").await;
    server.psql(&format!(
        "CREATE TABLESPACE small LOCATION '{}'",
        disk.tablespace_dir()
    ));
    server.psql("ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE small");
    server.psql("ALTER INDEX ALL IN TABLESPACE pg_default SET TABLESPACE small");
    assert_eq!(
        server.psql(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'full' \
             AND tablespace IS DISTINCT FROM 'small'"
        ),
        "0"
    );
    disk.fill();
    let n = name("full");
    let limits = ["5/s".parse().unwrap()];
    let config = RateConfig::new(&limits, RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    let r = name("full-rate");
    for _ in 0..3 {
        let e = pg
            .acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
            .await
            .expect_err("an acquire with the disk full");
        assert!(is_busy(&e), "{e:?}");
        let e = pg.rate_acquire(&r, &config, &one).await.unwrap_err();
        assert!(is_busy(&e), "{e:?}");
    }
    assert_eq!(pg.status(&n).await.unwrap(), None);
    disk.free();
    let a = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 1, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(matches!(
        pg.acquire(&n, 1, &req(LeaseId::random(), 1, LONG, None))
            .await
            .unwrap(),
        AcquireReply::NoPermit { .. }
    ));
    assert!(pg.release(&n, a).await.unwrap());
    assert!(matches!(
        pg.rate_acquire(&r, &config, &one).await.unwrap(),
        RateReply::Admitted { .. }
    ));
}

/// Resumes a stopped server process on drop (`SIGCONT`), so a failing test leaves no
/// frozen backend behind.
struct Stopped(u32);

impl Stopped {
    fn stop(pid: u32) -> Stopped {
        let ok = std::process::Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "SIGSTOP to the listener's backend {pid}");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A half-open listener connection: its server backend frozen (`SIGSTOP`), so the TCP
/// connection stays open but says nothing. The listener's ping of its own connection goes
/// unanswered, so the listener is rebuilt on a new backend; a waiter that queues afterwards
/// is woken by the push of the grant. Its waiter TTL is an hour, so its first heartbeat would
/// come after 20 minutes: a grant seen before that came by the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_open_listener_is_detected_rebuilt_and_still_wakes_waiters() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("half");
    let pg = backend(&server, "half").await;
    eventually(30, "the listener's backend is known", || {
        pg.listener_pid() != 0
    })
    .await;
    let frozen = pg.listener_pid();
    assert_eq!(
        server.psql(&format!(
            "SELECT application_name FROM pg_stat_activity WHERE pid = {frozen}"
        )),
        "tessera-listener"
    );
    let before = pg.listener_reconnects();
    let _stopped = Stopped::stop(frozen);
    eventually(60, "the listener is rebuilt", || {
        pg.listener_reconnects() > before && pg.listener_pid() != frozen
    })
    .await;
    // Released by another process: the grant comes through the rebuilt listener.
    a_peers_release_wakes_a_waiter(&server, &url, "half", "after the listener was rebuilt").await;
}

/// The listener checks its connection with a query of its own, not a `NOTIFY`: before
/// PostgreSQL 19 each `NOTIFY` signals every listening backend of the database, so N idle
/// processes pinging themselves every 2 s cost the server N²/2 wake-ups a second. An idle
/// store sends nothing on its channel over 2.5 ping periods, while its listener's backend
/// keeps answering pings (its last query and state change move on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_store_checks_its_listener_without_notifying_anyone() {
    let server = PostgresServer::start();
    let pg = backend(&server, "quiet").await;
    eventually(30, "the listener's backend is known", || {
        pg.listener_pid() != 0
    })
    .await;
    let channel_name = format!("tessera_w{}", pg.client_id());
    let mut channel = sqlx::postgres::PgListener::connect(&server.url())
        .await
        .unwrap();
    channel.listen(&channel_name).await.unwrap();
    let activity = || {
        server.psql(&format!(
            "SELECT query || ' @ ' || state_change FROM pg_stat_activity WHERE pid = {}",
            pg.listener_pid()
        ))
    };
    let before = activity();
    tokio::time::sleep(Duration::from_millis(5000)).await;
    assert_eq!(
        heard_until_marker(&server, &mut channel, &channel_name).await,
        Vec::<String>::new(),
        "an idle store notified its own channel"
    );
    let after = activity();
    assert!(
        after.starts_with("SELECT pg_backend_pid() @ ") && after != before,
        "the listener did not ping its connection: {before:?} then {after:?}"
    );
    assert_eq!(pg.listener_reconnects(), 0);
}

/// A small deterministic generator (xorshift), so a failing sequence repeats by its seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The rate functions against the memory store's rate model (the reference), request by
/// request: random costs, tries and reservations, cancels, statuses, deletes, limits
/// changed with and without `update`, and pauses that let windows slide and states expire.
/// The function reads the server's clock, so the model's clock is set to the server time of
/// each step: the `now` of an acquire or status reply, exactly; for the answers that carry
/// no time (cancel, delete, a mismatch) a time within the step's bracket `[t0, t1]` (server
/// times read just before and after it, from a status of a long-lived limiter) that agrees
/// with the answer — the earliest if the answer says the state was still there, the latest
/// if not; the answer itself must then be the model's. Every reply is compared whole: admit
/// and retry times to the microsecond, reservation ids, snapshots.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_functions_decide_like_the_memory_model_step_by_step() {
    use std::sync::Arc;
    use tessera::backend::stores::MemoryBackend;

    let server = PostgresServer::start();
    let pg = backend(&server, "ratediff").await;
    let clock = Arc::new(ManualClock::new(StoreTime(0)));
    let mem = MemoryBackend::with_clock(clock.clone());
    let model = mem.rate().unwrap();
    let spec = |s: &str| -> RateSpec { s.parse().unwrap() };
    let configs = [
        RateConfig::new(&[spec("2/300ms"), spec("4/1s")], RateMode::Exact).unwrap(),
        RateConfig::new(&[spec("3/500ms")], RateMode::Exact)
            .unwrap()
            .with_margin(Duration::from_millis(20))
            .unwrap(),
        RateConfig::new(
            &[spec("4/400ms"), spec("6/1s")],
            RateMode::Smooth { burst: 2 },
        )
        .unwrap(),
        RateConfig::new(&[spec("5/1s")], RateMode::Smooth { burst: 1 }).unwrap(),
    ];
    // The server's time, read by a status of a limiter that outlives the test.
    let clock_name = name("server-clock");
    let day = RateConfig::new(&[spec("1/d")], RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    pg.rate_acquire(&clock_name, &day, &one).await.unwrap();
    let server_now = || async { pg.rate_status(&clock_name).await.unwrap().unwrap().now };

    let names: Vec<Name> = (0..3).map(|i| name(&format!("diff-{i}"))).collect();
    let mut current = [0usize, 2, 3];
    let mut admitted: Vec<(usize, u64, StoreTime)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for step in 0..500 {
        let i = rng.below(names.len() as u64) as usize;
        let n = &names[i];
        let roll = rng.below(100);
        let t0 = server_now().await;
        if roll < 60 {
            // An acquire, now and then with other limits (with or without update).
            let mut update = false;
            if rng.below(10) == 0 {
                let other = rng.below(configs.len() as u64) as usize;
                update = rng.below(2) == 0;
                if update {
                    current[i] = other;
                }
                if !update && other != current[i] {
                    let c = &configs[other];
                    let req = RateRequest {
                        cost: 1,
                        max_wait: None,
                        update: false,
                    };
                    let got = pg.rate_acquire(n, c, &req).await;
                    let want = match &got {
                        // The state was there at the step's time, so at t0 too.
                        Err(e) if e.is_rate_mismatch() => {
                            clock.set(t0);
                            model.rate_acquire(n, c, &req).await
                        }
                        Ok(RateReply::Admitted { now, .. } | RateReply::Limited { now, .. }) => {
                            clock.set(*now);
                            model.rate_acquire(n, c, &req).await
                        }
                        Err(e) => panic!("step {step}: {e:?}"),
                    };
                    assert_eq!(
                        format!("{got:?}"),
                        format!("{want:?}"),
                        "step {step}: acquire with other limits on {n}"
                    );
                    if let Ok(RateReply::Admitted {
                        reservation, at, ..
                    }) = got
                    {
                        // Fresh (the old state had expired): these limits are its own now.
                        current[i] = other;
                        admitted.push((i, reservation, at));
                    }
                    seen.insert(if got.is_err() {
                        "mismatch"
                    } else {
                        "expired, redeclared"
                    });
                    continue;
                }
            }
            let c = &configs[current[i]];
            let cost = 1 + rng.below(u64::from(c.max_cost())) as u32;
            let max_wait = match rng.below(2) {
                0 => None,
                _ => Some(Duration::from_millis(rng.below(800))),
            };
            let req = RateRequest {
                cost,
                max_wait,
                update,
            };
            let got = pg.rate_acquire(n, c, &req).await.unwrap();
            let (RateReply::Admitted { now, .. } | RateReply::Limited { now, .. }) = got;
            clock.set(now);
            let want = model.rate_acquire(n, c, &req).await.unwrap();
            assert_eq!(got, want, "step {step}: acquire {req:?} of {c} on {n}");
            match got {
                RateReply::Admitted {
                    at,
                    reservation,
                    now,
                } => {
                    admitted.push((i, reservation, at));
                    seen.insert(if at > now { "reserved" } else { "admitted" });
                }
                RateReply::Limited { .. } => {
                    seen.insert("limited");
                }
            }
        } else if roll < 72 {
            // A cancel: usually the latest admission of this limiter, sometimes an older one.
            let mine: Vec<_> = admitted.iter().filter(|a| a.0 == i).collect();
            let Some(&&(_, id, at)) = (match rng.below(4) {
                0 => mine.first(),
                _ => mine.last(),
            }) else {
                continue;
            };
            let got = pg.rate_cancel(n, id, at).await.unwrap();
            let t1 = server_now().await;
            clock.set(if got { t0 } else { t1 });
            let want = model.rate_cancel(n, id, at).await.unwrap();
            assert_eq!(got, want, "step {step}: cancel {id} at {at:?} on {n}");
            seen.insert(if got { "cancelled" } else { "not cancelled" });
        } else if roll < 84 {
            let got = pg.rate_status(n).await.unwrap();
            if let Some(s) = &got {
                clock.set(s.now);
            } else {
                clock.set(server_now().await);
            }
            let want = model.rate_status(n).await.unwrap();
            assert_eq!(got, want, "step {step}: status of {n}");
            seen.insert(if got.is_some() { "status" } else { "no status" });
        } else if roll < 90 {
            let got = pg.rate_delete(n).await.unwrap();
            let t1 = server_now().await;
            clock.set(if got { t0 } else { t1 });
            let want = model.rate_delete(n).await.unwrap();
            assert_eq!(got, want, "step {step}: delete {n}");
            seen.insert(if got { "deleted" } else { "nothing to delete" });
        } else {
            tokio::time::sleep(Duration::from_millis(20 + rng.below(400))).await;
        }
    }
    for answer in [
        "admitted",
        "reserved",
        "limited",
        "mismatch",
        "cancelled",
        "not cancelled",
        "status",
        "no status",
        "deleted",
    ] {
        assert!(seen.contains(answer), "never saw {answer}: {seen:?}");
    }
}

/// The stored limits are read on the server only by cancel and status (an acquire sends its
/// own): `tessera__rate_limits` gives the burst and the longest enforced window of every
/// canonical form that `RateConfig::encode` writes, as the engine computes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reads_stored_limits_as_the_engine_does() {
    let server = PostgresServer::start();
    drop(backend(&server, "limits").await);
    let spec = |s: &str| -> RateSpec { s.parse().unwrap() };
    let cases = [
        (vec!["50/s", "1000/min"], RateMode::Exact, 0),
        (vec!["7/250ms"], RateMode::Exact, 20_000),
        (vec!["3/1500us", "10/7ms"], RateMode::Exact, 5),
        (vec!["2/h", "20/d"], RateMode::Exact, 1_000_000),
        (vec!["4/400ms", "6/1s"], RateMode::Smooth { burst: 2 }, 0),
        (vec!["9/90s"], RateMode::Smooth { burst: 9 }, 1_500),
    ];
    for (limits, mode, margin_us) in cases {
        let specs: Vec<RateSpec> = limits.iter().map(|s| spec(s)).collect();
        let config = RateConfig::new(&specs, mode)
            .unwrap()
            .with_margin(Duration::from_micros(margin_us))
            .unwrap();
        let text = config.encode();
        let burst = match mode {
            RateMode::Smooth { burst } => burst,
            _ => 0,
        };
        assert_eq!(
            server.psql(&format!(
                "SELECT burst || ',' || horizon FROM limits.tessera__rate_limits('{text}')"
            )),
            format!("{burst},{}", config.horizon_us()),
            "{text}"
        );
    }
    for bad in [
        "",
        "exact",
        "exact|",
        "smooth:0|5/s",
        "exact+5m|5/s",
        "exact|5/s,x",
    ] {
        let e = server
            .try_psql(&format!("SELECT limits.tessera__rate_limits('{bad}')"))
            .unwrap_err();
        assert!(
            e.contains("unreadable") || e.contains("burst of 0"),
            "{bad}: {e}"
        );
    }
}

/// Garbage in a limiter's row or log is `Error::Corrupt` from every step that reads it (never
/// a panic, never an admission), and deleting the limiter clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_rate_rows_is_corrupt_and_delete_clears_it() {
    let server = PostgresServer::start();
    let pg = backend(&server, "rgarb").await;
    let exact = RateConfig::new(&["3/h".parse().unwrap()], RateMode::Exact).unwrap();
    let smooth = RateConfig::new(&["3/h".parse().unwrap()], RateMode::Smooth { burst: 1 }).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    let damage = [
        ("p = -1", &exact),
        ("tat = '1,x'", &exact),
        ("tat = '1,2'", &smooth),
        ("config = 'exact|3/fortnight'", &exact),
        ("p = p + 5", &exact),
    ];
    for (i, (set, config)) in damage.into_iter().enumerate() {
        let n = name(&format!("garbage-{i}"));
        let reservation = match pg.rate_acquire(&n, config, &one).await.unwrap() {
            RateReply::Admitted {
                reservation, at, ..
            } => (reservation, at),
            other => panic!("{other:?}"),
        };
        server.psql(&format!(
            "UPDATE rgarb.tessera_rate_limiters SET {set} WHERE name = '{n}'"
        ));
        // A config that no longer matches is a mismatch, not garbage, for an acquire.
        if !set.starts_with("config") {
            let e = pg.rate_acquire(&n, config, &one).await.unwrap_err();
            assert!(e.is_corrupt(), "{set}: acquire: {e:?}");
        }
        let e = pg.rate_status(&n).await.unwrap_err();
        assert!(e.is_corrupt(), "{set}: status: {e:?}");
        if !set.starts_with("p = p") {
            let e = pg
                .rate_cancel(&n, reservation.0, reservation.1)
                .await
                .unwrap_err();
            assert!(e.is_corrupt(), "{set}: cancel: {e:?}");
        }
        assert!(pg.rate_delete(&n).await.unwrap(), "{set}");
        assert!(pg.rate_status(&n).await.unwrap().is_none(), "{set}");
        assert!(matches!(
            pg.rate_acquire(&n, config, &one).await.unwrap(),
            RateReply::Admitted { .. }
        ));
    }
}

/// WAL writes (`pg_stat_wal.wal_write`) made by `url`'s clients in `pairs` acquire + release
/// pairs: a synchronous commit writes its WAL before it returns (measured: about one write
/// per pair on one session), an asynchronous one leaves it to the WAL writer (a write per
/// 200 ms). Every handle of the store is dropped and its backends gone before the count is
/// read: a backend reports its WAL statistics when it exits. (They do exit: the listener's
/// connection used to outlive the store.)
async fn wal_writes(server: &PostgresServer, url: &str, pairs: usize) -> i64 {
    let writes = || -> i64 {
        server
            .psql("SELECT wal_write FROM pg_stat_wal")
            .parse()
            .unwrap()
    };
    let gone = || {
        server.psql("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'tessera%'")
            == "0"
    };
    let before = writes();
    let store = Store::connect(url).await.unwrap();
    let sem = Semaphore::new(&store, "wal", 1, SemaphoreOptions::default()).unwrap();
    for _ in 0..pairs {
        sem.acquire().await.unwrap().release().await.unwrap();
    }
    drop((sem, store));
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !gone() {
        assert!(
            std::time::Instant::now() < deadline,
            "tessera's backends did not exit: {}",
            server.psql(
                "SELECT application_name, state, query FROM pg_stat_activity \
                 WHERE application_name LIKE 'tessera%'"
            )
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    writes() - before
}

/// A role whose defaults cancel statements that wait for a lock or run long (`lock_timeout =
/// '1ms'`, `statement_timeout = '100ms'`, set for an application's queries) cancels none of
/// tessera's steps: a step that waits up to 2 s for its semaphore's row lock, held by another
/// session, completes once the lock is free (before, the server cancelled it after 1 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_with_short_lock_and_statement_timeouts_cancels_none_of_tesseras_steps() {
    let server = PostgresServer::start();
    server.psql(
        "CREATE ROLE hurried SUPERUSER LOGIN; \
         ALTER ROLE hurried SET lock_timeout = '1ms'; \
         ALTER ROLE hurried SET statement_timeout = '100ms'",
    );
    let url = format!(
        "postgres://hurried@127.0.0.1:{}/postgres?schema=hurry",
        server.port()
    );
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("h");
    let a = LeaseId::random();
    assert!(matches!(
        pg.acquire(&n, 2, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    // Another session holds the semaphore's row lock for 2 s.
    let locker = {
        let port = server.port();
        std::thread::spawn(move || {
            let out = std::process::Command::new(
                tessera_testkit::servers::postgres::bin_dir()
                    .unwrap()
                    .join("psql"),
            )
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-d", "postgres", "-Atq", "-c"])
            .arg(
                "BEGIN; SELECT 1 FROM hurry.tessera_semaphores WHERE name = 'h' FOR UPDATE; \
                 SELECT pg_sleep(2); COMMIT",
            )
            .output()
            .unwrap();
            assert!(out.status.success(), "{out:?}");
        })
    };
    eventually(30, "the other session holds the row lock", || {
        server.psql(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE query LIKE '%pg_sleep(2)%' AND pid <> pg_backend_pid()",
        ) == "1"
    })
    .await;
    let started = std::time::Instant::now();
    let b = LeaseId::random();
    let reply = pg.acquire(&n, 2, &req(b, 1, LONG, None)).await;
    assert!(
        matches!(reply, Ok(AcquireReply::Granted(_))),
        "the step that waited for the row lock: {reply:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(500),
        "the step did not wait for the row lock ({:?})",
        started.elapsed()
    );
    assert!(pg.release(&n, a).await.unwrap());
    assert!(pg.release(&n, b).await.unwrap());
    locker.join().unwrap();
}

/// Administrators set defaults for a whole database or role; two of them would break the
/// contract if tessera's sessions inherited them. `default_transaction_isolation =
/// serializable`: the functions lock the semaphore's row, then read what was committed
/// before the lock, which only `READ COMMITTED` sees (under `SERIALIZABLE` every contended
/// step failed with "could not serialize access"). `synchronous_commit = off`: tessera's
/// grants would no longer be durable. tessera's sessions run `READ COMMITTED` and commit
/// synchronously whatever the defaults say: 8 tasks on 2 permits see no error and never
/// more than 2 holders, and each commit writes its WAL before it returns, as it does not
/// with the URL's `synchronous_commit=off` (the same count, which shows the difference).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_defaulting_to_serializable_and_async_commit_changes_neither_the_step_nor_durability(
) {
    let server = PostgresServer::start();
    server.psql(
        "ALTER DATABASE postgres SET default_transaction_isolation = 'serializable'; \
         ALTER DATABASE postgres SET synchronous_commit = off",
    );
    assert_eq!(
        server.psql("SHOW default_transaction_isolation"),
        "serializable"
    );
    let store = Store::connect(&server.url_with_schema("dflt"))
        .await
        .unwrap();
    let sem = Semaphore::new(&store, "iso", 2, SemaphoreOptions::default()).unwrap();
    let holders = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (sem, holders) = (sem.clone(), holders.clone());
            tokio::spawn(async move {
                for _ in 0..25 {
                    let permit = sem.acquire().await?;
                    let now = holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    assert!(now <= 2, "{now} holders of 2 permits");
                    tokio::task::yield_now().await;
                    holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    permit.release().await?;
                }
                Ok::<_, Error>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .unwrap()
            .expect("every acquire and release succeeded");
    }
    drop((sem, store));

    let durable = wal_writes(&server, &server.url_with_schema("dflt"), 50).await;
    let url = format!("{}&synchronous_commit=off", server.url_with_schema("dflt"));
    let asynchronous = wal_writes(&server, &url, 50).await;
    assert!(
        durable >= 40,
        "50 pairs of synchronous commits made {durable} WAL writes (asynchronous: {asynchronous})"
    );
    assert!(
        asynchronous < 20,
        "50 pairs of asynchronous commits made {asynchronous} WAL writes"
    );
}

/// A server that ends idle sessions (`idle_session_timeout`, PostgreSQL 14 and later, set
/// for the database by an administrator, here 300 ms). tessera's connections are idle
/// between a lease's renewals, between calls, and the listener's between two pings; none is
/// ended: the listener keeps its backend, a holder keeps its permit across renewals, a call
/// after a pause succeeds, and a waiter of another process is woken by the push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ending_idle_sessions_ends_none_of_tesseras() {
    let server = PostgresServer::start();
    server.psql("ALTER DATABASE postgres SET idle_session_timeout = '300ms'");
    let pg = backend(&server, "idle").await;
    eventually(30, "the listener's backend is known", || {
        pg.listener_pid() != 0
    })
    .await;
    let (pid, reconnects) = (pg.listener_pid(), pg.listener_reconnects());

    let store = Store::connect(&server.url_with_schema("idle"))
        .await
        .unwrap();
    let opts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(1))
        .waiter_ttl(Duration::from_secs(3600));
    let sem = Semaphore::new(&store, "i", 1, opts).unwrap();
    let permit = sem.acquire().await.unwrap();
    // Renewals every ≈ 333 ms, each after more than the server's idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!permit.is_lost(), "the holder kept its permit");
    assert!(
        permit.release().await.unwrap(),
        "the release found the lease"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Held by another process; this waiter's heartbeat is 20 minutes away.
    let (_peer, held) = peer_holder(&server, "idle", "i").await;
    let waiter = queue_one(&sem);
    eventually(30, "the waiter is queued", || {
        server.psql("SELECT count(*) FROM idle.tessera_waiters") == "1"
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    held.release().await.unwrap();
    let got = granted(waiter, "woken by the push, with no error").await;
    got.release().await.unwrap();
    assert_eq!(
        (pg.listener_pid(), pg.listener_reconnects()),
        (pid, reconnects),
        "the listener kept its connection"
    );
}

/// A server's refusal reads as the server's message and SQLSTATE, under the redacted URL:
/// no password, and none of the client library's wrapping or the server's C source line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_says_why_in_the_servers_words() {
    let server = PostgresServer::start();
    let url = format!(
        "postgres://postgres:hunter2@127.0.0.1:{}/nope?schema=x",
        server.port()
    );
    let e = Store::connect(&url).await.unwrap_err().to_string();
    assert!(
        e.ends_with(&format!(
            "postgres://postgres:***@127.0.0.1:{}/nope?schema=x: PostgreSQL: database \"nope\" \
             does not exist (SQLSTATE 3D000)",
            server.port()
        )),
        "{e}"
    );
}

/// Refused credentials are an auth error in the shape of every server store: the server's
/// words, then a hint naming the URL with its password masked; the password never shows. A
/// wrong password is SQLSTATE 28P01, a role the server does not know 28000 (both were
/// "other" faults, which read as a fault of the server).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_or_an_unknown_role_is_an_auth_error_naming_the_url() {
    let server = PostgresServer::start();
    server.psql(
        "CREATE ROLE app LOGIN PASSWORD 'Right-pw-42'; GRANT CREATE ON DATABASE postgres TO app",
    );
    server.require_password("app");
    let port = server.port();
    let url = |user: &str| format!("postgres://{user}@127.0.0.1:{port}/postgres?schema=pw");
    Store::connect(&url("app:Right-pw-42"))
        .await
        .expect("the right password")
        .close()
        .await
        .unwrap();
    for (user, says) in [
        (
            "app:Wrong-pw-42",
            "password authentication failed for user \"app\" (SQLSTATE 28P01)",
        ),
        (
            "nobody:Wrong-pw-42",
            "role \"nobody\" does not exist (SQLSTATE 28000)",
        ),
    ] {
        let e = Store::connect(&url(user)).await.unwrap_err();
        assert!(e.is_auth(), "{e:?}");
        let masked = url(user).replace("Wrong-pw-42", "***");
        assert_eq!(
            e.to_string(),
            format!(
                "store error (auth): PostgreSQL: {says} (the server refused the credentials: \
                 check the user and password of {masked})"
            )
        );
        assert!(!format!("{e:?}").contains("Wrong-pw-42"), "{e:?}");
    }
}

/// A port where nothing listens: a connection error in the shape of every server store (as
/// Redis words it), naming the URL with its password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url_and_asks_whether_the_server_runs() {
    let port = tessera_testkit::servers::free_port();
    // (The listener is closed again here: nothing listens on the port.)
    let url = format!("postgres://app:hunter2-secret@127.0.0.1:{port}/postgres");
    let e = Store::connect(&url).await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("store error (connection): PostgreSQL: Connection refused"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "(nothing accepts connections at postgres://app:***@127.0.0.1:{port}/postgres: is \
             the server running, on this host and port?)"
        )),
        "{text}"
    );
    assert!(!format!("{text} {e:?}").contains("hunter2-secret"), "{e:?}");
}

/// A release right after the server restarted: the pooled connection it first takes is
/// dead, and the release is tried again on a new one rather than failing and leaving the
/// permit to its TTL (an hour here). The next acquire gets the permit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_a_restart_frees_the_permit() {
    let mut server = PostgresServer::start();
    let store = Store::connect(&server.url_with_schema("rr")).await.unwrap();
    let opts = SemaphoreOptions::default().ttl(LONG);
    let sem = Semaphore::new(&store, "rr", 1, opts).unwrap();
    for mode in [Shutdown::Fast, Shutdown::Immediate] {
        let permit = sem.acquire().await.unwrap();
        server.restart_with(mode);
        assert!(
            permit
                .release()
                .await
                .expect("the release reached the store"),
            "{mode:?}: the release found the lease"
        );
        let next = sem.try_acquire().await.unwrap();
        assert!(next.is_some(), "{mode:?}: the permit was free again");
        next.unwrap().release().await.unwrap();
    }
}

/// The usual application role has no `CREATE` on the database. Its first connect to a schema
/// nobody migrated fails with a message that says what to do; once an owner migrated the
/// schema and granted what that message names, the role holds, waits, is handed the permit
/// and rate-limits through the public API. A build with a newer step than the schema's
/// connects with this role too, and uses the owner's step until the owner connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_without_create_rights_uses_a_schema_an_owner_migrated() {
    let server = PostgresServer::start();
    server.psql("CREATE ROLE app LOGIN");
    let url = |role: &str| {
        format!(
            "postgres://{role}@127.0.0.1:{}/postgres?schema=shared",
            server.port()
        )
    };
    let e = Store::connect(&url("app")).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("42501") && text.contains("GRANT this role"),
        "{text}"
    );
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'shared'"),
        "0",
        "the refused connect created something"
    );

    Store::connect(&url("postgres")).await.unwrap();
    server.psql(
        "GRANT USAGE ON SCHEMA shared TO app; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA shared TO app; \
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA shared TO app",
    );
    tessera_testkit::conformance::serves_two_clients(&url("app")).await;

    // A build whose step is newer than the schema's (here: a step from before revisions,
    // without the heartbeats of several waiters in one call, nor a settle): the role may not
    // replace it, so it goes on with the owner's, which works, heartbeats included; a settle
    // is Unsupported and releases the permits.
    server.psql(
        "DROP FUNCTION shared.tessera__step_revision(); \
         DROP FUNCTION shared.tessera_heartbeat_many(text, text[], bigint[]); \
         DROP FUNCTION shared.tessera_settle(text, text, bigint, bigint, bigint, bigint, text)",
    );
    tessera_testkit::conformance::serves_two_clients(&url("app")).await;
    let store = Store::connect(&url("app")).await.unwrap();
    let adm = store
        .admission("old-settle")
        .permits(1)
        .rate("10/min".parse().unwrap())
        .unwrap();
    let ticket = adm.try_acquire().await.unwrap().expect("admitted");
    let err = ticket.settle(0).await.unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    assert!(
        adm.try_acquire().await.unwrap().is_some(),
        "the settle released the permit"
    );
    store.close().await.unwrap();
    let app = PostgresBackend::connect(&url("app")).await.unwrap();
    let (_, w) = hold_and_queue(&app, &name("old-step")).await;
    assert_eq!(
        app.heartbeat(&name("old-step"), w, LONG).await.unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(app.heartbeat_calls(), 0);
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_proc WHERE proname = 'tessera__step_revision'"),
        "0"
    );
    Store::connect(&url("postgres")).await.unwrap();
    assert_eq!(server.psql("SELECT shared.tessera__step_revision()"), "11");
}

/// `postgres:///db?host=/dir`: through the server's Unix socket (as libpq reads the URL),
/// with its wake-up listener: a waiter in another store is handed the permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_url_connects_through_the_socket() {
    let server = PostgresServer::start();
    // The socket file is named after the port: `localhost:PORT` picks it, the `host`
    // parameter says where it is.
    assert!(server
        .socket_dir()
        .join(format!(".s.PGSQL.{}", server.port()))
        .exists());
    let url = format!(
        "postgres://postgres@localhost:{}/postgres?host={}&schema=sock",
        server.port(),
        server.socket_dir().display()
    );
    let store = Store::connect(&url).await.unwrap();
    let other = Store::connect(&url).await.unwrap();
    let via: String = server.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'tessera%' \
         AND client_port = -1",
    );
    assert_ne!(via.trim(), "0", "no tessera session on the socket");
    tessera_testkit::conformance::hand_off_between(&store, &other, "s").await;
    let tcp: String = server.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE 'tessera%' \
         AND client_port <> -1",
    );
    assert_eq!(tcp.trim(), "0", "a tessera session went over TCP");
}

/// The usual set-up of a DBA who gives each application a schema of its own and no right to
/// create schemas: the schema's owner sets tessera up in it and uses it, although `CREATE
/// SCHEMA IF NOT EXISTS` would be refused on that database even for an existing schema.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_owner_of_a_schema_a_dba_made_sets_tessera_up_without_create_on_the_database() {
    let server = PostgresServer::start();
    server.psql(
        "CREATE ROLE app LOGIN; REVOKE CREATE ON DATABASE postgres FROM PUBLIC; \
         CREATE SCHEMA owned AUTHORIZATION app",
    );
    let url = format!(
        "postgres://app@127.0.0.1:{}/postgres?schema=owned",
        server.port()
    );
    tessera_testkit::conformance::serves_two_clients(&url).await;
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'owned' AND tablename = 'tessera_migrations'"),
        "1"
    );
    // The same role still may not create a schema tessera lacks: refused, nothing made.
    let other = url.replace("schema=owned", "schema=elsewhere");
    let e = Store::connect(&other).await.unwrap_err();
    assert!(e.to_string().contains("42501"), "{e}");
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'elsewhere'"),
        "0"
    );
}

/// `Store::connect_existing` (the CLI's `status`, `revoke`, `resize`, `delete`): a schema
/// tessera never set up is "no store", and neither the schema nor a table is created; a
/// set-up one opens and shows its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_existing_creates_nothing_where_tessera_has_no_schema() {
    let server = PostgresServer::start();
    let typo = server.url_with_schema("typo_123");
    let e = Store::connect_existing(&typo).await.unwrap_err();
    assert!(e.is_no_store(), "{e}");
    assert!(e.to_string().contains("typo_123"), "{e}");
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'typo_123'"),
        "0",
        "connect_existing created the schema"
    );
    // An empty schema of that name (made by someone else) is not a store either.
    server.psql("CREATE SCHEMA typo_123");
    assert!(Store::connect_existing(&typo)
        .await
        .unwrap_err()
        .is_no_store());
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_tables WHERE schemaname = 'typo_123'"),
        "0",
        "connect_existing created tables"
    );

    let url = server.url_with_schema("real");
    let store = Store::connect(&url).await.unwrap();
    let sem = store.semaphore("jobs", 2).unwrap();
    let permit = sem.acquire().await.unwrap();
    let existing = Store::connect_existing(&url).await.unwrap();
    let status = existing
        .semaphore("jobs", 2)
        .unwrap()
        .status()
        .await
        .unwrap();
    assert_eq!(status.used, 1);
    assert_eq!(status.holders[0].lease_id, permit.lease_id());
    permit.release().await.unwrap();
}

/// What the limiter of `name` counts (used and reserved, the largest over its limits).
async fn rate_used(pg: &PostgresBackend, name: &Name) -> u64 {
    pg.rate_status(name).await.unwrap().map_or(0, |s| {
        s.limits.iter().map(|l| l.used + l.reserved).max().unwrap()
    })
}

/// Admission through the seam, where the generic tests (`tests/admission.rs`) cannot look: an
/// admission that joins at the head goes before the plain waiter queued first (the seq below
/// the head's, with `head_seq` following it below 0); the release's hand-off stops at it and
/// only marks it woken, handing nothing to the plain waiter behind it; the admission's own
/// step charges its window and grants it (a retry answers the grant without its charge id);
/// its give-back returns the charge and the permit, which goes on to the plain waiter. The
/// semaphore row keeps the invariants the differential test checks at every step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_at_the_head_stops_the_hand_off_until_its_own_step_grants_it() {
    let server = PostgresServer::start();
    let pg = backend(&server, "gated").await;
    let adm = pg.admission().expect("the PostgreSQL store admits");
    let n = name("g");
    let (a, w) = hold_and_queue(&pg, &n).await;
    let config = RateConfig::new(&["5/min".parse().unwrap()], RateMode::Exact).unwrap();
    let x = LeaseId::random();
    let admit = AdmitRequest {
        acquire: req(x, 1, LONG, Some((LONG, 10))),
        cost: 1,
        update: false,
        at_head: true,
    };
    let consistent = || {
        server.psql(
            "SELECT count(*) FROM gated.tessera_semaphores s \
             JOIN gated.tessera_tails t ON t.name = s.name WHERE \
             t.enqueued - s.dequeued <> (SELECT count(*) FROM gated.tessera_waiters w WHERE w.name = s.name) \
             OR s.head_seq > t.next_seq \
             OR s.head_seq > (SELECT min(w.seq) FROM gated.tessera_waiters w WHERE w.name = s.name)",
        ) == "0"
    };
    let gate = || {
        server.psql(&format!(
            "SELECT seq || ' ' || gate FROM gated.tessera_waiters WHERE lease_id = '{x}'"
        ))
    };
    match adm.admit(&n, 1, &config, &admit).await.unwrap() {
        AdmitReply::Queued {
            position: 0,
            window_at: None,
            ..
        } => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(gate(), "-1 0", "first, waiting for permits");
    assert_eq!(
        server.psql("SELECT head_seq FROM gated.tessera_semaphores"),
        "-1"
    );
    assert!(consistent());
    let queue: Vec<LeaseId> = pg
        .status(&n)
        .await
        .unwrap()
        .unwrap()
        .queue
        .iter()
        .map(|q| q.lease_id)
        .collect();
    assert_eq!(queue, [x, w]);

    // The permit is freed: the hand-off wakes the admission and grants nobody.
    assert!(pg.release(&n, a).await.unwrap());
    assert_eq!(gate(), "-1 9223372036854775807", "woken");
    assert_eq!(pg.heartbeat(&n, w, LONG).await.unwrap(), WaitReply::Waiting);
    assert_eq!(rate_used(&pg, &n).await, 0);
    assert!(consistent());

    // Its own step charges the window and grants, at one instant.
    let AdmitReply::Granted { grant, reservation } =
        adm.admit(&n, 1, &config, &admit).await.unwrap()
    else {
        panic!("the woken admission was not granted")
    };
    assert!(reservation > 0);
    assert_eq!(grant.lease.acquired_at, grant.now);
    assert_eq!(rate_used(&pg, &n).await, 1);
    assert_eq!(gate(), "", "no longer queued");
    // A retry whose reply was lost: the same grant, without its charge id, charged once.
    match adm.admit(&n, 1, &config, &admit).await.unwrap() {
        AdmitReply::Granted {
            grant: again,
            reservation: 0,
        } => assert_eq!(again.lease, grant.lease),
        other => panic!("{other:?}"),
    }
    assert_eq!(rate_used(&pg, &n).await, 1);
    assert_eq!(pg.heartbeat(&n, w, LONG).await.unwrap(), WaitReply::Waiting);

    // Given back: the charge (still the latest) and the permit, which the plain waiter gets.
    let given = GiveBack {
        reservation,
        at: grant.lease.acquired_at,
        expired: false,
    };
    assert!(adm.give_back(&n, x, given).await.unwrap());
    assert_eq!(rate_used(&pg, &n).await, 0);
    assert!(matches!(
        pg.heartbeat(&n, w, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
    assert!(consistent());
    // Given back twice: nothing held, nothing more returned.
    assert!(!adm.give_back(&n, x, given).await.unwrap());
    assert!(pg.release(&n, w).await.unwrap());
}

/// An admission waiter is woken without a grant once its permit is free, by a release in
/// another process (a `NOTIFY` of its bare lease id on its process's channel) or in its own
/// (the bare lease id in the release's reply), and then its own step charges and grants it.
/// Every lease and waiter TTL is an hour, so its poll is 15 minutes away and no expiry comes
/// sooner: only the wake-up can have reached it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admission_waiter_is_woken_by_a_release_in_another_process_or_its_own() {
    let server = PostgresServer::start();
    let store = Store::connect(&server.url_with_schema("woken"))
        .await
        .unwrap();
    let hour = Duration::from_secs(3600);
    let opts = SemaphoreOptions::default().ttl(hour).waiter_ttl(hour);
    let adm = store
        .admission("woken")
        .permits(1)
        .semaphore_options(opts.clone())
        .rate("10/min".parse().unwrap())
        .unwrap();
    let queued =
        || server.psql("SELECT count(*) FROM woken.tessera_waiters WHERE gate IS NOT NULL") == "1";
    let wait = |adm: &Admission| {
        let adm = adm.clone();
        tokio::spawn(async move { adm.acquire_timeout(Duration::from_secs(60)).await })
    };

    // Held by another process, for an hour too: no expiry it could be told of comes first.
    let peer = Store::connect(&peer_url(&server, "woken")).await.unwrap();
    let held = Semaphore::new(&peer, "woken", 1, opts.clone())
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let waiting = wait(&adm);
    eventually(30, "the admission is queued", queued).await;
    held.release().await.unwrap();
    let ticket = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("woken by the peer's release");
    ticket.release().await.unwrap();

    let sem = Semaphore::new(&store, "woken", 1, opts).unwrap();
    let permit = sem.try_acquire().await.unwrap().expect("the free permit");
    let waiting = wait(&adm);
    eventually(30, "the admission is queued", queued).await;
    permit.release().await.unwrap();
    let ticket = waiting
        .await
        .unwrap()
        .unwrap()
        .expect("woken by its own process's release");
    assert_eq!(
        store.rate_status("woken").await.unwrap().unwrap().limits[0].used,
        2
    );
    ticket.release().await.unwrap();
    store.close().await.unwrap();
    peer.close().await.unwrap();
}

/// Turns a schema this build migrated back into what a build of migration 11 left: each
/// semaphore's row keeps `queued`, `next_seq` and `finish` again (from its tail), and there
/// are no tails, no `dequeued` and none of the step's fields of migration 12.
fn back_to_migration_11(server: &PostgresServer, schema: &str) {
    server.psql(&format!(
        "ALTER TABLE {s}.tessera_semaphores ADD COLUMN queued bigint, \
           ADD COLUMN next_seq bigint, ADD COLUMN finish bigint NOT NULL DEFAULT 0; \
         UPDATE {s}.tessera_semaphores x SET queued = t.enqueued - x.dequeued, \
           next_seq = t.next_seq, finish = t.finish \
           FROM {s}.tessera_tails t WHERE t.name = x.name; \
         ALTER TABLE {s}.tessera_semaphores ALTER COLUMN queued SET NOT NULL, \
           ALTER COLUMN next_seq SET NOT NULL, DROP COLUMN dequeued; \
         DROP TABLE {s}.tessera_tails; \
         ALTER TYPE {s}.tessera_step DROP ATTRIBUTE enqueued, DROP ATTRIBUTE dequeued, \
           DROP ATTRIBUTE tail, DROP ATTRIBUTE wait_purge_at; \
         DELETE FROM {s}.tessera_migrations WHERE version >= 12",
        s = schema
    ));
}

/// The lease ids of a status's queue, in its order.
fn queue_of(s: &SemaphoreStatus) -> Vec<LeaseId> {
    s.queue.iter().map(|w| w.lease_id).collect()
}

/// A schema at version 11 with a holder and waiters gains the tail's row (migration 12) at the
/// next connect: the holder and the waiters are kept in their order, the tail counts them
/// (`enqueued - dequeued`) and goes on from their `next_seq`, a newcomer queues behind them,
/// and the hand-off follows that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_migration_11_keeps_its_holder_and_waiters_in_order() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("twelve");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("kept");
    let (a, w1) = hold_and_queue(&pg, &n).await;
    let (w2, w3) = (LeaseId::random(), LeaseId::random());
    for (w, position) in [(w2, 1), (w3, 2)] {
        assert_eq!(
            pg.acquire(&n, 1, &req(w, 1, LONG, Some((LONG, 10))))
                .await
                .unwrap(),
            AcquireReply::Queued { position }
        );
    }
    drop(pg);
    back_to_migration_11(&server, "twelve");
    assert_eq!(versions(&server, "twelve"), "1,2,3,4,5,6,7,8,9,10,11");
    assert_eq!(
        server.psql("SELECT queued || ' ' || next_seq FROM twelve.tessera_semaphores"),
        "3 3"
    );
    let pg = PostgresBackend::connect(&url).await.unwrap();
    assert_eq!(versions(&server, "twelve"), "1,2,3,4,5,6,7,8,9,10,11,12");
    assert_eq!(
        server.psql(
            "SELECT t.enqueued || ' ' || s.dequeued || ' ' || t.next_seq \
             FROM twelve.tessera_semaphores s JOIN twelve.tessera_tails t USING (name)"
        ),
        "3 0 3"
    );
    assert_eq!(
        server.psql(
            "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'twelve' \
             AND table_name = 'tessera_semaphores' AND column_name IN ('queued', 'next_seq', 'finish')"
        ),
        "0"
    );
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, a);
    assert_eq!(queue_of(&status), [w1, w2, w3]);
    let w4 = LeaseId::random();
    assert_eq!(
        pg.acquire(&n, 1, &req(w4, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 3 }
    );
    assert!(pg.release(&n, a).await.unwrap());
    assert!(matches!(
        pg.heartbeat(&n, w1, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
    assert_eq!(pg.cancel(&n, w3).await.unwrap(), CancelReply::Dequeued);
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, w1);
    assert_eq!(queue_of(&status), [w2, w4]);
    assert_eq!(
        server.psql(
            "SELECT t.enqueued - s.dequeued FROM twelve.tessera_semaphores s \
             JOIN twelve.tessera_tails t USING (name)"
        ),
        "2"
    );
}

/// Waits (at most 3 s) until some session of the server waits for a lock: a step of the
/// store held up by the test's open transaction.
async fn until_a_lock_wait(server: &PostgresServer) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while server.psql(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND backend_type = 'client backend'",
    ) == "0"
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// "No lost wake-up" (docs/sql-queue.md), the release first: a release that ends with free
/// permits is in flight (its transaction held open) while a waiter enqueues. The enqueue
/// waits for the release's lock on the tail, then sees the freed permit and asks for a step
/// at once: the waiter is granted long before its heartbeat (20 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_in_flight_before_an_enqueue_is_seen_by_it() {
    use sqlx::Connection;
    let server = PostgresServer::start();
    let url = server.url_with_schema("gfirst");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let store = Store::connect(&url).await.unwrap();
    let n = name("g");
    let (a, b) = (LeaseId::random(), LeaseId::random());
    for lease in [a, b] {
        assert!(matches!(
            pg.acquire(&n, 2, &req(lease, 1, LONG, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
    let mut g = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN; SET LOCAL search_path TO gfirst")
        .execute(&mut g)
        .await
        .unwrap();
    let held: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT held::text FROM tessera_release('g', '{a}', NULL)"
    )))
    .fetch_one(&mut g)
    .await
    .unwrap();
    assert_eq!(held, "true");
    let opts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(120))
        .waiter_ttl(Duration::from_secs(60));
    let sem = Semaphore::new(&store, "g", 2, opts).unwrap();
    let waiter = queue_one(&sem);
    until_a_lock_wait(&server).await;
    sqlx::raw_sql("COMMIT").execute(&mut g).await.unwrap();
    let p = joined(
        waiter,
        Duration::from_secs(5),
        "the waiter beside the permit freed during its enqueue",
    )
    .await
    .unwrap();
    p.release().await.unwrap();
}

/// "No lost wake-up", the enqueue first: an enqueue is in flight (its transaction held open,
/// after its insert) while a release frees a permit. The release waits for the enqueue's
/// lock on the tail before it commits, sees the new waiter and grants it itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_in_flight_before_a_release_is_granted_by_it() {
    use sqlx::Connection;
    let server = PostgresServer::start();
    let url = server.url_with_schema("wfirst");
    let pg = PostgresBackend::connect(&url).await.unwrap();
    let n = name("w");
    let (a, b, w) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    for lease in [a, b] {
        assert!(matches!(
            pg.acquire(&n, 2, &req(lease, 1, LONG, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
    let mut enqueue = sqlx::PgConnection::connect(&url).await.unwrap();
    sqlx::raw_sql("BEGIN; SET LOCAL search_path TO wfirst")
        .execute(&mut enqueue)
        .await
        .unwrap();
    let queued: String = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT outcome FROM tessera_acquire('w', 2, '{w}', 1, 3600000000, 'w', '', \
           3600000000, 10)"
    )))
    .fetch_one(&mut enqueue)
    .await
    .unwrap();
    assert_eq!(queued, "queued");
    let release = {
        let pg = PostgresBackend::connect(&url).await.unwrap();
        let n = n.clone();
        tokio::spawn(async move { pg.release(&n, a).await })
    };
    until_a_lock_wait(&server).await;
    sqlx::raw_sql("COMMIT").execute(&mut enqueue).await.unwrap();
    assert!(release.await.unwrap().unwrap());
    assert_eq!(
        server.psql(&format!(
            "SELECT count(*) FROM wfirst.tessera_holders WHERE lease_id = '{w}'"
        )),
        "1",
        "the release committed beside the waiter without granting it"
    );
    let status = pg.status(&n).await.unwrap().unwrap();
    assert_eq!((status.used, status.queue.len()), (2, 0));
}

/// Enqueues that run at once, from several processes, take their places in the order they
/// commit (the tail's lock is held to the commit): while they run, every snapshot of the
/// queue is a prefix of the seq order (no gap), and at the end each waiter's position is its
/// place in the queue, the positions are 0 to n - 1, and the seqs are the queue's order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_queue_in_commit_order() {
    let server = PostgresServer::start();
    let url = server.url_with_schema("fifo");
    let n = name("f");
    let mut backends = Vec::new();
    for _ in 0..3 {
        backends.push(std::sync::Arc::new(
            PostgresBackend::connect(&url).await.unwrap(),
        ));
    }
    let holder = LeaseId::random();
    assert!(matches!(
        backends[0]
            .acquire(&n, 1, &req(holder, 1, LONG, None))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
    let count = 36;
    let tasks: Vec<_> = (0..count)
        .map(|i| {
            let pg = std::sync::Arc::clone(&backends[i % 3]);
            let n = n.clone();
            tokio::spawn(async move {
                let lease = LeaseId::random();
                let reply = pg
                    .acquire(&n, 1, &req(lease, 1, LONG, Some((LONG, 1000))))
                    .await
                    .unwrap();
                (lease, reply)
            })
        })
        .collect();
    let gap = "SELECT count(*) FROM fifo.tessera_waiters \
               HAVING count(*) > 0 AND max(seq) - min(seq) + 1 <> count(*)";
    while !tasks.iter().all(|t| t.is_finished()) {
        assert_eq!(server.psql(gap), "", "a snapshot of the queue with a gap");
    }
    let mut placed = vec![None; count];
    for t in tasks {
        let (lease, reply) = t.await.unwrap();
        let AcquireReply::Queued { position } = reply else {
            panic!("{reply:?}")
        };
        assert!(
            placed[position as usize].is_none(),
            "position {position} twice"
        );
        placed[position as usize] = Some(lease);
    }
    let placed: Vec<LeaseId> = placed.into_iter().map(Option::unwrap).collect();
    let status = backends[0].status(&n).await.unwrap().unwrap();
    assert_eq!(queue_of(&status), placed);
    assert_eq!(
        server.psql(
            "SELECT string_agg(lease_id, ',' ORDER BY seq) = string_agg(lease_id, ',' ORDER BY tag, seq) \
             AND max(seq) - min(seq) + 1 = count(*) FROM fifo.tessera_waiters"
        ),
        "t"
    );
}
