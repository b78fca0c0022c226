//! `tessera bench`: the workloads of the performance targets against any store URL.
//!
//! - **W1**: 1 client, capacity 10, an acquire + release loop (ops = pairs);
//! - **W2**: 8 clients on a lock, hold ≈ 0 (ops = grants);
//! - **W3**: 32 clients, capacity 4 (ops = grants).
//! - **depth**: one lock with 10 clients, then with `--clients` (default 1,000), all on one
//!   store connection: the cost of a hand-off behind a deep queue against a shallow one
//!   (bounded work; not part of `all`).
//! - **many**: `--names` locks (default 64), `--clients` per name (default 4), all at once
//!   (ops = grants over all names); the clients of one name share one store connection. On
//!   Redis it reports the CPU per grant of every server named in the URL (each primary of a
//!   `redis+cluster://` URL): how the work spreads over shards. Not part of `all`.
//!
//! Every client opens its own [`tessera::Store::connect`] (its own connections). Each
//! workload stops after `--ops` operations or at `--duration`, whichever comes first; the
//! duration is a hard bound (clients still running a moment after it are aborted).
//!
//! Measured per workload: operations per second, acquire latency (p50, p99, max), hand-offs
//! per second (a grant to a different client than the previous grant; a client re-taking the
//! permit it just released is not a hand-off), grants per client (min, max), over-grants seen
//! by an independent check (on Redis, a counter key on the same server that each holder
//! increments on entry and decrements on exit; elsewhere an in-process counter), Redis CPU
//! per grant (`INFO cpu` before and after; W1's without the `PING` slices below, read with
//! `INFO cpu` around each; W2's and W3's with the check's two commands per grant), and, in
//! the same run, the round-trip limit: one
//! client's bare `PING`s per second on its own connection (null on other stores), with the
//! ratio of W1 pairs per second to half of it. With one client the pings run in slices
//! between its operations (their time is not counted as the workload's), so a machine whose
//! load changes during the run slows both alike.
//!
//! - **rate**: clients (default 8) on one rate limiter (`--rates`, default `50/s` and
//!   `1000/min`, exact mode), either deciding as fast as they can (`--rate-mode decisions`,
//!   `try_acquire(1)`) or reserving with demand above the limit (`--rate-mode reserve`,
//!   `acquire_within(1, …)`), over `--rate-run` (default 10 s): decisions and admissions per
//!   second, the admitted ratio against the most the limits allow (see [`rate`]), latency,
//!   and window violations seen by the client. Not part of `all` (which stays the three
//!   semaphore workloads of the performance targets); run it with `--workload rate`.
//! - **admission**: clients (default 8) that need a permit (`--capacity`, default 4) and a
//!   turn within `--rates` per call, with demand above the limits: one admission per call
//!   beside the permit-then-turn calls, each way for `--rate-run` (see [`admission`]): calls
//!   per second, the admitted ratio, the wait (p50, p99, max), the permit time spent idle
//!   waiting for a turn, the most holding at once, window violations. Not part of `all`.
//!
//! Beside each semaphore workload a thread of its own measures the process's pauses (how
//! much later than asked a 1 ms sleep wakes) and the hypervisor's steal time, and counts the
//! waits over 10 ms that those pauses cover at least half of (see [`pauses`]): a long wait
//! in a pause was the machine not running the benchmark, not the store.
//!
//! - on a `postgres://` store, after the semaphore workloads, the figures to compare with on
//!   the same server (`--pg-baseline`, see [`postgres`]): advisory lock pairs and hand-offs,
//!   one session's INSERT+COMMIT rate, and a hand-written `SKIP LOCKED` semaphore.
//! - on a `mysql://` (or `mariadb://`) store, the run ends with the server's own figures in the
//!   same run (`--baseline-time` each, see [`mysql`]): one client's durable INSERT+COMMIT
//!   rate, 8 clients' `GET_LOCK` hand-offs, and 8 clients on a hand-written lock table.
//!   The two hand-written designs poll every `--baseline-poll` (see [`polling`]).
//!
//! The module is self-contained: the CLI wires [`BenchArgs`] under `tessera bench` and calls
//! [`run`] with the store URL.

mod admission;
mod args;
mod clients;
mod etcd_mutex;
mod mysql;
mod pauses;
mod polling;
mod postgres;
mod rate;
mod report;
mod tenants;
mod workloads;

use anyhow::Context;

pub use args::{BenchArgs, Workload};
#[allow(unused_imports)]
pub use report::WorkloadReport;
pub use workloads::Spec;

