//! The scenarios: each sets up a store, starts the workers, injects its faults on a
//! schedule, and hands the run to [`super::Run::finish`]. See `docs/reliability.md` for what
//! each proves.

use std::time::Duration;

use anyhow::Context;
use tessera::backend::Waking;
use tessera::{Semaphore, SemaphoreOptions};
use tokio::time::{sleep, Instant};

use super::report::{ScenarioReport, WRITER_FROZEN};
use super::{harness, Params, Run, StoreSpec};
use crate::grantlog::FaultPhase;
use crate::harness::{Need, StoreTraits};
use crate::proxy::{Mode, Proxy};

/// Every scenario, in the order they run.
pub fn names() -> Vec<&'static str> {
    vec![
        "baseline",
        "s1-kill",
        "s2-stop",
        "s3-proxy",
        "s4-restart",
        "s4-restart-aof",
        "s5-freeze",
        "s9-client-kill",
        "s10-reclaim",
        "s7-eviction",
        "clock-jump",
        "garbage",
        "f1-sentinel-failover",
        "f2-sentinel-kill",
        "f3-sentinel-freeze",
        "f4-cluster-kill",
    ]
}

/// Why failover scenario `name` cannot run on `spec` (it needs the topology it fails
/// over), or `None`.
fn topology_problem(name: &str, spec: &StoreSpec) -> Option<&'static str> {
    let sentinel = matches!(spec, StoreSpec::RedisSentinel { .. });
    let cluster = matches!(spec, StoreSpec::RedisCluster);
    match name {
        "f1-sentinel-failover" | "f2-sentinel-kill" | "f3-sentinel-freeze" if !sentinel => {
            Some("is no Sentinel topology the runner starts (no Sentinel failover)")
        }
        "f4-cluster-kill" if !cluster => {
            Some("is no Redis Cluster the runner starts (no cluster failover)")
        }
        _ => None,
    }
}

/// Why `s4-restart` (a server that comes back *empty*) does not apply to a store whose
/// server keeps its committed data through a kill -9 (a database: PostgreSQL, MariaDB,
/// etcd), or `None`. Their kill -9 and restart is `s4-restart-aof`.
fn keeps_its_data(name: &str, traits: &StoreTraits) -> Option<&'static str> {
    (name == "s4-restart" && traits.server && !traits.restartable && traits.durable_restart)
        .then_some(
            "keeps its committed data through a kill -9, so it never comes back empty \
             (keeps its data: its kill -9 and restart is s4-restart-aof)",
        )
}

/// Why a fault of one server (`s4-restart`, `s4-restart-aof`, `s5-freeze`) does not run on a
/// Redis topology, or `None`: there the kill -9 and the freeze of a server are failovers.
fn one_server_fault_on_a_topology(name: &str, spec: &StoreSpec) -> Option<&'static str> {
    let topology = matches!(
        spec,
        StoreSpec::RedisSentinel { .. } | StoreSpec::RedisCluster
    );
    (topology && matches!(name, "s4-restart" | "s4-restart-aof" | "s5-freeze")).then_some(
        "is a topology: the kill -9 and the freeze of its master are the failover scenarios \
         (f2-sentinel-kill, f3-sentinel-freeze, f4-cluster-kill) (see its failovers)",
    )
}

/// What scenario `name` needs of the store beyond being shared by processes (which every
/// store the runner takes is).
pub fn needs(name: &str, traits: &StoreTraits) -> &'static [Need] {
    match name {
        "s3-proxy" => &[Need::Proxy],
        // A store without a server (a file) restarts by losing every client at once.
        "s4-restart" if traits.server => &[Need::Restart],
        "s4-restart-aof" => &[Need::DurableRestart],
        "s5-freeze" => &[Need::Freeze],
        "s9-client-kill" => &[Need::CutClients],
        "s7-eviction" => &[Need::Eviction],
        // The scenario shifts the workers' wall clock; it means nothing to a store whose
        // time is the server's.
        "clock-jump" => &[Need::HostClock],
        "garbage" => &[Need::RawAccess],
        _ => &[],
    }
}

/// Runs scenario `name` once, or reports it skipped (with the trait the store lacks).
pub async fn run(
    name: &str,
    spec: &StoreSpec,
    p: &Params,
    seed: u64,
) -> anyhow::Result<ScenarioReport> {
    let kind = spec.kind();
    let traits = spec.traits();
    if let Some(why) = topology_problem(name, spec)
        .or_else(|| keeps_its_data(name, &traits))
        .or_else(|| one_server_fault_on_a_topology(name, spec))
        .or_else(|| needs(name, &traits).iter().find_map(|&n| traits.lacks(n)))
    {
        let why = format!("{kind} {why}");
        eprintln!("skipped: scenario {name}: {why}");
        return Ok(ScenarioReport::skipped(name, kind, seed, &why));
    }
    match name {
        "baseline" => baseline(spec, p, seed).await,
        "s1-kill" => s1_kill(spec, p, seed).await,
        "s2-stop" => s2_stop(spec, p, seed).await,
        "s3-proxy" => s3_proxy(spec, p, seed).await,
        "s4-restart" if traits.server => s4_restart(spec, p, seed, false).await,
        "s4-restart" => s4_kill_every_client(spec, p, seed).await,
        "s4-restart-aof" => s4_restart(spec, p, seed, true).await,
        "s5-freeze" => s5_freeze(spec, p, seed).await,
        "s9-client-kill" => s9_client_kill(spec, p, seed).await,
        "s10-reclaim" => s10_reclaim(spec, p, seed).await,
        "s7-eviction" => s7_eviction(spec, p, seed).await,
        "clock-jump" => clock_jump(spec, p, seed).await,
        "garbage" => garbage(spec, p, seed).await,
        "f1-sentinel-failover" | "f2-sentinel-kill" | "f3-sentinel-freeze" | "f4-cluster-kill" => {
            failover(name, spec, p, seed).await
        }
        _ => anyhow::bail!("unknown scenario {name}"),
    }
}

