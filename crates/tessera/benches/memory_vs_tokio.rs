//! The memory store next to `tokio::sync::Semaphore`, in the same run:
//! - one task, uncontended acquire + release (capacity 10);
//! - 32 tasks sharing 4 permits, each doing acquire + release in a loop.
//!
//! `cargo bench -p tessera-locks --bench memory_vs_tokio`

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};

mod common;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn uncontended(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("uncontended acquire+release, capacity 10");
    let tokio_sem = Arc::new(tokio::sync::Semaphore::new(10));
    g.bench_function("tokio::sync::Semaphore", |b| {
        b.to_async(&rt).iter(|| async {
            let p = tokio_sem.acquire().await.unwrap();
            drop(p);
        })
    });
    let sem = rt.block_on(async {
        let store = tessera::Store::connect("memory://bench-uncontended")
            .await
            .unwrap();
        store.semaphore("bench", 10).unwrap()
    });
    g.bench_function("tessera memory://", |b| {
        b.to_async(&rt).iter(|| async {
            let p = sem.acquire().await.unwrap();
            p.release().await.unwrap();
        })
    });
    g.finish();
}

const TASKS: u64 = 32;
const PER_TASK: u64 = 200;

fn contended(c: &mut Criterion) {
    let rt = runtime();
    let mut g = c.benchmark_group("32 tasks on 4 permits (200 acquire+release each)");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    g.bench_function("tokio::sync::Semaphore", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let start = Instant::now();
            for _ in 0..iters {
                let sem = Arc::new(tokio::sync::Semaphore::new(4));
                common::contend(TASKS, PER_TASK, move || {
                    let sem = sem.clone();
                    async move {
                        let p = sem.acquire().await.unwrap();
                        tokio::task::yield_now().await;
                        drop(p);
                    }
                })
                .await;
            }
            start.elapsed()
        })
    });
    g.bench_function("tessera memory://", |b| {
        b.to_async(&rt).iter_custom(|iters| async move {
            let store = tessera::Store::connect("memory://bench-contended")
                .await
                .unwrap();
            let start = Instant::now();
            for _ in 0..iters {
                let sem = store.semaphore("bench", 4).unwrap();
                common::contend(TASKS, PER_TASK, move || {
                    let sem = sem.clone();
                    async move {
                        let p = sem.acquire().await.unwrap();
                        tokio::task::yield_now().await;
                        p.release().await.unwrap();
                    }
                })
                .await;
            }
            start.elapsed()
        })
    });
    g.finish();
}

criterion_group!(benches, uncontended, contended);
criterion_main!(benches);
