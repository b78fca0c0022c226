//! What the benches share: the contended case's fan-out, the same for tokio's semaphore and
//! tessera's, so both sides of a comparison run the same harness.

use std::future::Future;

/// Runs `tasks` tasks on the current runtime, each calling `pair` (one acquire, a yield and a
/// release) `per_task` times, and waits for them all.
pub async fn contend<F, Fut>(tasks: u64, per_task: u64, pair: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let pair = pair.clone();
            tokio::spawn(async move {
                for _ in 0..per_task {
                    pair().await;
                }
            })
        })
        .collect();
    for h in handles {
        h.await.unwrap();
    }
}
