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

/// The host's boot-relative monotonic clock (`CLOCK_BOOTTIME`, µs since boot): it never
/// jumps with the wall clock and keeps counting through a suspend. Every process on the host
/// reads the same value, so it is the SQLite store's clock (see `stores/sqlite`).
#[cfg(feature = "sqlite")]
#[derive(Debug, Default, Clone, Copy)]
pub struct BootClock;

#[cfg(feature = "sqlite")]
impl Clock for BootClock {
    fn now(&self) -> StoreTime {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `ts` is a valid, writable timespec.
            let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
            assert_eq!(rc, 0, "clock_gettime(CLOCK_BOOTTIME) failed");
            StoreTime(ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000)
        }
        // Elsewhere there is no boot clock shared by every process: the wall clock.
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        StoreTime::host_now()
    }
}

/// The identity of the running boot (`/proc/sys/kernel/random/boot_id`), as a number; `None`
/// where the kernel does not say.
#[cfg(feature = "sqlite")]
pub fn boot_id() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    u128::from_str_radix(&hex, 16).ok()
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
