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
//!   (an admission at the head whose permits fit: `window_at` of its queued reply), and
//! - for an admission, the least time its limits need to admit the cost of every waiter up
//!   to this one ([`windows_floor`]: `N` per period `P` admit the `k`-th unit from now no
//!   sooner than `⌊(k − 1) / N⌋ · P`), which a pace read over the first half second of a
//!   burst would miss.
//!
//! The first sample is the place the store gave when the waiter joined. Until the place has
//! moved once, the store named the windows' instant, or the limits alone say more than
//! nothing, the expected wait is unknown (`None`), never a guess. [`QueuePace`] and
//! [`windows_floor`] are the estimator, pure: they see only what they are given.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use tessera_core::model::{LeaseId, StoreTime};
use tessera_core::rate::seam::{LimitUsage, RateStatus};
use tessera_core::seam::Backend;

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

/// The least time the windows need, from `now`, to admit `units` more (the cost of every
/// waiter up to and including this one), from a snapshot of their usage. For a limit of
/// `N` per period `P` (enforced over `P` plus `margin`, the window `W`) that counts `u`
/// (used and reserved), the `j`-th unit counted from the window's oldest passes once unit
/// `j − N` has left the window: at once for `j ≤ N`; at the limit's next free instant at the
/// earliest while `j − N ≤ u` (a unit already counted); else one `W` after unit `j − N`
/// passed. A floor: the counted units are taken as leaving all at the first one's expiry.
pub fn windows_floor(
    units: u64,
    usage: &[LimitUsage],
    margin: Duration,
    now: StoreTime,
) -> Duration {
    usage
        .iter()
        .map(|l| {
            let n = u64::from(l.limit.count().max(1));
            let counted = l.used + l.reserved;
            let j = counted + units;
            // Steps of one window back from unit j, until it is within the first N or
            // behind a counted unit.
            let steps = j.saturating_sub(n + counted).div_ceil(n);
            let window =
                (l.limit.period() + margin).saturating_mul(steps.min(u64::from(u32::MAX)) as u32);
            match j - steps * n > n {
                true => l.next_free.since(now) + window,
                false => window,
            }
        })
        .max()
        .unwrap_or(Duration::ZERO)
}

/// A wait being watched: the lease id of its current attempt, its pace, the windows'
/// instant its store named, and where to publish.
pub(crate) struct Watch<'a> {
    tx: &'a watch::Sender<Option<QueuePlace>>,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    lease: Option<LeaseId>,
    pace: QueuePace,
    windows_at: Option<Instant>,
    /// An admission's cost, and its windows' last snapshot (for [`windows_floor`]).
    windows: Option<(u32, Option<Windows>)>,
}

/// What the windows counted at `now`.
struct Windows {
    usage: Vec<LimitUsage>,
    margin: Duration,
    now: StoreTime,
    /// When the snapshot was read, on this process's clock.
    read: Instant,
}

impl<'a> Watch<'a> {
    pub(crate) fn new(tx: &'a watch::Sender<Option<QueuePlace>>) -> Self {
        Watch {
            tx,
            state: Mutex::default(),
        }
    }

