// Throwaway: W1 (one client, acquire+release pairs, capacity 10) next to a PING loop.
use std::time::{Duration, Instant};
use tessera::*;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let server = tessera_testkit::servers::redis::RedisServer::start();
    let url = server.url();
    for run in 0..3 {
        let store = Store::connect(&url).await.unwrap();
        let sem = store.semaphore(&format!("w1-{run}"), 10).unwrap();
        let backend = store.backend().clone();
        let n = Name::new(format!("w1b-{run}")).unwrap();
        // warm up
        for _ in 0..200 { let p = sem.acquire().await.unwrap(); p.release().await.unwrap(); }
        let client = redis::Client::open(url.as_str()).unwrap();
        let mut ping = client.get_multiplexed_async_connection().await.unwrap();
        let dur = Duration::from_secs(5);
        let pinger = tokio::spawn(async move {
            let t = Instant::now(); let mut k = 0u64;
            while t.elapsed() < dur { let _: String = redis::cmd("PING").query_async(&mut ping).await.unwrap(); k += 1; }
            k as f64 / t.elapsed().as_secs_f64()
        });
        let t = Instant::now(); let mut pairs = 0u64;
        while t.elapsed() < dur {
            let p = sem.acquire().await.unwrap(); p.release().await.unwrap(); pairs += 1;
        }
        let api = pairs as f64 / t.elapsed().as_secs_f64();
        let pings = pinger.await.unwrap();
        // raw backend pairs (no keep-alive task), no concurrent ping
        let t = Instant::now(); let mut raw = 0u64;
        while t.elapsed() < Duration::from_secs(3) {
            let id = LeaseId::random();
            let r = AcquireRequest { lease_id: id, weight: 1, ttl: Duration::from_secs(30), holder: "b".into(), wait: None };
            backend.acquire(&n, 10, &r).await.unwrap(); backend.release(&n, id).await.unwrap(); raw += 1;
        }
        let rawr = raw as f64 / t.elapsed().as_secs_f64();
        let _ = &server;
        println!("run {run}: api pairs/s {api:.0}, PING/s alongside {pings:.0}, ratio to 2-RTT limit {:.2}; raw backend pairs/s (alone) {rawr:.0}", api / (pings / 2.0));
    }

    // Scale: cost of a release (hand-off to the head) + a queued acquire at the tail, with
    // n holders and n waiters, for n = 10 and 10,000.
    let backend = tessera::stores::redis::RedisBackend::connect(&url).await.unwrap();
    for n in [10usize, 10_000, 10] {
        let name = Name::new(format!("scale-{n}-{}", rand::random::<u32>())).unwrap();
        let mk = |id, wait: bool| AcquireRequest { lease_id: id, weight: 1, ttl: Duration::from_secs(3600), holder: "s".into(),
            wait: wait.then_some(WaitSpec { waiter_ttl: Duration::from_secs(3600), queue_cap: 100_000 }) };
        let mut holders = std::collections::VecDeque::new();
        for _ in 0..n { let id = LeaseId::random(); backend.acquire(&name, n as u32, &mk(id, false)).await.unwrap(); holders.push_back(id); }
        let mut waiters = std::collections::VecDeque::new();
        for _ in 0..n { let id = LeaseId::random(); backend.acquire(&name, n as u32, &mk(id, true)).await.unwrap(); waiters.push_back(id); }
        let t = Instant::now(); let k = 3000;
        for _ in 0..k {
            let h = holders.pop_front().unwrap();
            assert!(backend.release(&name, h).await.unwrap());
            holders.push_back(waiters.pop_front().unwrap());
            let id = LeaseId::random();
            backend.acquire(&name, n as u32, &mk(id, true)).await.unwrap();
            waiters.push_back(id);
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / k as f64;
        println!("scale n={n}: {us:.1} µs per release(hand-off)+queued acquire");
        backend.delete(&name).await.unwrap();
    }
}
