//! One scenario in progress ([`Run`]): starts the workers, logs the faults, waits for the
//! store to drain and checks the logs.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use tessera::Store;

use super::{fenced, report, sibling_binary, Params, ScenarioReport};
use crate::grantlog::{EventKind, EventLog, FaultPhase};
use crate::harness::Harness;
use crate::worker::WorkerArgs;

/// A worker process.
struct WorkerProc {
    id: String,
    child: Child,
}

/// One scenario in progress: the store, the fenced resource, the workers and the fault log.
pub struct Run {
    /// The profile's parameters.
    pub params: Params,
    /// The scenario's name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// The store.
    pub env: Harness,
    /// The URL workers use (through a proxy, for the network scenarios).
    pub worker_url: String,
    /// The semaphore's name.
    pub name: String,
    /// The fenced resource.
    pub fenced: fenced::FencedResource,
    /// The runner's own client of the store (straight, never through the proxy).
    pub store: Store,
    logs: tempfile::TempDir,
    faults: EventLog,
    workers: Vec<WorkerProc>,
    spawned: usize,
    pub(super) started: tokio::time::Instant,
    /// How long workers run.
    pub duration: Duration,
    /// Notes for the report.
    pub notes: Vec<String>,
    /// Violations found by the scenario itself.
    pub violations: Vec<String>,
    /// Figures the scenario measured itself (e.g. reclaim times), in ms.
    pub reclaim_ms: Vec<u64>,
    /// Environment variables of the worker processes.
    pub worker_env: Vec<(String, String)>,
}

impl Run {
    /// Prepares a scenario whose workers run for `duration`.
    pub async fn new(
        scenario: &str,
        params: &Params,
        seed: u64,
        env: Harness,
        worker_url: Option<String>,
        duration: Duration,
    ) -> anyhow::Result<Run> {
        let logs = tempfile::tempdir()?;
        let faults = EventLog::create(logs.path().join("runner.jsonl"))?;
        faults.log(EventKind::Capacity {
            sem: "chaos".into(),
            capacity: params.permits,
        })?;
        let store = Store::connect(env.url())
            .await
            .with_context(|| format!("connecting to {}", env.url()))?;
        if params.tenants {
            let ceiling = params.permits.saturating_sub(1).max(1);
            store
                .set_tenant_limits("chaos", "t0", tessera::TenantLimits::new(Some(ceiling), 0)?)
                .await
                .context("setting the tenant's ceiling")?;
            faults.log(EventKind::Capacity {
                sem: crate::grantlog::tenant_sem("chaos", "t0"),
                capacity: ceiling,
            })?;
        }
        Ok(Run {
            params: params.clone(),
            scenario: scenario.to_string(),
            seed,
            worker_url: worker_url.unwrap_or_else(|| env.url().to_string()),
            env,
            name: "chaos".into(),
            fenced: fenced::FencedResource::start().await?,
            store,
            logs,
            faults,
            workers: Vec::new(),
            spawned: 0,
            started: tokio::time::Instant::now(),
            duration,
            notes: Vec::new(),
            violations: Vec::new(),
            reclaim_ms: Vec::new(),
            worker_env: Vec::new(),
        })
    }

    /// The directory of the grant logs.
    pub fn log_dir(&self) -> &std::path::Path {
        self.logs.path()
    }

    /// Time left until the workers stop.
    pub fn remaining(&self) -> Duration {
        self.duration.saturating_sub(self.started.elapsed())
    }

    /// The worker arguments of this run for worker `id`.
    pub fn worker_args(&self, id: &str) -> WorkerArgs {
        let ttl_ms = self.params.ttl.as_millis() as u64;
        WorkerArgs {
            ops: 1_000_000,
            hold_ms_max: ttl_ms / 2,
            ttl_ms,
            seed: Some(self.seed * 1000 + self.spawned as u64),
            try_ratio: 0.15,
            timeout_ratio: 0.85,
            timeout_ms: 20,
            timeout_ms_max: Some(2 * ttl_ms),
            duration_ms: Some(self.remaining().as_millis() as u64),
            fenced: Some(self.fenced.addr()),
            write_every_ms: 20,
            waiter_ttl_ms: Some(self.params.waiter_ttl.as_millis() as u64),
            tenant: self
                .params
                .tenants
                .then(|| format!("t{}", self.spawned % 3)),
            share: if self.params.tenants {
                self.spawned as u32 % 3 + 1
            } else {
                1
            },
            ..WorkerArgs::new(
                &self.worker_url,
                &self.name,
                self.params.permits,
                self.logs.path().join(format!("{id}.jsonl")),
                id,
            )
        }
    }

