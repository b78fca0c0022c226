//! `tessera run`: hold permits while a command runs.
//!
//! # The order of things
//!
//! 1. Validate every argument with the library's own rules (against a throw-away in-process
//!    store), so invalid input fails before the real store is touched.
//! 2. Install the signal handlers, then connect and acquire. A signal that stops tessera while
//!    it waits (Ctrl-C, SIGTERM, SIGHUP, SIGQUIT) cancels the wait: the library gives the
//!    queue place (or a grant that raced with the cancel) back, and tessera exits `128 + N`.
//!    A store that cannot be reached at the connect fails at once (exit 69); once it has
//!    answered, the wait rides out its outages (below).
//! 3. Start the guard of the command's process group (when it gets one, below), spawn the
//!    command with `TESSERA_LEASE_ID`, `TESSERA_FENCE`, `TESSERA_SEATS` and `TESSERA_NAME`
//!    exported, then supervise it (below).
//! 4. When it exits, disarm the guard, release the permit, then exit with the command's
//!    code.
//!
//! # Process groups and signals
//!
//! What a user expects is that `tessera run -- CMD` behaves like `CMD` alone, and that the
//! command never outlives the permit. Two cases:
//!
//! - **Interactive** (stdin is a terminal and tessera is in its foreground process group):
//!   the command stays in tessera's process group, so it can read the terminal and Ctrl-C,
//!   Ctrl-\ and Ctrl-Z reach it straight from the terminal, exactly as without tessera.
//!   Signals the kernel generated (a terminal's keys or hang-up, `si_code > 0`) already
//!   reached the command, so tessera does not forward them again; signals another process
//!   sent to tessera (`kill`, `si_code <= 0`) are forwarded. This is what `sudo` does. (A
//!   `kill` aimed at the whole process group reaches the command twice; aim it at tessera.)
//! - **Otherwise** (scripts, services, CI): the command leads its own process group and
//!   every forwarded signal goes to that group, so a shell script's children get it too.
//!
//! Signals the command itself sends to tessera are never bounced back to it.
//!
//! If tessera dies without ending normally (`kill -9`, an OOM kill, a crash), nobody renews
//! the lease, and nothing the command started may run on past it:
//!
//! - On Linux the command gets `PR_SET_PDEATHSIG = SIGKILL`, which reaches the command
//!   itself, not the processes it started.
//! - When the command leads its own process group, a guard ([`GroupGuard`], a `/bin/sh` of a
//!   few lines in a group of its own, outside tessera's) SIGKILLs the whole group when
//!   tessera dies: it reads a pipe whose only write end tessera holds, and the kernel closes
//!   that end, whatever killed tessera. The command writes its group's id to the pipe before
//!   it execs, so no process of the group can exist before the guard can name it; a guard
//!   that cannot start fails the run (exit 71) before the command runs. When the command
//!   has ended, tessera tells the guard to exit without killing, before it releases the
//!   permit: on a normal end the group's remaining processes (a job the command left in the
//!   background) are left alone, as without the guard, and a group id that the kernel may
//!   hand out again is never signalled. (The guard kills only after tessera died; a pid is
//!   reused only once the kernel has cycled through every other pid, not within the
//!   milliseconds the guard takes.)
//! - **Interactive**, the command shares tessera's process group with the shell's pipeline
//!   (`tessera run … | tee log`), which no guard may kill: only the command dies with
//!   tessera, and what it started in the background may outlive it. Run it with stdin
//!   redirected (`</dev/null`) to get a group of its own and the guard.
//!
//! # A store outage while waiting
//!
//! The library rides out a transient store fault (a dropped or refused connection, a
//! timeout, a busy store) during an acquire for the waiter TTL (5 s), then returns it. A
//! `tessera run` told to wait as long as it takes (no `--wait`), or whose `--wait` has not
//! run out, keeps waiting instead ([`ride_out`]): one line on stderr, then it probes the
//! store (250 ms, doubling up to 5 s, never past `--wait`); when the store answers, one more
//! line, and it waits again **from the tail of the queue** (its place expired with the
//! waiter TTL; a grant that raced with the fault is given back by the library). The same
//! holds for the turn within `--rate` limits, as long as the permit taken first is not lost,
//! and for an admission of both at once (`--permits` with `--rate` on a store with
//! admission: [`tessera::Admission`]; its ticket is checked against its use-by instant right
//! before the command starts, and given back and taken again first in the queue if late).
//! If `--wait` runs out during the outage, tessera exits 69 with the store's error, unless it
//! ran out within the library's own retries (the first waiter TTL of the outage): that is a
//! wait that ran out like any other, exit 75. Other
//! errors (a capacity mismatch, refused credentials, …) end the wait at once with their
//! codes, and so does a store that cannot be reached at the connect: [`Store::connect`]
//! reaches every store before it returns, so a wrong URL fails at once instead of waiting
//! for a store that will never answer.
//!
//! # Losing the permit
//!
//! When [`Permit::lost`] fires, the command (its process group, when it has its own) gets
//! SIGTERM at once, and SIGKILL [`KILL_LEAD`] before [`Permit::valid_until`] if it still
//! runs, so it never outlives the lease. tessera then exits [`exit::LOST`] with one line.

