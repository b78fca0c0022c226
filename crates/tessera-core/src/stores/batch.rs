//! Calls gathered per key: the waiters' heartbeats of one semaphore go to the server together
//! (PostgreSQL, MySQL and Redis, each in its `heartbeats.rs`).
//!
//! Every waiter heartbeats once per third of its waiter TTL, and a heartbeat is a step on its
//! semaphore (on the SQL stores it locks the semaphore's row). One call per heartbeat, with
//! 10,000 waiters of one process on one semaphore (3 s waiter TTL), is 10,000 calls a second
//! queued on that row and on the process's few connections: heartbeats came late, their
//! waiters expired and queued again, and the queue never filled (`tessera-chaos --scenario
//! s10-reclaim`; on a Redis Cluster on a starved machine, 4,264 of 10,000 in 90 s).
//!
//! Here the items of one key go through one queue. The first item that finds no call of its
//! key running starts a task that sends the queue as one call (at most [`BatchCall::MAX`] items)
//! and keeps sending while items arrived meanwhile; then it ends. A lone item is sent at
//! once; under load, each call carries the items that arrived while the previous one ran,
//! and at most one call per key is in flight. The task, not the caller, sends the call: an
//! item whose caller gives up (a timeout, a cancelled acquire) never strands the others
//! queued with it.
//!
//! Each item gets its own reply from the call, in order. An error of the whole call reaches
//! every item it carried, as the same error; a call that answers another number of replies
//! than it carried items is [`Error::Corrupt`] for each of them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::error::{Error, Result, StoreErrorKind};

/// The most items one call carries, unless the call says fewer.
pub const MAX_BATCH: usize = 1024;

/// The call that carries the items of one key.
pub trait BatchCall: Send + Sync + 'static {
    type Item: Send + 'static;
    type Reply: Send + 'static;
    /// The most items one call carries.
    const MAX: usize = MAX_BATCH;

    /// Sends `items` (1 to [`BatchCall::MAX`]) of `key` in one call; one reply per item, in
    /// order.
    fn call(
        &self,
        key: &str,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Vec<Result<Self::Reply>>>> + Send;
}

type Queue<C> = Vec<(
    <C as BatchCall>::Item,
    oneshot::Sender<Result<<C as BatchCall>::Reply>>,
)>;

/// The queues, by key; a key is present while its task runs.
pub struct Batcher<C: BatchCall> {
    call: C,
    queues: Mutex<HashMap<String, Queue<C>>>,
    /// Calls sent (for tests).
    calls: AtomicU64,
}

impl<C: BatchCall> Batcher<C> {
    pub fn new(call: C) -> Arc<Self> {
        Arc::new(Batcher {
            call,
            queues: Mutex::default(),
            calls: AtomicU64::new(0),
        })
    }

    /// How many calls were sent so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }

    /// Queues `item` on `key` and waits for its reply.
    pub async fn send(self: &Arc<Self>, key: &str, item: C::Item) -> Result<C::Reply> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap();
            match queues.get_mut(key) {
                Some(queue) => {
                    queue.push((item, tx));
                    false
                }
                None => {
                    queues.insert(key.to_string(), vec![(item, tx)]);
                    true
                }
            }
        };
        if start {
            let (me, key) = (self.clone(), key.to_string());
            tokio::spawn(async move {
                let mut guard = Draining {
                    batcher: &me,
                    key: &key,
                    done: false,
                };
                guard.run().await
            });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::store(
                StoreErrorKind::Connection,
                "the task sending the call ended without a reply (its runtime shut down)",
            ))
        })
    }
}

/// The task that sends the queue of one key. Dropped before the queue is empty (its runtime
/// shut down), it removes the queue, so that the items waiting in it fail rather than wait
/// forever, and the next item starts a new task.
struct Draining<'a, C: BatchCall> {
    batcher: &'a Batcher<C>,
    key: &'a str,
    /// The task removed the queue itself (another task may own a new one by now).
    done: bool,
}

impl<C: BatchCall> Drop for Draining<'_, C> {
    fn drop(&mut self) {
        if !self.done {
            if let Ok(mut queues) = self.batcher.queues.lock() {
                queues.remove(self.key);
            }
        }
    }
}

