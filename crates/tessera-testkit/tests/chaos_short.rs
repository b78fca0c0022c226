//! The chaos runner's short profile, as part of the test suite: every scenario on SQLite and
//! on a throwaway Redis must end with zero violations. (The long profile is run by hand:
//! `tessera-chaos --store redis --profile long`, see docs/reliability.md.)
//!
//! A missing `redis-server` fails the Redis tests with the install line, a missing
//! libfaketime (the SQLite clock-jump scenario) with `apt-get install -y faketime`.

use tessera_testkit::chaos::{self, Profile, RunConfig, ScenarioReport, StoreSpec};

const CHAOS: &str = env!("CARGO_BIN_EXE_tessera-chaos");

async fn short(store: StoreSpec, scenarios: &[&str]) -> Vec<ScenarioReport> {
    run(store, scenarios, false).await
}

/// The scenarios with the workers as three tenants (shares 1, 2, 3; `t0` at a ceiling of
/// one permit fewer than the capacity, checked in the grant logs like a capacity).
async fn with_tenants(store: StoreSpec, scenarios: &[&str]) -> Vec<ScenarioReport> {
    run(store, scenarios, true).await
}

async fn run(store: StoreSpec, scenarios: &[&str], tenants: bool) -> Vec<ScenarioReport> {
    let cfg = RunConfig {
        store,
        profile: Profile::Short,
        scenarios: scenarios.iter().map(|s| s.to_string()).collect(),
        seed: None,
        tenants,
    };
    let reports = chaos::run(&cfg).await.expect("the chaos runner failed");
    for r in &reports {
        eprintln!("{}", r.summary());
    }
    let broken: Vec<String> = reports
        .iter()
        .filter(|r| !r.violations.is_empty())
        .map(ScenarioReport::summary)
        .collect();
    assert!(broken.is_empty(), "{}", broken.join("\n"));
    reports
}

