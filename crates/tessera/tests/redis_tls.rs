//! `rediss://` against a throwaway TLS `redis-server` with a test CA. A separate test binary,
//! because the CA is trusted through the process-wide `SSL_CERT_FILE`.
#![cfg(feature = "redis")]

use std::time::Duration;

use tessera::*;
use tessera_testkit::servers::redis::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_connects_with_rustls_and_wakes_waiters() {
    let server = RedisServer::start_tls();
    // SAFETY (test process): set before any thread reads the environment for certificates.
    unsafe { std::env::set_var("SSL_CERT_FILE", server.ca_file()) };
    let store = Store::connect(&server.tls_url()).await.unwrap();
    let opts = SemaphoreOptions::default()
        .ttl(Duration::from_secs(60))
        .waiter_ttl(Duration::from_secs(60));
    let sem = Semaphore::new(&store, "tls", 1, opts).unwrap();
    let held = sem.acquire().await.unwrap();
    let sem2 = sem.clone();
    let waiter = tokio::spawn(async move { sem2.acquire().await });
    while store.status("tls").await.unwrap().unwrap().queue.is_empty() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    let permit = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("pushed over TLS")
        .unwrap()
        .unwrap();
    assert_eq!(permit.seats(), &[0]);
    drop(permit);

    // Plain text to the TLS port: the server closes the connection, and the error says
    // that the port may want rediss://.
    let plain = server.tls_url().replacen("rediss://", "redis://", 1);
    let e = Store::connect(&plain).await.expect_err("TLS-only port");
    assert!(e.to_string().contains("use rediss://"), "{e}");
}