    /// Starts the K workers; the run's clock starts now.
    pub fn start_workers(&mut self) -> anyhow::Result<()> {
        self.started = tokio::time::Instant::now();
        for _ in 0..self.params.workers {
            self.spawn_worker()?;
        }
        Ok(())
    }

    /// Starts one more worker for the rest of the run.
    pub fn spawn_worker(&mut self) -> anyhow::Result<()> {
        let id = format!("w{}", self.spawned);
        let args = self.worker_args(&id);
        self.spawned += 1;
        // Its stderr is kept, so a worker that fails by itself says why (see `finish`).
        let stderr = std::fs::File::create(self.logs.path().join(format!("{id}.stderr")))
            .context("creating a worker's stderr file")?;
        let child = Command::new(sibling_binary("tessera-worker")?)
            .args(args.to_args())
            .envs(self.worker_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("starting tessera-worker")?;
        self.workers.push(WorkerProc { id, child });
        Ok(())
    }

    /// Logs a fault.
    pub fn fault(&self, action: &str, phase: FaultPhase, worker: Option<&str>) {
        let _ = self.faults.log(EventKind::Fault {
            action: action.to_string(),
            phase,
            worker: worker.map(str::to_string),
        });
    }

    /// The workers that currently hold a permit, by the store's word: (index, id, lease).
    pub async fn holders(&mut self) -> Vec<(usize, String, tessera::LeaseId)> {
        let Ok(Some(status)) = self.store.status(&self.name).await else {
            return vec![];
        };
        let mut out = vec![];
        for lease in status.holders {
            let Some((id, pid)) = lease.holder.split_once('/') else {
                continue;
            };
            let Ok(pid) = pid.parse::<u32>() else {
                continue;
            };
            if let Some(i) = self
                .workers
                .iter_mut()
                .position(|w| w.id == id && w.child.id() == pid)
            {
                if matches!(self.workers[i].child.try_wait(), Ok(None)) {
                    out.push((i, id.to_string(), lease.lease_id));
                }
            }
        }
        out
    }

    /// A current holder, chosen by the seed: one the store shows holding the same lease
    /// twice 30 ms apart, so that it is holding rather than still receiving its grant. Waits
    /// (up to about two seconds) for one.
    pub async fn pick_holder(&mut self, round: u32) -> Option<(usize, String, tessera::LeaseId)> {
        for _ in 0..50 {
            let before = self.holders().await;
            tokio::time::sleep(Duration::from_millis(30)).await;
            let mut h = self.holders().await;
            h.retain(|x| before.contains(x));
            if !h.is_empty() {
                let k = (self.seed as usize + round as usize) % h.len();
                return Some(h[k].clone());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Sends `signal` to worker `i`.
    pub fn signal(&mut self, i: usize, signal: libc::c_int) {
        let pid = self.workers[i].child.id() as libc::pid_t;
        // SAFETY: kill(2) with a pid of a child we started and have not reaped yet.
        unsafe {
            libc::kill(pid, signal);
        }
    }

    /// Whether worker `i` holds an exclusive `flock`: on SQLite, the write gate, which a
    /// process holds only inside a write transaction.
    pub fn holds_an_exclusive_flock(&self, i: usize) -> bool {
        holds_an_exclusive_flock(self.workers[i].child.id())
    }

    /// SIGKILLs worker `i` and reaps it.
    pub fn kill(&mut self, i: usize) {
        let _ = self.workers[i].child.kill();
        let _ = self.workers[i].child.wait();
    }

    /// Indices of the workers still running.
    pub fn live_workers(&mut self) -> Vec<usize> {
        (0..self.workers.len())
            .filter(|&i| matches!(self.workers[i].child.try_wait(), Ok(None)))
            .collect()
    }

    /// Sleeps until the workers' time is up.
    pub async fn run_out(&self) {
        tokio::time::sleep(self.remaining()).await;
    }

    /// Waits for the workers to stop (killing stragglers), waits for the store to drain,
    /// and checks everything.
    pub async fn finish(mut self) -> anyhow::Result<ScenarioReport> {
        // Workers stop by themselves at the end of their duration, after at most one acquire
        // timeout (2 TTL) and one hold; give them that and a margin.
        let grace = self.params.ttl * 4 + Duration::from_secs(5);
        let deadline = tokio::time::Instant::now() + self.remaining() + grace;
        let mut stragglers = vec![];
        for i in 0..self.workers.len() {
            // A stopped worker never finishes: make sure none stays stopped.
            self.signal(i, libc::SIGCONT);
        }
        for i in 0..self.workers.len() {
            loop {
                match self.workers[i].child.try_wait() {
                    Ok(Some(status)) => {
                        // Killed workers end by a signal; a worker that failed by itself is
                        // worth a look.
                        if status.code().is_some_and(|c| c != 0) {
                            let id = &self.workers[i].id;
                            let err = std::fs::read_to_string(
                                self.logs.path().join(format!("{id}.stderr")),
                            )
                            .unwrap_or_default();
                            self.violations.push(format!(
                                "worker {id} exited with {status}: {}",
                                why_it_failed(&err)
                            ));
                        }
                        break;
                    }
                    Ok(None) if tokio::time::Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    _ => {
                        stragglers.push(self.workers[i].id.clone());
                        self.kill(i);
                        break;
                    }
                }
            }
        }
        if !stragglers.is_empty() {
            self.violations.push(format!(
                "workers {stragglers:?} did not stop within {grace:?} of the end and were killed"
            ));
        }
        let leaked = self.drain().await;
        report::analyse(self, leaked)
    }

    /// Waits until the store holds no permit and nobody queues (killed holders' leases
    /// expire within the TTL, dead waiters leave within the waiter TTL); returns the permits
    /// still held after that.
    async fn drain(&mut self) -> u32 {
        let limit = self.params.ttl * 2 + self.params.waiter_ttl + Duration::from_secs(2);
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            match self.store.status(&self.name).await {
                Ok(None) => return 0,
                Ok(Some(s)) if s.used == 0 && s.queue.is_empty() => return 0,
                Ok(Some(s)) if tokio::time::Instant::now() > deadline => {
                    self.violations.push(format!(
                        "leak: {limit:?} after the end, {} permits still held by {:?} and {} waiters queued",
                        s.used,
                        s.holders.iter().map(|h| &h.holder).collect::<Vec<_>>(),
                        s.queue.len()
                    ));
                    return s.used.max(1);
                }
                Err(e) if tokio::time::Instant::now() > deadline => {
                    self.violations
                        .push(format!("the store did not answer after the run: {e}"));
                    return 0;
                }
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        for w in &mut self.workers {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    }
}

/// What a worker's stderr says about its failure: the panic's location and message, or the
/// error it returned (a backtrace after either would bury them), else its last lines.
fn why_it_failed(stderr: &str) -> String {
    let lines: Vec<&str> = stderr.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.contains("panicked at") || l.starts_with("Error: "));
    let picked: Vec<&str> = match first {
        Some(i) => lines[i..]
            .iter()
            .filter(|l| !l.trim().is_empty())
            .take(3)
            .copied()
            .collect(),
        None => lines[lines.len().saturating_sub(5)..].to_vec(),
    };
    picked.join(" | ")
}

/// Whether process `pid` holds an exclusive `flock`, by `/proc/locks`.
pub fn holds_an_exclusive_flock(pid: u32) -> bool {
    let Ok(locks) = std::fs::read_to_string("/proc/locks") else {
        return false;
    };
    let pid = pid.to_string();
    // "1: FLOCK  ADVISORY  WRITE 12345 fd:01:131 0 EOF"; a blocked request reads "1: -> FLOCK …".
    locks.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 4 && f[1] == "FLOCK" && f[3] == "WRITE" && f[4] == pid
    })
}

#[cfg(test)]
mod tests {
    use super::why_it_failed;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_panicking_worker_is_reported_by_its_panic_not_its_backtrace() {
        let err = "starting\nthread 'main' panicked at src/worker.rs:10:5:\nrelease: store error\nstack backtrace:\n   0: f\n   1: g\n   2: h\n   3: i\n   4: _start";
        assert_eq!(
            why_it_failed(err),
            "thread 'main' panicked at src/worker.rs:10:5: | release: store error | stack backtrace:"
        );
        let err = "Error: the fenced resource closed\n\nCaused by:\n    reset\n\nStack backtrace:\n   0: f";
        assert_eq!(
            why_it_failed(err),
            "Error: the fenced resource closed | Caused by: |     reset"
        );
        assert_eq!(why_it_failed("a\nb\nc\nd\ne\nf"), "b | c | d | e | f");
    }

    #[test]
    fn an_exclusive_flock_is_seen_while_held_and_not_after() {
        let file = tempfile::tempfile().unwrap();
        let me = std::process::id();
        assert!(!super::holds_an_exclusive_flock(me));
        // SAFETY: flock(2) on a file this test owns.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert!(super::holds_an_exclusive_flock(me));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) }, 0);
        assert!(!super::holds_an_exclusive_flock(me));
    }
}