async fn start(
    name: &str,
    spec: &StoreSpec,
    p: &Params,
    seed: u64,
    duration: Duration,
) -> anyhow::Result<Run> {
    let env = harness(spec, name, seed, &[]);
    let mut run = Run::new(name, p, seed, env, None, duration).await?;
    run.start_workers()?;
    Ok(run)
}

/// No fault: the checker's baseline.
async fn baseline(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let run = start("baseline", spec, p, seed, p.duration).await?;
    run.run_out().await;
    run.finish().await
}

/// S1: SIGKILL a holder every few TTLs; a replacement worker joins at once.
async fn s1_kill(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let duration = p.duration + p.ttl * 2;
    let mut run = start("s1-kill", spec, p, seed, duration).await?;
    let mut round = 0;
    // Leave 2 TTL at the end so the last kill's permit can be seen coming back.
    while run.remaining() > p.ttl * 3 {
        sleep(p.ttl / 2 + p.ttl * (round % 2)).await;
        if let Some((i, id, _)) = run.pick_holder(round).await {
            run.kill(i);
            run.fault("sigkill", FaultPhase::Instant, Some(&id));
            run.spawn_worker()?;
        }
        round += 1;
    }
    run.run_out().await;
    run.finish().await
}

/// S2: SIGSTOP a holder for 3 TTL, then SIGCONT.
async fn s2_stop(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let duration = (p.ttl * 3 + p.ttl * 2) * p.rounds + p.ttl;
    let mut run = start("s2-stop", spec, p, seed, duration).await?;
    for round in 0..p.rounds {
        sleep(p.ttl).await;
        let Some((i, id, _)) = run.pick_holder(round).await else {
            run.notes.push("no holder to stop".into());
            continue;
        };
        run.signal(i, libc::SIGSTOP);
        run.fault("sigstop", FaultPhase::Start, Some(&id));
        // Stopped inside a write transaction of SQLite (one writer for every process), it
        // holds every other process's steps until it runs again: a frozen store.
        let frozen = matches!(spec, StoreSpec::Sqlite(_)) && {
            sleep(Duration::from_millis(20)).await;
            run.holds_an_exclusive_flock(i)
        };
        if frozen {
            run.fault(WRITER_FROZEN, FaultPhase::Start, None);
            run.notes.push(format!(
                "{id} was stopped inside a write transaction: every process waited for it"
            ));
        }
        sleep(p.ttl * 3).await;
        run.signal(i, libc::SIGCONT);
        run.fault("sigstop", FaultPhase::Heal, Some(&id));
        if frozen {
            run.fault(WRITER_FROZEN, FaultPhase::Heal, None);
        }
        sleep(p.ttl).await;
    }
    run.run_out().await;
    run.finish().await
}

/// S3: the workers reach the server through a proxy that delays, black-holes (shorter and
/// longer than the TTL), resets and drops replies. On etcd, one member of three is behind
/// the faulty proxy: the one the workers talk to first.
async fn s3_proxy(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let (env, proxy, others, worker_url) = if let StoreSpec::Etcd(None) = spec {
        // etcd: a 3-member cluster, each member behind a proxy of its own; the faults hit
        // the member the workers talk to first (the URL's first), so their requests,
        // keep-alives and watches must move to the next member.
        let mut env = crate::harness::Harness::etcd_with(3);
        let cluster = env.etcd_cluster().context("the etcd cluster")?;
        let ports: Vec<u16> = (0..cluster.len()).map(|i| cluster.client_port(i)).collect();
        let mut proxies = Vec::new();
        for port in ports {
            proxies.push(Proxy::start(([127, 0, 0, 1], port).into()).await?);
        }
        let prefix = env.url().rsplit_once('/').context("a key prefix")?.1;
        let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
        let worker_url = format!("etcd://{}/{prefix}", hosts.join(","));
        let proxy = proxies.remove(0);
        (env, proxy, proxies, worker_url)
    } else {
        let env = harness(spec, "s3-proxy", seed, &[]);
        let port = env.server_port().context("the server's port")?;
        let proxy = Proxy::start(([127, 0, 0, 1], port).into()).await?;
        let worker_url = env
            .url()
            .replace(&format!(":{port}"), &format!(":{}", proxy.addr().port()));
        (env, proxy, Vec::new(), worker_url)
    };
    let ttl = p.ttl;
    let schedule: Vec<(&str, Mode, Duration)> = vec![
        ("delay", Mode::Delay(ttl.as_millis() as u64 / 20), ttl),
        ("blackhole-short", Mode::Blackhole, ttl / 4),
        ("reset", Mode::Reset, ttl / 10),
        ("drop-replies", Mode::DropReplies, ttl / 4),
        ("blackhole-long", Mode::Blackhole, ttl * 2),
    ];
    let gap = ttl * 3 / 4;
    let per_round: Duration = schedule.iter().map(|(_, _, d)| *d + gap).sum();
    let duration = ttl + per_round * p.rounds + ttl;
    let mut run = Run::new("s3-proxy", p, seed, env, Some(worker_url), duration).await?;
    run.start_workers()?;
    sleep(ttl).await;
    for _ in 0..p.rounds {
        for (action, mode, hold) in &schedule {
            proxy.set(*mode);
            run.fault(action, FaultPhase::Start, None);
            sleep(*hold).await;
            proxy.set(Mode::Pass);
            run.fault(action, FaultPhase::Heal, None);
            sleep(gap).await;
        }
    }
    let s = proxy.stats();
    run.notes.push(format!(
        "proxy: {} connections, {} resets, {} reply chunks dropped",
        s.connections.load(std::sync::atomic::Ordering::Relaxed),
        s.resets.load(std::sync::atomic::Ordering::Relaxed),
        s.dropped_replies.load(std::sync::atomic::Ordering::Relaxed)
    ));
    run.run_out().await;
    let report = run.finish().await;
    drop((proxy, others));
    report
}

