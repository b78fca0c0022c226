//! The admin commands on every server store, as a user runs them: while `tessera run` holds
//! a permit, `status NAME`, `status`, `status --json`, `resize` and `revoke` (which stops the
//! holder's command), then `status` of what is gone, and a rate limit run, shown and deleted
//! where the store has rate limits (on etcd, a typed refusal). Each test starts its own
//! throwaway server.

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::tessera;
use tessera_testkit::harness::Harness;

fn run(home: &Path, url: &str, args: &[&str]) -> Output {
    tessera(home)
        .args(["--store", url])
        .args(args)
        .output()
        .unwrap()
}

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

    let detail = stdout_of(&run(home.path(), url, &["status", &name]), 0);
    assert!(detail.contains("capacity 2, used 1"), "{detail}");
    let summary = stdout_of(&run(home.path(), url, &["status"]), 0);
    assert!(summary.contains(&name), "{summary}");
    let json = stdout_of(&run(home.path(), url, &["status", "--json", &name]), 0);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["used"], 1, "{json}");
    let lease = json["holders"][0]["lease_id"].as_str().unwrap().to_string();
    assert!(detail.contains(&lease), "{detail}");

    stdout_of(&run(home.path(), url, &["resize", &name, "3"]), 0);
    let json = stdout_of(&run(home.path(), url, &["status", "--json", &name]), 0);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json["capacity"], 3, "{json}");

    stdout_of(&run(home.path(), url, &["revoke", &name, &lease]), 0);
    // The holder learns at its next renewal (at most a third of the TTL) and stops its command.
    let code = wait_exit(&mut holder, Duration::from_secs(15));
    assert_eq!(code, Some(74), "the revoked holder's exit code");
    let gone = run(home.path(), url, &["status", &name]);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");

    let limiter = format!("{name}-rate");
    let out = run(
        home.path(),
        url,
        &["run", "--name", &limiter, "--rate", "5/s", "--", "true"],
    );
    if rate {
        stdout_of(&out, 0);
        let shown = stdout_of(&run(home.path(), url, &["status", &limiter]), 0);
        assert!(shown.contains("rate limiter"), "{shown}");
        let listed = stdout_of(&run(home.path(), url, &["status"]), 0);
        assert!(listed.contains(&limiter), "{listed}");
        stdout_of(&run(home.path(), url, &["delete", &limiter]), 0);
    } else {
        assert_eq!(out.status.code(), Some(69), "{out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no clock"),
            "{out:?}"
        );
    }
    let gone = run(home.path(), url, &["status", &limiter]);
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
