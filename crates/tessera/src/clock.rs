//! The clock of stores whose clock is the host's (memory, SQLite). Injected, so logic tests
//! can move time by hand instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::model::StoreTime;

/// A source of store time.
pub trait Clock: Send + Sync + std::fmt::Debug + 'static {
    /// The current time.
    fn now(&self) -> StoreTime;
}

/// The host's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> StoreTime {
        StoreTime::host_now()
    }
}

/// A clock that moves only when told to.
#[derive(Debug)]
pub struct ManualClock(AtomicU64);

impl ManualClock {
    /// Starts at `start`.
    pub fn new(start: StoreTime) -> Self {
        ManualClock(AtomicU64::new(start.0))
    }
    /// Moves the clock forward.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(d.as_micros() as u64, Ordering::SeqCst);
    }
    /// Sets the clock, also backwards (a clock jump).
    pub fn set(&self, t: StoreTime) {
        self.0.store(t.0, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> StoreTime {
        StoreTime(self.0.load(Ordering::SeqCst))
    }
}