use std::ffi::OsString;
use std::io::Write as _;
use std::os::fd::{AsRawFd as _, RawFd};
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tessera::{
    Admission, Admitted, LossReason, Permit, RateDecision, RateLimiter, RateOptions, RateSpec,
    Semaphore, SemaphoreOptions, Store, Tenant,
};
use tokio::process::Child;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use crate::exit::{self, Failure, Outcome};
use crate::progress::{Wait, WaitLine};
use crate::signals::{self, Caught};

/// SIGKILL goes out this long before the lease could expire, so it lands while the lease is
/// still certainly held.
pub const KILL_LEAD: Duration = Duration::from_millis(100);
/// How long releasing the permit may take before tessera gives up (the lease then expires by
/// its TTL): at most [`RELEASE_TIMEOUT`], and no longer than the lease is certainly valid
/// plus [`RELEASE_AFTER_VALID`]. A lease lost because the store went away gets one short try,
/// so tessera does not outlive its command by seconds while the store is down.
const RELEASE_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`RELEASE_TIMEOUT`].
const RELEASE_AFTER_VALID: Duration = Duration::from_secs(1);
/// How long tessera waits before exiting for the library's background clean-ups (the cancel
/// of an abandoned queue place, the return of a rate reservation) to reach the store. What
/// is still under way then is finished by the library's exit handler, within its own bound.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(1);

/// The arguments of `tessera run`, parsed but not yet validated.
#[derive(Debug, Clone)]
pub struct RunArgs {
    pub name: String,
    /// `None`: no semaphore, only the rate limits.
    pub permits: Option<u32>,
    pub weight: u32,
    pub ttl: Duration,
    /// `None`: wait as long as it takes.
    pub wait: Option<Duration>,
    pub holder: Option<String>,
    /// The tenant and its share (`docs/fair-shares.md`).
    pub tenant: Option<(String, u32)>,
    /// Rate limits on `name`, charged `cost` each, after the permit (if any) is held.
    pub rates: Vec<RateSpec>,
    pub cost: u32,
    /// Replace stored limits that differ from `rates`.
    pub update_rates: bool,
    /// The margin between a turn's admission and its use (`None`: the library's default).
    pub rate_margin: Option<Duration>,
    /// No waiting line on the terminal (see `crate::progress`).
    pub quiet: bool,
    pub command: Vec<OsString>,
}

impl RunArgs {
    fn options(&self) -> SemaphoreOptions {
        let mut opts = SemaphoreOptions::default().ttl(self.ttl);
        if let Some(h) = &self.holder {
            opts = opts.holder(h.clone());
        }
        // Checked by `validate` first.
        if let Some(Ok(t)) = self.tenant() {
            opts = opts.tenant(t);
        }
        opts
    }

    fn tenant(&self) -> Option<Result<Tenant, tessera::InvalidInput>> {
        self.tenant
            .as_ref()
            .map(|(name, share)| Tenant::new(name, *share))
    }

    fn rate_options(&self) -> RateOptions {
        let opts = RateOptions::default().update(self.update_rates);
        match self.rate_margin {
            Some(m) => opts.margin(m),
            None => opts,
        }
    }

    /// Checks every argument with the library's rules; returns the weight. Uses a private
    /// in-process store: [`Semaphore::new`] writes nothing, and the real store (which may
    /// create a file on connect) is not touched.
    async fn validate(&self) -> Result<u32, Failure> {
        if let Some(Err(e)) = self.tenant() {
            return Err(e.into());
        }
        let scratch = Store::connect("memory://tessera-cli-validation").await?;
        if !self.rates.is_empty() {
            let limiter = RateLimiter::new(&scratch, &self.name, &self.rates, self.rate_options())?;
            let max = limiter.config().max_cost();
            if self.cost == 0 || self.cost > max {
                return Err(tessera::InvalidInput::Cost {
                    cost: self.cost,
                    max,
                }
                .into());
            }
        }
        let Some(permits) = self.permits else {
            return Ok(1);
        };
        let sem = Semaphore::new(&scratch, &self.name, permits, self.options())?;
        if self.weight == 0 || self.weight > sem.capacity() {
            return Err(tessera::InvalidInput::Weight {
                weight: self.weight,
                capacity: sem.capacity(),
            }
            .into());
        }
        Ok(self.weight)
    }
}

/// Runs `tessera run`.
pub async fn run(store_url: Option<&str>, args: RunArgs) -> Outcome {
    let weight = args.validate().await?;
    let mut caught = signals::install().map_err(|e| {
        Failure::new(
            exit::OS_ERROR,
            format!("cannot install signal handlers: {e}"),
        )
    })?;
    let store = crate::store_url::connect(store_url).await?;
    let outcome = hold_and_run(&store, &args, weight, &mut caught).await;
    // An interrupted or timed-out wait left its clean-up to the background: let it land
    // before the runtime ends. Every permit was released (or its release gave up) already.
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, store.close()).await;
    outcome
}

enum Acquired {
    Permit(Permit),
    TimedOut,
    Interrupted(libc::c_int),
}

