//! How long a refused acquire should wait before it asks again: the `Retry-After` of a
//! `queue_full` answer.
//!
//! A status snapshot cannot say when a place in the queue frees up (live holders keep
//! renewing; a lease's expiry is only its latest bound), so the server measures the pace of
//! each queue instead. Every acquire that waits through this server watches its own place
//! (`tessera::QueuePlace`, read every `tessera::READ_EVERY`), which gives, once the place has
//! moved, the time one hand-off took (its expected wait over the hand-offs it still needs).
//! [`Paces`] keeps the latest such figure per semaphore name; a `queue_full` answer for that
//! name says to retry after it (the time for one place to free), at least [`MIN_RETRY`] and
//! at most [`MAX_RETRY`], and after [`MIN_RETRY`] when no waiter measured a pace within the
//! last [`tessera::PACE_WINDOW`] (no waiter through this server, or a queue that has not
//! moved).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tessera::QueuePlace;
use tokio::sync::watch;
use tokio::time::Instant;

use super::error::{ApiError, QUEUE_FULL};

/// The shortest `Retry-After` of a full queue, and the answer when no pace is known.
pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// The longest `Retry-After` of a full queue: a queue slower than this is worth a look
/// sooner than it would free a place.
pub const MAX_RETRY: Duration = Duration::from_secs(30);
/// Names whose pace is kept; above it, the stalest figures go first.
const MAX_NAMES: usize = 4096;

/// The latest time one hand-off took, per semaphore name (see the module docs).
#[derive(Debug, Default)]
pub struct Paces {
    by_name: Mutex<HashMap<String, Measured>>,
}

#[derive(Debug, Clone, Copy)]
struct Measured {
    per_hand_off: Duration,
    at: Instant,
}

impl Paces {
    /// Records that at `at` a waiter of `name` measured `per_hand_off`.
    pub fn record(&self, name: &str, per_hand_off: Duration, at: Instant) {
        let mut by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        if by_name.len() >= MAX_NAMES && !by_name.contains_key(name) {
            by_name.retain(|_, m| at.saturating_duration_since(m.at) <= tessera::PACE_WINDOW);
            if by_name.len() >= MAX_NAMES {
                let stalest = by_name
                    .iter()
                    .min_by_key(|(_, m)| m.at)
                    .map(|(n, _)| n.clone());
                if let Some(n) = stalest {
                    by_name.remove(&n);
                }
            }
        }
        by_name.insert(name.to_string(), Measured { per_hand_off, at });
    }

    /// The `Retry-After` of a `queue_full` answer for `name` at `now`: the last pace measured
    /// within [`tessera::PACE_WINDOW`], between [`MIN_RETRY`] and [`MAX_RETRY`]; else
    /// [`MIN_RETRY`].
    pub fn retry_after(&self, name: &str, now: Instant) -> Duration {
        let by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        by_name
            .get(name)
            .filter(|m| now.saturating_duration_since(m.at) <= tessera::PACE_WINDOW)
            .map_or(MIN_RETRY, |m| m.per_hand_off.clamp(MIN_RETRY, MAX_RETRY))
    }

    /// `e` with, if it is a `queue_full` answer for `name`, the `Retry-After` of
    /// [`Paces::retry_after`].
    pub fn paced(&self, name: &str, mut e: ApiError) -> ApiError {
        if e.kind == QUEUE_FULL {
            e.retry_after = Some(self.retry_after(name, Instant::now()));
        }
        e
    }

    /// Records the pace each place published on `places` gives, for as long as the wait
    /// runs (it never returns: race it against the wait).
    pub async fn follow(
        &self,
        name: &str,
        mut places: watch::Receiver<Option<QueuePlace>>,
    ) -> std::convert::Infallible {
        loop {
            if places.changed().await.is_err() {
                // The wait is over (its sender dropped): nothing more to learn.
                std::future::pending::<()>().await;
            }
            let place = *places.borrow_and_update();
            if let Some(per) = place.and_then(|p| per_hand_off(p.position, p.expected_wait)) {
                self.record(name, per, Instant::now());
            }
        }
    }
}

/// The time one hand-off took, from a waiter's place: its expected wait over the hand-offs
/// it still needs (its 0-based `position`, plus one). `None` while the wait is unknown.
fn per_hand_off(position: u64, expected_wait: Option<Duration>) -> Option<Duration> {
    let hand_offs = u32::try_from(position.saturating_add(1)).unwrap_or(u32::MAX);
    Some(expected_wait? / hand_offs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_is_retried_after_one_hand_off_at_the_measured_pace() {
        let paces = Paces::default();
        let t0 = Instant::now();
        // Nothing measured: one second.
        assert_eq!(paces.retry_after("q", t0), MIN_RETRY);
        paces.record("q", Duration::from_millis(4_200), t0);
        assert_eq!(paces.retry_after("q", t0), Duration::from_millis(4_200));
        // Other names keep their own pace.
        assert_eq!(paces.retry_after("other", t0), MIN_RETRY);
        // At least a second, at most MAX_RETRY.
        paces.record("fast", Duration::from_millis(20), t0);
        assert_eq!(paces.retry_after("fast", t0), MIN_RETRY);
        paces.record("slow", Duration::from_secs(600), t0);
        assert_eq!(paces.retry_after("slow", t0), MAX_RETRY);
        // A pace older than the pace window is forgotten.
        let later = t0 + tessera::PACE_WINDOW + Duration::from_secs(1);
        assert_eq!(paces.retry_after("q", later), MIN_RETRY);
    }

    #[test]
    fn the_pace_of_a_place_is_its_expected_wait_per_hand_off_left() {
        let ms = |ms| Some(Duration::from_millis(ms));
        assert_eq!(per_hand_off(0, ms(700)), ms(700));
        assert_eq!(per_hand_off(3, ms(2_000)), ms(500));
        assert_eq!(per_hand_off(3, None), None);
    }

    #[test]
    fn the_names_kept_are_bounded() {
        let paces = Paces::default();
        let t0 = Instant::now();
        for i in 0..MAX_NAMES + 10 {
            let at = t0 + Duration::from_millis(i as u64);
            paces.record(&format!("n{i}"), Duration::from_secs(2), at);
        }
        let kept = paces.by_name.lock().unwrap().len();
        assert_eq!(kept, MAX_NAMES);
        // The newest is kept, the oldest went.
        let now = t0 + Duration::from_secs(1);
        assert_eq!(
            paces.retry_after(&format!("n{}", MAX_NAMES + 9), now),
            Duration::from_secs(2)
        );
        assert_eq!(paces.retry_after("n0", now), MIN_RETRY);
    }
}
