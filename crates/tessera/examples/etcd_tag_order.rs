//! What ordering etcd's queue by start tags would cost (`docs/fair-shares.md`, "etcd").
//!
//! tessera's etcd queue is ordered by each waiter key's create revision: an enqueue is one
//! `put` that never conflicts with another, and every waiter watches the key just before its
//! own. Ordering by start-time fair queueing instead needs each newcomer's tag, computed from
//! the queue's virtual time `V` and its tenant's last finish tag, written in the same
//! transaction as its waiter key (so the tag is in the key and the order is the keys'):
//! a read of the tags' key, then a transaction that compares its revision and writes the new
//! finish tag and the waiter key, retried when another arrival wrote the tags first.
//!
//! This measures both on a throwaway one-member etcd, `C` clients enqueueing `N` waiters in
//! all: enqueues per second, and round trips per enqueue of the tag order. Not a test:
//! figures go to `docs/fair-shares.md`.
//!
//! ```sh
//! cargo run --release -p tessera-locks --features etcd --example etcd_tag_order -- [N]
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use etcd_client::{Client, Compare, CompareOp, Txn, TxnOp};
use tessera_testkit::servers::etcd::EtcdCluster;

#[tokio::main]
async fn main() -> Result<(), etcd_client::Error> {
    let n: u64 = std::env::args()
        .nth(1)
        .map_or(2_000, |s| s.parse().expect("N"));
    let etcd = EtcdCluster::start(1);
    let endpoint = format!("127.0.0.1:{}", etcd.client_port(0));
    println!("etcd {endpoint}, {n} enqueues per case");
    println!("clients  order        enqueues/s  round trips per enqueue");
    for clients in [1u64, 8, 32] {
        for tagged in [false, true] {
            let prefix = format!("q{clients}{}", if tagged { "t" } else { "r" });
            let trips = Arc::new(AtomicU64::new(0));
            let started = Instant::now();
            let mut tasks = Vec::new();
            for c in 0..clients {
                let (endpoint, prefix, trips) = (endpoint.clone(), prefix.clone(), trips.clone());
                let each = n / clients;
                tasks.push(tokio::spawn(async move {
                    let mut client = Client::connect([endpoint], None).await?;
                    for i in 0..each {
                        let key = format!("{prefix}/w/{c}-{i}");
                        if tagged {
                            enqueue_tagged(&mut client, &prefix, &key, &trips).await?;
                        } else {
                            client.put(key, "", None).await?;
                            trips.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok::<_, etcd_client::Error>(())
                }));
            }
            for t in tasks {
                t.await.expect("client task")?;
            }
            let secs = started.elapsed().as_secs_f64();
            let done = n / clients * clients;
            println!(
                "{clients:>7}  {:<11}  {:>10.0}  {:>23.2}",
                if tagged { "start tags" } else { "revisions" },
                done as f64 / secs,
                trips.load(Ordering::Relaxed) as f64 / done as f64
            );
        }
    }
    Ok(())
}

/// One tag-ordered enqueue: read the queue's tags (`V`, one tenant's finish tag, both in one
/// key here), then write the next tags and the waiter key in one transaction if nobody wrote
/// the tags meanwhile; else again.
async fn enqueue_tagged(
    client: &mut Client,
    prefix: &str,
    key: &str,
    trips: &AtomicU64,
) -> Result<(), etcd_client::Error> {
    let tags = format!("{prefix}/tags");
    loop {
        let got = client.get(tags.as_str(), None).await?;
        trips.fetch_add(1, Ordering::Relaxed);
        let (finish, revision) = match got.kvs().first() {
            Some(kv) => (
                std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0),
                kv.mod_revision(),
            ),
            None => (0, 0),
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                tags.as_str(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([
                TxnOp::put(tags.as_str(), (finish + 1000).to_string(), None),
                TxnOp::put(format!("{key}/{finish:020}"), "", None),
            ]);
        let done = client.txn(txn).await?;
        trips.fetch_add(1, Ordering::Relaxed);
        if done.succeeded() {
            return Ok(());
        }
    }
}
