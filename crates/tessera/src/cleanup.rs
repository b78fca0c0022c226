//! Clean-up that must reach the store after its owner is gone: the release of a dropped
//! [`crate::Permit`], the cancel of an abandoned acquire, the return of a rate reservation
//! whose `acquire` was dropped.
//!
//! # The guarantee
//!
//! A clean-up handed here is attempted until the store answers it, it fails, or the process
//! exits — and a process that exits normally (`main` returns, `std::process::exit`) first
//! waits up to [`EXIT_GRACE`] for every clean-up still under way. So a program that acquires,
//! drops its permit and returns from `#[tokio::main]` leaves no holder behind, although the
//! runtime that would have run the release ends with `main`. Only a process killed outright
//! (SIGKILL, a crash) leaves its leases to expire by their TTL.
//!
//! # Implementation details
//!
//! Every clean-up is a [`Ticket`]: the store, the job, and a count of tickets under way kept
//! per store (awaited by [`crate::Store::close`]) and process-wide (awaited at exit). A ticket
//! ends only when its job has run.
//!
//! 1. Inside a tokio runtime the ticket runs as a task of that runtime, on the connection
//!    the store already has — the common case, costing one store call.
//! 2. If that task is dropped before it finished — its runtime shut down, as the runtime of
//!    `#[tokio::main]` does when `main` returns — or its job failed (the same shutdown often
//!    takes the store's connection first, and the job then fails instead of being dropped),
//!    the ticket's drop hands it to the *reaper*:
//!    one process-wide thread with a runtime of its own. Outside any runtime the ticket goes
//!    there at once. The reaper cannot use the store's connection (its driver tasks died with
//!    their runtime), so it opens a fresh one from the store's URL, once per URL, and runs the
//!    job on it. A store built with [`crate::Store::from_backend`] has no URL; the reaper then
//!    runs the job on that backend as it is.
//! 3. An `atexit` handler, registered with the first permit or ticket, hands the permits
//!    still held (a program that calls `std::process::exit` with a permit in hand) to the
//!    reaper as releases, then blocks the exit until no ticket is under way or
//!    [`EXIT_GRACE`] has passed.
//!
//! One case is left to the TTL: `std::process::exit` called on the only thread of a
//! current-thread runtime while a clean-up task of that runtime is still queued. That task
//! can no longer run and is not dropped either (the runtime is never shut down), so the exit
//! waits [`EXIT_GRACE`] for it in vain. [`crate::Store::close`] before exiting avoids it.
//!
//! Every job is idempotent (a release or cancel of a lease that is gone answers "not held"; a
//! rate reservation is returned at most once), so a job that reached the store before its
//! task was dropped does no harm when the reaper runs it again.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::conn::Conn;
use crate::stores::Open;
use tessera_core::model::{LeaseId, Name, StoreTime};
use tessera_core::seam::Backend;

/// How long a normal process exit waits for clean-ups still under way.
pub const EXIT_GRACE: Duration = Duration::from_secs(3);
/// How long the reaper gives one job (connecting included).
const REAPER_JOB_TIMEOUT: Duration = Duration::from_secs(2);

/// One clean-up.
#[derive(Debug, Clone)]
pub(crate) enum Job {
    /// Release a lease whose permit was dropped.
    Release { name: Name, lease: LeaseId },
    /// Cancel an abandoned acquire: the waiter leaves the queue, or a grant that raced with the
    /// abandonment is released.
    Cancel { name: Name, lease: LeaseId },
    /// Return a rate reservation whose `acquire` was dropped before its time.
    RateCancel {
        name: Name,
        reservation: u64,
        at: StoreTime,
    },
}

impl Job {
    /// Runs the job once: `Err` when the store gave no answer (or an error).
    async fn run(&self, backend: &dyn Backend) -> tessera_core::error::Result<()> {
        match self {
            Job::Release { name, lease } => backend.release(name, *lease).await.map(drop),
            Job::Cancel { name, lease } => backend.cancel(name, *lease).await.map(drop),
            Job::RateCancel {
                name,
                reservation,
                at,
            } => match backend.rate() {
                Some(rate) => rate.rate_cancel(name, *reservation, *at).await.map(drop),
                None => Ok(()),
            },
        }
    }

    /// Logs that the job is given up: what is left behind expires by itself.
    fn given_up(&self, e: &tessera_core::error::Error) {
        match self {
            Job::Release { name, lease } => {
                tracing::warn!(%name, %lease, error = %e, "release on drop failed; the lease expires by its TTL")
            }
            Job::Cancel { name, lease } => {
                tracing::warn!(%name, %lease, error = %e, "could not cancel an abandoned acquire; it expires by its TTL")
            }
            Job::RateCancel { name, .. } => {
                tracing::warn!(%name, error = %e, "could not return a cancelled rate reservation; it stays charged")
            }
        }
    }
}

/// Runs `job` against `conn` in the background (see the module docs). Never blocks.
pub(crate) fn spawn(conn: &Conn, job: Job) {
    let ticket = Ticket::new(conn.clone(), job);
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn(async move {
                let mut ticket = ticket;
                if let Some((store, job)) = &ticket.inner {
                    if let Err(e) = job.run(store.backend().as_ref()).await {
                        // Often the runtime shutting down under the job (its connection's
                        // task went first, as when `main` returns): dropped unfinished,
                        // the ticket goes to the reaper, which tries once more on a fresh
                        // connection and logs if that fails too.
                        tracing::debug!(error = %e, "clean-up failed; the reaper tries again");
                        return;
                    }
                }
                ticket.finish();
            });
        }
        Err(_) => reaper().send(ticket),
    }
}