impl<C: BatchCall> Draining<'_, C> {
    /// Sends the queue until it is empty, then removes it (under the lock, so an item queued
    /// after the last call starts a new task).
    async fn run(&mut self) {
        let (key, batcher) = (self.key, self.batcher);
        loop {
            let (items, replies): (Vec<C::Item>, Vec<_>) = {
                let mut queues = batcher.queues.lock().unwrap();
                let Some(queue) = queues.get_mut(key) else {
                    self.done = true;
                    return;
                };
                if queue.is_empty() {
                    queues.remove(key);
                    self.done = true;
                    return;
                }
                let n = queue.len().min(C::MAX);
                queue.drain(..n).unzip()
            };
            batcher.calls.fetch_add(1, Ordering::Relaxed);
            match batcher.call.call(key, &items).await {
                Ok(answers) if answers.len() == replies.len() => {
                    for (reply, answer) in replies.into_iter().zip(answers) {
                        let _ = reply.send(answer);
                    }
                }
                Ok(answers) => {
                    let msg = format!(
                        "a batched call answered {} replies for {} items",
                        answers.len(),
                        replies.len()
                    );
                    for reply in replies {
                        let _ = reply.send(Err(Error::Corrupt(msg.clone())));
                    }
                }
                Err(e) => {
                    for reply in replies {
                        let _ = reply.send(Err(copy(&e)));
                    }
                }
            }
        }
    }
}

/// The same error again, for each item of a failed call.
fn copy(e: &Error) -> Error {
    match e {
        Error::Store { kind, message } => Error::store(*kind, message.clone()),
        Error::Corrupt(msg) => Error::Corrupt(msg.clone()),
        other => Error::store(StoreErrorKind::Other, other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Answers each item with itself times ten, after a pause, recording each call's size;
    /// an item 0 fails the whole call.
    struct Echo(Mutex<Vec<usize>>);

    impl BatchCall for Arc<Echo> {
        type Item = u32;
        type Reply = u32;
        async fn call(&self, _key: &str, items: &[u32]) -> Result<Vec<Result<u32>>> {
            self.0.lock().unwrap().push(items.len());
            tokio::time::sleep(Duration::from_millis(20)).await;
            if items.contains(&0) {
                return Err(Error::store(StoreErrorKind::Busy, "item 0"));
            }
            Ok(items.iter().map(|i| Ok(i * 10)).collect())
        }
    }

    #[tokio::test]
    async fn items_arriving_during_a_call_go_together_in_the_next_and_each_gets_its_reply() {
        let echo = Arc::new(Echo(Mutex::default()));
        let batcher = Batcher::new(echo.clone());
        let tasks: Vec<_> = (1..=50u32)
            .map(|i| {
                let b = batcher.clone();
                tokio::spawn(async move { (i, b.send("a", i).await) })
            })
            .collect();
        for t in tasks {
            let (i, reply) = t.await.unwrap();
            assert_eq!(reply.unwrap(), i * 10);
        }
        let sizes = echo.0.lock().unwrap().clone();
        assert_eq!(sizes.iter().sum::<usize>(), 50, "{sizes:?}");
        assert!(
            sizes.len() <= 5,
            "50 items in {} calls: {sizes:?}",
            sizes.len()
        );
        assert_eq!(batcher.calls(), sizes.len() as u64);
        // A lone item is one call of one, and the queue is gone once answered.
        assert_eq!(batcher.send("b", 7).await.unwrap(), 70);
        assert_eq!(*echo.0.lock().unwrap().last().unwrap(), 1);
        assert!(batcher.queues.lock().unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_failed_call_fails_every_item_it_carried_and_no_other() {
        let echo = Arc::new(Echo(Mutex::default()));
        let batcher = Batcher::new(echo.clone());
        // The first call carries item 1 alone; 0 and 2 arrive during it and fail together.
        let first = tokio::spawn({
            let b = batcher.clone();
            async move { b.send("k", 1).await }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let (zero, two) = tokio::join!(batcher.send("k", 0), batcher.send("k", 2));
        assert_eq!(first.await.unwrap().unwrap(), 10);
        assert!(matches!(
            zero,
            Err(Error::Store {
                kind: StoreErrorKind::Busy,
                ..
            })
        ));
        assert!(matches!(
            two,
            Err(Error::Store {
                kind: StoreErrorKind::Busy,
                ..
            })
        ));
        assert_eq!(*echo.0.lock().unwrap(), vec![1, 2]);
    }

    #[test]
    fn a_task_dropped_with_its_runtime_fails_its_items_and_the_next_starts_anew() {
        let echo = Arc::new(Echo(Mutex::default()));
        let batcher = Batcher::new(echo.clone());
        {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            let b = batcher.clone();
            let waiting = rt.spawn(async move { b.send("k", 3).await });
            rt.block_on(async { tokio::time::sleep(Duration::from_millis(5)).await });
            drop(rt);
            drop(waiting);
        }
        assert!(batcher.queues.lock().unwrap().is_empty());
        let rt = tokio::runtime::Runtime::new().unwrap();
        assert_eq!(rt.block_on(batcher.send("k", 4)).unwrap(), 40);
    }
}