/// Runs the selected workloads against `store_url` and prints the summary (table or JSON).
/// Exit code: 0 if every workload completed without over-grants or errors, 1 if any
/// over-grant (rate: window violation) was seen, 2 if a workload had errors or could not finish its operations within
/// `--duration`.
pub async fn run(store_url: &str, args: &BenchArgs) -> anyhow::Result<i32> {
    // Fail early, with the store's own typed error, on a bad URL or an unreachable store.
    tessera::Store::connect(store_url)
        .await
        .with_context(|| format!("cannot connect to {}", redact(store_url)))?;
    if args.workload == Workload::Rate {
        let spec = rate::RateSpecBench {
            clients: args.clients.unwrap_or(8).max(1),
            limits: args.rates.clone(),
            mode: args.rate_mode,
            run: args.rate_run,
            duration: args.duration,
        };
        let r = rate::run(store_url, &spec).await?;
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print!("{}", rate::table(&r));
        }
        return Ok(if r.window_violations > 0 {
            1
        } else if r.errors > 0 {
            2
        } else {
            0
        });
    }
    if args.workload == Workload::Admission {
        let spec = admission::AdmissionSpec {
            clients: args.clients.unwrap_or(8).max(1),
            capacity: args.capacity.unwrap_or(4).max(1),
            limits: args.rates.clone(),
            hold: args.hold,
            run: args.rate_run.min(args.duration),
        };
        let reports = admission::run(store_url, &spec).await?;
        if args.json {
            for r in &reports {
                println!("{}", serde_json::to_string(r)?);
            }
        } else {
            print!("{}", admission::table(&reports));
        }
        return Ok(
            if reports
                .iter()
                .any(|r| r.window_violations > 0 || r.most_at_once > r.capacity as usize)
            {
                1
            } else if reports.iter().any(|r| r.errors > 0) {
                2
            } else {
                0
            },
        );
    }
    if args.workload == Workload::Tenants {
        let spec = tenants::TenantsSpec {
            capacity: args.capacity.unwrap_or(4).max(1),
            hold: match args.hold.is_zero() {
                true => std::time::Duration::from_millis(20),
                false => args.hold,
            },
            limits: args.rates.clone(),
            run: args.rate_run.min(args.duration),
            flood: args.flood,
        };
        let reports = tenants::run(store_url, &spec).await?;
        if args.json {
            for r in &reports {
                println!("{}", serde_json::to_string(r)?);
            }
        } else {
            print!("{}", tenants::table(&reports));
        }
        return Ok(if reports.iter().any(|r| r.errors > 0) {
            2
        } else {
            0
        });
    }
    if args.workload == Workload::Depth {
        return depth(store_url, args).await;
    }
    if args.workload == Workload::EtcdMutex {
        let r = etcd_mutex::run(store_url, &Spec::new(Workload::W2, args)).await?;
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        } else {
            print!("{}", report::table(std::slice::from_ref(&r)));
        }
        return Ok(if r.over_grants > 0 {
            1
        } else if r.errors > 0 || !r.completed {
            2
        } else {
            0
        });
    }
    let workloads = match args.workload {
        Workload::All => vec![Workload::W1, Workload::W2, Workload::W3],
        w => vec![w],
    };
    let mut reports = Vec::new();
    for w in workloads {
        let spec = Spec::new(w, args);
        let r = if w == Workload::Many {
            workloads::run_many(store_url, &spec, args.names.max(1)).await?
        } else {
            workloads::run(store_url, &spec, args.rtt_time).await?
        };
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        reports.push(r);
    }
    if !args.json {
        print!("{}", report::table(&reports));
    }
    let is_pg = store_url.starts_with("postgres://") || store_url.starts_with("postgresql://");
    if is_pg && !args.pg_baseline.is_zero() {
        let b = postgres::run(
            store_url,
            &redact(store_url),
            args.pg_baseline,
            args.baseline_poll,
        )
        .await?;
        if args.json {
            println!("{}", serde_json::to_string(&b)?);
        } else {
            print!("{}", postgres::table(&b, &reports));
        }
    }
    if mysql::is_mysql(store_url) && !args.baseline_time.is_zero() {
        let b = mysql::baselines(store_url, args.baseline_time, args.baseline_poll).await?;
        if args.json {
            println!("{}", serde_json::json!({ "baselines": b }));
        } else {
            print!("{}", mysql::table(&b));
        }
    }
    let code = if reports.iter().any(|r| r.over_grants > 0) {
        1
    } else if reports.iter().any(|r| r.errors > 0 || !r.completed) {
        2
    } else {
        0
    };
    Ok(code)
}

/// The queue depths of the `depth` workload, shallow first.
const SHALLOW: usize = 10;

/// The `depth` workload (bounded work, docs/sql-queue.md): one lock handed off between
/// [`SHALLOW`] clients, then between `--clients` (default 1,000), all on one store connection
/// (so the deep queue is not the cost of a thousand connections), and the cost of one
/// hand-off with the deep queue against the shallow one: wall-clock time per hand-off and,
/// on Redis, the server's CPU per grant. Exit codes as for the semaphore workloads.
async fn depth(store_url: &str, args: &BenchArgs) -> anyhow::Result<i32> {
    let deep = Spec::new(Workload::Depth, args);
    let shallow = Spec {
        clients: SHALLOW,
        ..deep.clone()
    };
    let mut reports = Vec::new();
    for spec in [shallow, deep] {
        let mut r = workloads::run_many(store_url, &spec, 1).await?;
        r.workload = "depth".to_string();
        if args.json {
            println!("{}", serde_json::to_string(&r)?);
        }
        reports.push(r);
    }
    let (a, b) = (&reports[0], &reports[1]);
    let per_handoff = |r: &report::WorkloadReport| 1e6 / r.handoffs_per_sec.max(f64::MIN_POSITIVE);
    let ratio = per_handoff(b) / per_handoff(a);
    let cpu = match (a.server_cpu_us_per_grant, b.server_cpu_us_per_grant) {
        (Some(x), Some(y)) if x > 0.0 => format!(
            "; server CPU per grant {x:.0} µs and {y:.0} µs ({:.2}x)",
            y / x
        ),
        _ => String::new(),
    };
    let line = format!(
        "depth: a hand-off costs {:.0} µs behind {} waiters and {:.0} µs behind {} ({ratio:.2}x; \
         target at most 1.5x){cpu}\n",
        per_handoff(b),
        b.clients - 1,
        per_handoff(a),
        a.clients - 1,
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({ "workload": "depth", "handoff_cost_ratio": ratio })
        );
    } else {
        print!("{}{line}", report::table(&reports));
    }
    Ok(if reports.iter().any(|r| r.over_grants > 0) {
        1
    } else if reports.iter().any(|r| r.errors > 0 || !r.completed) {
        2
    } else {
        0
    })
}

/// The URL with any password replaced (for messages).
fn redact(url: &str) -> String {
    tessera::backend::redact_url(url)
}
