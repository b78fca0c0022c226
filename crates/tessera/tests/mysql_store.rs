//! The MySQL / MariaDB store against a throwaway MariaDB (a missing `mariadbd` fails the
//! test with the install line). The store must behave like the reference model
//! (`memory://`) operation by operation (the test kit's differential test, on the server's
//! clock: long TTLs, times and fences left out); expiry, migrations, lock waits, garbage in
//! the rows and the server's clock are tested separately.
#![cfg(feature = "mysql")]

use std::time::Duration;

use tessera::backend::stores::MysqlBackend;
use tessera::backend::*;
use tessera::*;
use tessera_testkit::conformance::joined;
use tessera_testkit::differential::{DiffClock, Differential, Seen};
use tessera_testkit::gathered::{ManyWaiters, SHORT};
use tessera_testkit::seam::{self, name, req, LONG};
use tessera_testkit::servers::fill_pool;
use tessera_testkit::servers::mysql::MariaDbServer;
use tessera_testkit::status_locks::{self, Blocker};

/// The test kit's differential test against the reference model; after every step, no row
/// of a semaphore without holders or waiters is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behaves_like_the_memory_model_operation_by_operation() {
    let server = MariaDbServer::start();
    let mut seen = Seen::default();
    for seed in 0..6u64 {
        let url = server.url(&format!("diff{seed}"));
        let store = MysqlBackend::connect(&url).await.unwrap();
        let mut d = Differential::new(&store, DiffClock::Server, seed);
        for step in 0..300 {
            let what = d.step().await;
            if step % 50 == 49 {
                let stale = server.sql(&format!(
                    "SELECT COUNT(*) FROM diff{seed}.tessera_semaphores s \
                     JOIN diff{seed}.tessera_tails t ON t.name = s.name WHERE s.used = 0 \
                     AND t.enqueued = s.dequeued"
                ));
                assert_eq!(stale.trim(), "0", "{what} left an empty semaphore row");
            }
        }
        seen.add(&d);
    }
    seen.assert_every_answer_reached();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_holders_and_waiters_are_purged_and_the_queue_moves_on() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    seam::expired_holders_and_waiters_are_purged(&db).await;
    assert_no_rows_left(&server, "t");
}

