//! `rediss://` against a throwaway TLS `redis-server` with a test CA. A separate test binary,
//! because the CA is trusted through the process-wide `SSL_CERT_FILE`.
#![cfg(feature = "redis")]

use std::time::Duration;

use tessera::*;
use tessera_testkit::conformance::handed_within;
use tessera_testkit::servers::redis::RedisServer;
use tessera_testkit::servers::redis_sentinel::SentinelTopology;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_connects_with_rustls_and_wakes_waiters() {
    let server = RedisServer::start_tls();
    // SAFETY (test process): set before any thread reads the environment for certificates.
    unsafe { std::env::set_var("SSL_CERT_FILE", server.ca_file()) };
    let store = Store::connect(&server.tls_url()).await.unwrap();
    let opts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(60))
        .waiter_ttl(Duration::from_secs(60));
    // Pushed over TLS: heartbeats come every 15 s.
    let permit = handed_within(&store, &store, "tls", opts, Duration::from_secs(5)).await;
    assert_eq!(permit.seats(), &[0]);
    drop(permit);

    // Plain text to the TLS port: the server closes the connection, and the error says
    // that the port may want rediss://.
    let plain = server.tls_url().replacen("rediss://", "redis://", 1);
    let e = Store::connect(&plain).await.expect_err("TLS-only port");
    assert!(e.to_string().contains("use rediss://"), "{e}");
}

/// Sentinel with TLS everywhere (the sentinels, the master, the replica, replication and
/// the sentinels' own links) and passwords on both sides (the sentinels' default user has
/// one of its own): a `rediss+sentinel://` URL with the master's password and
/// `sentinel_password` hands a permit off over TLS and follows a failover to the new
/// master's TLS port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_sentinel_with_passwords_hands_off_and_follows_a_failover() {
    let mut topo = tokio::task::block_in_place(SentinelTopology::start_tls);
    // SAFETY (test process): set before any thread reads the environment for certificates.
    unsafe { std::env::set_var("SSL_CERT_FILE", topo.ca_file()) };
    tokio::task::block_in_place(|| topo.protect("Data-pw-5", "default", "Sent-pw-6"));
    let url = topo.url().replace("://", "://:Data-pw-5@");
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let url = format!("{url}?prefix=tls&sentinel_password=Sent-pw-6");
    let store = Store::connect(&url).await.unwrap();
    let other = Store::connect(&url).await.unwrap();
    tessera_testkit::conformance::hand_off_between(&store, &other, "s").await;
    let sem = Semaphore::new(&store, "a", 1, SemaphoreOptions::default()).unwrap();
    let held = sem.acquire().await.unwrap();
    let before = held.fence();
    held.release().await.unwrap();
    tokio::task::block_in_place(|| topo.failover());
    // The master changed: calls fail until the client follows it, then work again.
    let after = loop {
        match tokio::time::timeout(Duration::from_secs(10), sem.acquire()).await {
            Ok(Ok(p)) => {
                let fence = p.fence();
                p.release().await.unwrap();
                break fence;
            }
            Ok(Err(e)) => eprintln!("acquire during the failover: {e}"),
            Err(_) => eprintln!("acquire hung for 10 s during the failover"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(after > before, "fence {after} after {before}");
}
