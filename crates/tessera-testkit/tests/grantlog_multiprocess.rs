//! The grant-log reliability check end to end: workers (processes, or tasks of this process)
//! write grant logs, the checker proves C1, C2 and the seat properties from them.
//!
//! Positive runs must pass; the runs on a deliberately broken store (and on stores that do
//! not share state) must be caught, which shows the machinery can fail.

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tessera::backend::stores::MemoryBackend;
use tessera::backend::{
    AcquireReply, AcquireRequest, Backend, CancelReply, Capabilities, Name, RenewReply, WaitReply,
};
use tessera::{LeaseId, SemaphoreStatus, Store};
use tessera_testkit::grantlog::{check, read_logs, Report, Violation};
use tessera_testkit::worker::{run_worker_on, WorkerArgs};

const WORKER: &str = env!("CARGO_BIN_EXE_tessera-worker");

/// Worker arguments with the defaults of these tests.
fn args(store: &str, name: &str, permits: u32, log: &Path, worker: usize) -> WorkerArgs {
    WorkerArgs {
        store: store.to_string(),
        name: name.to_string(),
        permits,
        ops: 30,
        max_weight: 1,
        hold_ms_max: 10,
        ttl_ms: 300,
        log: log.join(format!("w{worker}.jsonl")),
        worker: format!("w{worker}"),
        seed: Some(worker as u64),
        try_ratio: 0.2,
        timeout_ratio: 0.2,
        timeout_ms: 10,
        ..WorkerArgs::new(store, name, permits, log.join("unused"), "unused")
    }
}

/// Starts a `tessera-worker` process.
fn spawn(a: &WorkerArgs) -> Child {
    Command::new(WORKER)
        .args(["--store", &a.store, "--name", &a.name])
        .args(["--permits", &a.permits.to_string()])
        .args(["--ops", &a.ops.to_string()])
        .args(["--max-weight", &a.max_weight.to_string()])
        .args(["--hold-ms-max", &a.hold_ms_max.to_string()])
        .args(["--ttl-ms", &a.ttl_ms.to_string()])
        .args(["--timeout-ms", &a.timeout_ms.to_string()])
        .args(["--try-ratio", &a.try_ratio.to_string()])
        .args(["--timeout-ratio", &a.timeout_ratio.to_string()])
        .arg("--log")
        .arg(&a.log)
        .args(["--worker", &a.worker])
        .args(["--seed", &a.seed.unwrap_or(0).to_string()])
        .spawn()
        .expect("starting tessera-worker")
}

/// Runs worker processes to the end and checks their merged logs.
fn run_processes(workers: &[WorkerArgs], dir: &Path) -> Report {
    let children: Vec<Child> = workers.iter().map(spawn).collect();
    for (mut child, a) in children.into_iter().zip(workers) {
        let status = child.wait().unwrap();
        assert!(status.success(), "worker {} failed: {status}", a.worker);
    }
    let report = check(&read_logs(dir).unwrap(), &HashMap::new());
    eprintln!("{report}");
    report
}

