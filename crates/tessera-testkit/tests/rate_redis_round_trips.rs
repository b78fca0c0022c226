//! On Redis, every rate decision is one round trip: one `FCALL` per `try_acquire` and per
//! `acquire`, whatever the number of limits, and nothing else is sent.

use std::process::Command;
use std::time::Duration;

use tessera::{RateSpec, Store};
use tessera_testkit::servers::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rate_decision_is_one_fcall() {
    let server = RedisServer::start();
    let store = Store::connect(&server.url()).await.unwrap();
    let limits: Vec<RateSpec> = ["5/s", "100/min", "1000/h"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let rl = store.rate_limiter("round-trips", &limits).unwrap();
    // Warm up: the first call loads the library (Function not found, FUNCTION LOAD, FCALL
    // again).
    let _ = rl.try_acquire(1).await.unwrap();
    let before = server.command_calls();
    for _ in 0..20 {
        let _ = rl.try_acquire(1).await.unwrap();
    }
    for _ in 0..3 {
        let _ = rl
            .acquire_within(1, Duration::from_millis(1))
            .await
            .unwrap();
    }
    let after = server.command_calls();
    let delta = |c: &str| after.get(c).unwrap_or(&0) - before.get(c).unwrap_or(&0);
    assert_eq!(delta("fcall"), 23, "{after:?}");
    // The library was not reloaded and no script, transaction or plain EVAL was used. (commandstats also
    // counts the commands the scripts call, so those cannot be told from client commands.)
    for c in [
        "function|load",
        "evalsha",
        "script|load",
        "eval",
        "multi",
        "exec",
    ] {
        assert_eq!(delta(c), 0, "{c}: {before:?} -> {after:?}");
    }
}

fn redis_cli(server: &RedisServer, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &server.port().to_string()])
        .args(args)
        .output()
        .expect("redis-cli (apt-get install -y redis-tools)");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_stays_bounded_and_the_keys_expire() {
    let server = RedisServer::start();
    let store = Store::connect(&format!("{}?prefix=b", server.url()))
        .await
        .unwrap();
    let limits: Vec<RateSpec> = ["10/200ms", "15/400ms"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let rl = store.rate_limiter("bounded", &limits).unwrap();
    // Drive it until 40 admissions (several full windows of both limits), checking the log
    // after every decision; bounded in time so a broken limiter cannot hang the test.
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let mut admitted = 0;
    while admitted < 40 {
        assert!(
            std::time::Instant::now() < end,
            "only {admitted} admitted in 30 s"
        );
        if rl.try_acquire(1).await.unwrap().is_admitted() {
            admitted += 1;
        }
        let n: u64 = redis_cli(&server, &["ZCARD", "{b:bounded}:rate:log"])
            .parse()
            .unwrap();
        assert!(n <= 15, "{n} log entries");
    }
    let ttl: i64 = redis_cli(&server, &["PTTL", "{b:bounded}:rate"])
        .parse()
        .unwrap();
    // The longest window (400 ms plus the default 20 ms margin) plus the 1 s grace.
    assert!(ttl > 0 && ttl <= 1420, "{ttl} ms");
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(
        redis_cli(
            &server,
            &["EXISTS", "{b:bounded}:rate", "{b:bounded}:rate:log"]
        ),
        "0"
    );
}
