//! The line in front of a backend's connection: at most so many calls in flight, the rest
//! waiting their turn in order.
//!
//! A call's response timeout counts from the moment it is handed to the connection, and
//! redis-rs pipelines every call it is handed. Without a line, a process that queued 10,000
//! acquires at once (the chaos runner's dead-waiters scenario) handed them all over at
//! once; on a Cluster under a busy machine the last of them waited behind the others longer
//! than the 5 s timeout and failed with "redis: timed out" while the server answered every
//! call it saw in well under a millisecond (5,574 of 10,000 failed in one CI run). The
//! same burst with `?wait=N` opened one connection per call.
//!
//! So each call first takes a place in a [`Line`]: a call is handed over only when fewer
//! than the line's limit are in flight, and the response timeout then measures the server
//! and the network, not the length of the line. The wait for a place fails only when no call
//! of the line has returned for the patience (the response timeout): then the server hangs
//! or is gone, and the calls ahead are stuck in their own timeouts. While calls keep
//! returning, the caller waits (first come, first served) however long the line is.
//!
//! Keep-alives (renewals, waiters' heartbeats) have a line of their own, so a burst of
//! operations never holds up the calls that keep leases and queue places alive: behind
//! 10,000 enqueues, a heartbeat that came late let its waiter expire, and the waiter queued
//! again (seen on PostgreSQL, stop 35 of the project's notes; the same holds here).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

use tessera_core::error::{Error, Result, StoreErrorKind};

/// Calls in flight on the shared (multiplexed) connection, per line. Enough to keep a server
/// busy over a long round trip (256 calls per 50 ms round trip is 5,000 calls a second),
/// and short enough that the last of them waits behind the others well inside the response
/// timeout even when the machine is starved.
pub(super) const SHARED_IN_FLIGHT: usize = 256;
/// Calls in flight with `?wait=N`, per line: each holds a connection of its own until its
/// `WAIT` answers, and the topology keeps up to 64 idle ones.
pub(super) const OWN_IN_FLIGHT: usize = 64;

/// A line of calls; see the module docs.
pub(super) struct Line {
    places: Semaphore,
    /// The line's clock (tokio's, so tests can pause it).
    origin: Instant,
    /// When a call of this line last returned (ms since `origin`, plus 1), 0 before the first.
    returned_at: AtomicU64,
    patience: Duration,
}

/// A place in the line, held while the call is in flight.
pub(super) struct Place<'a> {
    line: &'a Line,
    _permit: SemaphorePermit<'a>,
}

impl Line {
    pub(super) fn new(in_flight: usize, patience: Duration) -> Line {
        Line {
            places: Semaphore::new(in_flight),
            origin: Instant::now(),
            returned_at: AtomicU64::new(0),
            patience,
        }
    }

    /// Waits for a place. Fails only when no call of the line has returned within the
    /// patience while this caller waited; the caller keeps its place across those checks.
    pub(super) async fn enter(&self) -> Result<Place<'_>> {
        let acquire = self.places.acquire();
        tokio::pin!(acquire);
        loop {
            match tokio::time::timeout(self.patience, acquire.as_mut()).await {
                Ok(permit) => {
                    let permit = permit.expect("a line's places are never closed");
                    return Ok(Place {
                        line: self,
                        _permit: permit,
                    });
                }
                Err(_) if self.returned_within(self.patience) => continue,
                Err(_) => {
                    return Err(Error::store(
                        StoreErrorKind::Timeout,
                        format!(
                            "redis: timed out (no call answered within {:?})",
                            self.patience
                        ),
                    ))
                }
            }
        }
    }

    fn returned_within(&self, span: Duration) -> bool {
        let at = self.returned_at.load(Ordering::Relaxed);
        at != 0 && self.now_ms().saturating_sub(at) < span.as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64 + 1
    }
}

impl Place<'_> {
    /// The call got an answer from the server (a reply, or an error the server sent).
    pub(super) fn answered(&self) {
        self.line
            .returned_at
            .store(self.line.now_ms(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A line of 40 calls through 4 places, each call answered after 100 ms, lasts about 1 s,
    /// five times the patience: nobody fails, and never more than 4 are in flight.
    #[tokio::test(start_paused = true)]
    async fn a_long_line_that_moves_is_no_fault() {
        let line = Arc::new(Line::new(4, Duration::from_millis(200)));
        let in_flight = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let mut calls = vec![];
        for _ in 0..40 {
            let (line, in_flight, most) = (line.clone(), in_flight.clone(), most.clone());
            calls.push(tokio::spawn(async move {
                let place = line.enter().await?;
                let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                place.answered();
                Ok::<_, Error>(())
            }));
        }
        let started = tokio::time::Instant::now();
        for c in calls {
            c.await.unwrap().unwrap();
        }
        assert!(started.elapsed() >= Duration::from_millis(1000));
        assert_eq!(most.load(Ordering::SeqCst), 4);
    }

    /// Calls that never answer: those in line fail once the patience passed without an
    /// answer, with a timeout.
    #[tokio::test(start_paused = true)]
    async fn a_line_behind_calls_that_never_answer_fails_after_the_patience() {
        let line = Arc::new(Line::new(2, Duration::from_millis(500)));
        let stuck: Vec<_> = (0..2)
            .map(|_| {
                let line = line.clone();
                tokio::spawn(async move {
                    let _place = line.enter().await.unwrap();
                    std::future::pending::<()>().await;
                })
            })
            .collect();
        tokio::task::yield_now().await;
        let started = tokio::time::Instant::now();
        let waited = line.enter().await.err().expect("no place while both hang");
        assert_eq!(started.elapsed(), Duration::from_millis(500));
        assert!(matches!(
            waited,
            Error::Store {
                kind: StoreErrorKind::Timeout,
                ..
            }
        ));
        for s in stuck {
            s.abort();
        }
    }

    /// A caller that gives up frees its place; the line goes on in order.
    #[tokio::test(start_paused = true)]
    async fn a_place_given_up_goes_to_the_next_in_line() {
        let line = Line::new(1, Duration::from_secs(5));
        let first = line.enter().await.unwrap();
        let second = tokio::time::timeout(Duration::from_millis(10), line.enter()).await;
        assert!(second.is_err(), "the only place is taken");
        drop(first);
        let third = tokio::time::timeout(Duration::from_millis(10), line.enter()).await;
        assert!(third.is_ok());
    }
}