/// S4 on Redis: SIGKILL the server and start it again on the same port, without persistence
/// (it comes back empty) or with AOF (`appendfsync always`).
async fn s4_restart(
    spec: &StoreSpec,
    p: &Params,
    seed: u64,
    aof: bool,
) -> anyhow::Result<ScenarioReport> {
    let name = if aof { "s4-restart-aof" } else { "s4-restart" };
    let args: &[&str] = if aof {
        &["--appendonly", "yes", "--appendfsync", "always"]
    } else {
        &[]
    };
    let env = harness(spec, name, seed, args);
    // (PostgreSQL keeps its data through a restart anyway: the harness restarts it with an
    // immediate shutdown, i.e. crash recovery.)
    if let Some(server) = env.redis_server().filter(|_| aof) {
        let got = server.command(&["CONFIG", "GET", "appendonly"]);
        anyhow::ensure!(got.contains("yes"), "AOF is not on: {got:?}");
    }
    let duration = (p.ttl * 3) * p.rounds + p.ttl * 2;
    let mut run = Run::new(name, p, seed, env, None, duration).await?;
    run.start_workers()?;
    for _ in 0..p.rounds {
        sleep(p.ttl * 2).await;
        run.fault("restart", FaultPhase::Start, None);
        tokio::task::block_in_place(|| match run.env.postgres_server_mut() {
            // A crash of every process, not `pg_ctl stop -m immediate`.
            Some(pg) => pg.kill9_restart(),
            None => run.env.restart(),
        });
        run.fault("restart", FaultPhase::Heal, None);
        sleep(p.ttl).await;
    }
    run.run_out().await;
    run.finish().await
}

/// S5: SIGSTOP the server (every process of it, on PostgreSQL; the only member, on etcd)
/// for 2 TTL, past every lease's TTL, then SIGCONT. Connections stay open and nothing
/// answers meanwhile. Nothing is forgotten (the server keeps its state), so no finding is
/// excused: holders must stop believing before anyone else can be granted their seats, a
/// timed acquire must return by its deadline although its calls hang, and service resumes
/// within TTL + renewal interval of the thaw.
async fn s5_freeze(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let frozen = p.ttl * 2;
    let duration = (p.ttl * 2 + frozen) * p.rounds + p.ttl * 2;
    let mut run = start("s5-freeze", spec, p, seed, duration).await?;
    for _ in 0..p.rounds {
        sleep(p.ttl * 2).await;
        run.fault("freeze", FaultPhase::Start, None);
        run.env.freeze();
        let began = Instant::now();
        sleep(frozen).await;
        run.env.thaw();
        run.fault("freeze", FaultPhase::Heal, None);
        run.notes
            .push(format!("server frozen {} ms", began.elapsed().as_millis()));
    }
    run.run_out().await;
    // A stopped server never answers the drain: make sure it runs (a no-op if it does).
    run.env.thaw();
    run.finish().await
}

/// S4 on a store without a server (SQLite): SIGKILL every worker at once, holders in the
/// middle of their transactions, and start new ones.
async fn s4_kill_every_client(
    spec: &StoreSpec,
    p: &Params,
    seed: u64,
) -> anyhow::Result<ScenarioReport> {
    let duration = (p.ttl * 3) * p.rounds + p.ttl * 2;
    let mut run = start("s4-restart", spec, p, seed, duration).await?;
    for _ in 0..p.rounds {
        sleep(p.ttl * 2).await;
        let live = run.live_workers();
        for &i in &live {
            run.kill(i);
        }
        run.fault("kill-all", FaultPhase::Start, None);
        for _ in &live {
            run.spawn_worker()?;
        }
        run.fault("kill-all", FaultPhase::Heal, None);
        sleep(p.ttl).await;
    }
    run.run_out().await;
    run.finish().await
}

