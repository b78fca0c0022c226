//! `tessera run` stopped while it waits — by SIGTERM, SIGINT or `--wait` running out, during
//! the wait for a permit, for a turn within the rate limits, or for an admission of both —
//! runs nothing and leaves nothing behind: no holder, no queue place, no rate reservation,
//! checked with `tessera status` right after it exited.

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::tessera;

fn status_json(home: &Path, store: &str, name: &str) -> serde_json::Value {
    let out = tessera(home)
        .args(["--store", store, "status", name, "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// `(used, reserved)` of the first rate limit of `name`.
fn rate_usage(home: &Path, store: &str, name: &str) -> (u64, u64) {
    let s = status_json(home, store, name);
    let limit = &s["rate"]["limits"][0];
    (
        limit["used"].as_u64().unwrap_or(0),
        limit["reserved"].as_u64().unwrap_or(0),
    )
}

/// How many entries the status list `field` ("holders", "queue") has; 0 when the store keeps
/// no semaphore under the name.
fn count(s: &serde_json::Value, field: &str) -> usize {
    s[field].as_array().map_or(0, Vec::len)
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn spawn_run(home: &Path, store: &str, name: &str, extra: &[&str], marker: &Path) -> Child {
    tessera(home)
        .args(["--store", store, "run", "--name", name])
        .args(extra)
        .args(["--", "touch", marker.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on a process this test spawned.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// Uses up `1/2min` of `name` with one run that succeeds.
fn use_up_the_rate(home: &Path, store: &str, name: &str, extra: &[&str]) {
    let out = tessera(home)
        .args(["--store", store, "run", "--name", name, "--rate", "1/2min"])
        .args(extra)
        .args(["--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(rate_usage(home, store, name), (1, 0));
}

#[test]
fn a_signal_during_the_rate_wait_returns_the_reservation() {
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let home = tempfile::tempdir().unwrap();
        let store = format!("sqlite://{}", home.path().join("t.db").display());
        use_up_the_rate(home.path(), &store, "slow2", &[]);
        let marker = home.path().join("ran");
        let waiter = spawn_run(home.path(), &store, "slow2", &["--rate", "1/2min"], &marker);
        wait_until("the second run reserved its turn", || {
            rate_usage(home.path(), &store, "slow2") == (1, 1)
        });
        signal(&waiter, sig);
        let out = waiter.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("nothing was run"));
        assert!(!marker.exists());
        assert_eq!(
            rate_usage(home.path(), &store, "slow2"),
            (1, 0),
            "signal {sig}: the interrupted run kept its reservation"
        );
    }
}

/// `--permits` with `--rate` on SQLite is one admission: while the windows are full the run
/// waits in the queue holding no permit and reserving no turn, and a signal then leaves the
/// queue with nothing charged.
#[test]
fn a_signal_during_an_admission_wait_leaves_the_queue_and_charges_nothing() {
    a_signal_during_an_admission_wait(|home, _| {
        format!("sqlite://{}", home.join("t.db").display())
    });
}

/// The same on a throwaway PostgreSQL (a schema per signal), where the admission is one
/// function call that runs to its end on the server even when the run is interrupted.
#[test]
fn a_signal_during_an_admission_wait_leaves_the_queue_and_charges_nothing_on_postgres() {
    let server = tessera_testkit::servers::postgres::PostgresServer::start();
    a_signal_during_an_admission_wait(|_, sig| server.url_with_schema(&format!("sig{sig}")));
}

/// SIGTERM and SIGINT during an admission's wait, each on the store `store(home, signal)`.
fn a_signal_during_an_admission_wait(store: impl Fn(&Path, i32) -> String) {
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGINT, 130)] {
        let home = tempfile::tempdir().unwrap();
        let store = store(home.path(), sig);
        use_up_the_rate(home.path(), &store, "both", &["--permits", "2"]);
        let marker = home.path().join("ran");
        let waiter = spawn_run(
            home.path(),
            &store,
            "both",
            &["--permits", "2", "--rate", "1/2min"],
            &marker,
        );
        wait_until(
            "the run waits in the queue, holding and reserving nothing",
            || {
                let s = status_json(home.path(), &store, "both");
                count(&s, "queue") == 1
                    && s["used"] == 0
                    && s["rate"]["limits"][0]["used"] == 1
                    && s["rate"]["limits"][0]["reserved"] == 0
            },
        );
        signal(&waiter, sig);
        let out = waiter.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{out:?}");
        assert!(!marker.exists());
        let s = status_json(home.path(), &store, "both");
        assert_eq!((count(&s, "holders"), count(&s, "queue")), (0, 0), "{s}");
        assert_eq!(rate_usage(home.path(), &store, "both"), (1, 0), "{s}");
    }
}

#[test]
fn wait_running_out_before_the_turn_reserves_nothing() {
    let home = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", home.path().join("t.db").display());
    use_up_the_rate(home.path(), &store, "slow2", &["--permits", "1"]);
    let marker = home.path().join("ran");
    let out = spawn_run(
        home.path(),
        &store,
        "slow2",
        &["--permits", "1", "--rate", "1/2min", "--wait", "1s"],
        &marker,
    )
    .wait_with_output()
    .unwrap();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(!marker.exists());
    let s = status_json(home.path(), &store, "slow2");
    assert_eq!(count(&s, "holders"), 0, "{s}");
    assert_eq!(rate_usage(home.path(), &store, "slow2"), (1, 0), "{s}");
}

#[test]
fn sigterm_during_the_permit_wait_leaves_the_queue() {
    let home = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", home.path().join("t.db").display());
    let ready = home.path().join("ready");
    let holder = tessera(home.path())
        .args(["--store", &store, "run", "--name", "gate", "--permits", "1"])
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", ready.display()))
        .spawn()
        .unwrap();
    wait_until("the holder runs", || ready.exists());
    let marker = home.path().join("ran");
    let waiter = spawn_run(home.path(), &store, "gate", &["--permits", "1"], &marker);
    wait_until("the waiter queued", || {
        count(&status_json(home.path(), &store, "gate"), "queue") == 1
    });
    signal(&waiter, libc::SIGTERM);
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(!marker.exists());
    let s = status_json(home.path(), &store, "gate");
    assert_eq!((count(&s, "holders"), count(&s, "queue")), (1, 0), "{s}");
    signal(&holder, libc::SIGTERM);
    holder.wait_with_output().unwrap();
}

#[test]
fn a_frozen_tessera_says_it_was_frozen_when_it_loses_the_permit() {
    let home = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}", home.path().join("t.db").display());
    let ready = home.path().join("ready");
    let run = tessera(home.path())
        .args([
            "--store",
            &store,
            "run",
            "--name",
            "frozen",
            "--permits",
            "1",
        ])
        .args(["--ttl", "1s", "--", "sh", "-c"])
        .arg(format!("touch {}; sleep 30", ready.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the command runs", || ready.exists());
    signal(&run, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(3));
    signal(&run, libc::SIGCONT);
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(74), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not run"), "{err}");
    assert!(!err.contains("the store did not answer"), "{err}");
}