/// Runs workers as tasks of this process on one store and checks their merged logs.
async fn run_tasks(store: &Store, workers: Vec<WorkerArgs>, dir: &Path) -> Report {
    let tasks: Vec<_> = workers
        .into_iter()
        .map(|a| {
            let store = store.clone();
            tokio::spawn(async move { run_worker_on(&store, &a).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let report = check(&read_logs(dir).unwrap(), &HashMap::new());
    eprintln!("{report}");
    report
}

fn over_capacity(report: &Report) -> usize {
    report
        .violations
        .iter()
        .filter(|v| matches!(v, Violation::OverCapacity { .. }))
        .count()
}

#[test]
fn sqlite_workers_in_six_processes_never_over_grant() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite://{}/t.db", dir.path().display());
    six_processes_never_over_grant(&store, dir.path());
}

#[test]
fn redis_workers_in_six_processes_never_over_grant() {
    let server = tessera_testkit::servers::redis::RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    six_processes_never_over_grant(&server.url(), dir.path());
}

#[test]
fn postgres_workers_in_six_processes_never_over_grant() {
    let server = tessera_testkit::servers::postgres::PostgresServer::start();
    let dir = tempfile::tempdir().unwrap();
    six_processes_never_over_grant(&server.url_with_schema("grantlog"), dir.path());
}

#[test]
fn mariadb_workers_in_six_processes_never_over_grant() {
    let server = tessera_testkit::servers::mysql::MariaDbServer::start();
    let dir = tempfile::tempdir().unwrap();
    six_processes_never_over_grant(&server.url("t"), dir.path());
}

#[test]
fn etcd_workers_in_six_processes_never_over_grant() {
    let cluster = tessera_testkit::servers::etcd::EtcdCluster::start(1);
    let dir = tempfile::tempdir().unwrap();
    // etcd leases are whole seconds, at least 2 s.
    let workers: Vec<WorkerArgs> = (0..6)
        .map(|i| WorkerArgs {
            max_weight: 2,
            ttl_ms: 2_000,
            ..args(&cluster.url(), "grantlog", 3, dir.path(), i)
        })
        .collect();
    let report = run_processes(&workers, dir.path());
    report.assert_ok();
    assert!(report.stats.grants >= 60, "{report}");
    assert_eq!(report.stats.errors, 0, "{report}");
}

fn six_processes_never_over_grant(store: &str, dir: &std::path::Path) {
    let workers: Vec<WorkerArgs> = (0..6)
        .map(|i| WorkerArgs {
            max_weight: 2,
            ..args(store, "grantlog", 3, dir, i)
        })
        .collect();
    let report = run_processes(&workers, dir);
    report.assert_ok();
    assert!(report.stats.grants >= 60, "{report}");
    assert_eq!(report.stats.errors, 0, "{report}");
}

#[test]
fn one_worker_process_on_memory_writes_a_log_that_passes() {
    let dir = tempfile::tempdir().unwrap();
    let report = run_processes(&[args("memory://", "solo", 2, dir.path(), 0)], dir.path());
    report.assert_ok();
    let s = &report.stats;
    assert_eq!(s.acquires, 30, "{report}");
    // Alone on the semaphore, every acquire is granted.
    assert_eq!(
        (s.grants, s.releases, s.errors, s.losses),
        (30, 30, 0, 0),
        "{report}"
    );
    assert_eq!(s.max_concurrent_weight["solo"], 1);
}

#[test]
fn processes_that_do_not_share_a_store_are_caught_over_granting() {
    // Each process has its own `memory://`, so each grants the only permit: the merged logs
    // must show it held by several processes at once. This proves logs of many processes
    // merge onto one clock.
    let dir = tempfile::tempdir().unwrap();
    let workers: Vec<WorkerArgs> = (0..3)
        .map(|i| WorkerArgs {
            hold_ms_max: 20,
            try_ratio: 0.0,
            timeout_ratio: 0.0,
            ..args("memory://", "unshared", 1, dir.path(), i)
        })
        .collect();
    let report = run_processes(&workers, dir.path());
    assert!(over_capacity(&report) > 0, "{report}");
    assert!(report
        .violations
        .iter()
        .any(|v| v.to_string().contains("C1 over-grant")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_sharing_a_memory_store_never_over_grant() {
    let dir = tempfile::tempdir().unwrap();
    let url = "memory://grantlog-shared";
    let store = Store::connect(url).await.unwrap();
    let workers = (0..6)
        .map(|i| WorkerArgs {
            ops: 15,
            max_weight: 2,
            // Some holds outlast the keep-alive interval (TTL/3), so renewals are logged.
            hold_ms_max: 150,
            ..args(url, "shared", 3, dir.path(), i)
        })
        .collect();
    let report = run_tasks(&store, workers, dir.path()).await;
    report.assert_ok();
    let s = &report.stats;
    assert_eq!(s.acquires, 90, "{report}");
    assert!(s.grants > 0 && s.renewals > 0, "{report}");
    assert_eq!((s.errors, s.losses), (0, 0), "{report}");
    assert!(s.max_concurrent_weight["shared"] <= 3, "{report}");
}

/// A store that over-grants by one: it forwards everything to a memory store, but always
/// declares one permit more than the client asked for.
#[derive(Debug)]
struct OverGranting(MemoryBackend);

#[async_trait]
impl Backend for OverGranting {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> tessera::Result<AcquireReply> {
        self.0.acquire(name, capacity + 1, req).await
    }
    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> tessera::Result<WaitReply> {
        self.0.heartbeat(name, lease, waiter_ttl).await
    }
    async fn cancel(&self, name: &Name, lease: LeaseId) -> tessera::Result<CancelReply> {
        self.0.cancel(name, lease).await
    }
    async fn release(&self, name: &Name, lease: LeaseId) -> tessera::Result<bool> {
        self.0.release(name, lease).await
    }
    async fn renew(
        &self,
        name: &Name,
        lease: LeaseId,
        ttl: Duration,
    ) -> tessera::Result<RenewReply> {
        self.0.renew(name, lease, ttl).await
    }
    async fn status(&self, name: &Name) -> tessera::Result<Option<SemaphoreStatus>> {
        self.0.status(name).await
    }
    async fn list(&self) -> tessera::Result<Vec<String>> {
        self.0.list().await
    }
    async fn resize(&self, name: &Name, capacity: u32) -> tessera::Result<u32> {
        self.0.resize(name, capacity + 1).await
    }
    async fn revoke(&self, name: &Name, lease: LeaseId) -> tessera::Result<bool> {
        self.0.revoke(name, lease).await
    }
    async fn delete(&self, name: &Name) -> tessera::Result<bool> {
        self.0.delete(name).await
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_over_granting_store_is_caught() {
    let dir = tempfile::tempdir().unwrap();
    let backend = OverGranting(MemoryBackend::connect("memory://grantlog-broken").unwrap());
    let store = Store::from_backend(Arc::new(backend), "broken://");
    let workers = (0..4)
        .map(|i| WorkerArgs {
            ops: 25,
            hold_ms_max: 20,
            try_ratio: 0.0,
            timeout_ratio: 0.0,
            ..args("broken://", "broken", 2, dir.path(), i)
        })
        .collect();
    let report = run_tasks(&store, workers, dir.path()).await;
    assert!(over_capacity(&report) > 0, "{report}");
    assert_eq!(report.stats.max_concurrent_weight["broken"], 3, "{report}");
    // The extra permit sits on seat 2, outside 0..2.
    assert!(
        report
            .violations
            .iter()
            .any(|v| matches!(v, Violation::SeatOutOfRange { seat: 2, .. })),
        "{report}"
    );
}
