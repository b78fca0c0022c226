//! A short-lived program that leaves something for the store to clean up and then exits the
//! way a user's program would. The exit tests check the store right after it is gone.
//!
//! Usage: tessera-exit STORE_URL NAME MODE
//!
//! - `drop`: acquires one of 2 permits and returns from `#[tokio::main]` with the permit
//!   still in a local (dropped as `main`'s future ends, while the runtime shuts down).
//! - `outside`: acquires on a runtime it then shuts down, and drops the permit afterwards,
//!   outside any runtime.
//! - `exit`: acquires and calls `std::process::exit(0)` with the permit still held (never
//!   dropped) and its runtime still running.
//! - `queued`: joins the queue of a full semaphore (capacity 1, held elsewhere) with a wait
//!   of 300 ms — after which the acquire is dropped — and returns from `main`.
//! - `reserved`: reserves a turn of `1/min` (used up elsewhere), gives the reservation up
//!   after 300 ms and returns from `main`.
//! - `close`: acquires, calls `Store::close`, checks that the permit was lost with
//!   `LossReason::Closed`, and keeps the permit until the end of `main`.
//!
//! Prints `READY` once the permit, queue place or reservation is in the store.

use std::time::Duration;

use tessera::{LossReason, Semaphore, SemaphoreOptions, Store};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, mode] = &args[..] else {
        eprintln!("usage: tessera-exit STORE_URL NAME MODE");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    match mode.as_str() {
        "outside" => {
            let permit = rt.block_on(async {
                let store = Store::connect(url).await.expect("connect");
                let permit = semaphore(&store, name, 2).acquire().await.expect("acquire");
                println!("READY");
                permit
            });
            drop(rt);
            drop(permit);
        }
        _ => rt.block_on(run(url, name, mode)),
    }
}

fn semaphore(store: &Store, name: &str, capacity: u32) -> Semaphore {
    let opts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(60))
        .holder("tessera-exit");
    Semaphore::new(store, name, capacity, opts).expect("semaphore")
}

async fn run(url: &str, name: &str, mode: &str) {
    let store = Store::connect(url).await.expect("connect");
    match mode {
        "drop" => {
            let _permit = semaphore(&store, name, 2).acquire().await.expect("acquire");
            println!("READY");
        }
        "exit" => {
            let _permit = semaphore(&store, name, 2).acquire().await.expect("acquire");
            println!("READY");
            // Locals are not dropped: the permit is still held when the process exits.
            std::process::exit(0);
        }
        "queued" => {
            let sem = semaphore(&store, name, 1);
            println!("READY");
            let got = sem
                .acquire_many_timeout(1, Duration::from_millis(300))
                .await
                .expect("acquire");
            assert!(got.is_none(), "the semaphore was expected to be full");
        }
        "reserved" => {
            let limiter = store
                .rate_limiter(name, &["1/min".parse().unwrap()])
                .expect("limiter");
            let wait = limiter.acquire_within(1, Duration::from_secs(120));
            println!("READY");
            let given_up = tokio::time::timeout(Duration::from_millis(300), wait).await;
            assert!(given_up.is_err(), "the turn was expected a minute away");
        }
        "close" => {
            let permit = semaphore(&store, name, 2).acquire().await.expect("acquire");
            println!("READY");
            store.close().await.expect("close");
            assert!(permit.is_lost());
            assert_eq!(permit.lost().await, LossReason::Closed);
        }
        other => panic!("unknown mode {other}"),
    }
}
