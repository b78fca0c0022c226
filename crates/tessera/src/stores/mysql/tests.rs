//! The doorbell against a throwaway MariaDB: a ring reaches the waiters of exactly the
//! client it is addressed to, and a stale address rings nobody.

use std::sync::Arc;
use std::time::Duration;

use tessera_testkit::servers::mysql::MariaDbServer;
use tessera_testkit::servers::process::{make_ca, sign_leaf};

use super::conns::LOCK_WAIT_TIMEOUT_S;
use super::*;
use tessera_core::wake::Registration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_wakes_the_waiters_of_the_client_it_names_and_no_other() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let (a, b) = (
        MysqlBackend::connect(&url).await.unwrap(),
        MysqlBackend::connect(&url).await.unwrap(),
    );
    // A queued waiter opens each client's doorbell; wait until both are parked. (A doorbell
    // that parks wakes its client's waiters once: the registrations come after.)
    let (in_a, in_b) = (LeaseId::random(), LeaseId::random());
    a.set_waiting(in_a, true);
    b.set_waiting(in_b, true);
    let mut parked = 0;
    for _ in 0..100 {
        parked = server
            .sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'SELECT GET_LOCK(%tessera doorbell%'",
            )
            .trim()
            .parse()
            .unwrap();
        if parked == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(parked, 2);
    let (reg_a, reg_b) = (Registration::new(in_a), Registration::new(in_b));
    // B rings A: A's waiter wakes, B's does not.
    // Both clients are in this process, whose waiters every grant wakes directly: `ring`
    // leaves their doorbells alone.
    notify::ring(
        &b.conns.pool,
        vec![a.doorbell_address()],
        &b.doorbell_address(),
    )
    .await;
    let woke_a = tokio::time::timeout(Duration::from_millis(300), reg_a.notified()).await;
    assert!(woke_a.is_err(), "a doorbell of this process was rung");
    notify::ring_each(&b.conns.pool, vec![a.doorbell_address()]).await;
    tokio::time::timeout(Duration::from_secs(10), reg_a.notified())
        .await
        .expect("A's waiter woken by the ring");
    let woke_b = tokio::time::timeout(Duration::from_millis(300), reg_b.notified()).await;
    assert!(woke_b.is_err(), "B's waiter woke without a ring");
    // A stale address (a connection id with another token) rings nobody.
    let stale = format!(
        "{}:{:016x}",
        b.doorbell_address().split(':').next().unwrap(),
        7u64
    );
    notify::ring_each(&a.conns.pool, vec![stale]).await;
    let woke_b = tokio::time::timeout(Duration::from_millis(300), reg_b.notified()).await;
    assert!(woke_b.is_err(), "a stale address rang B");
    // After the ring A's doorbell parks again and can be rung again.
    let again = Arc::new(reg_a);
    for _ in 0..50 {
        notify::ring_each(&b.conns.pool, vec![a.doorbell_address()]).await;
        if tokio::time::timeout(Duration::from_millis(200), again.notified())
            .await
            .is_ok()
        {
            return;
        }
    }
    panic!("A's doorbell did not ring a second time");
}

/// The doorbell waits for a user lock that its latch connection holds. A latch that dies
/// releases the lock: the doorbell wakes its waiters and opens both again, at a new address
/// that rings like the old one did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_latch_wakes_the_waiters_and_the_doorbell_parks_again_at_a_new_address() {
    let server = MariaDbServer::start();
    let a = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let ringer = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let parked = |addr: String| {
        let token = addr
            .split_once(':')
            .map(|(_, t)| t.to_string())
            .unwrap_or_default();
        server
            .sql(&format!(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'SELECT GET_LOCK(%tessera doorbell {token}%'"
            ))
            .trim()
            == "1"
    };
    let lease = LeaseId::random();
    a.set_waiting(lease, true);
    let mut first = String::new();
    for _ in 0..200 {
        first = a.doorbell_address();
        if !first.is_empty() && parked(first.clone()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        parked(first.clone()),
        "the doorbell never parked on its user lock"
    );
    let token = first.split_once(':').unwrap().1.to_string();
    let latch = server.sql(&format!("SELECT IS_USED_LOCK('tessera-bell-{token}')"));
    let latch = latch.trim();
    assert_ne!(latch, "NULL", "nobody holds the doorbell's lock");
    assert_ne!(
        latch,
        first.split(':').next().unwrap(),
        "the doorbell holds its own lock"
    );
    let reg = Registration::new(lease);
    server.sql(&format!("KILL CONNECTION {latch}"));
    tokio::time::timeout(Duration::from_secs(10), reg.notified())
        .await
        .expect("the waiters were not woken when the latch died");
    // A new address, parked on a lock held by a new latch, and rung like the first.
    let mut second = String::new();
    for _ in 0..200 {
        second = a.doorbell_address();
        if !second.is_empty() && second != first && parked(second.clone()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        second != first && parked(second.clone()),
        "no new doorbell: {second}"
    );
    let token = second.split_once(':').unwrap().1.to_string();
    let held = server.sql(&format!(
        "SELECT IS_USED_LOCK('tessera-bell-{token}') IS NOT NULL"
    ));
    assert_eq!(held.trim(), "1", "the new doorbell's lock has no latch");
    let reg = Registration::new(lease);
    notify::ring_each(&ringer.conns.pool, vec![second]).await;
    tokio::time::timeout(Duration::from_secs(10), reg.notified())
        .await
        .expect("the new doorbell did not ring");
}

/// A ring that comes while the doorbell is between two parks (it was just rung, and is
/// waking its waiters) is not lost: the ring looks again until the doorbell has parked.
/// Here a plain connection plays the doorbell: idle when rung, parked 30 ms later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_that_finds_the_doorbell_between_parks_rings_it_once_it_parks() {
    use sqlx::Connection;
    let server = MariaDbServer::start();
    let url = server.url("t");
    let ringer = MysqlBackend::connect(&url).await.unwrap();
    let (mut bell, id) = plain_connection(&url).await;
    let token = format!("{:016x}", 0xbe11u64);
    notify::ring_each(&ringer.conns.pool, vec![format!("{id}:{token}")]).await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    // Parked for 30 s: only a ring ends it before the 20 s bound.
    let park = format!("SELECT SLEEP(30) /* tessera doorbell {token} */");
    let parked = tokio::time::timeout(
        Duration::from_secs(20),
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(park)).fetch_one(&mut bell),
    )
    .await
    .expect("the ring was lost: the doorbell slept on");
    // MariaDB answers a killed SLEEP with 1 or with error 1317; either is a ring.
    match parked {
        Ok(v) => assert_eq!(v, 1, "the SLEEP ended without being killed"),
        Err(e) => assert!(e.to_string().contains("interrupted"), "{e}"),
    }
    // The connection lives on (`KILL QUERY` ends the query, not the session).
    let one: i64 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut bell)
        .await
        .unwrap();
    assert_eq!(one, 1);
    bell.close().await.unwrap();
}

