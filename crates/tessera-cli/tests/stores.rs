//! The admin commands on every server store, as a user runs them: while `tessera run` holds
//! a permit, `status NAME`, `status`, `status --json`, `resize` and `revoke` (which stops the
//! holder's command), then `status` of what is gone, and a rate limit run, shown and deleted
//! where the store has rate limits (on etcd, a typed refusal). Each test starts its own
//! throwaway server.

use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{tessera, tessera_on};
use tessera_testkit::harness::Harness;

#[track_caller]
fn stdout_of(out: &Output, code: i32) -> String {
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

fn wait_exit(child: &mut Child, within: Duration) -> Option<i32> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the holder did not stop within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The whole walk on one store URL; `rate` says whether the store has rate limits.
fn admin_walk(url: &str, rate: bool) {
    let home = tempfile::tempdir().unwrap();
    let name = format!("admin-{:08x}", rand::random::<u32>());
    let ready = home.path().join("ready");
    let mut holder = tessera(home.path())
        .args(["--store", url, "run", "--name", &name, "--permits", "2"])
        .args(["--ttl", "4s", "--", "sh", "-c"])
        .arg(format!("echo ready > {}; sleep 60", ready.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = holder.try_wait().unwrap() {
            panic!("the holder exited with {status} before its command ran");
        }
        assert!(
            Instant::now() < deadline,
            "the holder never ran its command"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let detail = stdout_of(&tessera_on(home.path(), url, &["status", &name]), 0);
    assert!(detail.contains("capacity 2, used 1"), "{detail}");
    let summary = stdout_of(&tessera_on(home.path(), url, &["status"]), 0);
    assert!(summary.contains(&name), "{summary}");
    let json = stdout_of(
        &tessera_on(home.path(), url, &["status", "--json", &name]),
        0,
    );
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["used"], 1, "{json}");
    let lease = json["holders"][0]["lease_id"].as_str().unwrap().to_string();
    assert!(detail.contains(&lease), "{detail}");

    stdout_of(&tessera_on(home.path(), url, &["resize", &name, "3"]), 0);
    let json = stdout_of(
        &tessera_on(home.path(), url, &["status", "--json", &name]),
        0,
    );
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["capacity"], 3, "{json}");

    stdout_of(&tessera_on(home.path(), url, &["revoke", &name, &lease]), 0);
    // The holder learns at its next renewal (at most a third of the TTL) and stops its command.
    let code = wait_exit(&mut holder, Duration::from_secs(15));
    assert_eq!(code, Some(74), "the revoked holder's exit code");
    let gone = tessera_on(home.path(), url, &["status", &name]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");

    let limiter = format!("{name}-rate");
    let out = tessera_on(
        home.path(),
        url,
        // A minute: on a busy host these commands can take longer than a second, after
        // which a per-second limiter has no state left to show or delete.
        &["run", "--name", &limiter, "--rate", "5/min", "--", "true"],
    );
    if rate {
        stdout_of(&out, 0);
        let shown = stdout_of(&tessera_on(home.path(), url, &["status", &limiter]), 0);
        assert!(shown.contains("rate limiter"), "{shown}");
        let listed = stdout_of(&tessera_on(home.path(), url, &["status"]), 0);
        assert!(listed.contains(&limiter), "{listed}");
        stdout_of(&tessera_on(home.path(), url, &["delete", &limiter]), 0);
    } else {
        // A feature the store lacks is a usage error (64), not a store fault (69).
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no clock"),
            "{out:?}"
        );
    }
    let gone = tessera_on(home.path(), url, &["status", &limiter]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
}

#[test]
fn admin_commands_on_redis() {
    admin_walk(Harness::redis().url(), true);
}

#[test]
fn admin_commands_on_redis_sentinel() {
    admin_walk(Harness::redis_sentinel("").url(), true);
}

#[test]
fn admin_commands_on_redis_cluster() {
    admin_walk(Harness::redis_cluster(false).url(), true);
}

/// A Redis Cluster behind a password (`requirepass` and `masterauth` on every node), as
/// managed clusters run: the walk with the password in the URL; without it, or with a wrong
/// one, one line on stderr that says auth (it said "connection", under a warning of the
/// cluster client's own) and never shows the password.
#[test]
fn admin_commands_on_a_redis_cluster_behind_a_password() {
    const PW: &str = "Clu-pw-7";
    let cluster = tessera_testkit::servers::redis_cluster::RedisCluster::start(false);
    for node in cluster.nodes() {
        assert!(node
            .command(&["CONFIG", "SET", "masterauth", PW])
            .starts_with("+OK"));
        assert!(node
            .command(&["CONFIG", "SET", "requirepass", PW])
            .starts_with("+OK"));
    }
    let open = cluster.url();
    admin_walk(&open.replace("://", &format!("://:{PW}@")), true);
    let home = tempfile::tempdir().unwrap();
    for url in [open.clone(), open.replace("://", "://:Wrong-pw-7@")] {
        let out = tessera_on(home.path(), &url, &["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.starts_with("tessera: store error (auth)"), "{err}");
        assert!(!err.contains("pw-7"), "{err}");
    }
}

/// A wrong password on PostgreSQL and MariaDB: one line that says auth, as on Redis, with
/// the server's words and the URL (password masked); exit 69, as for Redis. (It said
/// "other".)
#[test]
fn a_wrong_password_is_an_auth_error_on_postgres_and_mariadb() {
    let pg = tessera_testkit::servers::postgres::PostgresServer::start();
    pg.psql("CREATE ROLE app LOGIN PASSWORD 'Right-pw-7'");
    pg.require_password("app");
    let maria = tessera_testkit::servers::mysql::MariaDbServer::start();
    let maria_url = maria.url("pw");
    maria.sql("CREATE USER 'app'@'%' IDENTIFIED BY 'Right-pw-7'; GRANT ALL ON pw.* TO 'app'@'%'");
    let home = tempfile::tempdir().unwrap();
    for (url, says) in [
        (
            format!("postgres://app:Wrong-pw-7@127.0.0.1:{}/postgres", pg.port()),
            "PostgreSQL: password authentication failed for user \"app\" (SQLSTATE 28P01)",
        ),
        (
            maria_url.replace("root@", "app:Wrong-pw-7@"),
            "MySQL: error 1045: Access denied for user 'app'@",
        ),
    ] {
        let out = tessera_on(home.path(), &url, &["status"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(69), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(
            err.starts_with(&format!("tessera: store error (auth): {says}")),
            "{err}"
        );
        assert!(
            err.trim_end().ends_with(&format!(
                "(the server refused the credentials: check the user and password of {})",
                url.replace("Wrong-pw-7", "***")
            )),
            "{err}"
        );
        assert!(!err.contains("pw-7"), "{err}");
    }
}

#[test]
fn admin_commands_on_postgres() {
    admin_walk(Harness::postgres().url(), true);
}

#[test]
fn admin_commands_on_mariadb() {
    admin_walk(Harness::mariadb().url(), true);
}

#[test]
fn admin_commands_on_etcd() {
    admin_walk(Harness::etcd().url(), false);
}

/// Two `tessera run` processes on one MariaDB lock: the holder's command ends, it releases
/// (handing the lock to the waiting process in the same call) and exits at once. The ring
/// that wakes the waiter's doorbell (`KILL QUERY`, counted by the server's `Com_kill`) is
/// sent before the holder exits: it used to be left to a background task that died with the
/// process, so every waiting process found its grant only at its next poll (20 processes
/// handing a lock on took 15 s instead of 1).
#[test]
fn a_holder_that_exits_after_its_release_has_rung_the_waiting_process() {
    let h = Harness::mariadb();
    let server = h.mariadb_server().unwrap();
    let kills = || -> u64 {
        let out = server.sql("SHOW GLOBAL STATUS LIKE 'Com_kill'");
        out.split_whitespace().last().unwrap().parse().unwrap()
    };
    let home = tempfile::tempdir().unwrap();
    let go = home.path().join("go");
    let ran = home.path().join("ran");
    let spawn = |script: String| {
        tessera(home.path())
            .args([
                "--store",
                h.url(),
                "run",
                "--name",
                "rung",
                "--permits",
                "1",
            ])
            .args(["--ttl", "30s", "--wait", "60s", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .spawn()
            .unwrap()
    };
    // The holder runs until the file `go` exists.
    let held = home.path().join("held");
    let mut holder = spawn(format!(
        "touch {held}; while [ ! -e {go} ]; do sleep 0.02; done",
        held = held.display(),
        go = go.display()
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held.exists() {
        assert!(
            Instant::now() < deadline,
            "the holder never ran its command"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut waiter = spawn(format!("touch {}", ran.display()));
    while server.sql("SELECT COUNT(*) FROM t.tessera_waiters").trim() != "1" {
        assert!(Instant::now() < deadline, "the second process never queued");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The waiting process's doorbell is parked before the holder lets go (the holder parks
    // one too: a revoke rings holders).
    let parked = || {
        server
            .sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'SELECT GET_LOCK(%tessera doorbell%'",
            )
            .trim()
            == "2"
    };
    while !parked() {
        assert!(
            Instant::now() < deadline,
            "the waiter's doorbell never parked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = kills();
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut holder, Duration::from_secs(30)), Some(0));
    let after_holder = kills();
    assert_eq!(wait_exit(&mut waiter, Duration::from_secs(30)), Some(0));
    assert!(ran.exists(), "the waiter's command did not run");
    assert!(
        after_holder > before,
        "the holder exited without ringing the waiter's doorbell (Com_kill {before} -> {after_holder})"
    );
}
