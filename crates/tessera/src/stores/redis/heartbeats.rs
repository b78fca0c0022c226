//! Waiters' heartbeats, gathered per semaphore into one call of the heartbeat function, which
//! takes any number of (lease, waiter TTL) pairs (`scripts/heartbeat.lua`).
//!
//! Every waiter heartbeats once per third of its waiter TTL: one process with 10,000 waiters
//! on one semaphore (3 s waiter TTL) sent 10,000 calls a second, each a step of the
//! semaphore (load, purge, hand-off) for one queue entry. On a Redis Cluster on a machine
//! starved of CPU, heartbeats came late, waiters expired and queued again, and only 4,264 of
//! 10,000 waiters were in the queue 90 s after the process started (`tessera-chaos --store
//! redis+cluster --scenario s10-reclaim`). Through the shared [`Batcher`], a lone heartbeat
//! is sent at once; under load each call carries the heartbeats of one semaphore that arrived
//! while the previous one ran, at most [`HeartbeatMany::MAX`], so one step serves them all
//! and a call's work in Redis stays bounded (up to four commands per waiter). On the same
//! starved machine (16 busy loops beside the run), all 10,000 were then queued by 12 s.
//!
//! Each lease gets exactly the reply a heartbeat alone gets (checked by
//! `heartbeats_gathered_in_one_call_answer_as_each_alone` in `redis_store.rs`).

use std::sync::Arc;

use redis::Value;

use super::{ops, Caller};
use tessera_core::error::{Error, Result};
use tessera_core::model::{LeaseId, Name, WaitReply};
use tessera_core::stores::batch::{BatchCall, Batcher};

/// The heartbeats of this backend's waiters, by semaphore.
pub(super) type Heartbeats = Batcher<HeartbeatMany>;

/// One call of the heartbeat function: items are a lease and its waiter TTL in µs.
pub(super) struct HeartbeatMany(pub(super) Arc<Caller>);

impl BatchCall for HeartbeatMany {
    type Item = (LeaseId, u64);
    type Reply = WaitReply;
    /// As on the SQL stores. A call of 1,024 heartbeats runs about 4,000 commands in one
    /// step (a few ms in which Redis serves no one else), where 1,024 calls of one would run
    /// the step's own commands 1,024 times. With 128, one call per semaphore in flight
    /// carried too few: in the starved run above, 10 calls in 2 s renewed 1,280 of about
    /// 4,000 waiters, which expired and queued again.
    const MAX: usize = 1024;

    async fn call(&self, name: &str, items: &[(LeaseId, u64)]) -> Result<Vec<Result<WaitReply>>> {
        let name = Name::new(name)
            .map_err(|e| Error::Corrupt(format!("a gathered heartbeat's name: {e}")))?;
        let mut args = Vec::with_capacity(items.len() * 2);
        for (lease, ttl) in items {
            args.push(lease.to_string());
            args.push(ttl.to_string());
        }
        let v = self.0.run(ops::Op::Heartbeat, &name, &args).await?;
        let Value::Array(replies) = v else {
            return Err(Error::Corrupt(format!(
                "the heartbeat function answered {v:?} where it answers one reply per lease"
            )));
        };
        if replies.len() != items.len() {
            return Err(Error::Corrupt(format!(
                "the heartbeat function answered {} replies for {} leases",
                replies.len(),
                items.len()
            )));
        }
        // One step answered them all: the first `waiting` reply says when it may next
        // expire something.
        if let Some(after) = replies.iter().find_map(ops::expiry_in) {
            self.0.expiries.note(&name, after);
        }
        Ok(replies
            .into_iter()
            .zip(items)
            .map(|(reply, &(lease, _))| ops::parse_heartbeat(reply, lease))
            .collect())
    }
}
