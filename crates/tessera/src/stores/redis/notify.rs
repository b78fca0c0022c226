//! The wake-up subscriber: one task per backend on a dedicated pub/sub connection.
//!
//! Its shape, for any store that pushes wake-ups (a PostgreSQL `LISTEN` task can follow it):
//!
//! 1. `connect` spawns the task and waits for `ready`: no grant to this client is published
//!    before someone listens, and a refused subscription fails `connect`.
//! 2. Each message is a lease id, or a lease id with its grant: [`wake::notify`] or
//!    [`wake::notify_grant`].
//! 3. A ping every [`SUBSCRIBER_PING`] detects a dead connection that reports nothing.
//! 4. On a connection loss it reconnects with backoff, resubscribes, and wakes every waiter
//!    the backend has queued: wake-ups published during the gap are lost, so each waiter asks
//!    the store at once instead of at its next periodic heartbeat.
//! 5. On Sentinel, when the topology follows a failover, it subscribes again on the new
//!    master (and wakes every waiter, as after a connection loss).
//!
//! On a cluster ([`cluster_loop`]) wake-ups travel on sharded pub/sub: the scripts
//! `SPUBLISH` on `{<prefix>:<name>}:wake:<client id>`, in the semaphore's slot, and the
//! backend `SSUBSCRIBE`s to that channel on the cluster connection before its first acquire
//! on the name (so no grant is published before it listens). cluster-async subscribes again
//! after a disconnect or a slot move and reports the disconnect; the loop then wakes every
//! waiter.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use redis::{RedisError, Value};

use super::ops;
use super::topology::Topology;
use super::{CONNECT_TIMEOUT, RESPONSE_TIMEOUT};
use tessera_core::model::LeaseId;
use tessera_core::wake;

/// How often the subscriber checks that its connection is alive.
const SUBSCRIBER_PING: Duration = Duration::from_secs(10);

/// The wake-up subscriber: subscribes to this client's channel and calls
/// [`wake::notify`] for each lease id published on it; on a connection loss it reconnects
/// with backoff, resubscribes, and wakes every waiter of this backend (a wake-up published
/// during the gap is lost, so they ask the store themselves).
pub(super) async fn subscribe_loop(
    topo: Arc<Topology>,
    channel: String,
    waiting: Arc<Mutex<HashSet<LeaseId>>>,
    url: String,
    ready: tokio::sync::oneshot::Sender<redis::RedisResult<()>>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(20);
    // Reconnects that failed since the connection was lost (see the warning below).
    let mut failed: u32 = 0;
    loop {
        // Watch first: a failover after this line is seen by `changes` below.
        if ready.is_none() {
            // Again after a loss: on Sentinel, to a server the sentinels name.
            topo.ensure_master().await;
        }
        let mut changes = topo.watch();
        changes.borrow_and_update();
        let client = topo.client().expect("a cluster has its own loop");
        let subscribed = async {
            let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
                })??;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&channel).await?;
            Ok::<_, RedisError>((sink, stream))
        }
        .await;
        let (mut sink, mut stream) = match subscribed {
            Ok(s) => s,
            Err(e) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(e));
                    return;
                }
                // Once per outage: a retry a second for as long as the server is down
                // would bury everything else a program logs.
                if failed == 0 {
                    tracing::warn!(%url, error = %e, "wake-up subscriber: reconnect failed; retrying until it succeeds");
                } else {
                    tracing::debug!(%url, error = %e, "wake-up subscriber: reconnect failed; retrying");
                }
                failed += 1;
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        let after = std::mem::take(&mut failed);
        match ready.take() {
            Some(tx) => {
                let _ = tx.send(Ok(()));
            }
            None => {
                tracing::info!(%url, failed_attempts = after, "wake-up subscriber: resubscribed");
                let leases: Vec<LeaseId> = waiting.lock().unwrap().iter().copied().collect();
                for lease in leases {
                    wake::notify(lease);
                }
            }
        }
        let mut ping = tokio::time::interval(SUBSCRIBER_PING);
        ping.tick().await;
        loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => wake_from(msg.get_payload_bytes(), &waiting),
                    None => break,
                },
                _ = changes.changed() => {
                    tracing::info!(%url, "wake-up subscriber: the master changed; subscribing there");
                    break;
                }
                _ = ping.tick() => {
                    let alive = tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<Value>()).await;
                    if !matches!(alive, Ok(Ok(_))) {
                        break;
                    }
                }
            }
        }
        tracing::warn!(%url, "wake-up subscriber: connection lost; reconnecting");
    }
}

/// The wake-up loop of a cluster client: reads the pushes of the cluster connection (sharded
/// messages on this client's channels), and wakes every waiter of this backend when a node's
/// connection dropped (a wake-up may have been lost meanwhile).
pub(super) async fn cluster_loop(
    mut pushes: tokio::sync::mpsc::UnboundedReceiver<redis::PushInfo>,
    waiting: Arc<Mutex<HashSet<LeaseId>>>,
) {
    while let Some(push) = pushes.recv().await {
        match push.kind {
            redis::PushKind::SMessage => {
                let Some(Value::BulkString(payload)) = push.data.get(1) else {
                    continue;
                };
                wake_from(payload, &waiting);
            }
            redis::PushKind::Disconnection => {
                let leases: Vec<LeaseId> = waiting.lock().unwrap().iter().copied().collect();
                for lease in leases {
                    wake::notify(lease);
                }
            }
            _ => {}
        }
    }
}

/// Wakes whoever a wake-up message names: the granted waiter (with its grant, and no longer
/// waited for here) or the holder of a revoked lease. A message that does not parse is
/// dropped (the waiter's heartbeat is the safety net).
fn wake_from(payload: &[u8], waiting: &Mutex<HashSet<LeaseId>>) {
    let payload = std::str::from_utf8(payload).unwrap_or("");
    match ops::parse_wake(payload) {
        Some((_, Some(grant))) => {
            waiting.lock().unwrap().remove(&grant.lease.lease_id);
            wake::notify_grant(grant);
        }
        Some((lease, None)) => wake::notify(lease),
        None => {}
    }
}
