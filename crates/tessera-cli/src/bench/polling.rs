//! The hand-written designs tessera replaces on SQL stores, measured in the same run as
//! tessera's workloads with the same figures, plus what their polling costs:
//!
//! - PostgreSQL ([`super::postgres`]): a `SELECT … FOR UPDATE SKIP LOCKED` semaphore, W3's
//!   shape (32 clients, capacity 4). A table of 4 slot rows; a client takes the first slot
//!   no one has locked and keeps its transaction open while it holds it (`COMMIT` gives it
//!   back); a client that finds every slot locked rolls back, sleeps the poll interval and
//!   asks again.
//! - MySQL / MariaDB ([`super::mysql`]): a lock table with a unique key, W2's shape (8 clients
//!   on one lock). `INSERT` of the lock's row takes the lock, a duplicate-key error means
//!   someone holds it (sleep the poll interval and try again), `DELETE` gives it back.
//!
//! Both are what their users write, without tessera's lease, fence, queue or push: no FIFO
//! (whoever asks first after a release wins), and a waiter learns of a free permit only at
//! its next poll. An in-process counter checks over-grants (entered after the grant, left
//! before the release is sent), as for tessera's own workloads on these stores.

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// What one run of a polling design measured.
#[derive(Debug, Clone, Serialize)]
pub struct PollFigures {
    /// The design (`skip-locked semaphore`, `lock table`).
    pub design: String,
    pub clients: usize,
    pub capacity: u32,
    /// How long a client sleeps after finding nothing free, ms.
    pub poll_ms: f64,
    pub grants_per_sec: f64,
    /// Grants to a different client than the previous grant, per second.
    pub handoffs_per_sec: f64,
    /// Wait from the first try to the grant, ms.
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    pub wait_max_ms: f64,
    pub grants_per_client_min: u64,
    pub grants_per_client_max: u64,
    /// Queries that found nothing free, per grant.
    pub empty_polls_per_grant: f64,
    /// Grants while `capacity` others were held, seen by the in-process check.
    pub over_grants: u64,
}

/// Shared by the clients of one run.
pub struct PollStats {
    capacity: i64,
    waits: Mutex<Histogram<u64>>,
    per_client: Vec<AtomicU64>,
    polls: AtomicU64,
    holders: AtomicI64,
    over: AtomicU64,
    last: AtomicUsize,
    handoffs: AtomicU64,
}

impl PollStats {
    pub fn new(clients: usize, capacity: u32) -> Self {
        PollStats {
            capacity: i64::from(capacity),
            waits: Mutex::new(Histogram::new_with_bounds(1, 600_000_000, 3).expect("bounds")),
            per_client: (0..clients).map(|_| AtomicU64::new(0)).collect(),
            polls: AtomicU64::new(0),
            holders: AtomicI64::new(0),
            over: AtomicU64::new(0),
            last: AtomicUsize::new(usize::MAX),
            handoffs: AtomicU64::new(0),
        }
    }

    /// A try that found nothing free.
    pub fn polled(&self) {
        self.polls.fetch_add(1, Ordering::Relaxed);
    }

    /// Client `client` got a permit after waiting `waited`; it holds it until [`Self::leaving`].
    pub fn granted(&self, client: usize, waited: Duration) {
        if self.holders.fetch_add(1, Ordering::SeqCst) + 1 > self.capacity {
            self.over.fetch_add(1, Ordering::Relaxed);
        }
        let us = (waited.as_micros() as u64).max(1);
        self.waits.lock().unwrap().saturating_record(us);
        self.per_client[client].fetch_add(1, Ordering::Relaxed);
        if self.last.swap(client, Ordering::Relaxed) != client {
            self.handoffs.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A holder is about to give its permit back.
    pub fn leaving(&self) {
        self.holders.fetch_sub(1, Ordering::SeqCst);
    }

    /// The figures over `seconds` of running.
    pub fn figures(&self, design: &str, poll: Duration, seconds: f64) -> PollFigures {
        let h = self.waits.lock().unwrap();
        let grants = h.len();
        let ms = |us: u64| us as f64 / 1000.0;
        let per: Vec<u64> = self
            .per_client
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        PollFigures {
            design: design.to_string(),
            clients: self.per_client.len(),
            capacity: self.capacity as u32,
            poll_ms: poll.as_secs_f64() * 1000.0,
            grants_per_sec: grants as f64 / seconds,
            handoffs_per_sec: self.handoffs.load(Ordering::Relaxed) as f64 / seconds,
            wait_p50_ms: ms(h.value_at_quantile(0.5)),
            wait_p99_ms: ms(h.value_at_quantile(0.99)),
            wait_max_ms: ms(h.max()),
            grants_per_client_min: per.iter().copied().min().unwrap_or(0),
            grants_per_client_max: per.iter().copied().max().unwrap_or(0),
            empty_polls_per_grant: self.polls.load(Ordering::Relaxed) as f64
                / (grants.max(1)) as f64,
            over_grants: self.over.load(Ordering::Relaxed),
        }
    }
}

/// One line of the table under the workloads.
pub fn line(f: &PollFigures) -> String {
    format!(
        "{}, {} clients, capacity {}, poll {:.0} ms: {:.0} grants/s, {:.0} hand-offs/s, wait \
         p50 {:.2} / p99 {:.2} / max {:.1} ms, grants per client {}-{}, {:.1} empty polls per \
         grant, {} over-grants\n",
        f.design,
        f.clients,
        f.capacity,
        f.poll_ms,
        f.grants_per_sec,
        f.handoffs_per_sec,
        f.wait_p50_ms,
        f.wait_p99_ms,
        f.wait_max_ms,
        f.grants_per_client_min,
        f.grants_per_client_max,
        f.empty_polls_per_grant,
        f.over_grants
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_count_hand_offs_fairness_polls_and_over_grants() {
        let s = PollStats::new(2, 1);
        s.polled();
        s.granted(0, Duration::from_millis(2));
        s.leaving();
        s.granted(0, Duration::from_millis(1));
        // Client 1 enters while client 0 still holds the only permit: an over-grant.
        s.granted(1, Duration::from_millis(4));
        s.leaving();
        s.leaving();
        s.polled();
        s.polled();
        let f = s.figures("lock table", Duration::from_millis(2), 2.0);
        assert_eq!(f.grants_per_sec, 1.5);
        assert_eq!(f.handoffs_per_sec, 1.0); // 0 (first), then 1
        assert_eq!((f.grants_per_client_min, f.grants_per_client_max), (1, 2));
        assert_eq!(f.empty_polls_per_grant, 1.0);
        assert_eq!(f.over_grants, 1);
        assert!((f.wait_max_ms - 4.0).abs() < 0.01, "{}", f.wait_max_ms);
        assert_eq!(f.poll_ms, 2.0);
    }
}