fn get<'a>(reports: &'a [ScenarioReport], name: &str) -> &'a ScenarioReport {
    reports
        .iter()
        .find(|r| r.scenario == name)
        .unwrap_or_else(|| panic!("no report for {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_survives_every_scenario_of_the_short_profile() {
    let reports = short(StoreSpec::Sqlite(None), &[]).await;
    for name in [
        "baseline",
        "s1-kill",
        "s2-stop",
        "s4-restart",
        "s10-reclaim",
    ] {
        assert!(get(&reports, name).skipped.is_none(), "{name} skipped");
    }
    assert!(get(&reports, "s1-kill").faults > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_survives_holder_faults_and_a_faulty_network() {
    let reports = short(
        StoreSpec::Redis(None),
        &["baseline", "s1-kill", "s2-stop", "s3-proxy"],
    )
    .await;
    let s3 = get(&reports, "s3-proxy");
    assert!(s3.faults >= 5 && s3.grants > 0, "{}", s3.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_survives_restarts_client_kills_and_reclaims_abandoned_permits() {
    let reports = short(
        StoreSpec::Redis(None),
        &[
            "s4-restart",
            "s4-restart-aof",
            "s5-freeze",
            "s9-client-kill",
            "s10-reclaim",
            "s7-eviction",
            "garbage",
        ],
    )
    .await;
    // Without the eviction guard, eviction is shown to break the contract: the report must
    // say so (as expected findings), which proves the scenario bites.
    let s7 = get(&reports, "s7-eviction");
    assert!(!s7.expected.is_empty(), "{}", s7.summary());
    assert_eq!(get(&reports, "s4-restart-aof").over_grants, 0);
    assert!(get(&reports, "s5-freeze").skipped.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_shares_and_a_ceiling_survive_holder_faults_on_sqlite() {
    let reports = with_tenants(
        StoreSpec::Sqlite(None),
        &["baseline", "s1-kill", "s2-stop", "s10-reclaim"],
    )
    .await;
    assert!(get(&reports, "s1-kill").faults > 0);
    for name in ["baseline", "s1-kill", "s2-stop"] {
        assert!(get(&reports, name).grants > 0, "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_with_shares_and_a_ceiling_survive_faults_on_redis() {
    let reports = with_tenants(
        StoreSpec::Redis(None),
        &["baseline", "s1-kill", "s3-proxy", "s5-freeze"],
    )
    .await;
    let s3 = get(&reports, "s3-proxy");
    assert!(s3.faults >= 5 && s3.grants > 0, "{}", s3.summary());
}

#[test]
fn the_binary_prints_one_json_object_per_scenario_and_rejects_bad_arguments() {
    let out = std::process::Command::new(CHAOS)
        .args(["--store", "sqlite", "--scenario", "baseline", "--json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1, "{text}");
    let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
    for key in [
        "scenario",
        "store",
        "ops",
        "over_grants",
        "stale_accepts",
        "leaked_permits",
        "lost_notices",
        "max_reclaim_ms",
        "violations",
    ] {
        assert!(v.get(key).is_some(), "{key} missing in {v}");
    }
    assert_eq!(v["scenario"], "baseline");
    assert_eq!(v["violations"].as_array().unwrap().len(), 0);

    for bad in [
        &["--store", "postgres://x"][..],
        &["--store", "redis://10.0.0.1:6379"],
        &["--store", "sqlite", "--scenario", "nope"],
        &["--store", "sqlite", "--profile", "medium"],
        &["--store", "etcd", "--tenants"],
    ] {
        let out = std::process::Command::new(CHAOS)
            .args(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(!out.stderr.is_empty(), "{bad:?}");
    }
}

/// The scenarios both SQL servers (PostgreSQL, MariaDB) run: holder faults, a faulty
/// network, a stop and a durable restart, a freeze, client kills, reclaims and garbage.
const SQL_SERVER_SCENARIOS: &[&str] = &[
    "baseline",
    "s1-kill",
    "s2-stop",
    "s3-proxy",
    "s4-restart-aof",
    "s5-freeze",
    "s9-client-kill",
    "s10-reclaim",
    "garbage",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_survives_holder_faults_a_faulty_network_crashes_freezes_cuts_and_garbage() {
    let reports = short(StoreSpec::Postgres, SQL_SERVER_SCENARIOS).await;
    // s10-reclaim: 10,000 waiters queued at once by one process, whose heartbeats go to the
    // server gathered per semaphore, on connections apart from the enqueues.
    for name in [
        "baseline",
        "s1-kill",
        "s3-proxy",
        "s4-restart-aof",
        "s5-freeze",
        "s10-reclaim",
        "garbage",
    ] {
        assert!(get(&reports, name).skipped.is_none(), "{name} skipped");
    }
    assert!(get(&reports, "s1-kill").faults > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mariadb_survives_holder_faults_restarts_freezes_client_kills_and_garbage() {
    let reports = short(StoreSpec::Mariadb, SQL_SERVER_SCENARIOS).await;
    // A MariaDB restart keeps what was committed: the durable-restart scenario.
    for name in [
        "baseline",
        "s1-kill",
        "s3-proxy",
        "s4-restart-aof",
        "s5-freeze",
        "s9-client-kill",
        "garbage",
    ] {
        assert!(get(&reports, name).skipped.is_none(), "{name} skipped");
    }
    let s3 = get(&reports, "s3-proxy");
    assert!(s3.faults >= 5 && s3.grants > 0, "{}", s3.summary());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_survives_holder_faults() {
    // s4-restart-aof and s5-freeze (11-14 s each, with etcd's 2 s TTL) are not here; run them
    // with `tessera-chaos --store etcd --scenario s4-restart-aof,s5-freeze`.
    // s10-reclaim is not here: it passes on etcd, but one debug process queueing 10,000
    // waiters took 60-77 s on a shared 2-core machine (docs/reliability.md); killed and frozen
    // holders are covered by s1 and s2.
    let reports = short(StoreSpec::Etcd(None), &["baseline", "s1-kill", "s2-stop"]).await;
    for name in ["baseline", "s1-kill", "s2-stop"] {
        let r = get(&reports, name);
        assert!(r.skipped.is_none() && r.grants > 0, "{}", r.summary());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_survives_a_faulty_connection_to_the_member_it_talks_to() {
    // s3-proxy on etcd: three members, the workers' connections to the first delayed,
    // black-holed (shorter and longer than the TTL), reset and losing replies; they move
    // to the next member.
    let reports = short(StoreSpec::Etcd(None), &["s3-proxy"]).await;
    let s3 = get(&reports, "s3-proxy");
    assert!(
        s3.skipped.is_none() && s3.faults >= 5 && s3.grants > 0,
        "{}",
        s3.summary()
    );
}

/// The scenarios a Sentinel or Cluster topology runs (the one-server faults need a server
/// of the harness's own), plus the failovers of that topology.
fn failover_reports(reports: &[ScenarioReport], names: &[&str]) {
    for name in names {
        let r = get(reports, name);
        assert!(r.skipped.is_none(), "{name} skipped");
        assert_eq!(r.stale_accepts, 0, "{}", r.summary());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_with_wait_survives_failovers_without_over_grants() {
    let failovers = [
        "f1-sentinel-failover",
        "f2-sentinel-kill",
        "f3-sentinel-freeze",
    ];
    let mut names = vec!["baseline", "s1-kill", "s2-stop"];
    names.extend(failovers);
    let reports = short(StoreSpec::RedisSentinel { wait: 1 }, &names).await;
    failover_reports(&reports, &failovers);
    for name in failovers {
        let r = get(&reports, name);
        assert_eq!(r.over_grants, 0, "{}", r.summary());
        assert!(r.expected.is_empty(), "{}", r.summary());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_without_wait_forgets_at_most_right_after_a_failover() {
    let failovers = [
        "f1-sentinel-failover",
        "f2-sentinel-kill",
        "f3-sentinel-freeze",
    ];
    // Over-grants right after a failover are expected findings (asynchronous replication),
    // anything else is a violation; stale accepts stay 0.
    let reports = short(StoreSpec::RedisSentinel { wait: 0 }, &failovers).await;
    failover_reports(&reports, &failovers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_survives_holder_faults_and_a_killed_primary() {
    let reports = short(
        StoreSpec::RedisCluster,
        &[
            "baseline",
            "s1-kill",
            "s2-stop",
            "s10-reclaim",
            "f4-cluster-kill",
        ],
    )
    .await;
    failover_reports(&reports, &["f4-cluster-kill"]);
}