async fn hold_and_run(
    store: &Store,
    args: &RunArgs,
    weight: u32,
    caught: &mut UnboundedReceiver<Caught>,
) -> Outcome {
    // `--wait` bounds the whole wait: the permit, then the turn within the rate limits; or
    // both at once, on a store with admission.
    let deadline = args.wait.map(|w| Instant::now() + w);
    let admission = match args.permits {
        Some(permits) if !args.rates.is_empty() && store.backend().admission().is_some() => {
            Some(admission(store, args, permits, weight)?)
        }
        _ => None,
    };
    let mut ticket = None;
    let mut permit = match (&admission, args.permits) {
        (Some(adm), _) => {
            ticket = Some(take_admission(store, args, adm, deadline, caught).await?);
            None
        }
        (None, Some(permits)) => {
            Some(take_permit(store, args, permits, weight, deadline, caught).await?)
        }
        (None, None) => None,
    };
    if admission.is_none() && !args.rates.is_empty() {
        if let Err(failure) = take_turn(store, args, deadline, permit.as_ref(), caught).await {
            if let Some(p) = permit {
                release(p).await;
            }
            return Err(failure);
        }
    }
    if let Some(p) = &permit {
        tracing::info!(name = %args.name, lease = %p.lease_id(), fence = p.fence(), "permit acquired");
    }
    if let Some(t) = &ticket {
        tracing::info!(name = %args.name, lease = %t.lease_id(), fence = t.fence(), "admitted");
    }

    if let Some(t) = ticket.take_if(|t| t.permit().is_lost()) {
        release(t.into_permit()).await;
        return Err(lost_before_start(&args.name));
    }
    if let Some(p) = permit.take_if(|p| p.is_lost()) {
        // Lost between the grant and now (revoked at once, or while waiting for the rate):
        // do not start the command.
        release(p).await;
        return Err(lost_before_start(&args.name));
    }
    let group = !is_interactive();
    // Started before the command, so a guard that cannot start leaves nothing running.
    let mut guard = match group.then(GroupGuard::start).transpose() {
        Ok(guard) => guard,
        Err(e) => {
            if let Some(p) = permit {
                release(p).await;
            }
            return Err(Failure::new(
                exit::OS_ERROR,
                format!("cannot start the guard of the command's process group: {e}"),
            ));
        }
    };
    // An admission is used right now or given back: past its use-by instant (the rate
    // margin after the store admitted it) the command's start might not count inside the
    // windows, so the turn goes back and the wait starts again at the head of the queue.
    if let (Some(adm), Some(t)) = (&admission, ticket.take()) {
        match fresh_admission(args, adm, t, deadline, caught).await {
            Ok(t) => permit = Some(t.into_permit()),
            Err(failure) => {
                drop(guard); // disarms it
                return Err(failure);
            }
        }
    }
    let spawned = spawn(
        &args.command,
        &args.name,
        permit.as_ref(),
        group,
        guard.as_ref().map(GroupGuard::fd),
    );
    let mut child = match spawned {
        Ok(child) => child,
        Err(failure) => {
            drop(guard); // disarms it
            if let Some(p) = permit {
                release(p).await;
            }
            return Err(failure);
        }
    };
    let supervised = supervise(&mut child, group, permit.as_ref(), caught).await;
    if supervised.is_err() {
        // Never release while the command may still run.
        let _ = child.kill().await;
    }
    // The command has ended (and is reaped): from here on tessera ends normally, leaving
    // the group's other processes as they are.
    if let Some(g) = guard.as_mut() {
        g.disarm();
    }
    if let Some(p) = permit {
        release(p).await;
    }
    let supervised = supervised
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot wait for the command: {e}")))?;
    if let Some(reason) = supervised.loss {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "lost the permit on {} while the command ran ({reason}); stopped the command with SIGTERM{}",
                args.name,
                if supervised.killed { ", then SIGKILL" } else { "" }
            ),
        ));
    }
    Ok(exit_code(supervised.status))
}

fn lost_before_start(name: &str) -> Failure {
    Failure::new(
        exit::LOST,
        format!("lost the permit on {name} before the command started; nothing was run"),
    )
}

/// `--permits` and `--rate` as one admission (see `tessera::Admission`).
fn admission(
    store: &Store,
    args: &RunArgs,
    permits: u32,
    weight: u32,
) -> Result<Admission, Failure> {
    let mut rates = args.rates.iter().copied();
    let first = rates.next().expect("called with at least one --rate");
    let mut adm = store
        .admission(&args.name)
        .permits(permits)
        .semaphore_options(args.options())
        .rate_options(args.rate_options())
        .rate(first)?;
    for r in rates {
        adm = adm.rate(r)?;
    }
    Ok(adm.weight(weight)?.cost(args.cost)?)
}

