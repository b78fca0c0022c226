//! A waiter's place in the queue and its expected wait, for a caller that watches its own
//! wait ([`Semaphore::acquire_many_watching`](super::Semaphore::acquire_many_watching),
//! [`Admission::acquire_watching`](crate::Admission::acquire_watching), `tessera run`'s line,
//! `tessera serve`'s `waiting` events).
//!
//! **How the wait is estimated.** The store keeps no history of hand-offs (a released lease
//! leaves nothing), so the pace of the queue is measured by the waiter itself: the place it
//! reads (one status call every [`READ_EVERY`] while it waits) and how fast that place went
//! down over the last [`PACE_WINDOW`]. The expected wait is the larger of
//!
//! - the hand-offs still needed (the place, counted from 1 at the head) times the time one
//!   took at that pace, and
//! - the time until the rate windows next admit the head's cost, when the store said so
//!   (an admission at the head whose permits fit: `window_at` of its queued reply).
//!
//! Neither is known before the place has moved once or the store named the windows' instant:
//! until then the expected wait is unknown (`None`), never a guess. [`QueuePace`] is the
//! estimator, pure: it sees only the samples it is given.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::model::LeaseId;
use crate::seam::Backend;

/// How far back the pace of the queue is measured.
pub const PACE_WINDOW: Duration = Duration::from_secs(30);

/// How often a watched wait reads its place (one status call of the semaphore each time).
pub const READ_EVERY: Duration = Duration::from_millis(500);

/// Where a waiter stands, as a watched acquire publishes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuePlace {
    /// 0: the head of the queue.
    pub position: u64,
    /// Waiters in the queue, this one included.
    pub queued: u64,
    /// About how long from now until it is granted (see the module docs); `None` while
    /// unknown: its place has not moved yet and the store named no windows' instant.
    pub expected_wait: Option<Duration>,
}

/// The estimator: `(instant, position)` samples of one waiter over the last [`PACE_WINDOW`],
/// and the expected wait they give. Pure: it reads no clock.
#[derive(Debug, Clone, Default)]
pub struct QueuePace {
    samples: VecDeque<(Instant, u64)>,
}

impl QueuePace {
    /// An estimator with no samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that at `at` the waiter was at `position` (0: the head). A position that went
    /// up (a waiter rejoined ahead, or this one joined again at the tail) starts the pace
    /// anew.
    pub fn record(&mut self, at: Instant, position: u64) {
        if self.samples.back().is_some_and(|&(_, p)| position > p) {
            self.samples.clear();
        }
        self.samples.push_back((at, position));
        while self
            .samples
            .front()
            .is_some_and(|&(t, _)| at.saturating_duration_since(t) > PACE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// The time one hand-off took over the samples kept; `None` until the place went down.
    pub fn per_hand_off(&self) -> Option<Duration> {
        let (&(t0, first), &(t1, last)) = (self.samples.front()?, self.samples.back()?);
        if last >= first || t1 <= t0 {
            return None;
        }
        Some((t1 - t0).div_f64((first - last) as f64))
    }

    /// The expected wait from the last sample: the larger of the hand-offs still needed at
    /// the measured pace and `windows_in` (how long until the windows admit the head, when
    /// the store said so; then the head's permits fit, so no hand-off is needed). `None`
    /// when neither is known.
    pub fn expected_wait(&self, windows_in: Option<Duration>) -> Option<Duration> {
        if windows_in.is_some() {
            return windows_in;
        }
        let &(_, position) = self.samples.back()?;
        Some(self.per_hand_off()?.saturating_mul(position as u32 + 1))
    }
}

/// A wait being watched: the lease id of its current attempt, the windows' instant its
/// store named, and where to publish.
pub(crate) struct Watch<'a> {
    tx: &'a watch::Sender<Option<QueuePlace>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lease: Option<LeaseId>,
    windows_at: Option<Instant>,
}

impl<'a> Watch<'a> {
    pub(crate) fn new(tx: &'a watch::Sender<Option<QueuePlace>>) -> Self {
        Watch {
            tx,
            state: Mutex::default(),
        }
    }