/// S9: bursts of connection cuts at the server (Redis `CLIENT KILL` of command and pub/sub
/// connections, PostgreSQL `pg_terminate_backend`, MySQL `KILL`), each much shorter than the
/// TTL: nobody may lose a full lease. A hand-off grant, provisional for what is left of its
/// waiter's entry (which the same cut kept from being renewed), may be lost; so may a
/// lease of a process the loaded machine did not run
/// ([`unexplained_losses`](super::report::unexplained_losses)).
async fn s9_client_kill(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let run = start("s9-client-kill", spec, p, seed, p.duration + p.ttl * 2).await?;
    while run.remaining() > p.ttl * 2 {
        sleep(p.ttl).await;
        run.fault("client-kill", FaultPhase::Start, None);
        for _ in 0..3 {
            let _ = run.env.cut_clients();
            sleep(Duration::from_millis(30)).await;
        }
        run.fault("client-kill", FaultPhase::Heal, None);
    }
    run.run_out().await;
    let mut r = run.finish().await?;
    if r.unexplained_losses > 0 {
        r.violations.push(format!(
            "spurious loss: {} lost() notices of full leases although every outage was far shorter than the TTL",
            r.unexplained_losses
        ));
    }
    let explained = r.lost_notices - r.unexplained_losses;
    if explained > 0 {
        r.expected.push(format!(
            "{explained} lost() notices of hand-off grants shorter than the cut (their waiters' heartbeats were cut too) or of a process the machine did not run"
        ));
    }
    Ok(r)
}

/// How often S10 counts the queue while its waiters join. A count is a `status`, which on
/// the SQL stores is a step: it locks the semaphore's row and reads every entry. Counted every
/// 100 ms on MariaDB (debug build, two busy loops beside the test on 2 cores), the counts kept
/// the row locked often enough that heartbeats came late: the queue reached 8,026, then
/// thousands of waiters expired at once and queued again, and it stayed between 240 and 1,400
/// until the 90 s ran out. Counted every second, all 10,000 were queued after 25 s (34 s with
/// three busy loops). Once the waiters are dead nothing competes: the queue is then counted
/// every 100 ms.
const QUEUE_COUNT_EVERY: Duration = Duration::from_secs(1);

/// S10: abandoned leases come back, dead waiters leave the queue, the queue cap holds.
async fn s10_reclaim(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let env = harness(spec, "s10-reclaim", seed, &[]);
    let mut run = Run::new("s10-reclaim", p, seed, env, None, Duration::ZERO).await?;
    let t0 = Instant::now();
    let c = p.permits;
    let opts = || {
        SemaphoreOptions::default()
            .ttl(p.ttl)
            .waiter_ttl(p.waiter_ttl)
            .holder("chaos-runner")
    };

    // (a) Holders that never release: C `tessera-hold` processes, SIGKILLed at once.
    let mut holders = vec![];
    for _ in 0..c {
        holders.push(crate::hold::spawn_holder(run.env.url(), "abandoned", c, p.ttl).await);
    }
    for h in &mut holders {
        h.start_kill()?;
        h.wait().await?;
    }
    let killed = Instant::now();
    let sem = Semaphore::new(&run.store, "abandoned", c, opts())?;
    let bound = p.ttl + p.ttl / 3 + Duration::from_nanos(super::report::SLACK_NS);
    match sem.acquire_many_timeout(c, bound * 2).await {
        Ok(Some(all)) => {
            let ms = killed.elapsed().as_millis() as u64;
            run.reclaim_ms.push(ms);
            run.notes
                .push(format!("{c} abandoned permits came back after {ms} ms"));
            if killed.elapsed() > bound {
                run.violations.push(format!(
                    "C5 abandoned permits came back after {ms} ms, bound {} ms",
                    bound.as_millis()
                ));
            }
            all.release().await?;
        }
        other => run.violations.push(format!(
            "abandoned permits did not come back within {:?}: {other:?}",
            bound * 2
        )),
    }

    // (b) N waiters in one process, SIGKILLed at once, leave the queue within the waiter TTL.
    // MariaDB's waiters poll too, but their heartbeats and polls go to the server gathered
    // per semaphore, so it takes the count of the stores that push.
    let n = match run.store.backend().capabilities().waking {
        Waking::Push => p.dead_waiters_push,
        _ if matches!(spec, StoreSpec::Mariadb) => p.dead_waiters_push,
        _ => p.dead_waiters_polling,
    };
    let waiter_ttl = Duration::from_secs(3);
    let wopts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(30))
        .holder("chaos-runner");
    let gate = Semaphore::new(&run.store, "dead-waiters", c, wopts)?;
    let full = gate.acquire_many(c).await?;
    let mut args = run.worker_args("waiters");
    args.name = "dead-waiters".into();
    args.store = run.env.url().to_string();
    args.ttl_ms = 30_000;
    args.waiter_ttl_ms = Some(waiter_ttl.as_millis() as u64);
    args.waiters = Some(n);
    args.duration_ms = Some(120_000);
    let mut child = std::process::Command::new(super::sibling_binary("tessera-worker")?)
        .args(args.to_args())
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    // What the worker's acquires returned before the kill (none should: the semaphore is
    // full, and a store that cannot keep up must not fail them).
    let returned = {
        let out = child.stdout.take().expect("piped stdout");
        std::thread::spawn(move || {
            use std::io::BufRead;
            let (mut count, mut first) = (0u64, None);
            for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
                if line.starts_with("GRANTED") || line.starts_with("FAILED") {
                    count += 1;
                    first.get_or_insert(line);
                }
            }
            (count, first)
        })
    };
    let queued_by = Instant::now() + Duration::from_secs(90);
    let mut queued = 0;
    let mut failed_counts = 0;
    while Instant::now() < queued_by {
        // A count that fails (a read of thousands of records answered late on a loaded
        // machine) is taken again at the next tick: it measures, it is not under test.
        match run.store.status("dead-waiters").await {
            Ok(s) => queued = s.map_or(0, |s| s.queue.len()),
            Err(e) => {
                failed_counts += 1;
                if failed_counts == 1 {
                    run.notes.push(format!("a count of the queue failed: {e}"));
                }
            }
        }
        if queued >= n as usize {
            break;
        }
        sleep(QUEUE_COUNT_EVERY).await;
    }
    if failed_counts > 0 {
        run.notes
            .push(format!("{failed_counts} counts of the queue failed"));
    }
    let enqueue_ms = t0.elapsed().as_millis();
    child.kill()?;
    child.wait()?;
    let killed = Instant::now();
    let (returned, first) = returned.join().unwrap_or((0, None));
    if returned > 0 {
        run.violations.push(format!(
            "{returned} of the {n} acquires returned before the kill, on a full semaphore; \
             the first: {}",
            first.unwrap_or_default()
        ));
    }
    if queued < n as usize {
        run.violations
            .push(format!("only {queued} of {n} waiters queued within 90 s"));
    }
    let empty_by = killed + waiter_ttl * 3;
    let mut left = queued;
    while Instant::now() < empty_by {
        left = run
            .store
            .status("dead-waiters")
            .await?
            .map_or(0, |s| s.queue.len());
        if left == 0 {
            break;
        }
        sleep(Duration::from_millis(100)).await;
    }
    let gone_ms = killed.elapsed().as_millis() as u64;
    run.notes.push(format!(
        "{queued} waiters queued (by {enqueue_ms} ms), SIGKILLed at once; queue empty after {gone_ms} ms (waiter TTL {} ms)",
        waiter_ttl.as_millis()
    ));
    if left > 0 {
        run.violations.push(format!(
            "{left} dead waiters still queued {} ms after the kill (waiter TTL {} ms)",
            gone_ms,
            waiter_ttl.as_millis()
        ));
    } else if killed.elapsed() > waiter_ttl + Duration::from_secs(1) {
        run.violations.push(format!(
            "dead waiters left the queue after {gone_ms} ms, waiter TTL {} ms",
            waiter_ttl.as_millis()
        ));
    }
    full.release().await?;
    match gate.try_acquire_many(c).await {
        Ok(Some(p)) => {
            p.release().await?;
        }
        other => run.violations.push(format!(
            "after the dead waiters left, try_acquire of all {c} permits answered {other:?}"
        )),
    }

    // (c) The queue cap: with the permits held and `cap` waiters queued, one more is refused.
    let cap = 5u32;
    let capped = Semaphore::new(&run.store, "capped", c, opts().queue_cap(cap))?;
    let full = capped.acquire_many(c).await?;
    let waiters: Vec<_> = (0..cap)
        .map(|_| {
            let s = capped.clone();
            tokio::spawn(async move { s.acquire_many_timeout(1, Duration::from_secs(20)).await })
        })
        .collect();
    let by = Instant::now() + Duration::from_secs(10);
    while Instant::now() < by
        && run
            .store
            .status("capped")
            .await?
            .map_or(0, |s| s.queue.len())
            < cap as usize
    {
        sleep(Duration::from_millis(20)).await;
    }
    match capped.acquire_many_timeout(1, Duration::from_secs(1)).await {
        Err(e) if e.is_queue_full() => run
            .notes
            .push(format!("queue cap {cap}: waiter {} refused: {e}", cap + 1)),
        other => run.violations.push(format!(
            "queue cap {cap}: waiter {} answered {other:?} instead of QueueFull",
            cap + 1
        )),
    }
    for w in waiters {
        w.abort();
    }
    full.release().await?;
    run.duration = t0.elapsed();
    run.finish().await
}