/// Clean-ups under way, process-wide; the exit handler waits for zero.
static UNDER_WAY: Mutex<usize> = Mutex::new(0);
static ALL_DONE: Condvar = Condvar::new();

/// A clean-up under way. Dropped unfinished, it passes itself to the reaper.
struct Ticket {
    inner: Option<(Conn, Job)>,
}

/// Makes sure the exit handler runs at a normal process exit. Cheap after the first call.
pub(crate) fn arm_exit() {
    static AT_EXIT: Once = Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: `at_exit` is a plain `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(at_exit) };
    });
}

/// Runs `job` on the reaper thread (at exit, when no runtime may run it).
pub(crate) fn reap(conn: &Conn, job: Job) {
    reaper().send(Ticket::new(conn.clone(), job));
}

impl Ticket {
    fn new(conn: Conn, job: Job) -> Ticket {
        arm_exit();
        *UNDER_WAY.lock().unwrap() += 1;
        conn.cleanups().send_modify(|n| *n += 1);
        Ticket {
            inner: Some((conn, job)),
        }
    }

    fn finish(&mut self) {
        let Some((conn, _)) = self.inner.take() else {
            return;
        };
        conn.cleanups().send_modify(|n| *n = n.saturating_sub(1));
        let mut n = UNDER_WAY.lock().unwrap();
        *n = n.saturating_sub(1);
        if *n == 0 {
            ALL_DONE.notify_all();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            // The task running it was dropped with its runtime: the reaper takes over.
            reaper().send(Ticket { inner: Some(inner) });
        }
    }
}

/// At a normal exit: hands every lease still held, through every connection, to the reaper
/// as a release; their owner is about to vanish, and nobody would renew them.
fn release_all_at_exit() {
    for conn in Conn::live() {
        for (name, lease) in conn
            .drain_held()
            .iter()
            .filter_map(|h| h.take_for_release(None))
        {
            reap(&conn, Job::Release { name, lease });
        }
    }
}

/// At a normal exit: releases the permits still held (their owner is about to vanish, and
/// nobody would renew them), then waits for every clean-up under way.
extern "C" fn at_exit() {
    // Never unwind into C.
    let _ = std::panic::catch_unwind(|| {
        release_all_at_exit();
        wait_for_clean_ups();
    });
}

fn wait_for_clean_ups() {
    let deadline = Instant::now() + EXIT_GRACE;
    let Ok(mut n) = UNDER_WAY.lock() else {
        return;
    };
    while *n > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            // No logging here: the subscriber may already be torn down.
            return;
        }
        n = match ALL_DONE.wait_timeout(n, left) {
            Ok((n, _)) => n,
            Err(_) => return,
        };
    }
}

/// The reaper thread's inbox.
struct Reaper {
    inbox: mpsc::UnboundedSender<Ticket>,
}

impl Reaper {
    fn send(&self, ticket: Ticket) {
        if let Err(mpsc::error::SendError(mut ticket)) = self.inbox.send(ticket) {
            // The reaper could not start (see `reaper`): give the clean-up up.
            ticket.finish();
        }
    }
}

fn reaper() -> &'static Reaper {
    static REAPER: OnceLock<Reaper> = OnceLock::new();
    REAPER.get_or_init(|| {
        let (inbox, rx) = mpsc::unbounded_channel();
        let started = std::thread::Builder::new()
            .name("tessera-reaper".into())
            .spawn(move || reaper_thread(rx));
        if let Err(e) = started {
            tracing::warn!(error = %e, "cannot start the clean-up thread; dropped permits expire by their TTL");
        }
        Reaper { inbox }
    })
}

fn reaper_thread(mut rx: mpsc::UnboundedReceiver<Ticket>) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the clean-up runtime; dropped permits expire by their TTL");
            rx.close();
            while let Ok(mut t) = rx.try_recv() {
                t.finish();
            }
            return;
        }
    };
    rt.block_on(async move {
        // Fresh connections by URL, shared by the jobs of one store.
        let connections: std::sync::Arc<tokio::sync::Mutex<HashMap<String, Conn>>> =
            Default::default();
        while let Some(mut ticket) = rx.recv().await {
            let connections = std::sync::Arc::clone(&connections);
            tokio::spawn(async move {
                if let Some((store, job)) = &ticket.inner {
                    let work = async {
                        let fresh = match store.reconnect_url() {
                            Some(url) => {
                                let mut open = connections.lock().await;
                                match open.get(url) {
                                    Some(s) => Some(s.clone()),
                                    None => match Conn::open(url, Open::CreateIfMissing).await {
                                        Ok(s) => {
                                            open.insert(url.to_string(), s.clone());
                                            Some(s)
                                        }
                                        Err(e) => {
                                            tracing::warn!(store = %store.url(), error = %e, "clean-up cannot reconnect; what it was to give back (a lease, a queue place) expires by its TTL");
                                            None
                                        }
                                    },
                                }
                            }
                            None => Some(store.clone()),
                        };
                        if let Some(s) = fresh {
                            if let Err(e) = job.run(s.backend().as_ref()).await {
                                job.given_up(&e);
                            }
                        }
                    };
                    if tokio::time::timeout(REAPER_JOB_TIMEOUT, work).await.is_err() {
                        tracing::warn!(store = %store.url(), "clean-up timed out; what it was to give back (a lease, a queue place) expires by its TTL");
                    }
                }
                ticket.finish();
            });
        }
    });
}