/// Processes that start together migrate one after another (or find the tables made), and
/// every one of them works; the recorded version is this build's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connects_migrate_once_and_all_work() {
    let server = MariaDbServer::start();
    let url = server.url("fresh");
    let connects = (0..8).map(|_| MysqlBackend::connect(&url));
    let stores: Vec<MysqlBackend> = futures::future::join_all(connects)
        .await
        .into_iter()
        .collect::<Result<_>>()
        .unwrap();
    let version =
        server.sql("SELECT meta_value FROM fresh.tessera_meta WHERE meta_key = 'schema_version'");
    assert_eq!(version.trim(), "10");
    for (i, s) in stores.iter().enumerate() {
        let n = name(&format!("s{i}"));
        let id = LeaseId::random();
        assert!(matches!(
            s.acquire(&n, 1, &req(id, 1, LONG, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        assert!(s.release(&n, id).await.unwrap());
    }
    // Connecting again changes nothing.
    MysqlBackend::connect(&url).await.unwrap();
    let version =
        server.sql("SELECT meta_value FROM fresh.tessera_meta WHERE meta_key = 'schema_version'");
    assert_eq!(version.trim(), "10");
    let routines =
        server.sql("SELECT meta_value FROM fresh.tessera_meta WHERE meta_key = 'routines_version'");
    assert_eq!(routines.trim(), "10");
    let procedures = server.sql(
        "SELECT GROUP_CONCAT(ROUTINE_NAME ORDER BY ROUTINE_NAME) FROM information_schema.ROUTINES \
         WHERE ROUTINE_SCHEMA = 'fresh'",
    );
    assert_eq!(
        procedures.trim(),
        "tessera_v10_release,tessera_v10_ring,\
         tessera_v4_acquire_one,tessera_v4_keep_alive,tessera_v4_release,\
         tessera_v5_heartbeat_many,tessera_v6_acquire_one,tessera_v6_heartbeat_many,\
         tessera_v6_release,tessera_v7_acquire_one,tessera_v7_heartbeat_many,\
         tessera_v7_keep_alive,tessera_v7_release,tessera_v8_acquire_one,tessera_v8_release,\
         tessera_v9_acquire_one,tessera_v9_heartbeat_many,tessera_v9_keep_alive,tessera_v9_release"
    );
}

/// Every semaphore table of database `db` is empty: nothing outlives its semaphore.
fn assert_no_rows_left(server: &MariaDbServer, db: &str) {
    for table in ["semaphores", "tails", "holders", "waiters", "free_seats"] {
        let left = server.sql(&format!("SELECT COUNT(*) FROM {db}.tessera_{table}"));
        assert_eq!(left.trim(), "0", "tessera_{table} keeps rows");
    }
}

/// Names are compared byte for byte, as on every other store: `Case` and `case` are two
/// semaphores on the procedures' path too, whose parameters are `ascii_general_ci` (the
/// columns' `ascii_bin` wins each comparison).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_differ_only_in_case_are_two_semaphores() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("c")).await.unwrap();
    let (upper, lower) = (name("Case"), name("case"));
    let (a, b, c, d) = (
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
    );
    let wait = Some((LONG, 10));
    for (n, id) in [(&upper, a), (&lower, b)] {
        let AcquireReply::Granted(g) = db.acquire(n, 1, &req(id, 1, LONG, None)).await.unwrap()
        else {
            panic!("{n} not granted: the other name's holder counted against it")
        };
        assert_eq!(g.lease.seats, vec![0]);
    }
    for (n, id) in [(&upper, c), (&lower, d)] {
        let queued = db.acquire(n, 1, &req(id, 1, LONG, wait)).await.unwrap();
        assert_eq!(queued, AcquireReply::Queued { position: 0 }, "{n}");
    }
    // Releasing Case hands its permit to Case's waiter, never to case's.
    assert!(db.release(&upper, a).await.unwrap());
    assert!(matches!(
        db.heartbeat(&upper, c, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
    assert_eq!(
        db.heartbeat(&lower, d, LONG).await.unwrap(),
        WaitReply::Waiting
    );
    assert!(!db.release(&lower, a).await.unwrap());
    assert!(db.release(&lower, b).await.unwrap());
    assert!(matches!(
        db.heartbeat(&lower, d, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
    for (n, id) in [(&upper, c), (&lower, d)] {
        assert!(db.release(n, id).await.unwrap());
    }
    assert_no_rows_left(&server, "c");
}

/// What turns database `db`'s semaphore rows (kept) back into those of schema version 9 and
/// below, one row per semaphore with `queued`, `next_seq` and `finish` and no tail rows
/// (`tails.sql` undone; the routines of version 9 dropped); the versions are left to the
/// caller.
fn one_row(db: &str) -> String {
    format!(
        "ALTER TABLE {db}.tessera_semaphores ADD COLUMN queued BIGINT NOT NULL DEFAULT 0, \
         ADD COLUMN next_seq BIGINT NOT NULL DEFAULT 0, ADD COLUMN finish BIGINT NOT NULL DEFAULT 0; \
         UPDATE {db}.tessera_semaphores s JOIN {db}.tessera_tails t ON t.name = s.name \
         SET s.queued = t.enqueued - s.dequeued, s.next_seq = t.next_seq, s.finish = t.finish; \
         ALTER TABLE {db}.tessera_semaphores DROP COLUMN dequeued; DROP TABLE {db}.tessera_tails; \
         DROP PROCEDURE IF EXISTS {db}.tessera_v9_acquire_one; DROP PROCEDURE IF EXISTS {db}.tessera_v9_release; \
         DROP PROCEDURE IF EXISTS {db}.tessera_v9_keep_alive; DROP PROCEDURE IF EXISTS {db}.tessera_v9_heartbeat_many; \
         UPDATE {db}.tessera_meta SET meta_value = LEAST(meta_value, 8) \
         WHERE meta_key = 'routines_version'; "
    )
}

/// Lease A holds the one permit of `n` and lease B waits behind it: their ids, A's grant.
async fn held_and_queued(db: &MysqlBackend, n: &Name) -> (LeaseId, LeaseId, Grant) {
    let (a, b) = (LeaseId::random(), LeaseId::random());
    let AcquireReply::Granted(ga) = db.acquire(n, 1, &req(a, 1, LONG, None)).await.unwrap() else {
        panic!("A not granted")
    };
    assert_eq!(
        db.acquire(n, 1, &req(b, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    (a, b, ga)
}

/// The server's count of procedure calls.
fn calls(server: &MariaDbServer) -> u64 {
    let out = server.sql("SHOW GLOBAL STATUS LIKE 'Com_call_procedure'");
    out.split_whitespace().last().unwrap().parse().unwrap()
}

/// Heartbeats of many waiters of one semaphore that arrive together go to the server in a
/// few calls (`tessera_v5_heartbeat_many`), and each waiter gets what a heartbeat of its own
/// gets (`tessera_testkit::gathered`), its queue entry renewed by its own waiter TTL. An
/// expired waiter is purged by the gathered call, as by the step, and the answers are the
/// same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_gathered_in_one_call_answer_as_each_alone() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("beats")).await.unwrap();
    let many = ManyWaiters::queue(&db).await;
    let (before, calls_before) = (db.heartbeat_calls(), calls(&server));
    many.heartbeat_all(&db).await;
    let gathered = db.heartbeat_calls() - before;
    assert!(
        gathered <= 10,
        "{} heartbeats took {gathered} calls",
        many.beats()
    );
    // The gathered calls, plus one call alone for each lease they left alone (the holder,
    // the unknown lease, the other semaphore's).
    let procedure_calls = calls(&server) - calls_before;
    assert!(procedure_calls <= 15, "{procedure_calls} procedure calls");
    // Each entry was renewed by its own waiter TTL (enqueued with 5 s).
    let renewed = |long: bool| {
        server
            .sql(&format!(
                "SELECT COUNT(*) FROM beats.tessera_waiters WHERE name = 'many' \
                 AND (expires_at - enqueued_at > 600000000) = {long}"
            ))
            .trim()
            .to_string()
    };
    assert_eq!((renewed(true), renewed(false)), ("30".into(), "30".into()));

    // A waiter whose entry expires: every answer stays the same, and it is gone (the
    // gathered call purges it: `the_gathered_call_purges_expired_waiters_and_answers_the_rest`
    // in the store's unit tests checks that call by call).
    let brief = many.queue_one(&db, Duration::from_millis(300)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    many.heartbeat_all(&db).await;
    assert_eq!(
        db.heartbeat(&many.name, brief, SHORT).await.unwrap(),
        WaitReply::Gone
    );
    assert_eq!(
        server
            .sql("SELECT COUNT(*) FROM beats.tessera_waiters WHERE name = 'many'")
            .trim(),
        "60"
    );

    // One lone heartbeat goes alone, as before: its entry is fresh, so it is one read and no
    // procedure call.
    let (before, calls_before) = (db.heartbeat_calls(), calls(&server));
    assert_eq!(
        db.heartbeat(&many.name, many.waiters[0], LONG)
            .await
            .unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(db.heartbeat_calls() - before, 1);
    assert_eq!(calls(&server) - calls_before, 0);
}

/// An acquire of one permit, a release, also one that hands the permit to the queue head,
/// a waiter's heartbeat and a renewal are each one procedure call; the grant handed off
/// carries the next fence and the freed seat, and its renewal makes it a lease of the full
/// TTL from the server's time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hot_path_is_one_procedure_call_per_operation() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let n = name("hot");
    let before = calls(&server);
    let (a, b, ga) = held_and_queued(&db, &n).await;
    assert_eq!(calls(&server) - before, 2);
    // A heartbeat that the read-only probe cannot answer (the entry has less than half of
    // the heartbeat's TTL left) is one call, which renews the entry and its doorbell.
    let before = calls(&server);
    assert_eq!(
        db.heartbeat(&n, b, LONG * 4).await.unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(calls(&server) - before, 1, "the heartbeat ran client side");
    let st = db.status(&n).await.unwrap().unwrap();
    assert_eq!(st.queue.len(), 1);
    assert!(st.queue[0].expires_at >= st.now.plus(LONG * 3));
    let before = calls(&server);
    assert!(db.release(&n, a).await.unwrap());
    assert_eq!(calls(&server) - before, 1);
    // B was granted by that release, in the same call.
    let WaitReply::Granted(gb) = db.heartbeat(&n, b, LONG).await.unwrap() else {
        panic!("B not granted by the release")
    };
    assert_eq!(gb.lease.seats, vec![0]);
    assert!(gb.lease.fence > ga.lease.fence);
    let before = calls(&server);
    let RenewReply::Renewed { expires_at, now } = db.renew(&n, b, LONG).await.unwrap() else {
        panic!("B's renewal found it gone")
    };
    assert_eq!(expires_at, now.plus(LONG));
    assert!(now >= gb.now);
    assert_eq!(db.renew(&n, a, LONG).await.unwrap(), RenewReply::Gone);
    assert_eq!(calls(&server) - before, 2, "a renewal ran client side");
    let st = db.status(&n).await.unwrap().unwrap();
    assert_eq!(st.holders.len(), 1);
    assert_eq!(st.holders[0].expires_at, expires_at);
    // A retried acquire of B answers its grant (as renewed); a retried release of A changes
    // nothing.
    let AcquireReply::Granted(again) = db.acquire(&n, 1, &req(b, 1, LONG, None)).await.unwrap()
    else {
        panic!("B's retry not granted")
    };
    assert_eq!(
        again.lease,
        Lease {
            expires_at,
            ..gb.lease.clone()
        }
    );
    assert!(!db.release(&n, a).await.unwrap());
    assert!(db.release(&n, b).await.unwrap());
    assert!(db.status(&n).await.unwrap().is_none());
    assert_no_rows_left(&server, "t");
}

/// Every connection of a client killed at once (`KILL CONNECTION`, as a server restart or a
/// cut does): its next renewal and heartbeat still answer. Each is a procedure call that may
/// run twice, so it is sent again on the next pooled connection, past every dead one (a
/// hand-off grant's first renewal comes 100 ms after the grant; failing on each dead
/// connection one keeper retry apart, it was reported lost in chaos s9-client-kill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_heartbeats_get_past_every_dead_pooled_connection() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("cut")).await.unwrap();
    let n = name("cut");
    let (a, b, _) = held_and_queued(&db, &n).await;
    let open = || {
        server
            .sql("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = 'cut'")
            .trim()
            .parse::<usize>()
            .unwrap()
    };
    for round in 0..2 {
        let (db, n) = (&db, &n);
        fill_pool(4, open, move || async move {
            let (w, x, y, z) = tokio::join!(db.status(n), db.status(n), db.status(n), db.status(n));
            for r in [w, x, y, z] {
                r.unwrap();
            }
        })
        .await;
        server.cut_clients();
        let before = calls(&server);
        let renewed = db.renew(n, a, LONG).await;
        assert!(
            matches!(renewed, Ok(RenewReply::Renewed { .. })),
            "round {round}: {renewed:?}"
        );
        // With less than half of the heartbeat's TTL left, the full heartbeat runs.
        let beat = db.heartbeat(n, b, LONG * 4).await;
        assert!(
            matches!(beat, Ok(WaitReply::Waiting)),
            "round {round}: {beat:?}"
        );
        assert!(
            calls(&server) - before >= 2,
            "round {round}: ran client side"
        );
    }
    assert!(db.release(&n, a).await.unwrap());
    assert!(db.release(&n, b).await.unwrap());
}

/// A database migrated by a build of routine version 3, holding a holder and a waiter, gets
/// version 4's procedures at the next connect and loses the earlier ones (they could read
/// rows from before the step they waited for); the schema version stays where older builds
/// read it, a client that finds the procedures gone runs the client-side step, and the
/// state carries over: the waiter queued before is granted by a release through a procedure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routines_are_added_to_a_database_holding_state_and_older_clients_keep_working() {
    let server = MariaDbServer::start();
    let url = server.url("old");
    let old = MysqlBackend::connect(&url).await.unwrap();
    // What a build of routine version 3 leaves: its procedures (stand-ins here, by name),
    // none of versions 4 to 10, routines_version 3.
    server.sql(
        "DROP PROCEDURE old.tessera_v4_acquire_one; DROP PROCEDURE old.tessera_v4_release; \
         DROP PROCEDURE old.tessera_v4_keep_alive; DROP PROCEDURE old.tessera_v5_heartbeat_many; \
         DROP PROCEDURE old.tessera_v6_acquire_one; DROP PROCEDURE old.tessera_v6_release; \
         DROP PROCEDURE old.tessera_v6_heartbeat_many; \
         DROP PROCEDURE old.tessera_v7_acquire_one; DROP PROCEDURE old.tessera_v7_release; \
         DROP PROCEDURE old.tessera_v7_keep_alive; DROP PROCEDURE old.tessera_v7_heartbeat_many; \
         DROP PROCEDURE old.tessera_v8_acquire_one; DROP PROCEDURE old.tessera_v8_release; \
         DROP PROCEDURE old.tessera_v9_acquire_one; DROP PROCEDURE old.tessera_v9_release; \
         DROP PROCEDURE old.tessera_v9_keep_alive; DROP PROCEDURE old.tessera_v9_heartbeat_many; \
         DROP PROCEDURE old.tessera_v10_release; DROP PROCEDURE old.tessera_v10_ring; \
         CREATE PROCEDURE old.tessera_v2_acquire_one() BEGIN END; \
         CREATE PROCEDURE old.tessera_v2_release() BEGIN END; \
         CREATE PROCEDURE old.tessera_v3_keep_alive() BEGIN END; \
         UPDATE old.tessera_meta SET meta_value = 3 WHERE meta_key = 'routines_version'",
    );
    let n = name("carried");
    let before = calls(&server);
    let (a, b, _) = held_and_queued(&old, &n).await;
    // The calls failed (no procedure) and the client-side step answered.
    assert_eq!(calls(&server) - before, 2);

    let new = MysqlBackend::connect(&url).await.unwrap();
    let meta = |key: &str| {
        server.sql(&format!(
            "SELECT meta_value FROM old.tessera_meta WHERE meta_key = '{key}'"
        ))
    };
    assert_eq!(meta("routines_version").trim(), "10");
    assert_eq!(meta("schema_version").trim(), "10");
    assert_eq!(
        server
            .sql(
                "SELECT GROUP_CONCAT(ROUTINE_NAME ORDER BY ROUTINE_NAME) \
                 FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = 'old'"
            )
            .trim(),
        "tessera_v10_release,tessera_v10_ring,\
         tessera_v4_acquire_one,tessera_v4_keep_alive,tessera_v4_release,\
         tessera_v5_heartbeat_many,tessera_v6_acquire_one,tessera_v6_heartbeat_many,\
         tessera_v6_release,tessera_v7_acquire_one,tessera_v7_heartbeat_many,\
         tessera_v7_keep_alive,tessera_v7_release,tessera_v8_acquire_one,tessera_v8_release,\
         tessera_v9_acquire_one,tessera_v9_heartbeat_many,tessera_v9_keep_alive,tessera_v9_release"
    );
    let before = calls(&server);
    assert!(new.release(&n, a).await.unwrap());
    assert_eq!(calls(&server) - before, 1);
    let WaitReply::Granted(g) = old.heartbeat(&n, b, LONG).await.unwrap() else {
        panic!("the waiter queued before the migration was not granted")
    };
    assert_eq!(g.lease.seats, vec![0]);
    // Both clients work on the migrated database.
    assert!(old.release(&n, b).await.unwrap());
    let c = LeaseId::random();
    assert!(matches!(
        new.acquire(&n, 1, &req(c, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(new.release(&n, c).await.unwrap());
    assert!(new.status(&n).await.unwrap().is_none());
}

/// A user who may not create routines still connects, and every operation runs client
/// side.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_create_routine_connects_and_works_client_side() {
    let server = MariaDbServer::start();
    server.url("limited");
    server.sql(
        "CREATE USER 'plain'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE ON limited.* TO 'plain'@'127.0.0.1'",
    );
    let url = format!("mysql://plain@127.0.0.1:{}/limited", server.port());
    let db = MysqlBackend::connect(&url).await.unwrap();
    let routines = server
        .sql("SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = 'limited'");
    assert_eq!(routines.trim(), "0");
    let n = name("plain");
    let (a, b, _) = held_and_queued(&db, &n).await;
    assert!(db.release(&n, a).await.unwrap());
    assert!(matches!(
        db.heartbeat(&n, b, LONG).await.unwrap(),
        WaitReply::Granted(_)
    ));
}

/// `connect_existing` (the CLI's status, revoke, resize, delete) on a database without
/// tessera's tables is `NoStore` and creates nothing there, neither tables nor procedures;
/// once a normal connect has set the database up, it opens it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_existing_creates_nothing_and_opens_what_exists() {
    let server = MariaDbServer::start();
    let url = server.url("typo");
    let objects = || {
        server
            .sql(
                "SELECT (SELECT COUNT(*) FROM information_schema.TABLES \
                 WHERE TABLE_SCHEMA = 'typo') + (SELECT COUNT(*) FROM \
                 information_schema.ROUTINES WHERE ROUTINE_SCHEMA = 'typo')",
            )
            .trim()
            .to_string()
    };
    let err = MysqlBackend::connect_existing(&url).await.unwrap_err();
    assert!(err.is_no_store(), "{err}");
    assert!(err.to_string().contains("typo"), "{err}");
    let err = Store::connect_existing(&url).await.unwrap_err();
    assert!(err.is_no_store(), "{err}");
    assert_eq!(objects(), "0", "connect_existing created something");

    MysqlBackend::connect(&url).await.unwrap();
    let existing = Store::connect_existing(&url).await.unwrap();
    assert!(existing.status("nothing").await.unwrap().is_none());
    existing.close().await.unwrap();
}

/// A database of schema version 2 (holder rows without a doorbell, waiter rows without a
/// gate): a user who may not ALTER still connects and works on it (revokes then reach
/// holders at renewal; admissions answer Unsupported), and the schema stays at 2; a user who
/// may adds both columns (and those of versions 5 to 7), and the version becomes 7.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_doorbells_are_added_to_an_older_schema_by_a_user_who_may() {
    let server = MariaDbServer::start();
    let url = server.url("v2");
    MysqlBackend::connect(&url).await.unwrap();
    server.sql(&format!(
        "{}ALTER TABLE v2.tessera_holders DROP COLUMN doorbell; \
         ALTER TABLE v2.tessera_waiters DROP COLUMN gate; \
         UPDATE v2.tessera_meta SET meta_value = 2 WHERE meta_key = 'schema_version'; \
         CREATE USER 'rows'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, EXECUTE ON v2.* TO 'rows'@'127.0.0.1'",
        one_row("v2")
    ));
    let version = || {
        server
            .sql("SELECT meta_value FROM v2.tessera_meta WHERE meta_key = 'schema_version'")
            .trim()
            .to_string()
    };
    let plain = MysqlBackend::connect(&format!("mysql://rows@127.0.0.1:{}/v2", server.port()))
        .await
        .unwrap();
    assert_eq!(version(), "2");
    assert!(plain.admission().is_none(), "admissions without gates");
    let n = name("old");
    let (a, b) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        plain.acquire(&n, 2, &req(a, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(plain.revoke(&n, a).await.unwrap());
    assert!(matches!(
        plain.acquire(&n, 2, &req(b, 1, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(plain.delete(&n).await.unwrap());

    let owner = MysqlBackend::connect(&url).await.unwrap();
    assert_eq!(version(), "10");
    assert!(owner.admission().is_some());
    let columns = server.sql(
        "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'v2' \
         AND (TABLE_NAME, COLUMN_NAME) IN (('tessera_holders', 'doorbell'), \
         ('tessera_waiters', 'gate'))",
    );
    assert_eq!(columns.trim(), "2");
}

/// Tables written by a newer tessera are refused at connect, with nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_schema_is_refused() {
    let server = MariaDbServer::start();
    let url = server.url("newer");
    MysqlBackend::connect(&url).await.unwrap();
    server.sql("UPDATE newer.tessera_meta SET meta_value = 99 WHERE meta_key = 'schema_version'");
    let err = MysqlBackend::connect(&url).await.unwrap_err();
    assert!(err.is_corrupt(), "{err}");
    assert!(err.to_string().contains("99"), "{err}");
}

/// A step that waits for a row lock longer than the lock wait timeout (here: a foreign
/// transaction holding the semaphore's row) is rolled back and run again, never answered
/// wrongly: once the lock is gone it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_wait_timeouts_are_retried_not_answered() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let db = MysqlBackend::connect(&url).await.unwrap();
    let n = name("held");
    let holder = LeaseId::random();
    db.acquire(&n, 2, &req(holder, 1, LONG, None))
        .await
        .unwrap();
    // Another session locks the row for longer than innodb_lock_wait_timeout (5 s).
    let mut blocker = std::process::Command::new("mariadb")
        .args([
            "--no-defaults",
            "-h127.0.0.1",
            &format!("-P{}", server.port()),
            "-uroot",
            "t",
            "-e",
            "BEGIN; SELECT used FROM tessera_semaphores WHERE name = 'held' FOR UPDATE; \
             DO SLEEP(7); COMMIT;",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let other = LeaseId::random();
    let reply = db.acquire(&n, 2, &req(other, 1, LONG, None)).await.unwrap();
    assert!(matches!(reply, AcquireReply::Granted(_)), "{reply:?}");
    blocker.wait().unwrap();
    let status = db.status(&n).await.unwrap().unwrap();
    assert_eq!(status.used, 2);
}

/// A status reads one consistent snapshot without the row lock when the step would change
/// nothing (`stores/sql/snapshot.rs`): while another session holds the semaphore's row with
/// `SELECT … FOR UPDATE` in an open transaction, it answers the holders and the queue.
/// Before, it was a step: it waited out lock wait timeouts and ran again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_answers_while_the_row_is_locked_by_another_session() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let db = MysqlBackend::connect(&url).await.unwrap();
    let lock = "SELECT used FROM tessera_semaphores WHERE name = 'locked' FOR UPDATE";
    status_locks::semaphore_status_answers_while_locked(&db, &name("locked"), async || {
        Blocker::mysql(&url, lock).await
    })
    .await;
}

/// A limiter's status reads one consistent snapshot without the row lock
/// (`stores/sql/rate_snapshot.rs`): while another session holds the limiter's row with
/// `SELECT … FOR UPDATE` in an open transaction, it answers. Before, it was a step, which
/// waited for the row lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_status_answers_while_the_row_is_locked_by_another_session() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let db = MysqlBackend::connect(&url).await.unwrap();
    let lock = "SELECT p FROM tessera_rate_limiters WHERE name = 'r' FOR UPDATE";
    status_locks::rate_status_answers_while_locked(&db, &name("r"), async || {
        Blocker::mysql(&url, lock).await
    })
    .await;
}

/// A limiter's status when something is due (a prune, an expiry) is the reference model's,
/// and so are the acquires after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_status_when_something_is_due_is_the_models() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    status_locks::rate_status_when_something_is_due_is_the_models(&db, &name("r"), async |d| {
        tokio::time::sleep(d).await
    })
    .await;
}

/// The status of an expired holder and a waiter is the step's hand-off (see the testkit's
/// `seam::status_of_an_expired_holder_is_the_steps_hand_off`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_of_an_expired_holder_and_a_waiter_is_the_steps_hand_off() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    seam::status_of_an_expired_holder_is_the_steps_hand_off(&db).await;
}

/// Garbage in tessera's rows (values of the right type, wrong meaning) is a typed
/// `Corrupt` error, never a panic or a grant; deleting the semaphore clears it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_in_the_rows_is_a_typed_error_and_delete_clears_it() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let n = name("damaged");
    let holder = LeaseId::random();
    db.acquire(&n, 3, &req(holder, 2, LONG, None))
        .await
        .unwrap();
    let queued = LeaseId::random();
    db.acquire(&n, 3, &req(queued, 3, LONG, Some((LONG, 10))))
        .await
        .unwrap();
    for (damage, repair) in [
        (
            "UPDATE t.tessera_holders SET seats = 'garbage'",
            "UPDATE t.tessera_holders SET seats = '0-1'",
        ),
        (
            "UPDATE t.tessera_semaphores SET used = -7",
            "UPDATE t.tessera_semaphores SET used = 2",
        ),
        (
            "UPDATE t.tessera_holders SET lease_id = 'zz'",
            "UPDATE t.tessera_holders SET lease_id = 'zz'",
        ),
        (
            "UPDATE t.tessera_meta SET meta_value = -1 WHERE meta_key = 'fence_hwm'",
            "UPDATE t.tessera_meta SET meta_value = 1 WHERE meta_key = 'fence_hwm'",
        ),
    ] {
        server.sql(damage);
        let err = db.status(&n).await.unwrap_err();
        assert!(err.is_corrupt(), "{damage}: {err}");
        // An acquire that reads the damaged value fails typed; one that does not (the
        // damage is in a row it never reads) is still refused: the queue is not empty.
        match db
            .acquire(&n, 3, &req(LeaseId::random(), 1, LONG, None))
            .await
        {
            Err(e) => assert!(e.is_corrupt(), "{damage}: {e}"),
            Ok(AcquireReply::NoPermit { .. }) => {}
            Ok(other) => panic!("{damage}: {other:?}"),
        }
        server.sql(repair);
    }
    // The lease id stayed damaged: only delete clears the semaphore.
    assert!(db.delete(&n).await.unwrap());
    assert!(db.status(&n).await.unwrap().is_none());
    let id = LeaseId::random();
    assert!(matches!(
        db.acquire(&n, 3, &req(id, 3, LONG, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
}

/// Leases run on the server's clock: a session's `SET timestamp` (which moves `NOW()` and
/// `UTC_TIMESTAMP()`) changes nothing, and the times a grant reports are the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_run_on_the_servers_clock() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let server_now: u64 = server
        .sql("SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', UTC_TIMESTAMP(6))")
        .trim()
        .parse()
        .unwrap();
    let AcquireReply::Granted(g) = db
        .acquire(&name("clock"), 1, &req(LeaseId::random(), 1, LONG, None))
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    assert!(g.now.0 >= server_now, "{} < {server_now}", g.now.0);
    assert!(
        g.now.0 - server_now < 60_000_000,
        "{} vs {server_now}",
        g.now.0
    );
    assert_eq!(
        g.lease.expires_at.0 - g.lease.acquired_at.0,
        LONG.as_micros() as u64
    );
}

/// A grant reaches a waiter queued through another client at once, through that client's
/// doorbell; with `wake=poll`, through its poll. Either way the waiter gets the permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_another_client_are_granted_with_and_without_the_doorbell() {
    let server = MariaDbServer::start();
    for wake in ["doorbell", "poll"] {
        let url = format!("{}?wake={wake}", server.url(wake));
        let a = Store::connect(&url).await.unwrap();
        let b = Store::connect(&url).await.unwrap();
        let lock_a = a.lock("l").unwrap();
        let lock_b = b.lock("l").unwrap();
        let held = lock_a.lock().await.unwrap();
        let waiter = tokio::spawn(async move { lock_b.lock().await.map(|p| p.fence()) });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let fence = held.fence();
        held.release().await.unwrap();
        let next = joined(waiter, Duration::from_secs(10), "the waiter was granted")
            .await
            .unwrap();
        assert!(next > fence, "{wake}: {next} <= {fence}");
        a.close().await.unwrap();
        b.close().await.unwrap();
    }
}

/// A malformed URL is a typed error naming the problem, never echoing the password, and
/// creating nothing.
#[tokio::test]
async fn bad_urls_are_refused_without_the_password() {
    for url in [
        "mysql://u:hunter2@127.0.0.1:1/",
        "mariadb://u:hunter2@127.0.0.1:1/db?ssl-mode=sometimes",
        "mysql://u:hunter2@127.0.0.1:1/db?prefix=x",
    ] {
        let err = Store::connect(url).await.unwrap_err();
        assert!(err.is_invalid_input(), "{url}: {err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
    // A server that is not there: a connection error, password not shown.
    let err = Store::connect("mysql://u:hunter2@127.0.0.1:1/db")
        .await
        .unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
}

/// Refused credentials (error 1045) are an auth error in the shape of every server store:
/// the server's words, then a hint naming the URL with its password masked; the password
/// never shows. (It was an "other" fault, which reads as a fault of the server.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_auth_error_naming_the_url() {
    let server = MariaDbServer::start();
    let root = server.url("pw");
    server.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'Right-pw-42'; GRANT ALL ON pw.* TO 'app'@'%'");
    Store::connect(&root.replace("root@", "app:Right-pw-42@"))
        .await
        .expect("the right password")
        .close()
        .await
        .unwrap();
    for user in ["app:Wrong-pw-42", "nobody:Wrong-pw-42"] {
        let e = Store::connect(&root.replace("root", user))
            .await
            .unwrap_err();
        assert!(e.is_auth(), "{e:?}");
        let name = user.split(':').next().unwrap();
        let text = e.to_string();
        assert!(
            text.starts_with(&format!(
                "store error (auth): MySQL: error 1045: Access denied for user '{name}'@"
            )),
            "{text}"
        );
        assert!(
            text.ends_with(&format!(
                "(the server refused the credentials: check the user and password of \
                 mysql://{name}:***@127.0.0.1:{}/pw)",
                server.port()
            )),
            "{text}"
        );
        assert!(!format!("{text} {e:?}").contains("Wrong-pw-42"), "{e:?}");
    }
}

/// A port where nothing listens: a connection error in the shape of every server store (as
/// Redis words it), naming the URL with its password masked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_url_and_asks_whether_the_server_runs() {
    let port = tessera_testkit::servers::free_port();
    // (The listener is closed again here: nothing listens on the port.)
    let url = format!("mariadb://app:hunter2-secret@127.0.0.1:{port}/db");
    let e = Store::connect(&url).await.unwrap_err();
    assert!(e.is_connection(), "{e:?}");
    let text = e.to_string();
    assert!(
        text.starts_with("store error (connection): MySQL: Connection refused"),
        "{text}"
    );
    assert!(
        text.ends_with(&format!(
            "(nothing accepts connections at mariadb://app:***@127.0.0.1:{port}/db: is the \
             server running, on this host and port?)"
        )),
        "{text}"
    );
    assert!(!format!("{text} {e:?}").contains("hunter2-secret"), "{e:?}");
}

/// Statements carry their values inlined as hexadecimal literals: a holder label with
/// quotes, backslashes, SQL and non-ASCII text is stored and read back as given, and runs
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_labels_are_data_never_sql() {
    let server = MariaDbServer::start();
    let db = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let n = name("labels");
    let label = r#"host'1"; DROP TABLE tessera_meta; -- \' \\ é ✓"#;
    let mut r = req(LeaseId::random(), 1, LONG, None);
    r.holder = label.to_string();
    assert!(matches!(
        db.acquire(&n, 2, &r).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let mut w = req(LeaseId::random(), 2, LONG, Some((LONG, 10)));
    w.holder = label.to_string();
    db.acquire(&n, 2, &w).await.unwrap();
    let status = db.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].holder, label);
    assert_eq!(status.queue[0].holder, label);
    let meta = server.sql("SELECT GROUP_CONCAT(meta_key ORDER BY meta_key) FROM t.tessera_meta");
    assert_eq!(meta.trim(), "fence_hwm,routines_version,schema_version");
}

/// A server that closes idle connections (`wait_timeout`, here 1 s; deployments lower it to
/// reap forgotten clients) closes none of tessera's: its pooled connections are idle between
/// a lease's renewals and between calls, and the doorbell's latch for its whole life. The
/// holder keeps its permit across renewals, its release finds the lease, a waiter of another
/// client is granted, a call after a pause succeeds, and the server's log shows no
/// connection it closed for its idle timeout ("Got timeout reading communication packets").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_closing_idle_connections_closes_none_of_tesseras() {
    let server = MariaDbServer::start_with(&["--wait-timeout=1"]);
    let url = server.url("idle");
    let timed_out = || {
        server
            .log()
            .lines()
            .filter(|l| l.contains("Got timeout reading communication packets"))
            .count()
    };
    let a = Store::connect(&url).await.unwrap();
    let b = Store::connect(&url).await.unwrap();
    let opts = SemaphoreOptions::default().ttl(Duration::from_secs(4));
    let sem_a = Semaphore::new(&a, "i", 1, opts.clone()).unwrap();
    let sem_b = Semaphore::new(&b, "i", 1, opts).unwrap();
    let held = sem_a.acquire().await.unwrap();
    // Renewals every ≈ 1.3 s, each after more than the server's idle timeout.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!held.is_lost(), "the holder kept its permit");
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(held.release().await.unwrap(), "the release found the lease");
    let next = joined(waiter, Duration::from_secs(10), "the waiter was granted")
        .await
        .expect("no error reached the waiter");
    next.release().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    sem_a.acquire().await.unwrap().release().await.unwrap();
    assert_eq!(timed_out(), 0, "closed by the server:\n{}", server.log());
    a.close().await.unwrap();
    b.close().await.unwrap();
}

/// A server that limits statement time (`max_statement_time`, here 0.2 s; also set per user
/// with `MAX_STATEMENT_TIME`) does not cut the doorbell's park short: it stays in one wait of
/// its user lock for more than a second (before, the server ended it every 0.2 s and each
/// end woke every waiter of the client to ask the store), and calls work as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_limiting_statement_time_does_not_cut_the_doorbells_park_short() {
    let server = MariaDbServer::start_with(&["--max-statement-time=0.2"]);
    assert_eq!(
        server.sql("SELECT @@global.max_statement_time").trim(),
        "0.200000"
    );
    let store = Store::connect(&server.url("limit")).await.unwrap();
    let sem = Semaphore::new(&store, "l", 1, SemaphoreOptions::default()).unwrap();
    // A queued waiter keeps the doorbell open.
    let held = sem.acquire().await.unwrap();
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let parked_ms = server.sql(
        "SELECT MAX(TIME_MS) FROM information_schema.PROCESSLIST \
         WHERE INFO LIKE 'SELECT GET_LOCK(%tessera doorbell%'",
    );
    let parked_ms: f64 = parked_ms.trim().parse().unwrap_or(0.0);
    assert!(
        parked_ms >= 1000.0,
        "the doorbell's current park began {parked_ms} ms ago"
    );
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    sem.acquire().await.unwrap().release().await.unwrap();
    store.close().await.unwrap();
}

/// A release right after the server restarted (killed and started again): the pooled
/// connection it first takes is dead, and the release is tried again on a new one rather
/// than failing and leaving the permit to its TTL (an hour here). The next acquire gets the
/// permit at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_right_after_a_restart_frees_the_permit() {
    let mut server = MariaDbServer::start();
    let store = Store::connect(&server.url("rr")).await.unwrap();
    let sem = Semaphore::new(&store, "rr", 1, SemaphoreOptions::default().ttl(LONG)).unwrap();
    let permit = sem.acquire().await.unwrap();
    server.restart();
    permit
        .release()
        .await
        .expect("the release reached the store");
    let next = sem.try_acquire().await.unwrap();
    assert!(next.is_some(), "the permit was free again");
    next.unwrap().release().await.unwrap();
}

/// An application user with only `SELECT`, `INSERT`, `UPDATE`, `DELETE` and `EXECUTE` on the
/// database: its first connect to a database nobody migrated fails with a message that says
/// what to do; once a user with `CREATE` migrated it, the application user holds, waits, is
/// handed the permit across clients (its procedures included) and rate-limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_only_row_rights_uses_tables_an_owner_migrated() {
    let server = MariaDbServer::start();
    let owner = server.url("shared");
    server.sql(
        "CREATE USER 'app'@'%' IDENTIFIED BY 'App-pw-1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON shared.* TO 'app'@'%'",
    );
    let app = owner.replace("root@", "app:App-pw-1@");
    let e = Store::connect(&app).await.unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("1142") && text.contains("connect once as a user"),
        "{text}"
    );
    assert!(!text.contains("App-pw-1"), "{text}");

    Store::connect(&owner).await.unwrap().close().await.unwrap();
    tessera_testkit::conformance::serves_two_clients(&app).await;
}

/// `?socket=/path`: through the server's Unix socket (the URL's host and port are not used):
/// holders, waiters and a hand-off work; a relative path is an invalid URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_url_connects_through_the_socket() {
    let server = MariaDbServer::start();
    server.sql("CREATE DATABASE sock");
    // Port 1: nothing listens there, so only the socket can serve.
    let url = format!(
        "mysql://root@localhost:1/sock?socket={}",
        server.socket().display()
    );
    let store = Store::connect(&url).await.unwrap();
    let other = Store::connect(&url).await.unwrap();
    tessera_testkit::conformance::hand_off_between(&store, &other, "s").await;
    let e = Store::connect("mysql://root@localhost/sock?socket=rel/s")
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
}

/// A server made read-only (`SET GLOBAL read_only = 1`, as before a switchover; users with
/// `READ_ONLY ADMIN`, such as root, are not held by it): an application user's calls fail
/// with a typed transient error (they were "other", so `tessera run` gave up at once), nothing
/// is granted, and a waiting acquire rides the episode out: once the server is writable
/// again it is granted, and the holder from before releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_a_transient_fault_that_grants_nothing_and_passes() {
    let server = MariaDbServer::start();
    let owner = server.url("ro");
    // The user owns the tables and procedures: procedures defined by root would run with
    // root's `READ_ONLY ADMIN` and write anyway.
    server.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'App-pw-2'; GRANT ALL ON ro.* TO 'app'@'%'");
    let app = owner.replace("root@", "app:App-pw-2@");
    let store = Store::connect(&app).await.unwrap();
    let sem = Semaphore::new(&store, "ro", 1, SemaphoreOptions::default()).unwrap();
    let held = sem.acquire().await.unwrap();

    server.sql("SET GLOBAL read_only = 1");
    let other = Semaphore::new(&store, "ro-other", 1, SemaphoreOptions::default()).unwrap();
    let e = other.try_acquire().await.unwrap_err();
    assert!(e.is_transient(), "{e:?}");
    assert!(e.to_string().contains("read-only"), "{e}");
    let waiting = {
        let other = other.clone();
        tokio::spawn(async move { other.acquire_many_timeout(1, Duration::from_secs(60)).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "the waiting acquire gave up on a read-only server"
    );
    assert_eq!(
        server.sql("SELECT COUNT(*) FROM ro.tessera_holders").trim(),
        "1",
        "something was granted on a read-only server"
    );
    server.sql("SET GLOBAL read_only = 0");
    let got = joined(
        waiting,
        Duration::from_secs(10),
        "no grant after the server became writable",
    )
    .await
    .unwrap()
    .expect("no permit within the wait");
    assert!(got.release().await.unwrap());
    assert!(held.release().await.unwrap());
    store.close().await.unwrap();
}

/// tessera's procedures run with the rights of the user that calls them (`SQL SECURITY
/// INVOKER`): created by an admin whose account is then dropped, they still run for the
/// application's user (a definer's procedure would fail every call, error 1449); created by
/// root, an application user's call on a read-only server is refused and writes nothing
/// (a definer's procedure would lend it root's `READ_ONLY ADMIN`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedures_created_by_a_dropped_admin_run_with_the_callers_rights() {
    let server = MariaDbServer::start();
    server.sql(
        "CREATE DATABASE inv; \
         CREATE USER 'admin'@'%' IDENTIFIED BY 'Adm-pw-1'; GRANT ALL ON inv.* TO 'admin'@'%'; \
         CREATE USER 'app'@'%' IDENTIFIED BY 'App-pw-3'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON inv.* TO 'app'@'%'",
    );
    let root = server.url("inv");
    let admin = root.replace("root@", "admin:Adm-pw-1@");
    let app = root.replace("root@", "app:App-pw-3@");
    let definers = || {
        server.sql(
            "SELECT GROUP_CONCAT(DISTINCT DEFINER) FROM information_schema.ROUTINES \
             WHERE ROUTINE_SCHEMA = 'inv'",
        )
    };

    Store::connect(&admin).await.unwrap().close().await.unwrap();
    assert_eq!(definers().trim(), "admin@%");
    server.sql("DROP USER 'admin'@'%'");
    let before = calls(&server);
    tessera_testkit::conformance::serves_two_clients(&app).await;
    assert!(
        calls(&server) - before >= 3,
        "the acquires and the release did not run as procedures"
    );

    // The same procedures created by root.
    server.sql(
        "DROP PROCEDURE inv.tessera_v4_acquire_one; DROP PROCEDURE inv.tessera_v4_release; \
         DROP PROCEDURE inv.tessera_v4_keep_alive; DROP PROCEDURE inv.tessera_v5_heartbeat_many; \
         DROP PROCEDURE inv.tessera_v6_acquire_one; DROP PROCEDURE inv.tessera_v6_release; \
         DROP PROCEDURE inv.tessera_v6_heartbeat_many; \
         DROP PROCEDURE inv.tessera_v7_acquire_one; DROP PROCEDURE inv.tessera_v7_release; \
         DROP PROCEDURE inv.tessera_v7_keep_alive; DROP PROCEDURE inv.tessera_v7_heartbeat_many; \
         DROP PROCEDURE inv.tessera_v8_acquire_one; DROP PROCEDURE inv.tessera_v8_release; \
         DROP PROCEDURE inv.tessera_v9_acquire_one; DROP PROCEDURE inv.tessera_v9_release; \
         DROP PROCEDURE inv.tessera_v9_keep_alive; DROP PROCEDURE inv.tessera_v9_heartbeat_many; \
         DROP PROCEDURE inv.tessera_v10_release; DROP PROCEDURE inv.tessera_v10_ring; \
         DELETE FROM inv.tessera_meta WHERE meta_key = 'routines_version'",
    );
    Store::connect(&root).await.unwrap().close().await.unwrap();
    assert_eq!(definers().trim(), "root@localhost");
    let store = Store::connect(&app).await.unwrap();
    let sem = Semaphore::new(&store, "inv", 1, SemaphoreOptions::default()).unwrap();
    server.sql("SET GLOBAL read_only = 1");
    let before = calls(&server);
    let e = sem.try_acquire().await.unwrap_err();
    assert!(
        e.is_transient() && e.to_string().contains("read-only"),
        "{e}"
    );
    assert!(
        calls(&server) > before,
        "the acquire did not call the procedure"
    );
    assert_eq!(
        server
            .sql("SELECT COUNT(*) FROM inv.tessera_holders")
            .trim(),
        "0",
        "a procedure wrote on a read-only server"
    );
    server.sql("SET GLOBAL read_only = 0");
    let p = sem
        .try_acquire()
        .await
        .unwrap()
        .expect("free once writable");
    assert!(p.release().await.unwrap());
    store.close().await.unwrap();
}

/// A revoke or a delete from another process reaches the holder at once, through its
/// client's doorbell: its `lost()` fires within milliseconds, not at its next renewal (TTL/3
/// = 10 s here), so no two processes run under one permit for long. (Within one process the
/// revoking step wakes the holder directly: the holder must be in another process.)
/// Covered: a permit granted at once (its client had no doorbell open), one handed over by
/// a release to a waiter that queued (its holder row written by the release), and one
/// handed over by a release of the holder's own process (delivered with the wake-up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoke_or_delete_from_another_process_fires_the_holders_lost_at_once() {
    let server = MariaDbServer::start();
    let url = server.url("rung");
    let admin = Store::connect(&url).await.unwrap();
    let soon = Duration::from_secs(3);

    // Revoke of a permit granted at once.
    let mut child = HolderProcess::spawn(&url).await;
    let lease = child.held().await;
    // Time for the holder's doorbell to open and its row to name it: the ring is tested,
    // not the claim that finds the row gone.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(admin.revoke("rv", &lease).await.unwrap());
    let after = child.lost(soon).await;
    eprintln!("revoke: lost() fired {after:?} after the revoke");

    // Delete of a permit handed over to a waiter by a release of another process.
    let first = admin.semaphore("rv", 1).unwrap().acquire().await.unwrap();
    let mut child = HolderProcess::spawn(&url).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.unwrap();
    child.held().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(admin.delete("rv").await.unwrap());
    let after = child.lost(soon).await;
    eprintln!("delete: lost() fired {after:?} after the delete");

    // Revoke of a permit handed over by a release within the holder's own process.
    let mut child = HolderProcess::spawn_with(&url, true).await;
    let lease = child.held().await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(admin.revoke("rv", &lease).await.unwrap());
    let after = child.lost(soon).await;
    eprintln!("revoke after an in-process hand-off: lost() fired {after:?} after the revoke");
    admin.close().await.unwrap();
}

/// This test binary run again as a holder of semaphore `rv` (30 s TTL) in a process of its
/// own ([`holder_in_a_child_process`]).
struct HolderProcess {
    child: tokio::process::Child,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
}

impl HolderProcess {
    async fn spawn(url: &str) -> HolderProcess {
        Self::spawn_with(url, false).await
    }

    /// `handoff`: the child's permit is handed over by a release of its own process.
    async fn spawn_with(url: &str, handoff: bool) -> HolderProcess {
        let mut command = tokio::process::Command::new(std::env::current_exe().unwrap());
        if handoff {
            command.env("TESSERA_MYSQL_CHILD_HANDOFF", "1");
        }
        let mut child = command
            .args(["--exact", "holder_in_a_child_process", "--nocapture"])
            .args(["--test-threads=1"])
            .env("TESSERA_MYSQL_CHILD_URL", url)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        use tokio::io::AsyncBufReadExt;
        let stdout = child.stdout.take().unwrap();
        let lines = tokio::io::BufReader::new(stdout).lines();
        HolderProcess { child, lines }
    }

    /// What the child prints after `prefix`, up to the end of that line.
    async fn line(&mut self, prefix: &str, within: Duration) -> String {
        let next = async {
            loop {
                match self.lines.next_line().await.unwrap() {
                    // libtest's "test … " comes first, on the same line.
                    Some(line) => match line.split_once(prefix) {
                        Some((_, rest)) => break rest.to_string(),
                        None => continue,
                    },
                    None => panic!("the holder process ended before printing {prefix:?}"),
                }
            }
        };
        tokio::time::timeout(within, next)
            .await
            .unwrap_or_else(|_| {
                panic!("the holder process printed no {prefix:?} within {within:?}")
            })
    }

    /// The lease id, once the child holds its permit.
    async fn held(&mut self) -> String {
        self.line("HELD ", Duration::from_secs(20)).await
    }

    /// Waits for the child's `lost()` to fire (at most `within`); how long that took.
    async fn lost(&mut self, within: Duration) -> Duration {
        let started = std::time::Instant::now();
        let reason = self.line("LOST ", within).await;
        assert_eq!(reason, "Gone");
        let _ = self.child.wait().await;
        started.elapsed()
    }
}

/// The holder of [`HolderProcess`], when run as one (`TESSERA_MYSQL_CHILD_URL`); otherwise
/// does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_in_a_child_process() {
    let Ok(url) = std::env::var("TESSERA_MYSQL_CHILD_URL") else {
        return;
    };
    let store = Store::connect(&url).await.unwrap();
    let sem = store.semaphore("rv", 1).unwrap();
    let permit = if std::env::var_os("TESSERA_MYSQL_CHILD_HANDOFF").is_some() {
        // Handed over within this process: the release of its first permit grants the queued
        // second one, delivered with the wake-up (the waiter asks the store nothing).
        let first = sem.acquire().await.unwrap();
        let queued = sem.clone();
        let waiter = tokio::spawn(async move { queued.acquire().await });
        while sem.status().await.unwrap().queue.len() != 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first.release().await.unwrap();
        waiter.await.unwrap().unwrap()
    } else {
        sem.acquire().await.unwrap()
    };
    println!("HELD {}", permit.lease_id());
    let reason = permit.lost().await;
    println!("LOST {reason:?}");
    drop(permit);
}

/// A server that is gone: the error says the connection was refused, not only that the
/// connection pool timed out (sqlx tries a refused connect again until its timeout and then
/// reports the timeout alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_is_gone_is_reported_as_refused_not_as_a_pool_timeout() {
    let mut server = MariaDbServer::start();
    let my = MysqlBackend::connect(&server.url("gone")).await.unwrap();
    let n = name("gone");
    let id = LeaseId::random();
    my.acquire(&n, 1, &req(id, 1, LONG, None)).await.unwrap();
    server.kill();
    // The first call may meet its dead pooled connection; the next finds the pool empty.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let e = my.status(&n).await.unwrap_err();
        assert!(e.is_transient(), "{e}");
        seen.push(e.to_string());
        if seen.last().unwrap().contains("refused") {
            break;
        }
    }
    assert!(
        seen.last().unwrap().contains("refused")
            && seen.iter().all(|m| !m.contains("pool timed out")),
        "{seen:?}"
    );
}

/// A database of schema version 5 (before fair shares), holding a holder and waiters, is
/// migrated at the next connect: the waiters keep their order (tag 0, by seq), a request of
/// a tenant then queues by its tag behind them, and the releases run the procedure of
/// routine version 8 (the one that keeps the tags and the tenants), handing the permit on in
/// that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_before_fair_shares_is_migrated_and_its_queue_keeps_its_order() {
    let server = MariaDbServer::start();
    let url = server.url("v4");
    let first = MysqlBackend::connect(&url).await.unwrap();
    let n = name("q");
    let (a, b, _) = held_and_queued(&first, &n).await;
    let c = LeaseId::random();
    first
        .acquire(&n, 1, &req(c, 1, LONG, Some((LONG, 10))))
        .await
        .unwrap();
    drop(first);
    server.sql(&format!(
        "{}ALTER TABLE v4.tessera_waiters DROP KEY tessera_waiters_by_tag, DROP COLUMN tag; \
         ALTER TABLE v4.tessera_semaphores DROP COLUMN vtime, DROP COLUMN finish, \
         DROP COLUMN tenants; DROP TABLE v4.tessera_tenants; DROP TABLE v4.tessera_tenant_limits; \
         ALTER TABLE v4.tessera_holders DROP COLUMN tenant; \
         ALTER TABLE v4.tessera_waiters DROP COLUMN tenant; \
         UPDATE v4.tessera_meta SET meta_value = 5 WHERE meta_key = 'schema_version'",
        one_row("v4")
    ));
    let store = MysqlBackend::connect(&url).await.unwrap();
    assert_eq!(
        server
            .sql("SELECT meta_value FROM v4.tessera_meta WHERE meta_key = 'schema_version'")
            .trim(),
        "10"
    );
    assert!(store.capabilities().fair_shares);
    let mut tenant = req(LeaseId::random(), 1, LONG, Some((LONG, 10)));
    tenant.tenant = Some(Tenant::new("t", 1).unwrap());
    store.acquire(&n, 1, &tenant).await.unwrap();
    let queue: Vec<LeaseId> = store
        .status(&n)
        .await
        .unwrap()
        .unwrap()
        .queue
        .iter()
        .map(|w| w.lease_id)
        .collect();
    assert_eq!(queue, vec![b, c, tenant.lease_id]);
    let before = calls(&server);
    assert!(store.release(&n, a).await.unwrap());
    let holders = store.status(&n).await.unwrap().unwrap().holders;
    assert_eq!(holders[0].lease_id, b);
    assert!(calls(&server) > before, "the release called the procedure");
    for (held, next) in [
        (b, Some(c)),
        (c, Some(tenant.lease_id)),
        (tenant.lease_id, None),
    ] {
        assert!(store.release(&n, held).await.unwrap());
        let status = store.status(&n).await.unwrap();
        assert_eq!(status.map(|s| s.holders[0].lease_id), next);
    }
}

/// A database of schema version 6 (before holder and waiter rows kept their tenant), holding
/// a holder and a waiter, is migrated at the next connect to version 8 with routine version
/// 8: both rows stay, naming no tenant; a tenant named from then on (its start tag at the
/// virtual time, so ahead of the old waiter) is kept on its waiter row and on the holder row
/// the release through the procedure of version 8 makes of it, and the old waiter follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_before_tenants_on_rows_is_migrated_and_keeps_its_holder_and_waiter() {
    let server = MariaDbServer::start();
    let url = server.url("v6");
    let first = MysqlBackend::connect(&url).await.unwrap();
    let n = name("q");
    let (a, b, _) = held_and_queued(&first, &n).await;
    drop(first);
    // What a build of schema and routine version 6 leaves.
    server.sql(&format!(
        "{}ALTER TABLE v6.tessera_holders DROP COLUMN tenant; \
         ALTER TABLE v6.tessera_waiters DROP COLUMN tenant; \
         DROP PROCEDURE v6.tessera_v7_acquire_one; DROP PROCEDURE v6.tessera_v7_release; \
         DROP PROCEDURE v6.tessera_v7_keep_alive; DROP PROCEDURE v6.tessera_v7_heartbeat_many; \
         DROP PROCEDURE v6.tessera_v8_acquire_one; DROP PROCEDURE v6.tessera_v8_release; \
         DROP TABLE v6.tessera_tenant_limits; \
         UPDATE v6.tessera_meta SET meta_value = 6 \
         WHERE meta_key IN ('schema_version', 'routines_version')",
        one_row("v6")
    ));
    let store = MysqlBackend::connect(&url).await.unwrap();
    let meta = |key: &str| {
        server
            .sql(&format!(
                "SELECT meta_value FROM v6.tessera_meta WHERE meta_key = '{key}'"
            ))
            .trim()
            .to_string()
    };
    assert_eq!(
        (meta("schema_version"), meta("routines_version")),
        ("10".into(), "10".into())
    );
    let tenants = |s: &SemaphoreStatus| {
        let holders: Vec<_> = s
            .holders
            .iter()
            .map(|h| (h.lease_id, h.tenant.clone()))
            .collect();
        let queue: Vec<_> = s
            .queue
            .iter()
            .map(|w| (w.lease_id, w.tenant.clone()))
            .collect();
        (holders, queue)
    };
    let status = store.status(&n).await.unwrap().unwrap();
    assert_eq!(tenants(&status), (vec![(a, None)], vec![(b, None)]));
    let mut named = req(LeaseId::random(), 1, LONG, Some((LONG, 10)));
    named.tenant = Some(Tenant::new("t", 1).unwrap());
    let before = calls(&server);
    assert!(matches!(
        store.acquire(&n, 1, &named).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    ));
    let t = Some("t".to_string());
    let status = store.status(&n).await.unwrap().unwrap();
    assert_eq!(
        tenants(&status),
        (
            vec![(a, None)],
            vec![(named.lease_id, t.clone()), (b, None)]
        )
    );
    assert!(store.release(&n, a).await.unwrap());
    assert_eq!(
        calls(&server) - before,
        2,
        "the acquire and the release ran as procedures"
    );
    let status = store.status(&n).await.unwrap().unwrap();
    assert_eq!(
        tenants(&status),
        (vec![(named.lease_id, t)], vec![(b, None)])
    );
    assert!(store.release(&n, named.lease_id).await.unwrap());
    let status = store.status(&n).await.unwrap().unwrap();
    assert_eq!(tenants(&status), (vec![(b, None)], vec![]));
    assert!(store.release(&n, b).await.unwrap());
    assert!(store.status(&n).await.unwrap().is_none());
}

