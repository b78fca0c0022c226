//! `tessera run` holders on Redis while the server is killed, restarted empty, or cuts the
//! client's connections: the command is stopped when the permit is lost (never left running
//! past the lease), tessera does not hang on a store that is gone, and short connection drops
//! cost nothing.

mod common;

use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{stderr_of, tessera};
use tessera_testkit::proxy::{Mode, Proxy};
use tessera_testkit::servers::redis::RedisServer;

/// The command: writes `started` to `dir/started`, and on SIGTERM the wall-clock time in ns
/// to `dir/term`; otherwise runs for `secs` seconds and exits 0.
fn child_script(dir: &Path, secs: u32) -> String {
    let d = dir.display();
    format!(
        "trap 'date +%s%N > {d}/term; exit 143' TERM; echo started > {d}/started; \
         i=0; while [ $i -lt {n} ]; do sleep 0.05; i=$((i+1)); done",
        n = secs * 20
    )
}

/// `tessera --store URL run --name job --permits 1`, for the caller's options and command.
fn run_job(home: &Path, url: &str) -> Command {
    let mut command = tessera(home);
    command.args(["--store", url, "run", "--name", "job", "--permits", "1"]);
    command
}

fn spawn_holder(home: &Path, url: &str, ttl: &str, script: &str) -> Child {
    run_job(home, url)
        .args(["--ttl", ttl, "--", "sh", "-c", script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A holder with a 3 s TTL whose command runs for a minute, once the command has started.
fn holding_for_a_minute(home: &Path, server: &RedisServer) -> Child {
    let holder = spawn_holder(home, &server.url(), "3s", &child_script(home, 60));
    wait_for(&home.join("started"), Duration::from_secs(20));
    holder
}

fn wait_for(path: &Path, within: Duration) {
    let deadline = Instant::now() + within;
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the child to exit (bounded) and returns its status and stderr.
fn finish(mut child: Child, within: Duration) -> (ExitStatus, String, Instant) {
    let deadline = Instant::now() + within;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tessera run did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let exited = Instant::now();
    (status, stderr_of(&mut child), exited)
}

fn wall_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[test]
fn a_holder_whose_redis_dies_stops_its_command_before_the_lease_could_expire() {
    let home = tempfile::tempdir().unwrap();
    let mut server = RedisServer::start();
    let ttl = Duration::from_secs(3);
    let holder = holding_for_a_minute(home.path(), &server);

    // Every renewal the holder sent was sent before this instant, so the lease expires on
    // the store by `killed + ttl` at the latest.
    let killed_wall = wall_ns();
    let killed = Instant::now();
    server.kill();

    let (status, err, exited) = finish(holder, ttl + Duration::from_secs(15));
    assert_eq!(status.code(), Some(74), "{err}");
    assert!(
        err.contains("lost the permit on job while the command ran"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let term: u128 = std::fs::read_to_string(home.path().join("term"))
        .expect("the command got SIGTERM")
        .trim()
        .parse()
        .unwrap();
    assert!(
        term < killed_wall + ttl.as_nanos(),
        "the command was stopped {} ms after the kill, at or after the lease could expire",
        (term - killed_wall) / 1_000_000
    );
    // The release cannot reach a dead server: tessera tries it briefly instead of waiting
    // out its 10 s limit. (Generous: the bound is about TTL + 1 s.)
    assert!(
        exited - killed < ttl + Duration::from_secs(5),
        "tessera exited {:?} after the kill",
        exited - killed
    );
}

#[test]
fn a_holder_whose_redis_restarts_empty_is_told_at_its_next_renewal() {
    let home = tempfile::tempdir().unwrap();
    let mut server = RedisServer::start();
    let holder = holding_for_a_minute(home.path(), &server);
    server.restart();

    let (status, err, _) = finish(holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(74), "{err}");
    assert!(
        err.contains("lost the permit on job while the command ran"),
        "{err}"
    );
    assert!(
        home.path().join("term").exists(),
        "the command got no SIGTERM"
    );
    // The restarted server forgot the lease: a new holder gets the permit at once.
    let out = run_job(home.path(), &server.url())
        .args(["--wait", "0s", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

#[test]
fn client_kills_shorter_than_the_ttl_cost_a_holder_nothing() {
    let home = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let url = server.url();
    let holder = spawn_holder(home.path(), &url, "2s", &child_script(home.path(), 4));
    wait_for(&home.path().join("started"), Duration::from_secs(20));
    // Drop every client connection (commands and the wake-up subscriber) a few times, each
    // far shorter than the TTL; the holder reconnects, renews and finishes normally.
    for _ in 0..5 {
        server.command(&["CLIENT", "KILL", "TYPE", "normal"]);
        server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
        std::thread::sleep(Duration::from_millis(300));
    }
    let (status, err, _) = finish(holder, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        !home.path().join("term").exists(),
        "the command was stopped: {err}"
    );
    // Released on exit: nobody holds the permit any more.
    let out = tessera(home.path())
        .args(["--store", &url, "status", "job", "--json"])
        .output()
        .unwrap();
    let held = serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .map(|v| v["used"].as_u64().unwrap_or(0))
        .unwrap_or(0);
    assert_eq!(held, 0, "{}", String::from_utf8_lossy(&out.stdout));
}

/// A run waiting without `--wait` ("as long as it takes") rides out a store outage longer
/// than the library's own retries (the waiter TTL, 5 s): it says so, rejoins the queue when
/// the store answers again, and runs its command once the holder releases. The waiter
/// reaches Redis through a proxy that resets every connection for 8 s; the holder connects
/// directly and keeps its permit throughout.
#[test]
fn a_waiter_without_wait_rides_out_a_store_outage_and_runs_its_command() {
    let home = tempfile::tempdir().unwrap();
    let server = RedisServer::start();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let proxy = rt
        .block_on(Proxy::start(
            format!("127.0.0.1:{}", server.port()).parse().unwrap(),
        ))
        .unwrap();
    let go = home.path().join("go");
    let ran = home.path().join("ran");
    let holder = run_job(home.path(), &server.url())
        .args(["--holder", "holder", "--", "sh", "-c"])
        .arg(format!(
            "echo started > {}/started; while [ ! -e {} ]; do sleep 0.05; done",
            home.path().display(),
            go.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for(&home.path().join("started"), Duration::from_secs(20));
    let mut waiter = run_job(home.path(), &format!("redis://{}", proxy.addr()))
        .args(["--holder", "waiter", "--", "sh", "-c"])
        .arg(format!("echo ran > {}", ran.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let queued = Instant::now() + Duration::from_secs(20);
    while !queue_has(&server, "waiter") {
        assert!(Instant::now() < queued, "the waiter never queued");
        assert!(waiter.try_wait().unwrap().is_none(), "the waiter exited");
        std::thread::sleep(Duration::from_millis(20));
    }

    proxy.set(Mode::Reset);
    std::thread::sleep(Duration::from_secs(8));
    if let Some(status) = waiter.try_wait().unwrap() {
        let (_, err, _) = finish(waiter, Duration::from_secs(1));
        panic!("the waiter gave up during the outage ({status}): {err}");
    }
    proxy.set(Mode::Pass);

    // Let the waiter rejoin before the holder leaves, so that the grant it gets is a
    // hand-off, not a free permit found on its next try.
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&go, "").unwrap();
    let (status, err, _) = finish(holder, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "holder: {err}");
    let (status, err, _) = finish(waiter, Duration::from_secs(20));
    assert_eq!(status.code(), Some(0), "waiter: {err}");
    assert!(ran.exists(), "the waiter's command did not run: {err}");
    // tessera's own lines; the library warns once per outage of each connection it keeps
    // (its wake-up subscriber retries every second, at debug after the first warning).
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with("tessera: ")).collect();
    assert_eq!(lines.len(), 2, "{err}");
    let library = err.lines().filter(|l| l.contains("WARN")).count();
    assert!(library <= 4, "{library} warnings for one outage: {err}");
    assert!(
        lines[0].starts_with("tessera: store error") && lines[0].contains("still waiting"),
        "{lines:?}"
    );
    assert!(lines[1].contains("answers again"), "{lines:?}");
}

/// Whether `label` waits in the queue of `job` (read with `tessera status`).
fn queue_has(server: &RedisServer, label: &str) -> bool {
    let home = tempfile::tempdir().unwrap();
    let out = tessera(home.path())
        .args(["--store", &server.url(), "status", "job", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&out.stdout)
        .ok()
        .and_then(|v| v["queue"].as_array().cloned())
        .is_some_and(|q| q.iter().any(|w| w["holder"] == label))
}