/// Waits for an admission of `--permits` and `--rate` in one step by `deadline` (`--wait`;
/// `--wait 0s`: a try), or fails with the documented exit code.
async fn take_admission(
    store: &Store,
    args: &RunArgs,
    adm: &Admission,
    deadline: Option<Instant>,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<Admitted, Failure> {
    let try_only = args.wait.is_some_and(|w| w.is_zero());
    let what = "a permit within the rate limits";
    let line = Wait {
        store,
        name: &args.name,
        what,
        holder: Some(
            args.holder
                .clone()
                .unwrap_or_else(tessera::backend::default_holder),
        ),
        deadline,
    };
    let _line = WaitLine::start(line, args.quiet || try_only);
    let waiting = Waiting {
        store,
        name: &args.name,
        what,
        again: "from the tail of the queue",
        deadline,
        held: None,
    };
    let attempt = ride_out(waiting, || async {
        match deadline {
            _ if try_only => adm.try_acquire().await,
            None => adm.acquire().await.map(Some),
            Some(d) => {
                adm.acquire_timeout(d.saturating_duration_since(Instant::now()))
                    .await
            }
        }
    });
    admitted_or_failure(args, attempt, what, caught).await
}

/// `ticket` if it is still within its use-by instant; else it is given back and the wait
/// starts again, first in the queue, within `deadline`.
async fn fresh_admission(
    args: &RunArgs,
    adm: &Admission,
    mut ticket: Admitted,
    deadline: Option<Instant>,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<Admitted, Failure> {
    while !ticket.is_fresh() {
        tracing::info!(name = %args.name, "admission past its use-by instant; given back");
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        let again = async {
            adm.readmit_timeout(ticket, left)
                .await
                .map_err(Failure::from)
        };
        ticket =
            admitted_or_failure(args, again, "a permit within the rate limits", caught).await?;
    }
    Ok(ticket)
}

/// The end of an admission's wait: the ticket, or the exit code of a timeout or a signal.
async fn admitted_or_failure(
    args: &RunArgs,
    attempt: impl std::future::Future<Output = Result<Option<Admitted>, Failure>>,
    what: &str,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<Admitted, Failure> {
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            reply = &mut attempt => {
                return match reply? {
                    Some(t) => Ok(t),
                    None => Err(Failure::new(
                        exit::TEMPFAIL,
                        format!(
                            "no permit within the rate limits of {} within --wait {}; nothing was run",
                            args.name,
                            args.wait
                                .map(|w| humantime::format_duration(w).to_string())
                                .unwrap_or_default()
                        ),
                    )),
                };
            }
            Some(signal) = caught.recv() => {
                if matches!(signal.signal, libc::SIGUSR1 | libc::SIGUSR2) {
                    continue;
                }
                // Dropping `attempt` cancels the wait in the background.
                return Err(interrupted(signal.signal, what, &args.name));
            }
        }
    }
}

/// Takes `weight` of `permits` by `deadline` (`--wait`), or fails with the documented exit
/// code.
async fn take_permit(
    store: &Store,
    args: &RunArgs,
    permits: u32,
    weight: u32,
    deadline: Option<Instant>,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<Permit, Failure> {
    let sem = Semaphore::new(store, &args.name, permits, args.options())?;
    let try_only = args.wait.is_some_and(|w| w.is_zero());
    let line = Wait {
        store,
        name: &args.name,
        what: "a permit",
        holder: Some(
            args.holder
                .clone()
                .unwrap_or_else(tessera::backend::default_holder),
        ),
        deadline,
    };
    let waiting_line = WaitLine::start(line, args.quiet || try_only);
    let acquired = acquire(store, &sem, weight, deadline, try_only, caught).await;
    drop(waiting_line);
    match acquired? {
        Acquired::Permit(p) => Ok(p),
        Acquired::TimedOut => Err(Failure::new(
            exit::TEMPFAIL,
            format!(
                "no permit on {} within --wait {}; nothing was run",
                args.name,
                args.wait
                    .map(|w| humantime::format_duration(w).to_string())
                    .unwrap_or_default()
            ),
        )),
        Acquired::Interrupted(signal) => Err(interrupted(signal, "a permit", &args.name)),
    }
}

fn interrupted(signal: libc::c_int, what: &str, name: &str) -> Failure {
    Failure::new(
        exit::SIGNAL_BASE + signal as u8,
        format!(
            "interrupted by {} while waiting for {what} on {name}; nothing was run",
            signals::name(signal),
        ),
    )
}

/// Reserves the earliest time every `--rate` limit admits `--cost` and sleeps until it
/// (FIFO reservations, no polling): the library's `acquire_until` with `--wait`, beyond whose
/// deadline nothing is charged and this fails with exit 75; without `--wait`, `acquire`, which
/// waits as long as it takes. A store outage is ridden out ([`ride_out`]) while `permit`
/// (the one taken first, if any) is not lost.
async fn take_turn(
    store: &Store,
    args: &RunArgs,
    deadline: Option<Instant>,
    permit: Option<&Permit>,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<(), Failure> {
    let limiter = RateLimiter::new(store, &args.name, &args.rates, args.rate_options())?;
    let line = Wait {
        store,
        name: &args.name,
        what: "a turn within the rate limits",
        holder: None,
        deadline,
    };
    let _line = WaitLine::start(
        line,
        args.quiet || deadline.is_some_and(|d| d <= Instant::now()),
    );
    let waiting = Waiting {
        store,
        name: &args.name,
        what: "a turn within the rate limits",
        again: "with a new reservation",
        deadline,
        held: permit,
    };
    let attempt = ride_out(waiting, || async {
        match deadline {
            Some(deadline) => limiter.acquire_until(args.cost, deadline).await,
            None => (limiter.acquire(args.cost).await).map(|at| RateDecision::Admitted { at }),
        }
    });
    tokio::pin!(attempt);
    let decision = loop {
        tokio::select! {
            d = &mut attempt => break d?,
            Some(signal) = caught.recv() => {
                if matches!(signal.signal, libc::SIGUSR1 | libc::SIGUSR2) {
                    continue;
                }
                // Dropping `attempt` gives its reservation back where it can.
                return Err(interrupted(signal.signal, "a turn within the rate limits", &args.name));
            }
        }
    };
    match decision {
        RateDecision::Admitted { .. } => Ok(()),
        RateDecision::Limited { retry_after, .. } => Err(Failure::new(
            exit::TEMPFAIL,
            format!(
                "no turn within the rate limits of {} within --wait (the next is in {}); nothing was run",
                args.name,
                humantime::format_duration(Duration::from_millis(retry_after.as_millis() as u64))
            ),
        )),
    }
}

/// Acquires by `deadline` (none: as long as it takes), riding out store outages
/// ([`ride_out`]) and giving up on a stopping signal. `try_only` (`--wait 0s`) makes it a
/// try-acquire (it never queues, and never jumps the queue either).
async fn acquire(
    store: &Store,
    sem: &Semaphore,
    weight: u32,
    deadline: Option<Instant>,
    try_only: bool,
    caught: &mut UnboundedReceiver<Caught>,
) -> Result<Acquired, Failure> {
    let waiting = Waiting {
        store,
        name: sem.name(),
        what: "a permit",
        again: "from the tail of the queue",
        deadline,
        held: None,
    };
    let attempt = ride_out(waiting, || async {
        match deadline {
            _ if try_only => sem.try_acquire_many(weight).await,
            None => sem.acquire_many(weight).await.map(Some),
            Some(d) => sem.acquire_many_until(weight, d).await,
        }
    });
    tokio::pin!(attempt);
    loop {
        tokio::select! {
            reply = &mut attempt => {
                return Ok(match reply? {
                    Some(p) => Acquired::Permit(p),
                    None => Acquired::TimedOut,
                });
            }
            Some(signal) = caught.recv() => {
                if matches!(signal.signal, libc::SIGUSR1 | libc::SIGUSR2) {
                    tracing::debug!(signal = %signals::name(signal.signal), "no command to forward to yet; ignored");
                    continue;
                }
                // Dropping `attempt` cancels the wait in the background (see `DRAIN_TIMEOUT`).
                return Ok(Acquired::Interrupted(signal.signal));
            }
        }
    }
}

/// The first pause after a transient store fault ends an acquire; it doubles after every
/// probe the store does not answer, up to [`OUTAGE_PAUSE_MAX`].
const OUTAGE_PAUSE: Duration = Duration::from_millis(250);
/// See [`OUTAGE_PAUSE`].
const OUTAGE_PAUSE_MAX: Duration = Duration::from_secs(5);

/// What a [`ride_out`] waits for, for its lines and its bounds.
struct Waiting<'a> {
    store: &'a Store,
    name: &'a str,
    /// "a permit", "a turn within the rate limits".
    what: &'a str,
    /// How the wait starts over when the store answers again ("from the tail of the queue").
    again: &'a str,
    /// `--wait`'s end; `None`: as long as it takes.
    deadline: Option<Instant>,
    /// A permit held meanwhile (during the rate wait): its loss ends the wait.
    held: Option<&'a Permit>,
}

/// Runs `attempt` (one acquire) until it ends other than with a transient store fault
/// ([`tessera::Error::is_transient`]: a dropped or refused connection, a timeout, a busy
/// store), which the library rides out by itself only for the waiter TTL (5 s).
///
/// After such a fault, while the deadline has not passed: one line on stderr, then the store
/// is probed (a read of `name`'s status) after [`OUTAGE_PAUSE`], doubling up to
/// [`OUTAGE_PAUSE_MAX`], never past the deadline; when it answers, one more line, and a new
/// attempt, which joins the queue again at its tail (the old place expired with the waiter
/// TTL, or is given up in the background). Cancel safe as `attempt` is: dropping it between
/// attempts holds nothing.
///
/// Fails with the fault's code (69) if the deadline passes first, and with the code of any
/// other error at once. The store answered once already: [`crate::store_url::connect`]
/// reaches it (a store that cannot be reached then fails at once, so a wrong URL never
/// hangs).
async fn ride_out<T, F, Fut>(waiting: Waiting<'_>, mut attempt: F) -> Result<T, Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = tessera::Result<T>>,
{
    let Waiting {
        store,
        name,
        what,
        again,
        deadline,
        held,
    } = waiting;
    let passed = || deadline.is_some_and(|d| Instant::now() >= d);
    let gave_up = |fault: tessera::Error| {
        let mut failure = Failure::from(fault);
        failure.message = format!(
            "{}; --wait ran out during the store outage; nothing was run",
            failure.message
        );
        failure
    };
    let mut outage = false;
    loop {
        let fault = match attempt().await {
            Err(e) if e.is_transient() && passed() && outage => return Err(gave_up(e)),
            Err(e) if e.is_transient() && !passed() => e,
            other => return other.map_err(Failure::from),
        };
        outage = true;
        eprintln!(
            "tessera: {}; still waiting for {what} on {name}, until the store answers again{}",
            exit::one_line(&fault.to_string()),
            if deadline.is_some() {
                " or --wait runs out"
            } else {
                ""
            }
        );
        let mut last = fault;
        let mut pause = OUTAGE_PAUSE;
        loop {
            let left = deadline.map_or(pause, |d| d.saturating_duration_since(Instant::now()));
            if left.is_zero() {
                return Err(gave_up(last));
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(OUTAGE_PAUSE_MAX);
            if held.is_some_and(Permit::is_lost) {
                return Err(Failure::new(
                    exit::LOST,
                    format!("lost the permit on {name} before the command started (the store did not answer); nothing was run"),
                ));
            }
            let probe = store.status(name);
            let answer = match deadline {
                Some(d) => match tokio::time::timeout_at(d, probe).await {
                    Ok(answer) => answer,
                    Err(_) => return Err(gave_up(last)),
                },
                None => probe.await,
            };
            match answer {
                Err(e) if e.is_transient() => last = e,
                // Any other answer, even an error, is the store's: the next attempt tells.
                _ => break,
            }
        }
        eprintln!("tessera: the store answers again; waiting for {what} on {name} again, {again}");
    }
}

/// Spawns the command. `guard`: the write end of a [`GroupGuard`]'s pipe, to which the
/// command writes its pid (its process group's id) before it execs.
fn spawn(
    command: &[OsString],
    name: &str,
    permit: Option<&Permit>,
    own_group: bool,
    guard: Option<RawFd>,
) -> Result<Child, Failure> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Failure::new(exit::USAGE, "no command given after --"))?;
    let mut cmd = std::process::Command::new(program);
    cmd.args(args).env("TESSERA_NAME", name);
    if let Some(permit) = permit {
        let seats = permit
            .seats()
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        cmd.env("TESSERA_LEASE_ID", permit.lease_id().to_string())
            .env("TESSERA_FENCE", permit.fence().to_string())
            .env("TESSERA_SEATS", seats);
    }
    if own_group {
        cmd.process_group(0);
    }
    #[cfg(target_os = "linux")]
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure calls only async-signal-safe functions (prctl, getppid, getpid,
    // signal, write) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            #[cfg(target_os = "linux")]
            {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // tessera died between fork and prctl: do not run without a permit.
                if libc::getppid() != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
            }
            // After the process group was made (std does it before these closures) and
            // before exec: no process of the group can exist that the guard cannot name.
            if let Some(fd) = guard {
                GroupGuard::announce(fd, libc::getpid())?;
            }
            Ok(())
        });
    }
    // Spawned from the main thread (the runtime is current-thread): PDEATHSIG follows the
    // thread that forked, and the main thread lives as long as tessera.
    tokio::process::Command::from(cmd).spawn().map_err(|e| {
        let shown = program.to_string_lossy();
        match e.kind() {
            std::io::ErrorKind::NotFound => Failure::new(
                exit::COMMAND_NOT_FOUND,
                format!("command not found: {shown}"),
            ),
            _ => Failure::new(exit::CANNOT_EXECUTE, format!("cannot run {shown}: {e}")),
        }
    })
}