/// A connection outside tessera (one that plays a doorbell, or calls a procedure by hand),
/// and its connection id.
async fn plain_connection(url: &str) -> (sqlx::mysql::MySqlConnection, u64) {
    use sqlx::ConnectOptions;
    let options: sqlx::mysql::MySqlConnectOptions = url.parse().unwrap();
    let mut conn = options.connect().await.unwrap();
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    (conn, id)
}

/// Certificates made with `openssl` in a temp dir: a CA, a server certificate for
/// 127.0.0.1 signed by it, and an unrelated CA.
struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    fn make() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        for ca in ["ca", "other-ca"] {
            make_ca(dir.path(), ca, &format!("tessera test {ca}"));
        }
        sign_leaf(
            dir.path(),
            "ca",
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
        );
        Certs { dir }
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).display().to_string()
    }
}

/// Collects every log line of the current thread, at every level.
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const PASSWORD: &str = "Tls-s3cret@pw";
const PASSWORD_IN_URL: &str = "Tls-s3cret%40pw";

#[tokio::test(flavor = "current_thread")]
async fn tls_with_a_custom_ca_encrypts_and_a_wrong_or_missing_ca_is_a_clear_error() {
    let logs = Logs::default();
    let writer = logs.clone();
    let _logging = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish(),
    );
    let certs = Certs::make();
    let server = MariaDbServer::start_with(&[
        &format!("--ssl-ca={}", certs.path("ca.pem")),
        &format!("--ssl-cert={}", certs.path("server.pem")),
        &format!("--ssl-key={}", certs.path("server.key")),
    ]);
    server.url("t");
    // A user that may only connect over TLS: every connection tessera opens with it (pool
    // and doorbell) must be encrypted, or the server refuses it.
    server.sql(&format!(
        "CREATE USER app@'%' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL; \
         GRANT ALL ON t.* TO app@'%'"
    ));
    let base = format!(
        "mysql://app:{PASSWORD_IN_URL}@127.0.0.1:{}/t",
        server.port()
    );
    let no_password = |e: &Error| {
        let (shown, debug) = (e.to_string(), format!("{e:?}"));
        for text in [&shown, &debug] {
            assert!(
                !text.contains(PASSWORD) && !text.contains(PASSWORD_IN_URL),
                "the password in {text}"
            );
        }
        shown
    };

    // With the CA: connects, verifies the server's name, and the session is encrypted.
    let url = format!("{base}?ssl-ca={}", certs.path("ca.pem"));
    let backend = MysqlBackend::connect(&url).await.expect("TLS with the CA");
    assert!(!format!("{backend:?}").contains(PASSWORD));
    assert!(!backend.url().contains(PASSWORD));
    let mut conn = backend.conns.pool.acquire().await.unwrap();
    let (_, cipher): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(!cipher.is_empty(), "the session is not encrypted");
    let (_, version): (String, String) = sqlx::query_as("SHOW SESSION STATUS LIKE 'Ssl_version'")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert!(version.starts_with("TLSv1."), "{version}");
    drop(conn);
    let name = Name::new("tls").unwrap();
    let req = AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl: Duration::from_secs(5),
        holder: "tls/1".into(),
        wait: None,
        tenant: None,
        first_send: false,
    };
    let reply = backend.acquire(&name, 1, &req).await.unwrap();
    assert!(matches!(reply, AcquireReply::Granted(_)), "{reply:?}");
    assert!(backend.release(&name, req.lease_id).await.unwrap());
    // The doorbell (a connection of its own, same user, opened for a waiter) is parked: it
    // is encrypted too.
    backend.set_waiting(LeaseId::random(), true);
    let mut parked = String::new();
    for _ in 0..100 {
        parked = server.sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE USER = 'app' AND INFO LIKE 'SELECT GET_LOCK(%tessera doorbell%'",
        );
        if parked.trim() == "1" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(parked.trim(), "1", "the doorbell did not park over TLS");
    drop(backend);

    // Encrypted without verification (`required`) connects as well.
    MysqlBackend::connect(&format!("{base}?ssl-mode=required"))
        .await
        .expect("TLS without verification");

    // Without the CA (the built-in roots do not know it), with another CA, or with a CA
    // that does not name this server: a connection error that says TLS, at connect.
    for (case, query) in [
        ("no CA", "ssl-mode=verify_identity".to_string()),
        ("wrong CA", format!("ssl-ca={}", certs.path("other-ca.pem"))),
        (
            "wrong CA, verify_ca",
            format!("ssl-mode=verify_ca&ssl-ca={}", certs.path("other-ca.pem")),
        ),
    ] {
        let e = MysqlBackend::connect(&format!("{base}?{query}"))
            .await
            .expect_err(case);
        let shown = no_password(&e);
        eprintln!("{case}: {shown}");
        assert!(e.is_connection(), "{case}: {e:?}");
        assert!(shown.contains("TLS"), "{case}: {shown}");
        assert!(shown.contains("certificate"), "{case}: {shown}");
    }
    // A CA file that cannot be read is an invalid URL, at once.
    let e = MysqlBackend::connect(&format!("{base}?ssl-ca=/nonexistent/ca.pem"))
        .await
        .expect_err("missing CA file");
    assert!(e.is_invalid_input(), "{e:?}");
    assert!(no_password(&e).contains("/nonexistent/ca.pem"));
    // Without TLS the server refuses this user; a wrong password is refused too: neither
    // error shows a password.
    let e = MysqlBackend::connect(&base).await.expect_err("no TLS");
    no_password(&e);
    let wrong = base.replace(PASSWORD_IN_URL, "Wr0ng-pw");
    let e = MysqlBackend::connect(&format!("{wrong}?ssl-ca={}", certs.path("ca.pem")))
        .await
        .expect_err("wrong password");
    assert!(!no_password(&e).contains("Wr0ng-pw"), "{e}");

    // Nothing logged at any level carried the password.
    let logged = String::from_utf8_lossy(&logs.0.lock().unwrap()).into_owned();
    eprintln!("{} log lines checked", logged.lines().count());
    assert!(
        !logged.contains(PASSWORD) && !logged.contains(PASSWORD_IN_URL),
        "the password was logged"
    );
}