    /// A watch of an admission of `cost` under `limits`.
    /// A watch of an admission of `cost`: the floor of its windows counts once their usage
    /// has been read.
    pub(crate) fn with_windows(self, cost: u32) -> Self {
        self.lock().windows = Some((cost, None));
        self
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attempt now waits under `lease` (a new attempt starts its pace anew).
    pub(crate) fn waiting_as(&self, lease: LeaseId) {
        let mut s = self.lock();
        s.lease = Some(lease);
        s.pace = QueuePace::new();
        s.windows_at = None;
    }

    /// The store answered that this waiter is at `position` of `queued` (`None`: the answer
    /// does not say), and, for an admission at the head, when its windows admit it.
    pub(crate) fn queued(&self, position: u64, queued: Option<u64>, windows_at: Option<Instant>) {
        let mut s = self.lock();
        s.windows_at = windows_at;
        let queued = queued.or_else(|| {
            let last = *self.tx.borrow();
            last.map(|p| p.queued.max(position + 1))
        });
        self.publish(
            &mut s,
            Instant::now(),
            position,
            queued.unwrap_or(position + 1),
        );
    }

    fn publish(&self, s: &mut State, now: Instant, position: u64, queued: u64) {
        s.pace.record(now, position);
        let windows_in = s.windows_at.map(|t| t.saturating_duration_since(now));
        let paced = s.pace.expected_wait(windows_in);
        let floor = s
            .windows
            .as_ref()
            .and_then(|(cost, w)| Some((cost, w.as_ref()?)))
            .map(|(cost, w)| {
                let units = (position + 1) * u64::from(*cost);
                windows_floor(units, &w.usage, w.margin, w.now)
                    .saturating_sub(now.saturating_duration_since(w.read))
            })
            .filter(|f| !f.is_zero());
        let place = QueuePlace {
            position,
            queued,
            expected_wait: paced.max(floor),
        };
        self.tx.send_if_modified(|old| {
            let changed = *old != Some(place);
            *old = Some(place);
            changed
        });
    }

    /// Reads the place every [`READ_EVERY`] and publishes it; never returns (it is raced
    /// against the wait). A failed read publishes nothing: the wait itself reports faults.
    pub(crate) async fn run(
        &self,
        backend: &dyn Backend,
        name: &tessera_core::model::Name,
    ) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(READ_EVERY).await;
            let Some(lease) = self.lock().lease else {
                continue;
            };
            let Ok(Some(status)) = backend.status(name).await else {
                continue;
            };
            let admission = self.lock().windows.is_some();
            let windows = match (admission, backend.rate()) {
                (true, Some(rate)) => rate.rate_status(name).await.ok().flatten(),
                _ => None,
            };
            let Some(position) = status.queue.iter().position(|w| w.lease_id == lease) else {
                // Granted, or between attempts: the wait says which.
                continue;
            };
            let mut s = self.lock();
            if s.lease != Some(lease) {
                continue;
            }
            if let (Some((_, w)), Some(r)) = (&mut s.windows, windows) {
                let RateStatus {
                    limits,
                    margin,
                    now,
                    ..
                } = r;
                *w = Some(Windows {
                    usage: limits,
                    margin,
                    now,
                    read: Instant::now(),
                });
            }
            self.publish(
                &mut s,
                Instant::now(),
                position as u64,
                status.queue.len() as u64,
            );
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
    fn the_windows_floor_waits_for_the_next_free_instant_then_whole_windows() {
        let usage = |t: &str, used: u64, free_in_ms: u64| LimitUsage {
            limit: t.parse().unwrap(),
            used,
            reserved: 0,
            next_free: StoreTime(1_000_000 + free_in_ms * 1_000),
        };
        let now = StoreTime(1_000_000);
        let floor = |units, u: &[LimitUsage]| windows_floor(units, u, Duration::ZERO, now);
        // Room for them all: nothing to wait for.
        assert_eq!(floor(10, &[usage("10/s", 0, 0)]), Duration::ZERO);
        assert_eq!(floor(4, &[usage("10/s", 6, 0)]), Duration::ZERO);
        // Full: the first waits for the next free instant, the 11th one window more.
        assert_eq!(
            floor(1, &[usage("10/s", 10, 300)]),
            Duration::from_millis(300)
        );
        assert_eq!(
            floor(11, &[usage("10/s", 10, 300)]),
            Duration::from_millis(1_300)
        );
        // Idle, and more than a window's worth: whole windows (with the margin).
        assert_eq!(
            windows_floor(26, &[usage("10/s", 0, 0)], Duration::from_millis(20), now),
            Duration::from_millis(2_040)
        );
        // The slowest limit decides.
        assert_eq!(
            floor(26, &[usage("10/s", 0, 0), usage("20/min", 0, 0)]),
            Duration::from_secs(60)
        );
        assert_eq!(floor(26, &[]), Duration::ZERO);
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