    /// The attempt now waits under `lease`.
    pub(crate) fn waiting_as(&self, lease: LeaseId) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        s.lease = Some(lease);
        s.windows_at = None;
    }

    /// The store said when the windows admit the head (this waiter), or that they do not
    /// block it (`None`).
    pub(crate) fn windows_at(&self, at: Option<Instant>) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .windows_at = at;
    }

    /// Reads the place every [`READ_EVERY`] and publishes it; never returns (it is raced
    /// against the wait). A failed read publishes nothing: the wait itself reports faults.
    pub(crate) async fn run(
        &self,
        backend: &dyn Backend,
        name: &crate::model::Name,
    ) -> std::convert::Infallible {
        let mut pace = QueuePace::new();
        loop {
            tokio::time::sleep(READ_EVERY).await;
            let (lease, windows_at) = {
                let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                (s.lease, s.windows_at)
            };
            let Some(lease) = lease else { continue };
            let Ok(Some(status)) = backend.status(name).await else {
                continue;
            };
            let now = Instant::now();
            let Some(position) = status.queue.iter().position(|w| w.lease_id == lease) else {
                // Granted, or between attempts: the wait says which.
                continue;
            };
            pace.record(now, position as u64);
            let windows_in = windows_at.map(|t| t.saturating_duration_since(now));
            let place = QueuePlace {
                position: position as u64,
                queued: status.queue.len() as u64,
                expected_wait: pace.expected_wait(windows_in),
            };
            self.tx.send_replace(Some(place));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn nothing_is_expected_until_the_place_has_moved() {
        let base = Instant::now();
        let mut pace = QueuePace::new();
        assert_eq!(pace.expected_wait(None), None);
        pace.record(at(base, 0), 5);
        assert_eq!(pace.expected_wait(None), None);
        pace.record(at(base, 3_000), 5);
        assert_eq!(pace.expected_wait(None), None);
    }

    #[test]
    fn the_expected_wait_is_the_hand_offs_left_at_the_measured_pace() {
        let base = Instant::now();
        let mut pace = QueuePace::new();
        // 6 places in 3 s: half a second a hand-off; at place 3 (0-based), 4 hand-offs left.
        pace.record(at(base, 0), 9);
        pace.record(at(base, 1_000), 7);
        pace.record(at(base, 3_000), 3);
        assert_eq!(pace.per_hand_off(), Some(Duration::from_millis(500)));
        assert_eq!(pace.expected_wait(None), Some(Duration::from_secs(2)));
        // The head still needs one hand-off.
        pace.record(at(base, 4_500), 0);
        assert_eq!(pace.expected_wait(None), Some(Duration::from_millis(500)));
    }

    #[test]
    fn the_windows_instant_is_the_wait_of_a_head_whose_permits_fit() {
        let base = Instant::now();
        let mut pace = QueuePace::new();
        pace.record(at(base, 0), 0);
        let windows = Some(Duration::from_millis(700));
        assert_eq!(pace.expected_wait(windows), windows);
        pace.record(at(base, 0), 2);
        pace.record(at(base, 100), 0);
        assert_eq!(pace.expected_wait(windows), windows);
    }

    #[test]
    fn a_place_that_went_up_starts_the_pace_anew() {
        let base = Instant::now();
        let mut pace = QueuePace::new();
        pace.record(at(base, 0), 4);
        pace.record(at(base, 1_000), 2);
        pace.record(at(base, 2_000), 6);
        assert_eq!(pace.expected_wait(None), None);
        pace.record(at(base, 4_000), 5);
        assert_eq!(pace.expected_wait(None), Some(Duration::from_secs(12)));
    }

    #[test]
    fn the_pace_forgets_what_is_older_than_its_window() {
        let base = Instant::now();
        let mut pace = QueuePace::new();
        // Fast long ago, slow now: only the last 30 s count.
        pace.record(at(base, 0), 100);
        pace.record(at(base, 1_000), 50);
        pace.record(at(base, 40_000), 40);
        pace.record(at(base, 50_000), 39);
        assert_eq!(pace.per_hand_off(), Some(Duration::from_secs(10)));
    }
}
