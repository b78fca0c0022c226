//! Throwaway measurements of the rate limiter (not a test; figures for the report):
//!
//! ```text
//! cargo run --release -p tessera-testkit --example rate_throughput -- [STORE_URL]
//! ```
//!
//! Without a URL it starts a throwaway redis-server. Prints (1) decisions per second from 8
//! clients, each on its own connection, calling `try_acquire` on one limiter, once with
//! demand far above the limit (mostly "limited") and once with a limit high enough that
//! every request is admitted; (2) the admitted cost over 10 s with 8 clients reserving with
//! `acquire` on `50/s`, against the limit (500).

use std::time::{Duration, Instant};

use tessera::{RateDecision, RateSpec, Store};

async fn decisions(url: &str, name: &str, limits: &[&str], secs: u64) -> (u64, u64) {
    let specs: Vec<RateSpec> = limits.iter().map(|l| l.parse().unwrap()).collect();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = Store::connect(url).await.unwrap();
        let rl = store.rate_limiter(name, &specs).unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut n, mut admitted) = (0u64, 0u64);
            let end = Instant::now() + Duration::from_secs(secs);
            while Instant::now() < end {
                if rl.try_acquire(1).await.unwrap().is_admitted() {
                    admitted += 1;
                }
                n += 1;
            }
            (n, admitted)
        }));
    }
    let mut total = (0, 0);
    for t in tasks {
        let (n, a) = t.await.unwrap();
        total.0 += n;
        total.1 += a;
    }
    total
}

async fn fill(url: &str, secs: u64) -> (u64, u64) {
    let spec: RateSpec = "50/s".parse().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let store = Store::connect(url).await.unwrap();
        let rl = store.rate_limiter("fill", &[spec]).unwrap();
        tasks.push(tokio::spawn(async move {
            let mut ats = Vec::new();
            let end = Instant::now() + Duration::from_secs(secs + 1);
            while Instant::now() < end {
                if let RateDecision::Admitted { at } = rl
                    .acquire_within(1, Duration::from_millis(200))
                    .await
                    .unwrap()
                {
                    ats.push(at.0);
                }
            }
            ats
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    let first = all[0];
    let in_run = all
        .iter()
        .filter(|&&t| t < first + secs * 1_000_000)
        .count() as u64;
    (in_run, 50 * secs)
}

#[tokio::main]
async fn main() {
    let server;
    let url = match std::env::args().nth(1) {
        Some(u) => u,
        None => {
            server = tessera_testkit::servers::redis::RedisServer::start();
            server.url()
        }
    };
    let secs = 5;
    let (n, a) = decisions(&url, "hot-limited", &["50/s", "1000/min"], secs).await;
    println!(
        "limited-heavy: {} decisions/s ({} admitted) from 8 clients over {secs}s",
        n / secs,
        a
    );
    let (n, a) = decisions(&url, "hot-admitted", &["1000000/s"], secs).await;
    println!(
        "all-admitted:  {} decisions/s ({} admitted) from 8 clients over {secs}s",
        n / secs,
        a
    );
    let (got, limit) = fill(&url, 10).await;
    println!(
        "fill 50/s with acquire, 8 clients, 10 s: admitted {got} of {limit} ({:.1}%)",
        got as f64 * 100.0 / limit as f64
    );
}