/// S7: Redis with `maxmemory` and `volatile-lru`, filled with keys that never expire, so the
/// only keys Redis may evict are tessera's (which all carry a TTL). `eviction=refuse` must
/// refuse to connect; the default (`warn`) connects, and the report shows what eviction does.
async fn s7_eviction(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let env = harness(
        spec,
        "s7-eviction",
        seed,
        &[
            "--maxmemory",
            "4mb",
            "--maxmemory-policy",
            "volatile-lru",
            "--enable-debug-command",
            "yes",
        ],
    );
    let refused = tessera::Store::connect(&format!("{}&eviction=refuse", env.url())).await;
    let guard = match &refused {
        Err(e) => format!("eviction=refuse refused to connect: {e}"),
        Ok(_) => "eviction=refuse CONNECTED".to_string(),
    };
    let server = env.redis_server().context("owned redis")?;
    // Fill to the limit with keys that never expire.
    for i in 0..200 {
        let info = server.command(&["INFO", "memory"]);
        let used = info_field(&info, "used_memory:").unwrap_or(0);
        if used > 4 * 1024 * 1024 - 300 * 1024 {
            break;
        }
        server.command(&["DEBUG", "POPULATE", "2000", &format!("filler{i}"), "100"]);
    }
    let duration = p.duration;
    let mut run = Run::new("s7-eviction", p, seed, env, None, duration).await?;
    if refused.is_ok() {
        run.violations
            .push("the eviction guard let eviction=refuse connect".into());
    }
    run.notes.push(guard);
    run.start_workers()?;
    run.fault("memory-pressure", FaultPhase::Start, None);
    run.run_out().await;
    let stats = run
        .env
        .redis_server()
        .context("owned redis")?
        .command(&["INFO", "stats"]);
    run.notes.push(format!(
        "without the guard (eviction=warn): Redis evicted {} keys during the run",
        info_field(&stats, "evicted_keys:").unwrap_or(0)
    ));
    run.fault("memory-pressure", FaultPhase::Heal, None);
    // The checker's findings on this run are what eviction does; they are listed as
    // expected, not as violations.
    let mut r = run.finish().await?;
    // The leak check cannot pass when Redis deletes holder sets: report, do not fail.
    let (leaks, rest): (Vec<String>, Vec<String>) =
        r.violations.drain(..).partition(|v| v.starts_with("leak:"));
    r.expected.extend(leaks);
    r.violations = rest;
    Ok(r)
}