/// A user who may not ALTER leaves a database of schema version 6 there: that client calls
/// the procedures of routine version 6 (written for those tables) and keeps no tenant on the
/// rows, so status shows none, while the tenants' order still holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_alter_keeps_schema_6_and_no_tenant_on_the_rows() {
    let server = MariaDbServer::start();
    let url = server.url("six");
    MysqlBackend::connect(&url).await.unwrap();
    server.sql(&format!(
        "{}ALTER TABLE six.tessera_holders DROP COLUMN tenant; \
         ALTER TABLE six.tessera_waiters DROP COLUMN tenant; \
         UPDATE six.tessera_meta SET meta_value = 6 WHERE meta_key = 'schema_version'; \
         CREATE USER 'rows'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, CREATE, EXECUTE ON six.* TO 'rows'@'127.0.0.1'",
        one_row("six")
    ));
    let plain = MysqlBackend::connect(&format!("mysql://rows@127.0.0.1:{}/six", server.port()))
        .await
        .unwrap();
    let version =
        server.sql("SELECT meta_value FROM six.tessera_meta WHERE meta_key = 'schema_version'");
    assert_eq!(version.trim(), "6");
    assert!(plain.capabilities().fair_shares);
    let n = name("t");
    let (a, b) = (LeaseId::random(), LeaseId::random());
    let mut first = req(a, 1, LONG, None);
    first.tenant = Some(Tenant::new("t", 1).unwrap());
    let mut second = req(b, 1, LONG, Some((LONG, 10)));
    second.tenant = Some(Tenant::new("u", 1).unwrap());
    let before = calls(&server);
    let AcquireReply::Granted(g) = plain.acquire(&n, 1, &first).await.unwrap() else {
        panic!("not granted")
    };
    assert_eq!(g.lease.tenant, None);
    assert_eq!(
        plain.acquire(&n, 1, &second).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert!(plain.release(&n, a).await.unwrap());
    assert_eq!(calls(&server) - before, 3, "version 6's procedures ran");
    let status = plain.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, b);
    assert_eq!(status.holders[0].tenant, None);
    assert!(plain.release(&n, b).await.unwrap());
}

