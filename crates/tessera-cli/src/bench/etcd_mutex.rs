//! The comparison on etcd: W2's shape (clients on one lock, hold ≈ 0) with etcd's own
//! `concurrency` mutex recipe, through the same client library (etcd-client's lock API, the
//! server-side v3lock service that implements the recipe): each client keeps one session
//! lease, and loops `lock(name, lease)` → `unlock(key)`. No fence re-check, no seats, no
//! FIFO weights, no waiter TTL: the baseline tessera's etcd store is measured against.
//!
//! Only `etcd://host:port[,…][/prefix]` without user or TLS.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Context;
use etcd_client::{Client, LockOptions};
use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::report::WorkloadReport;
use super::workloads::Spec;

/// Endpoints and key prefix of a plain `etcd://` URL.
fn endpoints(store_url: &str) -> anyhow::Result<(Vec<String>, String)> {
    let rest = store_url
        .strip_prefix("etcd://")
        .context("the etcd mutex comparison needs an etcd:// URL")?;
    anyhow::ensure!(
        !rest.contains('@') && !rest.contains('?'),
        "the etcd mutex comparison takes etcd://host:port[,…][/prefix] without user or options"
    );
    let (hosts, prefix) = rest.split_once('/').unwrap_or((rest, "tessera"));
    let eps = hosts.split(',').map(|h| format!("http://{h}")).collect();
    Ok((eps, prefix.to_string()))
}

/// Runs the mutex recipe with `spec.clients` clients for `spec.ops` grants.
pub async fn run(store_url: &str, spec: &Spec) -> anyhow::Result<WorkloadReport> {
    let (eps, prefix) = endpoints(store_url)?;
    let name = format!("{prefix}/bench-mutex-{:08x}", rand::random::<u32>());
    let mut clients = Vec::new();
    for _ in 0..spec.clients {
        let mut c = Client::connect(&eps, None)
            .await
            .context("connecting to etcd")?;
        let lease = c.lease_grant(60, None).await?.id();
        clients.push((c, lease));
    }
    let claimed = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let last = Arc::new(AtomicUsize::new(usize::MAX));
    let handoffs = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(AtomicI64::new(0));
    let deadline = Instant::now() + spec.duration;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (id, (mut c, lease)) in clients.into_iter().enumerate() {
        let (claimed, done, last, handoffs, errors, holders) = (
            claimed.clone(),
            done.clone(),
            last.clone(),
            handoffs.clone(),
            errors.clone(),
            holders.clone(),
        );
        let (name, ops, hold) = (name.clone(), spec.ops, spec.hold);
        tasks.push(tokio::spawn(async move {
            let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
            let (mut grants, mut max_seen, mut over) = (0u64, 0i64, 0u64);
            while claimed.fetch_add(1, Ordering::Relaxed) < ops && Instant::now() < deadline {
                let t0 = Instant::now();
                let locked = tokio::time::timeout_at(
                    deadline,
                    c.lock(name.as_str(), Some(LockOptions::new().with_lease(lease))),
                )
                .await;
                let key = match locked {
                    Ok(Ok(r)) => r.key().to_vec(),
                    Ok(Err(e)) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, "etcd lock failed");
                        break;
                    }
                    Err(_) => break,
                };
                latency.saturating_record((t0.elapsed().as_micros() as u64).max(1));
                grants += 1;
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                max_seen = max_seen.max(now);
                if now > 1 {
                    over += 1;
                }
                let prev = last.swap(id, Ordering::Relaxed);
                if prev != usize::MAX && prev != id {
                    handoffs.fetch_add(1, Ordering::Relaxed);
                }
                if !hold.is_zero() {
                    tokio::time::sleep(hold).await;
                }
                holders.fetch_sub(1, Ordering::SeqCst);
                if let Err(e) = c.unlock(key).await {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %e, "etcd unlock failed");
                    break;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
            let _ = c.lease_revoke(lease).await;
            (grants, latency, max_seen, over)
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        match tokio::time::timeout_at(deadline + std::time::Duration::from_secs(5), t).await {
            Ok(Ok(r)) => results.push(r),
            _ => {
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).unwrap();
    for r in &results {
        all.add(&r.1).ok();
    }
    let done = done.load(Ordering::Relaxed);
    Ok(WorkloadReport {
        workload: "etcd-mutex".to_string(),
        capacity: 1,
        preload: 0,
        handoffs_per_sec: handoffs.load(Ordering::Relaxed) as f64 / secs,
        grants_per_client_min: results.iter().map(|r| r.0).min().unwrap_or(0),
        grants_per_client_max: results.iter().map(|r| r.0).max().unwrap_or(0),
        max_holders_seen: results.iter().map(|r| r.2).max().unwrap_or(0),
        over_grants: results.iter().map(|r| r.3).sum(),
        errors: errors.load(Ordering::Relaxed),
        ..spec.report(store_url, done, secs, &all)
    })
}
