//! What happens at the end of a program: [`tessera::Store::close`], and permits, waits and
//! rate reservations left behind by a process that exits normally.

use std::process::Stdio;
use std::time::Duration;

use tessera::{LossReason, Semaphore};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use super::{assert_drained, opts, status, unique};
use crate::harness::{Harness, Need};

/// `Store::close` releases every permit still held through the store (clones included),
/// fires their `lost()` with `Closed` first, and waits for the release of a permit dropped
/// just before: right after it returns, the store holds nothing.
pub async fn close_releases_every_held_permit_and_tells_its_holder(h: &Harness) {
    let name = unique("close");
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 4, opts(5_000)).unwrap();
    let kept = sem.acquire().await.unwrap();
    let clone = Semaphore::new(&client.store.clone(), &name, 4, opts(5_000)).unwrap();
    let kept_by_clone = clone.acquire_many(2).await.unwrap();
    let dropped = sem.acquire().await.unwrap();
    assert_eq!(status(&client.store, &name).await.unwrap().used, 4);
    drop(dropped);
    client.store.close().await.expect("close");
    // No polling: close returned after every release was answered.
    let after = status(&client.store, &name).await;
    assert!(after.is_none(), "still in the store after close: {after:?}");
    for p in [&kept, &kept_by_clone] {
        assert!(p.is_lost());
        assert_eq!(p.lost().await, LossReason::Closed);
    }
    assert!(!kept.release().await.unwrap(), "released twice");
    drop(kept_by_clone);
    // The store stays usable.
    let again = sem.acquire_many(4).await.unwrap();
    assert!(again.release().await.unwrap());
    assert_drained(&client.store, &name).await;
}

/// Runs `tessera-exit URL NAME MODE` to its end; panics unless it said READY and exited 0.
async fn run_exit_program(url: &str, name: &str, mode: &str) {
    let mut child = Command::new(crate::hold::testkit_binary("tessera-exit"))
        .args([url, name, mode])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn tessera-exit");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(20), lines.next_line()).await;
    assert!(
        matches!(&ready, Ok(Ok(Some(l))) if l == "READY"),
        "tessera-exit {mode}: {ready:?}"
    );
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("tessera-exit did not exit")
        .unwrap();
    assert!(status.success(), "tessera-exit {mode}: {status}");
}

/// A program that returns from `main` (or calls `std::process::exit`) with a permit held,
/// dropped with its runtime or outside any runtime, a wait abandoned, or a rate reservation
/// given up, leaves nothing in the store: checked right after the process is gone, long
/// before any TTL (60 s) could have expired.
pub async fn nothing_is_left_behind_by_a_process_that_exits(h: &Harness) {
    if h.skip_unless(Need::MultiProcess) {
        return;
    }
    let client = h.client().await;
    for mode in ["drop", "outside", "exit", "close"] {
        let name = unique(mode);
        run_exit_program(h.url(), &name, mode).await;
        let left = status(&client.store, &name).await;
        assert!(left.is_none(), "{mode}: left in the store: {left:?}");
    }

    // A waiter that gives up and returns from main leaves the queue.
    let name = unique("queued");
    let sem = Semaphore::new(&client.store, &name, 1, opts(60_000)).unwrap();
    let holder = sem.acquire().await.unwrap();
    run_exit_program(h.url(), &name, "queued").await;
    let s = status(&client.store, &name).await.unwrap();
    assert!(s.queue.is_empty(), "the waiter stayed queued: {s:?}");
    assert!(holder.release().await.unwrap());

    // A rate reservation given up before its time is returned (stores with a rate limiter).
    if client.store.backend().rate().is_none() {
        eprintln!(
            "skipped: the rate part of this test: {} has no rate limiter yet",
            h.scheme()
        );
        return;
    }
    let name = unique("reserved");
    let limiter = client
        .store
        .rate_limiter(&name, &["1/min".parse().unwrap()])
        .unwrap();
    assert!(limiter.try_acquire(1).await.unwrap().is_admitted());
    run_exit_program(h.url(), &name, "reserved").await;
    let s = client.store.rate_status(&name).await.unwrap().unwrap();
    assert_eq!(
        (s.limits[0].used, s.limits[0].reserved),
        (1, 0),
        "the reservation stayed: {s:?}"
    );
}
