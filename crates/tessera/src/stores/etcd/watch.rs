//! The waiters' watches: each waiter of this backend watches exactly what can let it in
//! (see the [store's docs](super)), and a watch event wakes only that waiter
//! ([`crate::wake::notify`]), whose next heartbeat re-reads the semaphore and decides.
//!
//! A watch starts at the revision after the snapshot its waiter decided on, so nothing
//! that happened between the read and the watch is missed. etcd-client does not re-establish
//! a watch: when a watch stream ends for any reason (the connection dropped, the member
//! went away, the start revision was compacted, the server cancelled it) the waiter is
//! woken, and its heartbeat reads the semaphore afresh and sets a new watch from that read's
//! revision. A compacted revision therefore costs one extra read, never a lost wake-up.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use etcd_client::{Client, WatchFilterType, WatchOptions};
use tokio::task::JoinHandle;

use crate::model::LeaseId;
use crate::wake;

/// What a waiter watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Target {
    /// The head of the queue: every deletion of a `q/` key (a holder leaving frees
    /// permits) and the capacity key (a resize).
    Head { queue: String, cap: String },
    /// Behind another waiter: that waiter's key (granted: this one may be the head now;
    /// deleted: this one moved up).
    Behind(String),
}

struct Watch {
    target: Target,
    generation: u64,
    task: JoinHandle<()>,
}

/// The watches of one backend's waiters, by lease id.
pub(super) struct Watches {
    client: Client,
    map: Mutex<(u64, HashMap<LeaseId, Watch>)>,
}

impl Watches {
    pub(super) fn new(client: Client) -> Arc<Watches> {
        Arc::new(Watches {
            client,
            map: Mutex::new((0, HashMap::new())),
        })
    }

    /// Makes `id` watch `target` from revision `from` on, unless it already watches it (a
    /// running watch of the same target started earlier, so it misses nothing either).
    pub(super) fn set(self: &Arc<Self>, id: LeaseId, target: Target, from: i64) {
        let mut map = self.map.lock().unwrap();
        if let Some(w) = map.1.get(&id) {
            if w.target == target && !w.task.is_finished() {
                return;
            }
            w.task.abort();
        }
        map.0 += 1;
        let generation = map.0;
        let task = tokio::spawn(run(
            Arc::downgrade(self),
            self.client.clone(),
            id,
            target.clone(),
            from,
            generation,
        ));
        map.1.insert(
            id,
            Watch {
                target,
                generation,
                task,
            },
        );
    }

    /// `id` no longer waits.
    pub(super) fn stop(&self, id: LeaseId) {
        if let Some(w) = self.map.lock().unwrap().1.remove(&id) {
            w.task.abort();
        }
    }

    pub(super) fn stop_all(&self) {
        for (_, w) in self.map.lock().unwrap().1.drain() {
            w.task.abort();
        }
    }

    #[cfg(test)]
    pub(super) fn target(&self, id: LeaseId) -> Option<Target> {
        self.map
            .lock()
            .unwrap()
            .1
            .get(&id)
            .map(|w| w.target.clone())
    }
}

async fn run(
    watches: Weak<Watches>,
    mut client: Client,
    id: LeaseId,
    target: Target,
    from: i64,
    generation: u64,
) {
    let outcome: Result<(), etcd_client::Error> = async {
        let (key, options) = match &target {
            Target::Head { queue, .. } => (
                queue.clone(),
                WatchOptions::new()
                    .with_prefix()
                    .with_filters([WatchFilterType::NoPut]),
            ),
            Target::Behind(key) => (key.clone(), WatchOptions::new()),
        };
        let mut stream = client
            .watch(key, Some(options.with_start_revision(from)))
            .await?;
        if let Target::Head { cap, .. } = &target {
            let options = WatchOptions::new().with_start_revision(from);
            stream.watch(cap.clone(), Some(options)).await?;
        }
        while let Some(resp) = stream.message().await? {
            if resp.canceled() || resp.compact_revision() > 0 {
                // Cancelled by the server, or our start revision is compacted: re-read.
                return Ok(());
            }
            if !resp.events().is_empty() {
                wake::notify(id);
            }
        }
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        tracing::debug!(lease = %id, error = %e, "etcd watch ended");
    }
    // The watch ended: forget it (unless a newer one replaced it) and wake the waiter, whose
    // heartbeat reads the semaphore again and sets a new watch.
    if let Some(w) = watches.upgrade() {
        let mut map = w.map.lock().unwrap();
        if map.1.get(&id).is_some_and(|w| w.generation == generation) {
            map.1.remove(&id);
        }
    }
    wake::notify(id);
}