/// Kills the command's process group if tessera dies without ending normally (see "Process
/// groups and signals" in the module docs).
///
/// A `/bin/sh` in a process group of its own, whose stdin is the read end of a pipe. The
/// command, between its fork and its exec, writes its pid (the id of the group it leads) as
/// the first line; tessera holds the only other write end (close-on-exec, so neither the
/// guard nor the command keeps one). [`GroupGuard::disarm`] writes a second line and the
/// guard exits; if tessera dies first, the kernel closes its end, the guard reads EOF instead
/// and sends SIGKILL to the group.
struct GroupGuard {
    /// `None` once disarmed.
    pipe: Option<std::io::PipeWriter>,
    /// Never waited for: dropped, tokio reaps it in the background.
    _process: Child,
}

/// The guard: the group's id, then a line (disarmed) or EOF (tessera died: kill the group).
/// dash's `kill` takes `-s KILL -- -PGID`, not `-9 -- -PGID`. A first line that is not a
/// pid (the command never got to exec: tessera's disarming line came first) kills nothing.
const GUARD_SCRIPT: &str = r#"read -r pgid || exit 0
case $pgid in ''|*[!0-9]*|0|1) exit 0 ;; esac
read -r _ || kill -s KILL -- "-$pgid""#;

impl GroupGuard {
    fn start() -> std::io::Result<GroupGuard> {
        let (read, write) = std::io::pipe()?; // both ends close-on-exec
        let mut cmd = tokio::process::Command::new("/bin/sh");
        cmd.args(["-c", GUARD_SCRIPT, "tessera-guard"])
            .stdin(Stdio::from(read))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .current_dir("/")
            // Out of tessera's group, which a CI runner or a terminal may signal as a whole
            // (the very case the guard is for), and out of the command's, which tessera
            // signals as a whole.
            .process_group(0);
        let process = cmd.spawn()?;
        Ok(GroupGuard {
            pipe: Some(write),
            _process: process,
        })
    }

