//! The doorbell against a throwaway MariaDB: a ring reaches the waiters of exactly the
//! client it is addressed to, and a stale address rings nobody.

use std::sync::Arc;
use std::time::Duration;

use tessera_testkit::servers::mysql::MariaDbServer;

use super::*;
use crate::wake::Registration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_wakes_the_waiters_of_the_client_it_names_and_no_other() {
    let server = MariaDbServer::start();
    let url = server.url("t");
    let (a, b) = (
        MysqlBackend::connect(&url).await.unwrap(),
        MysqlBackend::connect(&url).await.unwrap(),
    );
    // Wait until both doorbells are parked.
    let mut parked = 0;
    for _ in 0..100 {
        parked = server
            .sql(
                "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
                 WHERE INFO LIKE 'SELECT SLEEP(%tessera doorbell%'",
            )
            .trim()
            .parse()
            .unwrap();
        if parked == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(parked, 2);
    let (in_a, in_b) = (LeaseId::random(), LeaseId::random());
    let (reg_a, reg_b) = (Registration::new(in_a), Registration::new(in_b));
    a.set_waiting(in_a, true);
    b.set_waiting(in_b, true);
    // B rings A: A's waiter wakes, B's does not.
    // Both clients are in this process, whose waiters every grant wakes directly: `ring`
    // leaves their doorbells alone.
    notify::ring(&b.pool, vec![a.doorbell_address()], &b.doorbell_address());
    let woke_a = tokio::time::timeout(Duration::from_millis(300), reg_a.notified()).await;
    assert!(woke_a.is_err(), "a doorbell of this process was rung");
    notify::ring_each(&b.pool, vec![a.doorbell_address()]);
    tokio::time::timeout(Duration::from_secs(10), reg_a.notified())
        .await
        .expect("A's waiter woken by the ring");
    let woke_b = tokio::time::timeout(Duration::from_millis(300), reg_b.notified()).await;
    assert!(woke_b.is_err(), "B's waiter woke without a ring");
    // A stale address (a connection id with another token) rings nobody.
    let stale = format!(
        "{}:{:016x}",
        b.doorbell_address().split(':').next().unwrap(),
        7u64
    );
    notify::ring_each(&a.pool, vec![stale]);
    let woke_b = tokio::time::timeout(Duration::from_millis(300), reg_b.notified()).await;
    assert!(woke_b.is_err(), "a stale address rang B");
    // After the ring A's doorbell parks again and can be rung again.
    let again = Arc::new(reg_a);
    for _ in 0..50 {
        notify::ring_each(&b.pool, vec![a.doorbell_address()]);
        if tokio::time::timeout(Duration::from_millis(200), again.notified())
            .await
            .is_ok()
        {
            return;
        }
    }
    panic!("A's doorbell did not ring a second time");
}