/// A database of schema version 7 (before tenants' limits), holding a holder and a waiter,
/// is migrated at the next connect to version 8 with routine version 8: both rows stay, and
/// limits set from then on apply to them through the procedures (which leave the name to the
/// client-side step): a floor keeps the permit the holder frees from the waiter, the floor's
/// tenant is granted it at once, and clearing the floor hands it on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_before_tenant_limits_is_migrated_keeps_its_holder_and_waiter_and_takes_limits()
{
    let server = MariaDbServer::start();
    let url = server.url("v7");
    let first = MysqlBackend::connect(&url).await.unwrap();
    let n = name("q");
    let (a, b, _) = held_and_queued(&first, &n).await;
    drop(first);
    // What a build of schema and routine version 7 leaves.
    server.sql(&format!(
        "{}DROP TABLE v7.tessera_tenant_limits; \
         DROP PROCEDURE v7.tessera_v8_acquire_one; DROP PROCEDURE v7.tessera_v8_release; \
         UPDATE v7.tessera_meta SET meta_value = 7 \
         WHERE meta_key IN ('schema_version', 'routines_version')",
        one_row("v7")
    ));
    let store = MysqlBackend::connect(&url).await.unwrap();
    let meta = |key: &str| {
        server
            .sql(&format!(
                "SELECT meta_value FROM v7.tessera_meta WHERE meta_key = '{key}'"
            ))
            .trim()
            .to_string()
    };
    assert_eq!(
        (meta("schema_version"), meta("routines_version")),
        ("10".into(), "10".into())
    );
    assert!(store.capabilities().tenant_limits);
    let ids = |s: Option<SemaphoreStatus>| {
        let s = s.unwrap();
        let holders: Vec<_> = s.holders.iter().map(|h| h.lease_id).collect();
        let queue: Vec<_> = s.queue.iter().map(|w| w.lease_id).collect();
        (holders, queue)
    };
    assert_eq!(ids(store.status(&n).await.unwrap()), (vec![a], vec![b]));
    let floor = TenantLimits::new(None, 1).unwrap();
    store.set_tenant_limits(&n, "ops", floor).await.unwrap();
    assert_eq!(store.tenant_limits(&n).await.unwrap()["ops"], floor);
    // The release calls the procedure, which leaves it to the step: the permit is kept for
    // ops, whose request is granted at once ahead of the waiter.
    let before = calls(&server);
    assert!(store.release(&n, a).await.unwrap());
    assert_eq!(calls(&server) - before, 1);
    assert_eq!(ids(store.status(&n).await.unwrap()), (vec![], vec![b]));
    let mut ops = req(LeaseId::random(), 1, LONG, None);
    ops.tenant = Some(Tenant::new("ops", 1).unwrap());
    assert!(matches!(
        store.acquire(&n, 1, &ops).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(store.release(&n, ops.lease_id).await.unwrap());
    assert_eq!(ids(store.status(&n).await.unwrap()), (vec![], vec![b]));
    // Cleared, the floor keeps nothing: the step that clears it hands the permit on.
    store
        .set_tenant_limits(&n, "ops", TenantLimits::default())
        .await
        .unwrap();
    assert_eq!(ids(store.status(&n).await.unwrap()), (vec![b], vec![]));
    assert!(store.tenant_limits(&n).await.unwrap().is_empty());
    assert!(store.release(&n, b).await.unwrap());
    assert!(store.status(&n).await.unwrap().is_none());
}

/// A database of schema version 8 (before window ceilings), holding a tenant's limits, a
/// holder and a waiter, and a rate limiter's state, is migrated at the next connect to
/// version 9: all of them stay (the limits without a window ceiling, the limiter's windows
/// as they were, under its key widened for the tenants' own limiters), and a window ceiling
/// set from then on is kept and holds the tenant to its share of the windows (2 of 10 a
/// minute at 20 %) while the others are admitted as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_before_window_ceilings_is_migrated_keeps_its_rows_and_takes_them() {
    let server = MariaDbServer::start();
    let url = server.url("v8");
    let first = MysqlBackend::connect(&url).await.unwrap();
    let n = name("q");
    let limits = TenantLimits::new(Some(5), 0).unwrap();
    first.set_tenant_limits(&n, "bulk", limits).await.unwrap();
    let (a, b, _) = held_and_queued(&first, &n).await;
    drop(first);
    let admission = |store: &Store, tenant: &str| {
        store
            .admission("w")
            .permits(100)
            .semaphore_options(SemaphoreOptions::default().tenant(Tenant::new(tenant, 1).unwrap()))
            .rate_options(RateOptions::default().margin(Duration::from_secs(1)))
            .rate(RateSpec::per_minute(10).unwrap())
            .unwrap()
    };
    let used = |store: &Store| {
        let store = store.clone();
        async move {
            let s = store.rate_status("w").await.unwrap().unwrap();
            s.limits.iter().map(|l| l.used + l.reserved).max().unwrap()
        }
    };
    let store = Store::connect(&url).await.unwrap();
    let mut held = Vec::new();
    held.push(
        admission(&store, "alerts")
            .try_acquire()
            .await
            .unwrap()
            .unwrap(),
    );
    drop(store);
    // What a build of schema version 8 leaves.
    server.sql(&format!(
        "{}ALTER TABLE v8.tessera_tenant_limits DROP COLUMN window_ceiling, \
         DROP COLUMN window_capped_until; \
         ALTER TABLE v8.tessera_rate_limiters MODIFY COLUMN name VARCHAR(128) \
         CHARACTER SET ascii COLLATE ascii_bin NOT NULL; \
         ALTER TABLE v8.tessera_rate_log MODIFY COLUMN name VARCHAR(128) \
         CHARACTER SET ascii COLLATE ascii_bin NOT NULL; \
         UPDATE v8.tessera_meta SET meta_value = 8 WHERE meta_key = 'schema_version'",
        one_row("v8")
    ));
    let db = MysqlBackend::connect(&url).await.unwrap();
    let meta = |key: &str| {
        server
            .sql(&format!(
                "SELECT meta_value FROM v8.tessera_meta WHERE meta_key = '{key}'"
            ))
            .trim()
            .to_string()
    };
    assert_eq!(
        (meta("schema_version"), meta("routines_version")),
        ("10".into(), "10".into())
    );
    assert!(db.capabilities().window_ceilings);
    assert_eq!(db.tenant_limits(&n).await.unwrap()["bulk"], limits);
    let status = db.status(&n).await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, a);
    assert_eq!(status.queue[0].lease_id, b);

    let store = Store::connect(&url).await.unwrap();
    assert_eq!(used(&store).await, 1, "the limiter's windows are kept");
    let windowed = limits.with_window_ceiling(Some(20)).unwrap();
    store
        .set_tenant_limits("w", "bulk", windowed)
        .await
        .unwrap();
    assert_eq!(store.tenant_limits("w").await.unwrap()["bulk"], windowed);
    let bulk = admission(&store, "bulk");
    let mut admitted = 0;
    for _ in 0..4 {
        if let Some(t) = bulk.try_acquire().await.unwrap() {
            held.push(t);
            admitted += 1;
        }
    }
    assert_eq!(admitted, 2);
    held.push(
        admission(&store, "alerts")
            .try_acquire()
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(used(&store).await, 4);
    // The tenants' own limiters are not listed as limiters of their own.
    assert_eq!(store.rate_list().await.unwrap(), vec!["w".to_string()]);
}

/// Two clients of one database (as two processes): limits one sets are seen and obeyed by
/// the other, whose acquires and releases call the procedures (which leave a name with
/// limits to the client-side step); a raised ceiling hands the other's waiter its permit; a
/// delete through one removes them for both; and a name without limits runs one procedure
/// call per operation as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_client_sees_the_limits_the_first_sets_and_obeys_them() {
    let server = MariaDbServer::start();
    let url = server.url("two");
    let (first, second) = (
        MysqlBackend::connect(&url).await.unwrap(),
        MysqlBackend::connect(&url).await.unwrap(),
    );
    let n = name("jobs");
    let ceiling = |c| TenantLimits::new(Some(c), 0).unwrap();
    first
        .set_tenant_limits(&n, "bulk", ceiling(1))
        .await
        .unwrap();
    assert_eq!(second.tenant_limits(&n).await.unwrap()["bulk"], ceiling(1));
    let bulk = || {
        let mut r = req(LeaseId::random(), 1, LONG, Some((LONG, 10)));
        r.tenant = Some(Tenant::new("bulk", 1).unwrap());
        r
    };
    let (one, two) = (bulk(), bulk());
    assert!(matches!(
        second.acquire(&n, 3, &one).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    // Two permits free, but bulk is at its ceiling.
    assert_eq!(
        second.acquire(&n, 3, &two).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    first
        .set_tenant_limits(&n, "bulk", ceiling(2))
        .await
        .unwrap();
    let held: Vec<_> = second
        .status(&n)
        .await
        .unwrap()
        .unwrap()
        .holders
        .iter()
        .map(|h| h.lease_id)
        .collect();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.contains(&two.lease_id));
    // At its ceiling again: a third waits, and a release of bulk's lets it in.
    let three = bulk();
    assert_eq!(
        second.acquire(&n, 3, &three).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert!(second.release(&n, one.lease_id).await.unwrap());
    let status = first.status(&n).await.unwrap().unwrap();
    assert!(status.holders.iter().any(|h| h.lease_id == three.lease_id));
    assert!(status.queue.is_empty());
    assert!(first.delete(&n).await.unwrap());
    assert!(second.tenant_limits(&n).await.unwrap().is_empty());
    // Without limits again: one call per acquire, and bulk takes every free permit.
    let before = calls(&server);
    for _ in 0..3 {
        assert!(matches!(
            second.acquire(&n, 3, &bulk()).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
    assert_eq!(calls(&server) - before, 3);
}

/// A user who may not create tessera's tables leaves a database of schema version 7 there:
/// that client keeps no limits (its capabilities say so, setting them is `Unsupported` and
/// lists none), and works as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_who_may_not_create_keeps_schema_7_without_tenant_limits() {
    let server = MariaDbServer::start();
    let url = server.url("seven");
    MysqlBackend::connect(&url).await.unwrap();
    server.sql(&format!(
        "{}DROP TABLE seven.tessera_tenant_limits; \
         UPDATE seven.tessera_meta SET meta_value = 7 WHERE meta_key = 'schema_version'; \
         CREATE USER 'rows'@'127.0.0.1'; \
         GRANT SELECT, INSERT, UPDATE, DELETE, EXECUTE ON seven.* TO 'rows'@'127.0.0.1'",
        one_row("seven")
    ));
    let url = format!("mysql://rows@127.0.0.1:{}/seven", server.port());
    let store = Store::connect(&url).await.unwrap();
    let version =
        server.sql("SELECT meta_value FROM seven.tessera_meta WHERE meta_key = 'schema_version'");
    assert_eq!(version.trim(), "7");
    assert!(!store.backend().capabilities().tenant_limits);
    assert!(store.backend().capabilities().fair_shares);
    let err = store
        .set_tenant_limits("jobs", "web", TenantLimits::new(None, 1).unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    assert!(store.tenant_limits("jobs").await.unwrap().is_empty());
    let n = name("jobs");
    let before = calls(&server);
    let (a, _b, _) = held_and_queued(&MysqlBackend::connect(&url).await.unwrap(), &n).await;
    assert_eq!(calls(&server) - before, 2, "version 7's procedures");
    assert!(store.backend().release(&n, a).await.unwrap());
}

/// A database of schema version 9 (one row per semaphore, its queue's tail in it) holding a
/// holder and three waiters is migrated at the next connect to version 10 with routine
/// version 9: the tails move to `tessera_tails` (the queue's length as `enqueued`, nothing
/// dequeued), the old columns are gone, the holder and the waiters stay in their order, a
/// newcomer queues behind them, and the releases (through the procedures) hand the permit
/// on in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_of_before_the_tail_rows_is_migrated_and_keeps_its_holder_waiters_and_order() {
    let server = MariaDbServer::start();
    let url = server.url("v9");
    let first = MysqlBackend::connect(&url).await.unwrap();
    let n = name("q");
    let (a, b, _) = held_and_queued(&first, &n).await;
    let mut waiters = vec![b];
    for position in 1..3 {
        let w = LeaseId::random();
        assert_eq!(
            first
                .acquire(&n, 1, &req(w, 1, LONG, Some((LONG, 10))))
                .await
                .unwrap(),
            AcquireReply::Queued { position }
        );
        waiters.push(w);
    }
    drop(first);
    // What a build of schema version 9 and routine version 8 leaves.
    server.sql(&format!(
        "{}UPDATE v9.tessera_meta SET meta_value = 9 WHERE meta_key = 'schema_version'",
        one_row("v9")
    ));
    assert_eq!(
        server
            .sql("SELECT CONCAT(queued, ',', next_seq) FROM v9.tessera_semaphores")
            .trim(),
        "3,3"
    );
    let store = MysqlBackend::connect(&url).await.unwrap();
    let meta = |key: &str| {
        server
            .sql(&format!(
                "SELECT meta_value FROM v9.tessera_meta WHERE meta_key = '{key}'"
            ))
            .trim()
            .to_string()
    };
    assert_eq!(
        (meta("schema_version"), meta("routines_version")),
        ("10".into(), "10".into())
    );
    assert_eq!(
        server
            .sql(
                "SELECT CONCAT(t.next_seq, ',', t.enqueued, ',', s.dequeued) \
                 FROM v9.tessera_tails t JOIN v9.tessera_semaphores s ON s.name = t.name"
            )
            .trim(),
        "3,3,0"
    );
    assert_eq!(
        server
            .sql(
                "SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = 'v9' \
                 AND TABLE_NAME = 'tessera_semaphores' \
                 AND COLUMN_NAME IN ('queued', 'next_seq', 'finish')"
            )
            .trim(),
        "0"
    );
    let st = store.status(&n).await.unwrap().unwrap();
    assert_eq!(st.holders[0].lease_id, a);
    let queue: Vec<LeaseId> = st.queue.iter().map(|w| w.lease_id).collect();
    assert_eq!(queue, waiters);
    let late = LeaseId::random();
    assert_eq!(
        store
            .acquire(&n, 1, &req(late, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 3 }
    );
    waiters.push(late);
    let before = calls(&server);
    let mut held = a;
    for next in &waiters {
        assert!(store.release(&n, held).await.unwrap());
        let st = store.status(&n).await.unwrap().unwrap();
        assert_eq!(st.holders[0].lease_id, *next);
        held = *next;
    }
    assert!(
        calls(&server) - before >= 4,
        "the releases ran as procedures"
    );
    assert!(store.release(&n, held).await.unwrap());
    assert!(store.status(&n).await.unwrap().is_none());
    assert_no_rows_left(&server, "v9");
}