    /// The write end, for the command's [`GroupGuard::announce`].
    fn fd(&self) -> RawFd {
        self.pipe.as_ref().map_or(-1, |p| p.as_raw_fd())
    }

    /// Writes `pid` and a newline to `fd`; called in the command between fork and exec, so
    /// async-signal-safe: no allocation, no lock. SIGPIPE (reset to its default by std for
    /// the child) is ignored around the write, so a dead guard fails the spawn instead of
    /// killing the child unseen.
    fn announce(fd: RawFd, pid: libc::pid_t) -> std::io::Result<()> {
        let mut line = [0u8; 12];
        let mut at = line.len() - 1;
        line[at] = b'\n';
        let mut n = pid.unsigned_abs();
        loop {
            at -= 1;
            line[at] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let line = &line[at..];
        // SAFETY: signal(2) and write(2) are async-signal-safe; `line` outlives the call.
        let written = unsafe {
            let before = libc::signal(libc::SIGPIPE, libc::SIG_IGN);
            let n = libc::write(fd, line.as_ptr().cast(), line.len());
            libc::signal(libc::SIGPIPE, before);
            n
        };
        match written {
            n if n == line.len() as isize => Ok(()),
            -1 => Err(std::io::Error::last_os_error()),
            _ => Err(std::io::Error::from_raw_os_error(libc::EIO)),
        }
    }

    /// Tells the guard to exit without killing. tessera ends normally from here on.
    fn disarm(&mut self) {
        if let Some(mut pipe) = self.pipe.take() {
            // A guard already gone (EPIPE; tessera ignores SIGPIPE) has nothing to kill.
            let _ = pipe.write_all(b"\n");
        }
    }
}

impl Drop for GroupGuard {
    /// Only a tessera that dies never drops its guard: every way out of it disarms.
    fn drop(&mut self) {
        self.disarm();
    }
}

/// How a supervised command ended.
#[derive(Debug)]
pub(crate) struct Supervised {
    pub status: ExitStatus,
    /// Set if the permit was lost while the command ran.
    pub loss: Option<LossReason>,
    /// SIGKILL was sent after the loss.
    pub killed: bool,
}

/// Waits for the command, forwarding signals (see the module docs) and stopping it if the
/// permit is lost. `own_group`: the command leads its own process group.
pub(crate) async fn supervise(
    child: &mut Child,
    own_group: bool,
    permit: Option<&Permit>,
    caught: &mut UnboundedReceiver<Caught>,
) -> std::io::Result<Supervised> {
    let pid = child.id().map(|p| p as libc::pid_t).unwrap_or(0);
    let target = if own_group { -pid } else { pid };
    let send = |signal: libc::c_int| {
        if pid > 0 {
            // SAFETY: kill(2) with a pid/pgid we spawned; an ESRCH (already gone) is harmless.
            unsafe { libc::kill(target, signal) };
        }
    };
    let lost = async {
        match permit {
            Some(p) => p.lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(lost);
    let mut loss: Option<LossReason> = None;
    let mut kill_at: Option<Instant> = None;
    let mut killed = false;
    loop {
        tokio::select! {
            biased;
            status = child.wait() => {
                return Ok(Supervised { status: status?, loss, killed });
            }
            reason = &mut lost, if loss.is_none() => {
                tracing::info!(%reason, "permit lost; sending SIGTERM to the command");
                send(libc::SIGTERM);
                let valid_until = permit.map_or_else(Instant::now, Permit::valid_until);
                let deadline = valid_until.checked_sub(KILL_LEAD).unwrap_or_else(Instant::now);
                kill_at = Some(deadline);
                loss = Some(reason);
            }
            _ = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() && !killed => {
                tracing::info!("the command still runs as the lease could expire; sending SIGKILL");
                send(libc::SIGKILL);
                killed = true;
            }
            Some(signal) = caught.recv() => {
                if should_forward(&signal, own_group, pid) {
                    tracing::debug!(signal = %signals::name(signal.signal), "forwarding to the command");
                    send(signal.signal);
                }
            }
        }
    }
}

/// Whether a signal tessera caught should go on to the command.
fn should_forward(signal: &Caught, own_group: bool, child: libc::pid_t) -> bool {
    if signal.sent_by_process() && signal.pid == child {
        return false; // the command signalled tessera: do not bounce it back
    }
    // In tessera's own process group, the kernel (a terminal) already sent it to the command.
    own_group || signal.sent_by_process()
}

/// Stdin is a terminal and tessera is in its foreground process group.
fn is_interactive() -> bool {
    // SAFETY: plain queries on fd 0 and on this process.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code as u8,
        (None, Some(signal)) => exit::SIGNAL_BASE.saturating_add(signal as u8),
        (None, None) => exit::OS_ERROR,
    }
}

async fn release(permit: Permit) {
    let name = permit.name().to_string();
    let within = RELEASE_TIMEOUT.min(
        permit
            .valid_until()
            .saturating_duration_since(Instant::now())
            + RELEASE_AFTER_VALID,
    );
    match tokio::time::timeout(within, permit.release()).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => eprintln!(
            "tessera: could not release the permit on {name} ({}); it expires by its TTL",
            exit::one_line(&e.to_string())
        ),
        Err(_) => eprintln!(
            "tessera: the store did not answer the release of the permit on {name}; it expires by its TTL"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caught(signal: libc::c_int, code: libc::c_int, pid: libc::pid_t) -> Caught {
        Caught { signal, code, pid }
    }

    #[test]
    fn terminal_signals_are_not_delivered_twice() {
        const SI_KERNEL: libc::c_int = 0x80;
        // Same process group: the terminal already signalled the command.
        assert!(!should_forward(
            &caught(libc::SIGINT, SI_KERNEL, 0),
            false,
            42
        ));
        // Own group: the terminal's signal reached only tessera.
        assert!(should_forward(
            &caught(libc::SIGINT, SI_KERNEL, 0),
            true,
            42
        ));
        // `kill` from another process: always forwarded.
        assert!(should_forward(&caught(libc::SIGTERM, 0, 7), false, 42));
        // The command signalling tessera: never bounced back.
        assert!(!should_forward(&caught(libc::SIGUSR1, 0, 42), true, 42));
    }

    /// The loss path, in one process (the memory store is per process): an admin revoke must
    /// stop the command with SIGTERM and report the loss.
    #[tokio::test]
    async fn a_revoked_permit_stops_the_command() {
        let store = Store::connect("memory://cli-run-lost").await.unwrap();
        let sem = Semaphore::new(
            &store,
            "lost",
            1,
            SemaphoreOptions::default().ttl(Duration::from_secs(3)),
        )
        .unwrap();
        let permit = sem.acquire().await.unwrap();
        let command = ["sleep", "30"].map(OsString::from);
        let mut child = spawn(&command, "t", Some(&permit), true, None).unwrap();
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let lease = permit.lease_id().to_string();
        let started = Instant::now();
        let admin = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(admin.revoke("lost", &lease).await.unwrap());
        });
        let done = supervise(&mut child, true, Some(&permit), &mut rx)
            .await
            .unwrap();
        assert!(done.loss.is_some());
        assert_eq!(done.status.signal(), Some(libc::SIGTERM));
        assert!(!done.killed);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    fn refused() -> tessera::Error {
        tessera::Error::Store {
            kind: tessera::StoreErrorKind::Connection,
            message: "Connection refused".into(),
        }
    }

    fn waiting(store: &Store, deadline: Option<Instant>) -> Waiting<'_> {
        Waiting {
            store,
            name: "outage",
            what: "a permit",
            again: "from the tail of the queue",
            deadline,
            held: None,
        }
    }

    /// Faults the library gave up on are retried while the store answers (the memory
    /// store's status always does) and no deadline passed.
    #[tokio::test]
    async fn transient_faults_do_not_end_a_wait_without_a_deadline() {
        let store = Store::connect("memory://cli-ride-out").await.unwrap();
        let mut attempts = 0;
        let got = ride_out(waiting(&store, None), || {
            attempts += 1;
            let fail = attempts <= 2;
            async move {
                if fail {
                    Err(refused())
                } else {
                    Ok(7)
                }
            }
        })
        .await;
        assert_eq!(got.unwrap(), 7);
        assert_eq!(attempts, 3);
    }

    /// An outage still on when `--wait` runs out ends the wait with the store's code, then.
    #[tokio::test]
    async fn a_fault_outlasting_the_deadline_fails_with_the_store_error_at_the_deadline() {
        let store = Store::connect("memory://cli-ride-out-deadline")
            .await
            .unwrap();
        let started = Instant::now();
        let deadline = started + Duration::from_millis(150);
        let got: Result<(), Failure> =
            ride_out(waiting(&store, Some(deadline)), || async { Err(refused()) }).await;
        let failure = got.unwrap_err();
        assert_eq!(failure.code, exit::UNAVAILABLE);
        assert!(failure.message.contains("--wait ran out"), "{failure}");
        assert!(Instant::now() >= deadline);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// Other errors, and faults once the deadline passed (`--wait 0s`), end it at once.
    #[tokio::test]
    async fn other_errors_and_faults_past_the_deadline_end_the_wait_at_once() {
        let store = Store::connect("memory://cli-ride-out-now").await.unwrap();
        let mut attempts = 0;
        let got: Result<(), Failure> = ride_out(waiting(&store, None), || {
            attempts += 1;
            async { Err(tessera::Error::NotFound("outage".into())) }
        })
        .await;
        assert_eq!(got.unwrap_err().code, exit::NOT_FOUND);
        assert_eq!(attempts, 1);
        let mut attempts = 0;
        let got: Result<(), Failure> = ride_out(waiting(&store, Some(Instant::now())), || {
            attempts += 1;
            async { Err(refused()) }
        })
        .await;
        assert_eq!(got.unwrap_err().code, exit::UNAVAILABLE);
        assert_eq!(attempts, 1);
    }

    /// A command that ignores SIGTERM is killed before the lease could expire.
    #[tokio::test]
    async fn a_command_ignoring_sigterm_is_killed_before_the_lease_expires() {
        let store = Store::connect("memory://cli-run-kill").await.unwrap();
        let ttl = Duration::from_secs(1);
        let sem = Semaphore::new(&store, "kill", 1, SemaphoreOptions::default().ttl(ttl)).unwrap();
        let permit = sem.acquire().await.unwrap();
        let command = ["sh", "-c", "trap '' TERM; sleep 30"].map(OsString::from);
        let mut child = spawn(&command, "t", Some(&permit), true, None).unwrap();
        let (_tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let lease = permit.lease_id().to_string();
        let admin = store.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            admin.revoke("kill", &lease).await.unwrap();
        });
        let done = supervise(&mut child, true, Some(&permit), &mut rx)
            .await
            .unwrap();
        assert!(done.killed);
        assert_eq!(done.status.signal(), Some(libc::SIGKILL));
        assert!(Instant::now() < permit.valid_until());
    }
}