/// Deadlocks (1213) and lock wait timeouts (1205) raised by a trigger on tessera's holders
/// table while `tessera_test_faults.n` is positive (counted down in a non-transactional
/// table, so the count survives the rolled-back statement).
const INJECT_FAULTS: &str = "CREATE TRIGGER tessera_test_faults BEFORE INSERT ON tessera_holders \
     FOR EACH ROW BEGIN \
       DECLARE left_ INT DEFAULT (SELECT n FROM tessera_test_faults); \
       DECLARE code INT DEFAULT 1213; \
       IF left_ > 0 THEN \
         UPDATE tessera_test_faults SET n = n - 1; \
         IF left_ % 2 = 0 THEN SET code = 1205; END IF; \
         SIGNAL SQLSTATE '40001' SET MYSQL_ERRNO = code, MESSAGE_TEXT = 'injected by the test'; \
       END IF; \
     END";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_deadlocks_and_lock_wait_timeouts_never_over_grant() {
    use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};

    const CLIENTS: usize = 4;
    const ROUNDS: usize = 25;
    let server = MariaDbServer::start();
    let root = server.url("t");
    // The tables first (as root), then the fault injection on them.
    drop(MysqlBackend::connect(&root).await.unwrap());
    server.sql(
        "CREATE TABLE t.tessera_test_faults (n INT NOT NULL) ENGINE=Aria; \
         INSERT INTO t.tessera_test_faults VALUES (0)",
    );
    let mut conn = sqlx::mysql::MySqlConnection::connect(&root).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(INJECT_FAULTS))
        .execute(&mut conn)
        .await
        .unwrap();
    // One user per client, so the faults can pick a client's connections.
    let mut stores = Vec::new();
    for i in 0..CLIENTS {
        server.sql(&format!(
            "CREATE USER c{i}@'%'; GRANT ALL ON t.* TO c{i}@'%'; \
             GRANT PROCESS, CONNECTION ADMIN ON *.* TO c{i}@'%'"
        ));
        let url = root.replace("root@", &format!("c{i}@"));
        stores.push(crate::Store::connect(&url).await.unwrap());
    }

    // Clients loop acquire / release on a lock; an in-process count of holders catches an
    // over-grant. `role[i]`: 0 idle, 1 waiting, 2 holding.
    let holders = Arc::new(AtomicI64::new(0));
    let over = Arc::new(AtomicUsize::new(0));
    let role: Arc<Vec<AtomicUsize>> = Arc::new((0..CLIENTS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = Vec::new();
    for (i, store) in stores.iter().enumerate() {
        let sem = crate::Semaphore::new(
            store,
            "chaos",
            1,
            crate::SemaphoreOptions::default()
                .ttl(Duration::from_secs(3))
                .waiter_ttl(Duration::from_secs(3)),
        )
        .unwrap();
        let (holders, over, role) = (holders.clone(), over.clone(), role.clone());
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            for _ in 0..ROUNDS {
                role[i].store(1, Ordering::SeqCst);
                let permit = match sem.acquire().await {
                    Ok(p) => p,
                    Err(e) => {
                        errors.push(format!("acquire: {e}"));
                        continue;
                    }
                };
                role[i].store(2, Ordering::SeqCst);
                if holders.fetch_add(1, Ordering::SeqCst) != 0 {
                    over.fetch_add(1, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..20))).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                role[i].store(0, Ordering::SeqCst);
                if let Err(e) = permit.release().await {
                    // A connection killed during the release's commit: the lease is left
                    // to its TTL.
                    errors.push(format!("release: {e}"));
                }
            }
            errors
        }));
    }

    // A session outside tessera holds the lock's row past innodb_lock_wait_timeout once:
    // the steps behind it time out (1205) and run again.
    let blocker = {
        let root = root.clone();
        tokio::spawn(async move {
            let mut c = sqlx::mysql::MySqlConnection::connect(&root).await.unwrap();
            sqlx::raw_sql(
                "START TRANSACTION; \
                 SELECT name FROM tessera_semaphores WHERE name = 'chaos' FOR UPDATE",
            )
            .execute(&mut c)
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_secs(LOCK_WAIT_TIMEOUT_S as u64 + 1)).await;
            sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
        })
    };

    // Faults, in turn: kill every connection (pool and doorbell) of the holder, of a waiter,
    // a doorbell alone, and inject deadlocks and lock wait timeouts.
    let mut kills = [0usize; 3];
    let mut injected = 0;
    let mut turn = 0usize;
    while !tasks.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(Duration::from_millis(60)).await;
        turn += 1;
        let pick = |wanted: usize| (0..CLIENTS).find(|&i| role[i].load(Ordering::SeqCst) == wanted);
        let (kind, victim, filter) = match turn % 4 {
            // A holder holds for at most 20 ms between long waits: look for one for a while
            // rather than only at this instant, or holder kills are rare enough that a run
            // may have none (with 200 ms of looking, one CI run on a loaded machine found no
            // holder in 15 turns: hand-offs took most of each round there). Up to 2 s.
            0 => {
                let mut holder = pick(2);
                for _ in 0..1000 {
                    if holder.is_some() || tasks.iter().all(|t| t.is_finished()) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    holder = pick(2);
                }
                (0, holder, "")
            }
            1 => (1, pick(1), ""),
            2 => (
                2,
                Some(turn % CLIENTS),
                "AND INFO LIKE '%tessera doorbell%'",
            ),
            _ => {
                server.sql("UPDATE t.tessera_test_faults SET n = n + 2");
                injected += 2;
                continue;
            }
        };
        let Some(victim) = victim else { continue };
        let ids = server.sql(&format!(
            "SELECT ID FROM information_schema.PROCESSLIST WHERE USER = 'c{victim}' {filter}"
        ));
        let kill: String = ids
            .split_whitespace()
            .map(|id| format!("KILL CONNECTION {id};"))
            .collect();
        if !kill.is_empty() && server.try_sql(&kill).is_ok() {
            kills[kind] += 1;
        }
    }
    blocker.await.unwrap();
    let mut errors = Vec::new();
    for t in tasks {
        errors.extend(t.await.unwrap());
    }
    let left: i64 = server
        .sql("SELECT n FROM t.tessera_test_faults")
        .trim()
        .parse()
        .unwrap();
    eprintln!(
        "kills (holder, waiter, doorbell): {kills:?}; injected {injected}, left {left}; \
         errors: {errors:?}"
    );
    assert_eq!(over.load(Ordering::SeqCst), 0, "over-granted");
    assert!(
        kills.iter().all(|&k| k > 0),
        "a fault never happened: {kills:?}"
    );
    assert!(injected > left, "no injected fault was hit");
    // A deadlock or lock wait timeout is retried, never an answer.
    assert!(
        errors
            .iter()
            .all(|e| !e.contains("injected") && !e.contains("1205")),
        "{errors:?}"
    );
    // Afterwards the lock is free and works.
    let store = crate::Store::connect(&root).await.unwrap();
    let sem = store.semaphore("chaos", 1).unwrap();
    // (A release cut off in its commit leaves the lease to its TTL.)
    let permit = tokio::time::timeout(Duration::from_secs(30), sem.acquire())
        .await
        .expect("the lock is free again")
        .unwrap();
    assert!(permit.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_probe_answers_without_a_write_and_defers_to_the_full_step() {
    let server = MariaDbServer::start();
    let b = MysqlBackend::connect(&server.url("t")).await.unwrap();
    let s = Name::new("probe").unwrap();
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    let waiter_ttl = Duration::from_secs(60);
    let req = |lease, wait| AcquireRequest {
        lease_id: lease,
        weight: 1,
        ttl: Duration::from_secs(60),
        holder: "probe/1".into(),
        wait,
        tenant: None,
        first_send: false,
    };
    let wait = Some(tessera_core::model::WaitSpec {
        waiter_ttl,
        queue_cap: 100,
    });
    assert!(matches!(
        b.acquire(&s, 1, &req(holder, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        b.acquire(&s, 1, &req(waiter, wait)).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    // The waiter opened the doorbell; once it is parked, a heartbeat's full step moves the
    // waiter to its address.
    for _ in 0..250 {
        if !b.doorbell_address().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!b.doorbell_address().is_empty(), "no doorbell");
    b.heartbeat(&s, waiter, waiter_ttl).await.unwrap();
    let expiry = || server.sql("SELECT expires_at FROM t.tessera_waiters");
    let first = expiry();
    // Fresh: the probe answers, and a heartbeat leaves the expiry alone.
    assert_eq!(
        b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap(),
        Some(WaitReply::Waiting)
    );
    assert_eq!(
        b.heartbeat(&s, waiter, waiter_ttl).await.unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(expiry(), first);
    // Less than half of the TTL asked for is left: the full step refreshes the expiry.
    let longer = Duration::from_secs(200);
    assert_eq!(b.probe_heartbeat(&s, waiter, longer).await.unwrap(), None);
    assert_eq!(
        b.heartbeat(&s, waiter, longer).await.unwrap(),
        WaitReply::Waiting
    );
    assert_ne!(expiry(), first);
    // The row names another doorbell (this client's reconnected): the full step moves it.
    server.sql("UPDATE t.tessera_waiters SET doorbell = '1:00'");
    assert_eq!(
        b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap(),
        None
    );
    b.heartbeat(&s, waiter, waiter_ttl).await.unwrap();
    assert_eq!(
        server.sql("SELECT doorbell FROM t.tessera_waiters").trim(),
        b.doorbell_address()
    );
    assert_eq!(
        b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap(),
        Some(WaitReply::Waiting)
    );
    // The holder expired: the probe defers, the full step grants the waiter, and the probe
    // then answers with the grant.
    server.sql("UPDATE t.tessera_holders SET expires_at = 0");
    assert_eq!(
        b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap(),
        None
    );
    let WaitReply::Granted(granted) = b.heartbeat(&s, waiter, waiter_ttl).await.unwrap() else {
        panic!("the waiter was not granted");
    };
    let Some(WaitReply::Granted(probed)) = b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap()
    else {
        panic!("the probe did not find the grant");
    };
    assert_eq!(probed.lease, granted.lease);
    // An unknown lease is not answered by the probe.
    let unknown = LeaseId::random();
    assert_eq!(
        b.probe_heartbeat(&s, unknown, waiter_ttl).await.unwrap(),
        None
    );
    assert_eq!(
        b.heartbeat(&s, unknown, waiter_ttl).await.unwrap(),
        WaitReply::Gone
    );
}

/// How many doorbells are parked on the server (any client's).
fn parked_doorbells(server: &MariaDbServer) -> u32 {
    server
        .sql(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
             WHERE INFO LIKE 'SELECT GET_LOCK(%tessera doorbell%'",
        )
        .trim()
        .parse()
        .unwrap()
}

/// The address of `bell` once it has one (up to 5 s; `""` if it never opens).
async fn opened(bell: &Doorbell) -> String {
    for _ in 0..250 {
        let addr = bell.address();
        if !addr.is_empty() {
            return addr;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    String::new()
}

/// The doorbell's two connections exist only while its client has waiters queued or holds
/// leases: a client whose tries find no permit opens none, a holder's client opens them (so
/// that a revoke reaches it), the first queued waiter of another client opens its own, and a
/// whole park with no ring, no waiter and no holder closes them (latch and lock included)
/// until the next waiter or holder opens them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doorbell_opens_for_waiters_and_holders_and_closes_after_a_quiet_park() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let (a, b) = (
        MysqlBackend::connect(&url).await.unwrap(),
        MysqlBackend::connect(&url).await.unwrap(),
    );
    let name = Name::new("lazy").unwrap();
    let req = |wait| AcquireRequest {
        lease_id: LeaseId::random(),
        weight: 1,
        ttl: Duration::from_secs(60),
        holder: "lazy/1".into(),
        wait,
        tenant: None,
        first_send: false,
    };
    let parked_after = |want: u32| {
        let server = &server;
        async move {
            let mut parked = 0;
            for _ in 0..250 {
                parked = parked_doorbells(server);
                if parked == want {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            parked
        }
    };
    let held = req(None);
    let reply = a.acquire(&name, 1, &held).await.unwrap();
    assert!(matches!(reply, AcquireReply::Granted(_)), "{reply:?}");
    assert_eq!(
        parked_after(1).await,
        1,
        "the holder's client opened no doorbell"
    );
    assert!(!a.doorbell_address().is_empty());
    let tried = req(None);
    let reply = b.acquire(&name, 1, &tried).await.unwrap();
    assert!(matches!(reply, AcquireReply::NoPermit { .. }), "{reply:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        parked_doorbells(&server),
        1,
        "a try without a permit opened one"
    );
    assert!(b.doorbell_address().is_empty());
    let queued = req(Some(WaitSpec {
        waiter_ttl: Duration::from_secs(30),
        queue_cap: 16,
    }));
    let reply = b.acquire(&name, 1, &queued).await.unwrap();
    assert!(matches!(reply, AcquireReply::Queued { .. }), "{reply:?}");
    assert_eq!(
        parked_after(2).await,
        2,
        "the waiter's client opened no doorbell"
    );
    assert!(!b.doorbell_address().is_empty());
    assert!(b.cancel(&name, queued.lease_id).await.is_ok());
    assert!(a.release(&name, held.lease_id).await.unwrap());

    // A doorbell that parks 1 s at a time: it stays through quiet parks while a waiter is
    // queued, and closes after the first quiet park without one.
    let config = parse_url(&url).unwrap();
    let waiting: Waiting = Arc::default();
    let holders = Holders::new(sqlx::MySqlPool::connect_lazy_with(config.options.clone()));
    let bell = Doorbell::start_parking(config.options, Arc::clone(&waiting), holders, 1);
    let lease = LeaseId::random();
    waiting.lock().unwrap().insert(lease);
    bell.wake();
    let first = opened(&bell).await;
    assert!(!first.is_empty(), "the doorbell did not open");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(bell.address(), first, "it closed with a waiter queued");
    waiting.lock().unwrap().remove(&lease);
    let token = first.split_once(':').unwrap().1.to_string();
    let mut lock_held = String::new();
    for _ in 0..250 {
        lock_held = server.sql(&format!(
            "SELECT IS_USED_LOCK('tessera-bell-{token}') IS NOT NULL"
        ));
        if bell.address().is_empty() && lock_held.trim() == "0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(bell.address().is_empty(), "the doorbell stayed open");
    assert_eq!(lock_held.trim(), "0", "its latch still holds the lock");
    waiting.lock().unwrap().insert(lease);
    bell.wake();
    let second = opened(&bell).await;
    assert!(
        !second.is_empty() && second != first,
        "no new doorbell: {second}"
    );
}

/// Runs `first`, then `second`, each queued behind a session outside tessera that holds
/// semaphore `name`'s row, and lets them go only once both wait for that lock: they then run
/// in that order, and `second` starts before `first` commits.
async fn queued_in_order<A, B>(
    server: &MariaDbServer,
    url: &str,
    name: &str,
    first: A,
    second: B,
) -> (A::Output, B::Output)
where
    A: std::future::Future + Send + 'static,
    A::Output: Send,
    B: std::future::Future + Send + 'static,
    B::Output: Send,
{
    let mut c = sqlx::mysql::MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "START TRANSACTION; SELECT name FROM tessera_semaphores WHERE name = '{name}' FOR UPDATE"
    )))
    .execute(&mut c)
    .await
    .unwrap();
    // A statement waiting for the lock (a procedure's shows as its own).
    let queued = |n: u32| async move {
        for _ in 0..500 {
            let waiting = server.sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE '%FROM tessera_semaphores WHERE name =%FOR UPDATE'",
            );
            if waiting.trim().parse::<u32>().unwrap() >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{n} operations did not queue behind the row lock");
    };
    let first = tokio::spawn(first);
    queued(1).await;
    let second = tokio::spawn(second);
    queued(2).await;
    sqlx::raw_sql("COMMIT").execute(&mut c).await.unwrap();
    (first.await.unwrap(), second.await.unwrap())
}

/// A procedure queued behind another transaction's lock on the semaphore's row decides on
/// what that transaction committed. A statement that locks the row and reads the other
/// tables in subqueries reads them as they were when it started, before its lock wait, so
/// each race below is forced ([`queued_in_order`]): an operation that ends or grants a lease,
/// then the procedure under test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn procedures_queued_behind_the_row_lock_see_what_the_step_before_them_committed() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let (a, b) = (
        Arc::new(MysqlBackend::connect(&url).await.unwrap()),
        Arc::new(MysqlBackend::connect(&url).await.unwrap()),
    );
    let s = Name::new("behind").unwrap();
    let ttl = Duration::from_secs(60);
    let waiter_ttl = Duration::from_secs(60);
    let req = |lease, wait: bool| AcquireRequest {
        lease_id: lease,
        weight: 1,
        ttl,
        holder: "behind/1".into(),
        wait: wait.then_some(tessera_core::model::WaitSpec {
            waiter_ttl,
            queue_cap: 100,
        }),
        tenant: None,
        first_send: false,
    };
    let acquired = |b: &Arc<MysqlBackend>| {
        let (b, s) = (b.clone(), s.clone());
        async move {
            match b
                .acquire(&s, 2, &req(LeaseId::random(), false))
                .await
                .unwrap()
            {
                AcquireReply::Granted(g) => g,
                other => panic!("not granted: {other:?}"),
            }
        }
    };
    let used = || {
        server
            .sql("SELECT used FROM t.tessera_semaphores")
            .trim()
            .to_string()
    };
    let revoke = |lease| {
        let (b, s) = (b.clone(), s.clone());
        async move { b.revoke(&s, lease).await.unwrap() }
    };

    // 1. A revoke, then the holder's own release: the release finds nothing to free,
    //    whichever seat the lease has (the other holder's is below or above it).
    let mut other = acquired(&a).await;
    for raced_first in [false, true] {
        let mut raced = acquired(&a).await;
        if raced_first {
            std::mem::swap(&mut raced, &mut other);
        }
        let lease = raced.lease.lease_id;
        let release = {
            let (a, s) = (a.clone(), s.clone());
            async move { a.release(&s, lease).await }
        };
        let (revoked, released) =
            queued_in_order(&server, &url, "behind", revoke(lease), release).await;
        assert!(revoked, "the revoke ran first and found the lease");
        assert!(
            matches!(released, Ok(false)),
            "a release after the revoke answered {released:?} (seat {:?})",
            raced.lease.seats
        );
        assert_eq!(used(), "1", "one holder left");
    }

    // 2. A revoke, then the lease's renewal: the renewal finds it gone.
    let lease = acquired(&a).await.lease.lease_id;
    let renew = {
        let (a, s) = (a.clone(), s.clone());
        async move { a.renew(&s, lease, ttl).await.unwrap() }
    };
    let (revoked, renewed) = queued_in_order(&server, &url, "behind", revoke(lease), renew).await;
    assert!(revoked);
    assert_eq!(renewed, RenewReply::Gone, "a revoked lease was renewed");
    assert_eq!(used(), "1");

    // 3. A release that hands the permit to the queue head, then the head's heartbeat (the
    //    procedure, not the read-only probe) or a retry of its acquire: both answer its
    //    grant.
    for retry_acquire in [false, true] {
        let full = acquired(&a).await.lease.lease_id;
        let waiter = LeaseId::random();
        assert!(matches!(
            b.acquire(&s, 2, &req(waiter, true)).await.unwrap(),
            AcquireReply::Queued { .. }
        ));
        let release = {
            let (a, s) = (a.clone(), s.clone());
            async move { a.release(&s, full).await.unwrap() }
        };
        let answer = {
            let (b, s) = (b.clone(), s.clone());
            let request = req(waiter, true);
            async move {
                if retry_acquire {
                    match b.acquire(&s, 2, &request).await.unwrap() {
                        AcquireReply::Granted(g) => WaitReply::Granted(g),
                        AcquireReply::Queued { .. } => WaitReply::Waiting,
                        other => panic!("{other:?}"),
                    }
                } else {
                    match b.heartbeat_fast(&s, waiter, waiter_ttl).await.unwrap() {
                        Fast::Done(reply) => reply,
                        Fast::Fallback => panic!("the procedure left the heartbeat to the step"),
                    }
                }
            }
        };
        let (released, answer) = queued_in_order(&server, &url, "behind", release, answer).await;
        assert!(released);
        assert!(
            matches!(&answer, WaitReply::Granted(g) if g.lease.lease_id == waiter),
            "the waiter handed the permit was told {answer:?} (retried acquire: {retry_acquire})"
        );
        assert!(b.release(&s, waiter).await.unwrap());
        assert_eq!(used(), "1");
    }
    assert!(a.release(&s, other.lease.lease_id).await.unwrap());
    assert_eq!(used(), "");
}

/// The gathered heartbeat call purges expired waiters itself, as the step does, and answers
/// the others: leaving every heartbeat alone while any waiter had expired sent 10,000
/// waiters' heartbeats one by one, the storm the call exists to avoid, and more waiters
/// expired. With a permit free (a head that could fit), it still leaves every heartbeat
/// alone, having changed nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gathered_call_purges_expired_waiters_and_answers_the_rest() {
    use tessera_core::stores::batch::BatchCall;
    let server = MariaDbServer::start();
    let b = MysqlBackend::connect(&server.url("g")).await.unwrap();
    let req = |lease, weight, wait: Option<Duration>| AcquireRequest {
        lease_id: lease,
        weight,
        ttl: Duration::from_secs(3600),
        holder: "g/1".into(),
        wait: wait.map(|waiter_ttl| tessera_core::model::WaitSpec {
            waiter_ttl,
            queue_cap: 100,
        }),
        tenant: None,
        first_send: false,
    };
    let call = heartbeats::HeartbeatMany {
        conns: b.conns.clone(),
        doorbell: b.doorbell.as_ref().map(Doorbell::address_cell),
        db: b.db,
    };
    let minute = Duration::from_secs(60);
    let ttl = 60_000_000i64;

    let s = Name::new("g").unwrap();
    let (holder, brief, w1, w2) = (
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
        LeaseId::random(),
    );
    assert!(matches!(
        b.acquire(&s, 1, &req(holder, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let short = Some(Duration::from_millis(300));
    for (lease, wait) in [(brief, short), (w1, Some(minute)), (w2, Some(minute))] {
        let reply = b.acquire(&s, 1, &req(lease, 1, wait)).await.unwrap();
        assert!(matches!(reply, AcquireReply::Queued { .. }), "{reply:?}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let replies = call
        .call(s.as_str(), &[(w1, ttl), (brief, ttl), (w2, ttl)])
        .await
        .unwrap();
    let replies: Vec<_> = replies.into_iter().map(|r| r.unwrap()).collect();
    // The expired waiter is gone (left to a heartbeat alone, which answers `Gone`).
    let waiting = heartbeats::Answer::Reply(WaitReply::Waiting);
    assert_eq!(
        replies,
        [
            waiting,
            heartbeats::Answer::Alone,
            heartbeats::Answer::Reply(WaitReply::Waiting)
        ]
    );
    assert_eq!(
        server.sql("SELECT COUNT(*) FROM g.tessera_waiters").trim(),
        "2"
    );
    assert_eq!(
        server
            .sql(
                "SELECT t.enqueued - s.dequeued FROM g.tessera_semaphores s \
                 JOIN g.tessera_tails t ON t.name = s.name"
            )
            .trim(),
        "2"
    );
    assert_eq!(
        b.heartbeat(&s, brief, minute).await.unwrap(),
        WaitReply::Gone
    );

    // Capacity 2, one permit held, a head of weight 2 that does not fit: a permit is free,
    // so every heartbeat is left alone and nothing changes.
    let f = Name::new("f").unwrap();
    let (held, heavy, light) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
    assert!(matches!(
        b.acquire(&f, 2, &req(held, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    for (lease, weight) in [(heavy, 2), (light, 1)] {
        let reply = b
            .acquire(&f, 2, &req(lease, weight, Some(minute)))
            .await
            .unwrap();
        assert!(matches!(reply, AcquireReply::Queued { .. }), "{reply:?}");
    }
    let expiries = || {
        server.sql(
            "SELECT GROUP_CONCAT(expires_at ORDER BY seq) FROM g.tessera_waiters WHERE name = 'f'",
        )
    };
    let before = expiries();
    let replies = call
        .call(f.as_str(), &[(heavy, ttl * 2), (light, ttl * 2)])
        .await
        .unwrap();
    let replies: Vec<_> = replies.into_iter().map(|r| r.unwrap()).collect();
    assert_eq!(
        replies,
        [heartbeats::Answer::Alone, heartbeats::Answer::Alone]
    );
    assert_eq!(expiries(), before);
}

/// A waiter that names a tenant and is granted by a release (routine version 8's hand-off)
/// learns its tenant with its grant by every path a heartbeat takes: the read-only probe, the
/// keep-alive of routine version 7, and the heartbeat itself; the grant pushed to a waiter of
/// this process with its wake-up, the release's, carries it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_granted_waiters_heartbeat_answers_its_tenant_by_every_path() {
    let server = MariaDbServer::start();
    let b = MysqlBackend::connect(&server.url("t")).await.unwrap();
    assert_eq!(b.db.calls(), Some(routines::TAILS_VERSION));
    let s = Name::new("tenants").unwrap();
    let waiter_ttl = Duration::from_secs(30);
    let ask = |lease, wait: bool, tenant: &str| AcquireRequest {
        lease_id: lease,
        weight: 1,
        ttl: Duration::from_secs(3600),
        holder: "h/1".into(),
        wait: wait.then_some(WaitSpec {
            waiter_ttl,
            queue_cap: 10,
        }),
        tenant: Some(Tenant::new(tenant, 1).unwrap()),
        first_send: false,
    };
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    let AcquireReply::Granted(g) = b.acquire(&s, 1, &ask(holder, false, "a")).await.unwrap() else {
        panic!("not granted")
    };
    assert_eq!(g.lease.tenant.as_deref(), Some("a"));
    let registration = Registration::new(waiter);
    assert_eq!(
        b.acquire(&s, 1, &ask(waiter, true, "b")).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    let status = b.status(&s).await.unwrap().unwrap();
    assert_eq!(status.queue[0].tenant.as_deref(), Some("b"));
    assert!(b.release(&s, holder).await.unwrap());
    let pushed = registration
        .take_grant()
        .expect("the grant pushed with the wake-up");
    assert_eq!(pushed.lease.tenant.as_deref(), Some("b"));
    let b_tenant = |reply: Option<WaitReply>| match reply {
        Some(WaitReply::Granted(g)) => g.lease.tenant,
        other => panic!("not granted: {other:?}"),
    };
    let probed = b.probe_heartbeat(&s, waiter, waiter_ttl).await.unwrap();
    assert_eq!(b_tenant(probed).as_deref(), Some("b"));
    let Fast::Done(fast) = b.heartbeat_fast(&s, waiter, waiter_ttl).await.unwrap() else {
        panic!("the keep-alive left it to the step")
    };
    assert_eq!(b_tenant(Some(fast)).as_deref(), Some("b"));
    let beat = b.heartbeat(&s, waiter, waiter_ttl).await.unwrap();
    assert_eq!(b_tenant(Some(beat)).as_deref(), Some("b"));
    let status = b.status(&s).await.unwrap().unwrap();
    assert_eq!(status.holders[0].tenant.as_deref(), Some("b"));
}

/// Waits until a statement like `pattern` runs (in the processlist, where a procedure's
/// statement shows as its own): the statement a test holds a procedure at.
fn running(server: &MariaDbServer, pattern: &str) {
    for _ in 0..500 {
        let n = server.sql(&format!(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE '{pattern}'"
        ));
        if n.trim() != "0" {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!(
        "no statement like {pattern}: {}",
        server.sql("SELECT ID, STATE, INFO FROM information_schema.PROCESSLIST")
    );
}

/// A session outside tessera that runs `sql` in a transaction it keeps open.
async fn hold_open(url: &str, sql: &str) -> sqlx::mysql::MySqlConnection {
    let mut c = sqlx::mysql::MySqlConnection::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("START TRANSACTION; {sql}")))
        .execute(&mut c)
        .await
        .unwrap();
    c
}

/// Capacity 2, both permits held (A and C) and nobody waiting: the setting of the two
/// interleavings below, where A's release ends with a permit free while B enqueues.
async fn two_held(b: &MysqlBackend, s: &Name) -> (LeaseId, LeaseId) {
    let (a, c) = (LeaseId::random(), LeaseId::random());
    for lease in [a, c] {
        let held = b.acquire(s, 2, &no_lost_req(lease, false)).await.unwrap();
        assert!(matches!(held, AcquireReply::Granted(_)), "{held:?}");
    }
    (a, c)
}

fn no_lost_req(lease: LeaseId, wait: bool) -> AcquireRequest {
    AcquireRequest {
        lease_id: lease,
        weight: 1,
        ttl: Duration::from_secs(60),
        holder: "lost/1".into(),
        wait: wait.then_some(tessera_core::model::WaitSpec {
            waiter_ttl: Duration::from_secs(60),
            queue_cap: 100,
        }),
        tenant: None,
        first_send: false,
    }
}

/// `docs/sql-queue.md`, "No lost wake-up", the granting step first: A's release takes the
/// tail row (it ends with a permit free) and is held before its commit (a session outside
/// tessera locks A's holder row); B's enqueue, without the semaphore row's lock, then waits
/// for the tail; once the release commits, the enqueue's re-read of the semaphore row sees the
/// freed permit and B is granted by the locked step its client runs at once, not left
/// queued beside a free permit until its heartbeat.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_behind_a_release_that_frees_a_permit_is_granted_at_once() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    // Two clients (as two processes): a client sends one call at a time.
    let db = Arc::new(MysqlBackend::connect(&url).await.unwrap());
    let other = Arc::new(MysqlBackend::connect(&url).await.unwrap());
    assert_eq!(db.db.calls(), Some(routines::TAILS_VERSION));
    let s = Name::new("lost").unwrap();
    let (a, _c) = two_held(&db, &s).await;
    let mut blocker = hold_open(
        &url,
        &format!(
            "SELECT lease_id FROM tessera_holders WHERE name = 'lost' AND lease_id = '{a}' \
             FOR UPDATE"
        ),
    )
    .await;
    let release = {
        let (db, s) = (db.clone(), s.clone());
        tokio::spawn(async move { db.release(&s, a).await.unwrap() })
    };
    running(&server, "DELETE FROM tessera_holders%");
    // The release holds the semaphore row and the tail row, and waits for A's holder row.
    let b = LeaseId::random();
    let enqueue = {
        let (db, s) = (other.clone(), s.clone());
        tokio::spawn(async move { db.acquire(&s, 2, &no_lost_req(b, true)).await.unwrap() })
    };
    running(
        &server,
        "SELECT next_seq, enqueued, finish%FROM tessera_tails%FOR UPDATE",
    );
    sqlx::raw_sql("COMMIT").execute(&mut blocker).await.unwrap();
    assert!(release.await.unwrap());
    let reply = enqueue.await.unwrap();
    assert!(
        matches!(&reply, AcquireReply::Granted(g) if g.lease.lease_id == b),
        "{reply:?}"
    );
    let st = db.status(&s).await.unwrap().unwrap();
    assert_eq!((st.used, st.queue.len()), (2, 0));
}

/// `docs/sql-queue.md`, "No lost wake-up", the enqueue first: B's enqueue holds the tail row
/// and is held before its commit (a session outside tessera holds an uncommitted waiter row
/// with the seq B takes); A's release, which ends with a permit free, then waits for the tail
/// row, sees B's waiter once the enqueue commits, and B holds the permit when the release
/// returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_frees_a_permit_behind_an_enqueue_hands_it_over() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    // Two clients (as two processes): a client sends one call at a time.
    let db = Arc::new(MysqlBackend::connect(&url).await.unwrap());
    let other = Arc::new(MysqlBackend::connect(&url).await.unwrap());
    let s = Name::new("lost").unwrap();
    let (a, _c) = two_held(&db, &s).await;
    let next_seq = server.sql("SELECT next_seq FROM t.tessera_tails WHERE name = 'lost'");
    let next_seq: i64 = next_seq.trim().parse().unwrap();
    let mut blocker = hold_open(
        &url,
        &format!(
            "INSERT INTO tessera_waiters (name, seq, lease_id, weight, holder, ttl, \
             enqueued_at, expires_at, doorbell, tag) \
             VALUES ('lost', {next_seq}, '{}', 1, 'x', 1, 0, 0, '', 0)",
            LeaseId::random()
        ),
    )
    .await;
    let b = LeaseId::random();
    let enqueue = {
        let (db, s) = (other.clone(), s.clone());
        tokio::spawn(async move { db.acquire(&s, 2, &no_lost_req(b, true)).await.unwrap() })
    };
    running(&server, "INSERT INTO tessera_waiters%");
    // The enqueue holds the tail row and waits for the outside row's seq.
    let release = {
        let (db, s) = (db.clone(), s.clone());
        tokio::spawn(async move { db.release(&s, a).await.unwrap() })
    };
    running(&server, "SELECT enqueued%FROM tessera_tails%FOR UPDATE");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    assert_eq!(enqueue.await.unwrap(), AcquireReply::Queued { position: 0 });
    assert!(release.await.unwrap());
    let st = db.status(&s).await.unwrap().unwrap();
    let holders: Vec<LeaseId> = st.holders.iter().map(|h| h.lease_id).collect();
    assert!(holders.contains(&b), "{holders:?}");
    assert_eq!((st.used, st.queue.len()), (2, 0));
}

/// Enqueues that run at once on one semaphore (from two clients, as two processes) take
/// their sequence numbers in the order they commit, each under the tail row's lock: the
/// positions they answer are 0, 1, 2, … without a gap or a repeat, the queue lists them in
/// that order, and the releases hand the permit on in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_queue_in_the_order_they_commit() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let stores = [
        Arc::new(MysqlBackend::connect(&url).await.unwrap()),
        Arc::new(MysqlBackend::connect(&url).await.unwrap()),
    ];
    let s = Name::new("fifo").unwrap();
    let holder = LeaseId::random();
    assert!(matches!(
        stores[0]
            .acquire(&s, 1, &no_lost_req(holder, false))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
    let before = server.sql("SHOW GLOBAL STATUS LIKE 'Com_call_procedure'");
    let enqueues = (0..16).map(|i| {
        let (db, s) = (stores[i % 2].clone(), s.clone());
        tokio::spawn(async move {
            let lease = LeaseId::random();
            match db.acquire(&s, 1, &no_lost_req(lease, true)).await.unwrap() {
                AcquireReply::Queued { position } => (position, lease),
                other => panic!("not queued: {other:?}"),
            }
        })
    });
    let mut queued = Vec::new();
    for e in enqueues {
        queued.push(e.await.unwrap());
    }
    assert_ne!(
        server.sql("SHOW GLOBAL STATUS LIKE 'Com_call_procedure'"),
        before
    );
    queued.sort();
    let positions: Vec<u64> = queued.iter().map(|(p, _)| *p).collect();
    assert_eq!(positions, (0..16).collect::<Vec<u64>>());
    let order: Vec<LeaseId> = queued.iter().map(|(_, l)| *l).collect();
    let st = stores[1].status(&s).await.unwrap().unwrap();
    let queue: Vec<LeaseId> = st.queue.iter().map(|w| w.lease_id).collect();
    assert_eq!(queue, order);
    let mut held = holder;
    for next in order {
        assert!(stores[0].release(&s, held).await.unwrap());
        let st = stores[1].status(&s).await.unwrap().unwrap();
        assert_eq!(st.holders[0].lease_id, next);
        held = next;
    }
    assert!(stores[0].release(&s, held).await.unwrap());
    assert!(stores[0].status(&s).await.unwrap().is_none());
}

/// A plain enqueue takes no lock on the semaphore row (`docs/sql-queue.md`): with that row
/// locked by a session outside tessera, as a release in flight holds it, the enqueue still
/// answers at once, and the waiter is handed the permit once the holder releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_does_not_wait_for_the_semaphore_row() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let db = MysqlBackend::connect(&url).await.unwrap();
    let s = Name::new("row").unwrap();
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    let held = db
        .acquire(&s, 1, &no_lost_req(holder, false))
        .await
        .unwrap();
    assert!(matches!(held, AcquireReply::Granted(_)), "{held:?}");
    let mut blocker = hold_open(
        &url,
        "SELECT name FROM tessera_semaphores WHERE name = 'row' FOR UPDATE",
    )
    .await;
    let reply = tokio::time::timeout(
        Duration::from_secs(3),
        db.acquire(&s, 1, &no_lost_req(waiter, true)),
    )
    .await
    .expect("the enqueue waited for the semaphore row")
    .unwrap();
    assert_eq!(reply, AcquireReply::Queued { position: 0 });
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut blocker)
        .await
        .unwrap();
    assert!(db.release(&s, holder).await.unwrap());
    let st = db.status(&s).await.unwrap().unwrap();
    assert_eq!(st.holders[0].lease_id, waiter);
    assert!(db.release(&s, waiter).await.unwrap());
}

/// Routine version 10: a release that hands the permit to a waiter rings that waiter's
/// doorbell itself, after its commit, and says what it did (`routines_v10.sql`): it rings a
/// doorbell parked with its token (1); it leaves alone one that the caller lists as its own
/// process's (NULL), a connection parked under another token (0: the client looks again),
/// and a connection id that does not exist (-1). A plain connection plays the doorbell.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_rings_the_doorbell_of_the_waiter_it_grants_unless_it_is_the_callers() {
    use sqlx::{Connection, Row};
    let server = MariaDbServer::start();
    let url = server.url("t");
    let db = MysqlBackend::connect(&url).await.unwrap();
    assert_eq!(db.db.release(), Some(routines::RING_VERSION));
    let (mut caller, _) = plain_connection(&url).await;
    let (mut bell, id) = plain_connection(&url).await;
    let token = format!("{:016x}", 0xbe11u64);
    let s = Name::new("bell").unwrap();
    let mut held = LeaseId::random();
    let first = db.acquire(&s, 1, &no_lost_req(held, false)).await.unwrap();
    assert!(matches!(first, AcquireReply::Granted(_)), "{first:?}");
    let cases = [
        (format!("{id}:{token}"), String::new(), Some(1)),
        (format!("{id}:{token}"), format!("1:ab,{id}:{token}"), None),
        (format!("{id}:{:016x}", 0xfu64), String::new(), Some(0)),
        (format!("{}:{token}", u32::MAX), String::new(), Some(-1)),
    ];
    for (doorbell, local, rung) in cases {
        let waiter = LeaseId::random();
        let queued = db.acquire(&s, 1, &no_lost_req(waiter, true)).await.unwrap();
        assert!(matches!(queued, AcquireReply::Queued { .. }), "{queued:?}");
        server.sql(&format!(
            "UPDATE t.tessera_waiters SET doorbell = '{doorbell}' WHERE lease_id = '{waiter}'"
        ));
        let park = format!("SELECT SLEEP(30) /* tessera doorbell {token} */");
        let mut parked = tokio::spawn(async move {
            let r = sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(park))
                .fetch_one(&mut bell)
                .await;
            (bell, r)
        });
        running(&server, "SELECT SLEEP(30)%");
        let call =
            routines::release_call("bell", &held.to_string(), routines::RING_VERSION, &local);
        let rows = routines::call(&mut caller, call).await.unwrap().unwrap();
        let answered: Option<i64> = rows[0].try_get(13).unwrap();
        assert_eq!(answered, rung, "{doorbell} with {local:?} local");
        let limit = if rung == Some(1) {
            Duration::from_secs(10)
        } else {
            Duration::from_millis(300)
        };
        let ended = tokio::time::timeout(limit, &mut parked).await.ok();
        assert_eq!(
            ended.is_some(),
            rung == Some(1),
            "{doorbell}: rung {ended:?}"
        );
        let (b, _) = match ended {
            Some(done) => done.unwrap(),
            None => {
                server.sql(&format!("KILL QUERY {id}"));
                parked.await.unwrap()
            }
        };
        bell = b;
        // The permit went to the waiter in every case.
        let st = db.status(&s).await.unwrap().unwrap();
        let holders: Vec<LeaseId> = st.holders.iter().map(|h| h.lease_id).collect();
        assert_eq!((holders, st.queue.len()), (vec![waiter], 0));
        held = waiter;
    }
    bell.close().await.unwrap();
    caller.close().await.unwrap();
}
