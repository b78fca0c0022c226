//! The machine's own pauses during a workload, measured beside it, and how many of the
//! workload's long waits they cover.
//!
//! A wait of 10–40 ms in a run whose hand-offs take 0.2 ms has two kinds of cause: the store
//! or tessera's protocol (a lost wake-up caught by a heartbeat, a retry, a slow script), or
//! the machine not running the benchmark at all for that long (the hypervisor running another
//! guest on its CPU, other processes taking both cores, a page-fault storm). The second kind
//! slows every round trip of the process at once, which is what W2's long waits on Redis look
//! like (`docs/performance.md`, "W2's max wait"). To tell them apart the benchmark runs, for
//! the length of each workload, a thread of its own outside the tokio runtime that asks to
//! sleep [`TICK`] over and over and records each time it woke more than [`RECORDED`] late (as
//! jHiccup does for the JVM): a *pause*, the interval in which that thread could not run. A
//! long wait (over [`LONG_WAIT`]) is *in a pause* when pauses cover at least half of it: the
//! process (or the whole machine) was not running for most of that wait, whatever the store
//! did. The hypervisor's share is read from `/proc/stat` (steal time, Linux only) over the
//! same interval.
//!
//! The figures are the benchmark's, never a test's: they explain a measurement, they do not
//! judge one.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How long the pause thread asks to sleep each time.
const TICK: Duration = Duration::from_millis(1);
/// A wake-up this much later than asked is recorded as a pause.
const RECORDED: Duration = Duration::from_millis(2);
/// A workload's wait longer than this is a long wait.
pub const LONG_WAIT: Duration = Duration::from_millis(10);
/// At most this many long waits of one run are kept (the rest are only counted).
const KEPT_WAITS: usize = 10_000;

/// The pause thread of one workload run; [`Pauses::finish`] stops it.
pub struct Pauses {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<(Instant, Duration)>>,
    steal_before: Option<u64>,
}

/// What the pause thread saw over one workload, and how it covers the long waits.
#[derive(Debug, Clone, Serialize)]
pub struct PauseFigures {
    /// The longest pause of the process, ms.
    pub max_ms: f64,
    /// Pauses of 5 ms or more.
    pub over_5ms: u64,
    /// Time the process could not run (every recorded pause), ms.
    pub total_ms: f64,
    /// The hypervisor's steal time over the run, summed over the CPUs, ms (Linux only).
    pub steal_ms: Option<f64>,
    /// Waits longer than 10 ms.
    pub long_waits: u64,
    /// Of those, the ones that pauses of the process cover at least half of.
    pub long_waits_in_pauses: u64,
}

impl Pauses {
    /// Starts the pause thread.
    pub fn start() -> Pauses {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("tessera-bench-pauses".into())
            .spawn(move || {
                let mut pauses = Vec::new();
                while !flag.load(Ordering::Relaxed) {
                    let asked = Instant::now();
                    std::thread::sleep(TICK);
                    let woke = Instant::now();
                    let late = woke.saturating_duration_since(asked + TICK);
                    if late >= RECORDED {
                        pauses.push((woke - late, late));
                    }
                }
                pauses
            })
            .expect("spawning the pause thread");
        Pauses {
            stop,
            thread,
            steal_before: steal_ticks(),
        }
    }

    /// Stops the thread and relates its pauses to the `waits` (start, length) of the run;
    /// `long_waits` counts every long wait, also those beyond the ones kept.
    pub fn finish(self, waits: &[(Instant, Duration)], long_waits: u64) -> PauseFigures {
        self.stop.store(true, Ordering::Relaxed);
        let pauses = self.thread.join().unwrap_or_default();
        let steal_ms = match (self.steal_before, steal_ticks()) {
            (Some(a), Some(b)) => Some(b.saturating_sub(a) as f64 * 1000.0 / USER_HZ),
            _ => None,
        };
        figures(&pauses, waits, long_waits, steal_ms)
    }
}

/// The figures of `pauses` (start, length, by start) against `waits`.
fn figures(
    pauses: &[(Instant, Duration)],
    waits: &[(Instant, Duration)],
    long_waits: u64,
    steal_ms: Option<f64>,
) -> PauseFigures {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let covered = |(start, len): (Instant, Duration)| -> Duration {
        let end = start + len;
        // Pauses are recorded in order and do not overlap (one thread, one sleep at a time).
        let first = pauses.partition_point(|&(p, l)| p + l <= start);
        pauses[first..]
            .iter()
            .take_while(|&&(p, _)| p < end)
            .map(|&(p, l)| (p + l).min(end).saturating_duration_since(p.max(start)))
            .sum()
    };
    PauseFigures {
        max_ms: pauses.iter().map(|&(_, l)| ms(l)).fold(0.0, f64::max),
        over_5ms: pauses
            .iter()
            .filter(|&&(_, l)| l >= Duration::from_millis(5))
            .count() as u64,
        total_ms: pauses.iter().map(|&(_, l)| ms(l)).sum(),
        steal_ms,
        long_waits,
        long_waits_in_pauses: waits.iter().filter(|&&w| covered(w) * 2 >= w.1).count() as u64,
    }
}

/// The long waits of the clients of one run, shared by them.
#[derive(Debug, Default)]
pub struct LongWaits {
    kept: Mutex<Vec<(Instant, Duration)>>,
    count: std::sync::atomic::AtomicU64,
}

impl LongWaits {
    /// Notes a wait that started at `start` and lasted `len`, if it is long.
    pub fn note(&self, start: Instant, len: Duration) {
        if len <= LONG_WAIT {
            return;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let mut kept = self.kept.lock().unwrap();
        if kept.len() < KEPT_WAITS {
            kept.push((start, len));
        }
    }

    /// The kept waits and the count of all of them.
    pub fn take(&self) -> (Vec<(Instant, Duration)>, u64) {
        (
            std::mem::take(&mut *self.kept.lock().unwrap()),
            self.count.load(Ordering::Relaxed),
        )
    }
}

/// The steal time of every CPU so far, in clock ticks (`/proc/stat`'s eighth field).
fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().next()?.strip_prefix("cpu ")?;
    cpu.split_whitespace().nth(7)?.parse().ok()
}

/// `/proc/stat`'s clock ticks per second (`USER_HZ`): 100 on every Linux architecture
/// tessera builds for.
const USER_HZ: f64 = 100.0;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_is_in_a_pause_when_pauses_cover_half_of_it() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let pauses = [
            (t + ms(10), ms(6)),
            (t + ms(20), ms(3)),
            (t + ms(100), ms(30)),
        ];
        let waits = [
            (t, ms(20)),           // covered 6 of 20: not in a pause
            (t + ms(5), ms(20)),   // 6 + 3 of 20: not
            (t + ms(95), ms(40)),  // 30 of 40: in a pause
            (t + ms(12), ms(8)),   // 4 of 8, half: in
            (t + ms(200), ms(20)), // none
        ];
        let f = figures(&pauses, &waits, 7, None);
        assert_eq!(f.long_waits, 7);
        assert_eq!(f.long_waits_in_pauses, 2);
        assert_eq!(f.over_5ms, 2);
        assert!((f.max_ms - 30.0).abs() < 1e-9);
        assert!((f.total_ms - 39.0).abs() < 1e-9);
    }
}
