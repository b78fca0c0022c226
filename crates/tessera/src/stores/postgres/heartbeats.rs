//! Waiters' heartbeats, gathered per semaphore into one call (`sql/heartbeat_many.sql`).
//!
//! Every waiter heartbeats once per third of its waiter TTL. One call per heartbeat locked
//! the semaphore's row once per waiter, so one process with 10,000 waiters on one semaphore
//! (3 s waiter TTL) sent 10,000 calls a second through its [`POOL_SIZE`](super::conns::POOL_SIZE)
//! connections, all queued on that row, behind the enqueues still being sent: heartbeats
//! came late, their waiters expired and queued again, and 90 s after the process started
//! only 4,001 of its 10,000 waiters were in the queue (`tessera-chaos --store postgres
//! --scenario s10-reclaim`). Heartbeats now also take a connection of their own when the
//! operations' are all busy (`conns::KEEP_POOL_SIZE`).
//!
//! The heartbeats of one semaphore go through one queue of a [`Batcher`]: a lone heartbeat is
//! sent at once; under load, each call carries the heartbeats that arrived while the
//! previous one ran, at most [`MAX_BATCH`](tessera_core::stores::batch::MAX_BATCH), and at
//! most one call per semaphore is in flight.
//!
//! Each lease gets exactly the reply `tessera_heartbeat` gives it alone (checked by
//! `heartbeats_gathered_in_one_call_answer_as_each_alone` in `postgres_store.rs`).

use std::sync::Arc;

use sqlx::postgres::PgRow;

use super::conns::{keep_alive_rows, Conns};
use super::ops;
use tessera_core::error::{Error, Result};
use tessera_core::model::{LeaseId, Name, WaitReply};
use tessera_core::stores::batch::{BatchCall, Batcher};
use tessera_core::stores::expiries::Expiries;

/// The heartbeats of this backend's waiters, by semaphore.
pub(crate) type Heartbeats = Batcher<HeartbeatMany>;

/// One call of `tessera_heartbeat_many`: items are a lease and its waiter TTL in µs.
pub(crate) struct HeartbeatMany {
    pub(crate) conns: Arc<Conns>,
    pub(crate) keep: Arc<Conns>,
    pub(crate) url: String,
    pub(crate) expiries: Arc<Expiries>,
}

impl BatchCall for HeartbeatMany {
    type Item = (LeaseId, i64);
    type Reply = WaitReply;

    async fn call(&self, name: &str, items: &[(LeaseId, i64)]) -> Result<Vec<Result<WaitReply>>> {
        let leases: Vec<String> = items.iter().map(|(lease, _)| lease.to_string()).collect();
        let ttls: Vec<i64> = items.iter().map(|&(_, ttl)| ttl).collect();
        let rows = keep_alive_rows(&self.conns, &self.keep, &self.url, || {
            sqlx::query(ops::HEARTBEAT_MANY)
                .bind(name)
                .bind(&leases)
                .bind(&ttls)
        })
        .await?;
        if rows.len() != items.len() {
            return Err(Error::Corrupt(format!(
                "tessera_heartbeat_many answered {} rows for {} leases",
                rows.len(),
                items.len()
            )));
        }
        // One step answered them all: a `waiting` row says when it may next expire something.
        if let Some(after) = rows.iter().find_map(ops::expiry_in) {
            if let Ok(name) = Name::new(name) {
                self.expiries.note(&name, after);
            }
        }
        Ok(rows
            .iter()
            .zip(items)
            .map(|(row, &(lease, _))| parse_row(row, lease))
            .collect())
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
