//! `tessera bench` runs every workload with a few operations and reports the JSON fields,
//! with zero over-grants (structure and safety only: timings are never asserted). Each test
//! takes its store from the test kit's [`Harness`], which also says whether the store is a
//! server (whose round trips and CPU the bench measures).

use std::process::Command;

use tessera_testkit::harness::Harness;

const FIELDS: [&str; 15] = [
    "workload",
    "clients",
    "capacity",
    "ops",
    "ops_per_sec",
    "handoffs_per_sec",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "first_acquire_max_ms",
    "grants_per_client_min",
    "grants_per_client_max",
    "over_grants",
    "server_cpu_us_per_grant",
    "rtt_per_sec",
];

/// `tessera bench ARGS --json` on `store`: every JSON line it printed (it must succeed).
fn bench_json(store: &str, args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .env("TESSERA_STORE", store)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run tessera bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "tessera bench on {store} exited with {}: {stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn bench(store: &str) -> Vec<serde_json::Value> {
    bench_json(
        store,
        &[
            "--workload",
            "all",
            "--ops",
            "40",
            "--duration",
            "20s",
            "--rtt-time",
            "50ms",
        ],
    )
}

fn check(reports: &[serde_json::Value], rtt: bool) {
    let names: Vec<&str> = reports
        .iter()
        .map(|r| r["workload"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["w1", "w2", "w3"]);
    for (r, (clients, capacity)) in reports.iter().zip([(1, 10), (8, 1), (32, 4)]) {
        for f in FIELDS {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
        assert_eq!(r["clients"], clients, "{r}");
        assert_eq!(r["capacity"], capacity, "{r}");
        assert_eq!(r["ops"], 40, "{r}");
        assert_eq!(r["over_grants"], 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["first_acquire_max_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["max_holders_seen"].as_i64().unwrap() <= capacity, "{r}");
        assert_eq!(r["rtt_per_sec"].is_number(), rtt, "{r}");
        assert_eq!(r["server_cpu_us_per_grant"].is_number(), rtt, "{r}");
    }
    assert_eq!(
        reports[0]["handoffs_per_sec"], 0.0,
        "one client never hands off"
    );
    assert_eq!(reports[0]["rtt_limit_ratio"].is_number(), rtt);
}

/// Every workload on the harness's store; round trips and server CPU are measured exactly
/// when the store is a server.
fn bench_all(h: &Harness) -> Vec<serde_json::Value> {
    let reports = bench(h.url());
    check(&reports, h.traits().server);
    reports
}

#[test]
fn bench_runs_every_workload_on_memory() {
    bench_all(&Harness::memory());
}

#[test]
fn bench_runs_every_workload_on_redis_without_over_grants() {
    let reports = bench_all(&Harness::redis());
    for r in &reports[1..] {
        assert_eq!(r["over_grant_check"], "redis-counter", "{r}");
    }
}

#[test]
fn bench_runs_on_sqlite() {
    bench_all(&Harness::sqlite());
}

/// `tessera bench` on a SQL store, one workload, briefly, with the server's baselines on:
/// every JSON line it printed.
fn bench_sql(store: &str, workload: &str, baseline_flag: &str) -> Vec<serde_json::Value> {
    bench_json(
        store,
        &[
            "--workload",
            workload,
            "--ops",
            "40",
            "--duration",
            "20s",
            baseline_flag,
            "500ms",
            "--baseline-poll",
            "1ms",
        ],
    )
}

/// A hand-written polling design's figures: it granted, never over-granted, its clients,
/// capacity and poll are the ones named, and its wait and poll figures are reported.
fn check_polling(f: &serde_json::Value, design: &str, clients: u64, capacity: u64) {
    assert_eq!(f["design"], design, "{f}");
    assert_eq!(f["clients"], clients, "{f}");
    assert_eq!(f["capacity"], capacity, "{f}");
    assert_eq!(f["poll_ms"], 1.0, "{f}");
    assert_eq!(f["over_grants"], 0, "{f}");
    assert!(f["grants_per_sec"].as_f64().unwrap() > 0.0, "{f}");
    for field in [
        "wait_p50_ms",
        "wait_p99_ms",
        "wait_max_ms",
        "empty_polls_per_grant",
    ] {
        assert!(f[field].is_number(), "{field} missing in {f}");
    }
}

#[test]
fn bench_on_postgres_measures_a_skip_locked_semaphore_in_the_same_run() {
    let h = Harness::postgres();
    let lines = bench_sql(h.url(), "w3", "--pg-baseline");
    assert_eq!(lines[0]["workload"], "w3", "{lines:?}");
    assert_eq!(lines[0]["over_grants"], 0, "{lines:?}");
    let b = &lines[1];
    assert_eq!(b["workload"], "postgres-baseline", "{b}");
    assert!(b["insert_commits_per_sec"].as_f64().unwrap() > 0.0, "{b}");
    check_polling(&b["skip_locked"], "SKIP LOCKED semaphore", 32, 4);
    // Its tables are dropped afterwards.
    let left = h
        .postgres_server()
        .unwrap()
        .psql("SELECT count(*) FROM pg_tables WHERE tablename LIKE 'tessera_bench%'");
    assert_eq!(left.trim(), "0");
}

#[test]
fn bench_on_mariadb_measures_a_lock_table_in_the_same_run() {
    let h = Harness::mariadb();
    let lines = bench_sql(h.url(), "w2", "--baseline-time");
    assert_eq!(lines[0]["workload"], "w2", "{lines:?}");
    assert_eq!(lines[0]["over_grants"], 0, "{lines:?}");
    let b = &lines[1]["baselines"];
    assert!(b["insert_commit_per_sec"].as_f64().unwrap() > 0.0, "{b}");
    check_polling(&b["lock_table"], "lock table", 8, 1);
}

const RATE_FIELDS: [&str; 16] = [
    "workload",
    "clients",
    "limits",
    "mode",
    "duration_s",
    "decisions",
    "decisions_per_sec",
    "admitted",
    "admitted_per_sec",
    "limit_per_sec",
    "admitted_ratio",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "window_violations",
    "errors",
];

/// `tessera bench --workload rate` in both modes, briefly, on `store`.
fn bench_rate(store: &str) {
    for mode in ["decisions", "reserve"] {
        let lines = bench_json(
            store,
            &[
                "--workload",
                "rate",
                "--rate-mode",
                mode,
                "--rates",
                "20/s",
                "--clients",
                "4",
                "--rate-run",
                "1s",
                "--duration",
                "5s",
            ],
        );
        assert_eq!(lines.len(), 1, "{lines:?}");
        let r = &lines[0];
        for f in RATE_FIELDS {
            assert!(r.get(f).is_some(), "{f} missing in {r}");
        }
        assert_eq!(r["workload"], "rate", "{r}");
        assert_eq!(r["mode"], mode, "{r}");
        assert_eq!(r["clients"], 4, "{r}");
        assert_eq!(r["limits"], serde_json::json!(["20/s"]), "{r}");
        assert_eq!(r["duration_s"], 1.0, "{r}");
        assert_eq!(r["limit_per_sec"], 20.0, "{r}");
        assert_eq!(r["max_allowed"], 20, "{r}");
        assert_eq!(r["window_violations"], 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        let admitted = r["admitted"].as_u64().unwrap();
        assert!((1..=20).contains(&admitted), "{r}");
        assert!(r["decisions"].as_u64().unwrap() >= admitted, "{r}");
    }
}

#[test]
fn bench_rate_on_memory() {
    bench_rate(Harness::memory().url());
}

#[test]
fn bench_rate_on_sqlite() {
    bench_rate(Harness::sqlite().url());
}

#[test]
fn bench_rate_on_redis_without_window_violations() {
    bench_rate(Harness::redis().url());
}

/// The many workload on a 3-primary cluster: every name gets its grants, no over-grant, and
/// the CPU of each primary is reported.
#[test]
fn bench_many_spreads_over_a_cluster_without_over_grants() {
    let h = Harness::redis_cluster(false);
    let lines = bench_json(
        h.url(),
        &[
            "--workload",
            "many",
            "--names",
            "8",
            "--clients",
            "2",
            "--ops",
            "200",
            "--duration",
            "30s",
        ],
    );
    assert_eq!(lines.len(), 1, "{lines:?}");
    let r = &lines[0];
    assert_eq!(r["workload"], "manyx8", "{r}");
    assert_eq!(r["clients"], 16, "{r}");
    assert_eq!(r["over_grants"], 0, "{r}");
    assert_eq!(r["ops"], 200, "{r}");
    assert!(r["grants_per_client_min"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(
        r["node_cpu_us_per_grant"].as_array().unwrap().len(),
        3,
        "{r}"
    );
}

/// `tessera bench --workload admission`, briefly, on a store with admission: both ways
/// report, neither sees a window violation or more holders than the capacity, and only the
/// separate way holds permits idle while it waits for a turn.
fn bench_admission(store: &str) {
    let lines = bench_json(
        store,
        &[
            "--workload",
            "admission",
            "--rates",
            "20/s",
            "--clients",
            "6",
            "--capacity",
            "2",
            "--hold",
            "20ms",
            "--rate-run",
            "1s",
        ],
    );
    let ways: Vec<&str> = lines.iter().map(|r| r["way"].as_str().unwrap()).collect();
    assert_eq!(ways, ["admission", "separate"], "{lines:?}");
    for r in &lines {
        assert_eq!(r["workload"], "admission", "{r}");
        assert_eq!(r["window_violations"], 0, "{r}");
        assert_eq!(r["errors"], 0, "{r}");
        assert!(r["most_at_once"].as_u64().unwrap() <= 2, "{r}");
        let admitted = r["admitted"].as_u64().unwrap();
        assert!((1..=20).contains(&admitted), "{r}");
        assert_eq!(r["max_allowed"], 20, "{r}");
    }
    assert_eq!(lines[0]["idle_permit_ms_per_call"], 0.0, "{}", lines[0]);
}

#[test]
fn bench_admission_on_memory() {
    bench_admission(Harness::memory().url());
}

#[test]
fn bench_admission_on_sqlite() {
    bench_admission(Harness::sqlite().url());
}

#[test]
fn bench_admission_on_redis() {
    bench_admission(Harness::redis().url());
}

#[test]
fn bench_admission_on_mariadb() {
    bench_admission(Harness::mariadb().url());
}

#[test]
fn bench_admission_on_postgres() {
    bench_admission(Harness::postgres().url());
}

/// `--workload depth`: the shallow and the deep queue on one lock, every grant made, none
/// over-granted, and the ratio of their hand-off costs.
#[test]
fn bench_depth_compares_a_deep_queue_with_a_shallow_one() {
    let lines = bench_json(
        "memory://",
        &["--workload", "depth", "--clients", "60", "--ops", "240"],
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    for (r, clients) in lines[..2].iter().zip([10, 60]) {
        assert_eq!(r["workload"], "depth", "{r}");
        assert_eq!(r["clients"], clients, "{r}");
        assert_eq!(r["ops"], 240, "{r}");
        assert_eq!(r["over_grants"], 0, "{r}");
        assert!(r["handoffs_per_sec"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        lines[2]["handoff_cost_ratio"].as_f64().unwrap() > 0.0,
        "{:?}",
        lines[2]
    );
}
