//! The client's own cost per uncontended acquire + release, in a plain loop that
//! `valgrind --tool=callgrind` can count (instructions are repeatable on a busy machine,
//! seconds are not). `scripts/callgrind.sh` runs it and prints instructions per pair.
//!
//! `cargo bench -p tessera-locks --bench hot_path -- [memory|tokio] [PAIRS]` prints ns per pair;
//! `memory-contended` and `tokio-contended` share 4 permits among 32 tasks (PAIRS in all, on
//! one thread, so callgrind counts the hand-offs too).

use std::time::Instant;

mod common;

/// Tasks sharing 4 permits in the contended cases.
const TASKS: u64 = 32;

fn main() {
    // `cargo bench` passes `--bench`; every other argument is ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let what = args.first().map(String::as_str).unwrap_or("memory");
    let pairs: u64 = args.get(1).and_then(|n| n.parse().ok()).unwrap_or(200_000);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    match what {
        "tokio" => rt.block_on(async {
            let sem = tokio::sync::Semaphore::new(10);
            for _ in 0..pairs {
                let p = sem.acquire().await.unwrap();
                drop(std::hint::black_box(p));
            }
        }),
        "memory" => rt.block_on(async {
            let store = tessera::Store::connect("memory://hot-path").await.unwrap();
            let sem = store.semaphore("hot", 10).unwrap();
            for _ in 0..pairs {
                let p = sem.acquire().await.unwrap();
                std::hint::black_box(&p);
                p.release().await.unwrap();
            }
        }),
        "tokio-contended" => rt.block_on(async {
            let sem = std::sync::Arc::new(tokio::sync::Semaphore::new(4));
            common::contend(TASKS, pairs / TASKS, move || {
                let sem = sem.clone();
                async move {
                    let p = sem.acquire().await.unwrap();
                    tokio::task::yield_now().await;
                    drop(std::hint::black_box(p));
                }
            })
            .await
        }),
        "memory-contended" => rt.block_on(async {
            let store = tessera::Store::connect("memory://hot-path").await.unwrap();
            let sem = store.semaphore("contended", 4).unwrap();
            common::contend(TASKS, pairs / TASKS, move || {
                let sem = sem.clone();
                async move {
                    let p = sem.acquire().await.unwrap();
                    tokio::task::yield_now().await;
                    p.release().await.unwrap();
                }
            })
            .await
        }),
        other => panic!("unknown case {other:?}: memory, tokio, memory-contended, tokio-contended"),
    }
    let ns = start.elapsed().as_nanos() as f64 / pairs as f64;
    println!("{what}: {pairs} pairs, {ns:.0} ns per pair");
}
