//! What every workload's clients share: the latency histogram and joining the client tasks
//! at the hard time bound.

use std::sync::atomic::{AtomicU64, Ordering};

use hdrhistogram::Histogram;
use tokio::time::Instant;

/// A latency histogram in microseconds, from 1 µs to an hour, 3 significant digits.
pub(super) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

/// Waits for every client task until `hard`, then aborts what still runs. A client that
/// panicked or had to be aborted counts as one error in `errors`.
pub(super) async fn join_clients<T>(
    tasks: Vec<tokio::task::JoinHandle<T>>,
    hard: Instant,
    errors: &AtomicU64,
) -> Vec<T> {
    let mut results = Vec::new();
    for t in tasks {
        let abort = t.abort_handle();
        match tokio::time::timeout_at(hard, t).await {
            Ok(Ok(r)) => results.push(r),
            Ok(Err(e)) => {
                errors.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "bench client panicked");
            }
            Err(_) => {
                abort.abort();
                errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    results
}