fn info_field(info: &str, key: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// Where Debian's `faketime` package puts the library.
fn libfaketime() -> anyhow::Result<String> {
    for dir in [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
    ] {
        let p = format!("{dir}/faketime/libfaketime.so.1");
        if std::path::Path::new(&p).exists() {
            return Ok(p);
        }
    }
    anyhow::bail!("libfaketime is not installed: install it with `apt-get install -y faketime`")
}

/// A wall-clock jump on the store's host: every worker runs under libfaketime reading one
/// offset file; the runner steps it 30 s forward, then back. With
/// `FAKETIME_DONT_FAKE_MONOTONIC=1` libfaketime leaves `CLOCK_MONOTONIC` (leases' certain
/// validity, the grant logs) and `CLOCK_BOOTTIME` (the SQLite store's clock) alone, as a real
/// wall-clock step would; only the wall clock jumps (the fences' floor, the wall times in
/// replies). No over-grant is expected: any is a violation.
async fn clock_jump(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let lib = libfaketime()?;
    let env = harness(spec, "clock-jump", seed, &[]);
    let mut run = Run::new("clock-jump", p, seed, env, None, p.ttl * 5).await?;
    let offset = run.log_dir().join("faketime.rc");
    std::fs::write(&offset, "+0\n")?;
    run.worker_env = vec![
        ("LD_PRELOAD".into(), lib),
        (
            "FAKETIME_TIMESTAMP_FILE".into(),
            offset.display().to_string(),
        ),
        ("FAKETIME_NO_CACHE".into(), "1".into()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
    ];
    run.start_workers()?;
    sleep(p.ttl).await;
    run.fault("clock-forward-30s", FaultPhase::Start, None);
    std::fs::write(&offset, "+30s\n")?;
    run.fault("clock-forward-30s", FaultPhase::Heal, None);
    sleep(p.ttl * 3 / 2).await;
    run.fault("clock-back-30s", FaultPhase::Start, None);
    std::fs::write(&offset, "+0\n")?;
    run.fault("clock-back-30s", FaultPhase::Heal, None);
    run.run_out().await;
    run.finish().await
}

/// The keys of semaphore `name` under `prefix` (the Redis store's layout, kept in step with
/// `stores/redis/ops.rs`).
fn redis_keys(prefix: &str, name: &str) -> Vec<String> {
    [
        "meta", "holders", "leases", "queue", "waiters", "wexp", "seats", "fence", "tags",
    ]
    .iter()
    .map(|s| format!("{{{prefix}:{name}}}:{s}"))
    .collect()
}

/// Garbage written into tessera's own keys or rows by someone else, twice: first every
/// value replaced by garbage of the right type, then (Redis) every key replaced by one of a
/// type tessera never uses, or (SQLite) numbers out of range. Each lasts a TTL, then an
/// operator deletes the semaphore's state. Workers must get typed errors (a panic fails the
/// worker, which is a violation), nothing is over-granted while the garbage is there, and
/// service resumes after the clean-up. The overlap right after the clean-up is the store
/// forgetting leases, as in `s4-restart`.
async fn garbage(spec: &StoreSpec, p: &Params, seed: u64) -> anyhow::Result<ScenarioReport> {
    let env = harness(spec, "garbage", seed, &[]);
    let duration = p.ttl * 6;
    let mut run = Run::new("garbage", p, seed, env, None, duration).await?;
    let sqlite = match run.env.sqlite_path() {
        Some(path) => {
            let opts = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .busy_timeout(Duration::from_secs(10));
            Some(sqlx::SqlitePool::connect_with(opts).await?)
        }
        None => None,
    };
    run.start_workers()?;
    for round in ["garbage-fields", "garbage-types"] {
        sleep(p.ttl).await;
        run.fault(round, FaultPhase::Start, None);
        if let Some(server) = run.env.mariadb_server() {
            // One statement per round, so the garbage lands at once. (An operator's
            // statements may deadlock with the workers' steps, and are sent again then.)
            server.sql_retrying(if round == "garbage-fields" {
                "UPDATE t.tessera_holders SET seats = 'garbage', lease_id = CONCAT('zz', \
                 LEFT(lease_id, 30)) WHERE name = 'chaos'"
            } else {
                "UPDATE t.tessera_semaphores SET used = -7, seat_high = -1, last_fence = -1 \
                 WHERE name = 'chaos'"
            });
            sleep(p.ttl).await;
            run.fault(round, FaultPhase::Heal, None);
            server.sql_retrying(
                "DELETE FROM t.tessera_holders WHERE name = 'chaos'; \
                 DELETE FROM t.tessera_waiters WHERE name = 'chaos'; \
                 DELETE FROM t.tessera_semaphores WHERE name = 'chaos'; \
                 DELETE FROM t.tessera_free_seats WHERE name = 'chaos'",
            );
            continue;
        }
        match &sqlite {
            Some(db) => {
                let sql: &[&str] = if round == "garbage-fields" {
                    &[
                        "UPDATE tessera_holders SET seats = 'garbage', lease_id = 'zz' || lease_id WHERE name = 'chaos'",
                        "UPDATE tessera_waiters SET lease_id = 'not-hex' || seq WHERE name = 'chaos'",
                    ]
                } else {
                    &["UPDATE tessera_semaphores SET used = -7, seat_high = -1, last_fence = -1 WHERE name = 'chaos'"]
                };
                for &q in sql {
                    sqlx::query(q).execute(db).await?;
                }
            }
            None if run.env.postgres_server().is_some() => {
                let server = run.env.postgres_server().context("owned postgres")?;
                let schema = pg_schema(run.env.url())?;
                // One psql command: one transaction, so the garbage lands at once. It locks
                // the semaphore's row first, as every tessera step does, so it waits for a
                // step instead of deadlocking with one.
                let sql = if round == "garbage-fields" {
                    format!(
                        "SELECT 1 FROM {schema}.tessera_semaphores WHERE name = 'chaos' FOR UPDATE; \
                         UPDATE {schema}.tessera_holders SET seats = '{{7,7}}', lease_id = 'zz' || lease_id WHERE name = 'chaos'; \
                         UPDATE {schema}.tessera_waiters SET lease_id = 'not-hex' || seq WHERE name = 'chaos'"
                    )
                } else {
                    format!("UPDATE {schema}.tessera_semaphores SET used = -7, seat_high = -1, last_fence = -1 WHERE name = 'chaos'")
                };
                server.try_psql(&sql).map_err(anyhow::Error::msg)?;
            }
            None => {
                let server = run.env.redis_server().context("owned redis")?;
                let prefix = url::Url::parse(run.env.url())?
                    .query_pairs()
                    .find(|(k, _)| k == "prefix")
                    .map(|(_, v)| v.into_owned())
                    .context("prefix")?;
                // One script, so the garbage lands at once: a key deleted and re-created
                // in two steps would let tessera see the semaphore missing in between.
                let script = if round == "garbage-types" {
                    "for _, k in ipairs(KEYS) do redis.call('DEL', k); redis.call('RPUSH', k, 'garbage') end return 'OK'"
                } else {
                    "for _, k in ipairs(KEYS) do \
                       local t = redis.call('TYPE', k)['ok'] \
                       if t == 'hash' then \
                         for _, f in ipairs(redis.call('HKEYS', k)) do redis.call('HSET', k, f, 'garbage') end \
                       elseif t == 'zset' then redis.call('ZADD', k, 1, 'garbage') \
                       elseif t == 'set' then redis.call('SADD', k, 'garbage') \
                       elseif t == 'string' then redis.call('SET', k, 'garbage') end \
                     end return 'OK'"
                };
                let keys = redis_keys(&prefix, "chaos");
                let mut words = vec!["EVAL", script, "8"];
                words.extend(keys.iter().map(String::as_str));
                let reply = server.command(&words);
                anyhow::ensure!(reply.contains("OK"), "garbage script: {reply}");
            }
        }
        sleep(p.ttl).await;
        // The operator cleans up: the heal starts now (the report counts an overlap right
        // after it as the store forgetting leases).
        run.fault(round, FaultPhase::Heal, None);
        match &sqlite {
            Some(db) => {
                for q in [
                    "DELETE FROM tessera_holders WHERE name = 'chaos'",
                    "DELETE FROM tessera_waiters WHERE name = 'chaos'",
                    "DELETE FROM tessera_semaphores WHERE name = 'chaos'",
                    "DELETE FROM tessera_free_seats WHERE name = 'chaos'",
                ] {
                    sqlx::query(q).execute(db).await?;
                }
            }
            None if run.env.postgres_server().is_some() => {
                let server = run.env.postgres_server().context("owned postgres")?;
                let schema = pg_schema(run.env.url())?;
                // One transaction that locks the semaphore's row first, as tessera's steps do.
                let lock = format!(
                    "SELECT 1 FROM {schema}.tessera_semaphores WHERE name = 'chaos' FOR UPDATE"
                );
                let deletes = [
                    "tessera_holders",
                    "tessera_waiters",
                    "tessera_semaphores",
                    "tessera_free_seats",
                ]
                .map(|t| format!("DELETE FROM {schema}.{t} WHERE name = 'chaos'"));
                let sql = std::iter::once(lock)
                    .chain(deletes)
                    .collect::<Vec<_>>()
                    .join("; ");
                server.try_psql(&sql).map_err(anyhow::Error::msg)?;
            }
            None => {
                let server = run.env.redis_server().context("owned redis")?;
                let prefix = url::Url::parse(run.env.url())?
                    .query_pairs()
                    .find(|(k, _)| k == "prefix")
                    .map(|(_, v)| v.into_owned())
                    .context("prefix")?;
                let keys = redis_keys(&prefix, "chaos");
                let mut words = vec!["DEL"];
                words.extend(keys.iter().map(String::as_str));
                server.command(&words);
            }
        }
    }
    run.run_out().await;
    run.finish().await
}

/// The `schema` of a `postgres://` URL (the PostgreSQL store's tables live there).
fn pg_schema(url: &str) -> anyhow::Result<String> {
    url::Url::parse(url)?
        .query_pairs()
        .find(|(k, _)| k == "schema")
        .map(|(_, v)| v.into_owned())
        .context("schema")
}

/// F1–F4: the workers run through failovers of a Redis topology the runner started:
/// `SENTINEL FAILOVER` (F1), a SIGKILLed master (F2), a master frozen by SIGSTOP past the
/// sentinels' down-after time and then let run again (F3), and a SIGKILLed cluster primary
/// (the one holding the semaphore's slot) whose replica takes over (F4). After each, the lost
/// server comes back (empty) as a replica and the next round waits until it is in sync.
///
/// Without `?wait=N` Redis replicates asynchronously, so the new master may lack the last
/// writes of the old one: the fault is logged as `failover`, after which the checker counts
/// over-grants as expected (the store forgot leases whose holders still hold them), like a
/// restart without persistence. With `?wait=1` it is logged as `failover-wait` and nothing is
/// excused; since with one replica no write can then be acknowledged until a replica is in
/// sync again, the fault heals only then (the C5 bound counts from there). The fenced
/// resource is audited either way. The notes give, per round, the time from the fault's
/// start to the first grant after it.
async fn failover(
    name: &str,
    spec: &StoreSpec,
    p: &Params,
    seed: u64,
) -> anyhow::Result<ScenarioReport> {
    let env = harness(spec, name, seed, &[]);
    let action = match spec {
        StoreSpec::RedisSentinel { wait } if *wait > 0 => "failover-wait",
        _ => "failover",
    };
    // The key prefix, from the options (a host list is no URL the `url` crate parses).
    let prefix = env
        .url()
        .split_once('?')
        .and_then(|(_, query)| {
            url::form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == "prefix")
                .map(|(_, v)| v.into_owned())
        })
        .unwrap_or_else(|| "tessera".into());
    // A failover takes the down-after or node timeout (1-2 s) plus the election; then the
    // lost server resyncs.
    let duration = (p.ttl * 2 + Duration::from_secs(10)) * p.rounds + p.ttl * 2;
    let mut run = Run::new(name, p, seed, env, None, duration).await?;
    let key = format!("{{{prefix}:{}}}:meta", run.name);
    run.start_workers()?;
    let mut starts = Vec::new();
    let mut heals = Vec::new();
    for _ in 0..p.rounds {
        sleep(p.ttl * 2).await;
        starts.push(crate::grantlog::monotonic_ns());
        run.fault(action, FaultPhase::Start, None);
        let began = Instant::now();
        tokio::task::block_in_place(|| match name {
            "f1-sentinel-failover" => run.env.sentinel_mut().map(|t| t.failover()),
            "f2-sentinel-kill" => run.env.sentinel_mut().map(|t| t.kill_master()),
            "f3-sentinel-freeze" => run.env.sentinel_mut().map(|t| {
                t.freeze_master();
            }),
            _ => run.env.cluster_mut().map(|c| {
                c.kill_primary_for(&key);
            }),
        })
        .context("the harness has no topology")?;
        // With `wait=1` and one replica no write is acknowledged until a replica is back in
        // sync: the fault heals then (the C5 bound counts from there).
        let waits = action == "failover-wait";
        if !waits {
            run.fault(action, FaultPhase::Heal, None);
            heals.push(crate::grantlog::monotonic_ns());
        }
        run.notes.push(format!(
            "{action}: new master/primary in {} ms",
            began.elapsed().as_millis()
        ));
        tokio::task::block_in_place(|| {
            if let Some(t) = run.env.sentinel_mut() {
                t.restart_dead();
                t.wait_replica_in_sync();
            }
            if let Some(c) = run.env.cluster_mut() {
                c.restart_dead();
            }
        });
        if waits {
            run.fault(action, FaultPhase::Heal, None);
            heals.push(crate::grantlog::monotonic_ns());
            run.notes.push(format!(
                "{action}: a replica in sync again {} ms after the fault began",
                began.elapsed().as_millis()
            ));
        }
        sleep(p.ttl).await;
    }
    run.run_out().await;
    // A failover the sentinels made on their own (a master starved past their down-after on
    // a loaded machine) forgets like the one asked for, outside the windows counted here:
    // the note tells such a run apart.
    if let Some(epoch) = run.env.sentinel_mut().and_then(|t| t.config_epoch()) {
        run.notes.push(format!(
            "sentinel config-epoch {epoch} at the end, after {} failovers asked for",
            starts.len()
        ));
    }
    let events = crate::grantlog::read_logs(run.log_dir())?;
    let grants: Vec<u64> = events
        .iter()
        .filter(|e| {
            matches!(
                &e.kind,
                crate::grantlog::EventKind::AcquireReturned {
                    outcome: crate::grantlog::Outcome::Granted { .. },
                    ..
                }
            )
        })
        .map(|e| e.t_ns)
        .collect();
    for (round, (start, heal)) in starts.iter().zip(&heals).enumerate() {
        // The longest stretch without any grant that overlaps the fault (from its start to
        // its heal): how long the semaphore could not be had. Grants right after the start
        // may have been decided before it.
        let mut times: Vec<u64> = grants
            .iter()
            .copied()
            .filter(|&t| t + 10_000_000_000 > *start && t < heal + 10_000_000_000)
            .collect();
        times.insert(0, *start);
        let gap = times
            .windows(2)
            .filter(|w| w[1] > *start && w[0] < *heal)
            .map(|w| w[1] - w[0])
            .max();
        let first = grants.iter().find(|&&t| t > *heal).map(|t| t - heal);
        run.notes.push(format!(
            "round {round}: longest stretch without a grant during the fault {} ms; first grant {} after it healed",
            gap.map_or("-".into(), |g| (g / 1_000_000).to_string()),
            first.map_or("never".into(), |f| format!("{} ms", f / 1_000_000)),
        ));
    }
    run.finish().await
}
