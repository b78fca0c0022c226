//! Waiters' heartbeats, gathered per semaphore into one call (`sql/heartbeat_many.sql`).
//!
//! Every waiter heartbeats once per third of its waiter TTL. One call per heartbeat locks the
//! semaphore's row once per waiter, so one process with 10,000 waiters on one semaphore (3 s
//! waiter TTL) sent 10,000 calls a second through its [`POOL_SIZE`](super::POOL_SIZE)
//! connections, all queued on that row, behind the enqueues still being sent: heartbeats
//! came late, their waiters expired and queued again, and 90 s after the process started
//! only 4,001 of its 10,000 waiters were in the queue (`tessera-chaos --store postgres
//! --scenario s10-reclaim`). Heartbeats now also take a connection of their own when the
//! operations' are all busy (`super::KEEP_POOL_SIZE`).
//!
//! Here the heartbeats of one semaphore go through one queue. The first heartbeat that finds
//! no call of its semaphore running starts a task that sends the queue as one call (at most
//! [`MAX_BATCH`] leases) and keeps sending while heartbeats arrived meanwhile; then it ends.
//! A lone heartbeat is sent at once, as before; under load, each call carries the heartbeats
//! that arrived while the previous one ran, and at most one call per semaphore is in flight.
//! The task, not the caller, sends the call: a heartbeat whose caller gives up (a timeout, a
//! cancelled acquire) never strands the others queued with it.
//!
//! Each lease gets exactly the reply `tessera_heartbeat` gives it alone (checked by
//! `heartbeats_gathered_in_one_call_answer_as_each_alone` in `postgres_store.rs`). An error
//! of the call reaches every heartbeat it carried, as the same error.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use sqlx::postgres::PgRow;
use tokio::sync::oneshot;

use super::{keep_alive_conn, ops, run_rows, Conns};
use crate::error::{Error, Result, StoreErrorKind};
use crate::model::{LeaseId, WaitReply};

/// The most leases one call carries.
pub(crate) const MAX_BATCH: usize = 1024;

/// One waiting heartbeat: its lease, its waiter TTL in µs, and where its reply goes.
struct Pending {
    lease: LeaseId,
    ttl_us: i64,
    reply: oneshot::Sender<Result<WaitReply>>,
}

/// The queues, by semaphore name; a name is present while its task runs.
#[derive(Default)]
pub(crate) struct Heartbeats {
    queues: Mutex<HashMap<String, Vec<Pending>>>,
    /// Calls sent (for tests).
    calls: AtomicU64,
}

impl Heartbeats {
    /// How many calls carried heartbeats so far.
    pub(crate) fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Queues the heartbeat of `lease` on `name` and waits for its reply.
    pub(crate) async fn send(
        self: &Arc<Self>,
        conns: &Arc<Conns>,
        keep: &Arc<Conns>,
        url: &str,
        name: &str,
        lease: LeaseId,
        ttl_us: i64,
    ) -> Result<WaitReply> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap();
            let pending = Pending {
                lease,
                ttl_us,
                reply: tx,
            };
            match queues.get_mut(name) {
                Some(queue) => {
                    queue.push(pending);
                    false
                }
                None => {
                    queues.insert(name.to_string(), vec![pending]);
                    true
                }
            }
        };
        if start {
            let (me, conns, keep) = (self.clone(), conns.clone(), keep.clone());
            let (url, name) = (url.to_string(), name.to_string());
            tokio::spawn(async move {
                let mut guard = Draining {
                    heartbeats: &me,
                    name: &name,
                    done: false,
                };
                guard.run(&conns, &keep, &url).await
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::store(
                StoreErrorKind::Connection,
                "the heartbeat task ended without a reply (its runtime shut down)",
            ))
        })
    }
}

/// The task that sends the queue of one semaphore. Dropped before the queue is empty (its
/// runtime shut down), it removes the queue, so that the heartbeats waiting in it fail
/// rather than wait forever, and the next heartbeat starts a new task.
struct Draining<'a> {
    heartbeats: &'a Heartbeats,
    name: &'a str,
    /// The task removed the queue itself (another task may own a new one by now).
    done: bool,
}

impl Drop for Draining<'_> {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut queues) = self.heartbeats.queues.lock() {
                queues.remove(self.name);
            }
        }
    }
}

impl Draining<'_> {
    /// Sends the queue until it is empty, then removes it (under the lock, so a heartbeat
    /// queued after the last call starts a new task).
    async fn run(&mut self, conns: &Conns, keep: &Conns, url: &str) {
        let (name, heartbeats) = (self.name, self.heartbeats);
        loop {
            let batch: Vec<Pending> = {
                let mut queues = heartbeats.queues.lock().unwrap();
                let Some(queue) = queues.get_mut(name) else {
                    self.done = true;
                    return;
                };
                if queue.is_empty() {
                    queues.remove(name);
                    self.done = true;
                    return;
                }
                let n = queue.len().min(MAX_BATCH);
                queue.drain(..n).collect()
            };
            heartbeats.calls.fetch_add(1, Ordering::Relaxed);
            let leases: Vec<String> = batch.iter().map(|p| p.lease.to_string()).collect();
            let ttls: Vec<i64> = batch.iter().map(|p| p.ttl_us).collect();
            let rows = match keep_alive_conn(conns, keep).await {
                Ok(conn) => {
                    let query = sqlx::query(ops::HEARTBEAT_MANY)
                        .bind(name)
                        .bind(&leases)
                        .bind(&ttls);
                    run_rows(conn, url, query).await
                }
                Err(e) => Err(e),
            };
            match rows {
                Ok(rows) if rows.len() == batch.len() => {
                    for (p, row) in batch.into_iter().zip(rows.iter()) {
                        let _ = p.reply.send(parse_row(row, p.lease));
                    }
                }
                Ok(rows) => {
                    let msg = format!(
                        "tessera_heartbeat_many answered {} rows for {} leases",
                        rows.len(),
                        batch.len()
                    );
                    for p in batch {
                        let _ = p.reply.send(Err(Error::Corrupt(msg.clone())));
                    }
                }
                Err(e) => {
                    for p in batch {
                        let _ = p.reply.send(Err(copy(&e)));
                    }
                }
            }
        }
    }
}

/// One row of `tessera_heartbeat_many`: the lease it answers must be `lease`.
fn parse_row(row: &PgRow, lease: LeaseId) -> Result<WaitReply> {
    let id: Option<String> = sqlx::Row::try_get(row, "lease_id")
        .map_err(|e| Error::Corrupt(format!("column lease_id: {e}")))?;
    if id.as_deref() != Some(lease.to_string().as_str()) {
        return Err(Error::Corrupt(format!(
            "tessera_heartbeat_many answered for lease {id:?} in the place of {lease}"
        )));
    }
    ops::parse_heartbeat(row, lease)
}

/// The same error again, for each heartbeat of a failed call.
fn copy(e: &Error) -> Error {
    match e {
        Error::Store { kind, message } => Error::store(*kind, message.clone()),
        Error::Corrupt(msg) => Error::Corrupt(msg.clone()),
        other => Error::store(StoreErrorKind::Other, other.to_string()),
    }
}
