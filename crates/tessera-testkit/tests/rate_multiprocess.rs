//! Worker processes share one rate limiter on SQLite and on Redis; the checker proves from
//! their merged logs that no limit was exceeded in any window (see
//! `tessera_testkit::ratelog`).
//!
//! By default each test runs the short profile: 8 processes for 3 s on `20/s AND 60/3s`.
//! The long profile of the issue — 8 processes for 30 s on `50/s AND 1000/min` — runs with
//!
//! ```text
//! TESSERA_RATE_LONG=1 cargo nextest run -p tessera-testkit --test rate_multiprocess --no-capture
//! ```

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use tessera::RateSpec;
use tessera_testkit::ratelog::{check, read_logs, RateReport};

const WORKER: &str = env!("CARGO_BIN_EXE_tessera-rate-worker");

struct Profile {
    processes: usize,
    run_ms: u64,
    rates: Vec<RateSpec>,
}

fn profile() -> Profile {
    let long = std::env::var("TESSERA_RATE_LONG").is_ok_and(|v| v == "1");
    let (run_ms, rates) = match long {
        true => (30_000, ["50/s", "1000/min"]),
        false => (3_000, ["20/s", "60/3s"]),
    };
    Profile {
        processes: 8,
        run_ms,
        rates: rates.iter().map(|r| r.parse().unwrap()).collect(),
    }
}

fn spawn(store: &str, p: &Profile, dir: &Path, i: usize) -> Child {
    let mut cmd = Command::new(WORKER);
    cmd.args(["--store", store, "--name", "shared-rate"])
        .args(["--run-ms", &p.run_ms.to_string()])
        .args(["--max-cost", &(1 + i % 3).to_string()])
        .args([
            "--try-ratio",
            if i.is_multiple_of(2) { "0.8" } else { "0.2" },
        ])
        .args(["--seed", &i.to_string()])
        .arg("--log")
        .arg(dir.join(format!("w{i}.jsonl")));
    for r in &p.rates {
        cmd.args(["--rate", &r.to_string()]);
    }
    cmd.spawn().expect("starting tessera-rate-worker")
}

fn run(store: &str) -> RateReport {
    let p = profile();
    let dir = tempfile::tempdir().unwrap();
    let children: Vec<Child> = (0..p.processes)
        .map(|i| spawn(store, &p, dir.path(), i))
        .collect();
    for mut c in children {
        let status = c.wait().unwrap();
        assert!(status.success(), "rate worker failed: {status}");
    }
    let events = read_logs(dir.path()).unwrap();
    let report = check(&events, &p.rates, Duration::from_millis(2));
    eprintln!("{report}");
    report.assert_ok();
    // Demand is far above the limits: the longest limit's window fills (liveness), and no
    // more than the limits allow over the run.
    let longest = p.rates.iter().max_by_key(|r| r.period()).unwrap();
    let full = report
        .limits
        .iter()
        .find(|l| l.limit == *longest)
        .unwrap()
        .max_store_window;
    // (Half full is the bar: on a loaded machine the processes start staggered.)
    assert!(
        full * 2 >= longest.count() as u64,
        "the {longest} window never came near full: {report}"
    );
    report
}

#[test]
fn sqlite_processes_sharing_a_limiter_never_exceed_any_window() {
    let dir = tempfile::tempdir().unwrap();
    run(&format!("sqlite://{}/rate.db", dir.path().display()));
}

#[test]
fn redis_processes_sharing_a_limiter_never_exceed_any_window() {
    let server = tessera_testkit::servers::redis::RedisServer::start();
    run(&server.url());
}
