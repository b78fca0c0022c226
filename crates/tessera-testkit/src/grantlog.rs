//! Grant logs: what workers saw, written as JSON lines, and the checker that proves the
//! contract from them afterwards.
//!
//! # The format
//!
//! Each worker process appends [`Event`]s to its own `*.jsonl` file through an [`EventLog`],
//! one line per event, each written with a single `write` so a worker killed with SIGKILL
//! leaves every line but possibly a torn last one (which [`read_logs`] skips). Every event is
//! stamped with the host's `CLOCK_MONOTONIC` in nanoseconds ([`monotonic_ns`]), the same clock
//! in every process of the host, so logs of many processes merge into one timeline.
//!
//! # What "certainly held" means
//!
//! A worker cannot see the store; it only knows what the store answered. A lease is
//! **certainly held** over `[grant returned, min(release invoked, lost notice, last
//! valid_until))`: the store granted it before the acquire returned, released it only after
//! the release was sent, and the holder cannot be sure of anything past its latest
//! [`tessera::Permit::valid_until`]. Each of these ends is conservative, so a correct store
//! can never make two certainly-held intervals conflict; any conflict the checker finds is a
//! real bug in the store or the client.
//!
//! # What [`check`] proves, per semaphore
//!
//! - **C1, never over-grant**: at no instant does the weight of the certainly-held leases
//!   exceed the capacity (a sweep over the interval ends);
//! - **C2, fences increase per seat**: if lease B's interval starts after lease A's ended and
//!   they share a seat, `fence(B) > fence(A)`; and no fence is granted twice;
//! - **seats**: two leases whose intervals overlap never share a seat; every seat is in
//!   `0..capacity`; a lease holds exactly `weight` distinct seats;
//! - **C3, fence order follows real-time order**: if lease A's acquire returned before lease
//!   B's acquire was invoked (on the same semaphore), `fence(A) < fence(B)`;
//! - **C4, every "no permit" is explained**: while a try-acquire of weight `w` was in flight,
//!   either the leases *possibly* held left fewer than `w` permits free at some instant, or
//!   some other acquire was possibly waiting (a try-acquire never jumps the queue). A lease is
//!   possibly held from its acquire's invocation to its release's return (forever if it never
//!   returned); a timed-out or failed acquire possibly waits, and possibly holds a grant that
//!   raced with its cancellation, until [`CANCEL_GRACE_NS`] after it returned (the
//!   cancellation runs in the background);
//! - **C7, deadlines**: a timed acquire returns within its timeout plus the documented cancel
//!   grace ([`DEADLINE_GRACE_NS`]).
//!
//! The chaos runner ([`crate::chaos`]) adds the properties that need to know the faults (C5,
//! loss notices, the fenced resource) on top of this report.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::Context;
use serde::{Deserialize, Serialize};
use tessera::LeaseId;

/// Now on the host's `CLOCK_MONOTONIC`, in nanoseconds: the same clock in every process of
/// the host, never stepped by NTP or an administrator.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A tokio instant (such as [`tessera::Permit::valid_until`]) on the [`monotonic_ns`] clock:
/// reads both clocks at the same moment and carries the offset over.
pub fn instant_to_ns(instant: tokio::time::Instant) -> u64 {
    let (now, now_ns) = (tokio::time::Instant::now(), monotonic_ns());
    if instant >= now {
        now_ns.saturating_add((instant - now).as_nanos() as u64)
    } else {
        now_ns.saturating_sub((now - instant).as_nanos() as u64)
    }
}

/// One line of a grant log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When it happened, on [`monotonic_ns`].
    pub t_ns: u64,
    /// What happened.
    #[serde(flatten)]
    pub kind: EventKind,
}

/// How an acquire was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AcquireMode {
    /// `acquire_many`: waits as long as it takes.
    Acquire,
    /// `try_acquire_many`: answers at once.
    TryAcquire,
    /// `acquire_many_timeout` with this timeout.
    Timeout {
        /// The timeout in milliseconds.
        timeout_ms: u64,
    },
}

/// What an acquire returned.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Outcome {
    /// A permit.
    Granted {
        /// Its lease id.
        lease_id: LeaseId,
        /// Its fence token.
        fence: u64,
        /// Its seats.
        seats: Vec<u32>,
        /// Its weight.
        weight: u32,
        /// [`tessera::Permit::valid_until`] on the [`monotonic_ns`] clock.
        valid_until_ns: u64,
    },
    /// A try-acquire found no permit free.
    NoPermit,
    /// A timed acquire reached its timeout.
    TimedOut,
    /// The acquire failed.
    Error {
        /// The error, displayed.
        message: String,
    },
}

/// The kinds of events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum EventKind {
    /// The capacity of a semaphore (the checker can also be given it).
    Capacity {
        /// Semaphore name.
        sem: String,
        /// Its capacity.
        capacity: u32,
    },
    /// An acquire is about to be sent.
    AcquireInvoked {
        /// The worker.
        worker: String,
        /// The operation number within the worker; pairs this with its return.
        op: u64,
        /// Semaphore name.
        sem: String,
        /// Permits asked for.
        weight: u32,
        /// How.
        mode: AcquireMode,
    },
    /// An acquire returned.
    AcquireReturned {
        /// The worker.
        worker: String,
        /// The operation number, as in [`EventKind::AcquireInvoked`].
        op: u64,
        /// What it returned.
        outcome: Outcome,
    },
    /// The holder saw its certain validity move (a renewal was acknowledged).
    Renewed {
        /// The lease.
        lease_id: LeaseId,
        /// The new [`tessera::Permit::valid_until`] on the [`monotonic_ns`] clock.
        valid_until_ns: u64,
    },
    /// A release is about to be sent.
    ReleaseInvoked {
        /// The lease.
        lease_id: LeaseId,
    },
    /// A release returned.
    ReleaseReturned {
        /// The lease.
        lease_id: LeaseId,
        /// Whether the store still held it.
        was_held: bool,
        /// The error, if the release failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// `Permit::lost()` fired.
    Lost {
        /// The lease.
        lease_id: LeaseId,
        /// Why, displayed.
        reason: String,
    },
    /// A fault injected or healed by the chaos runner.
    Fault {
        /// What was done (`sigkill`, `sigstop`, `blackhole`, `restart`, …).
        action: String,
        /// Whether the fault starts, heals, or is over at once.
        phase: FaultPhase,
        /// The worker it hit, if it hit one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
    },
    /// A holder wrote to the fenced resource with its fence.
    ResourceWrite {
        /// The lease.
        lease_id: LeaseId,
        /// The seat written.
        seat: u32,
        /// The fence sent.
        fence: u64,
        /// Whether the resource accepted it.
        accepted: bool,
        /// Whether the lease was certainly held when the write was sent (before
        /// `valid_until`); a write sent while merely *believing* to hold is `false`.
        certain: bool,
    },
}

/// The phase of a [`EventKind::Fault`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultPhase {
    /// The fault begins (the store or holder is impaired from now on).
    Start,
    /// The fault is healed.
    Heal,
    /// A fault that is over as soon as it happened (a SIGKILL).
    Instant,
}

impl Event {
    /// An event stamped now.
    pub fn now(kind: EventKind) -> Event {
        Event {
            t_ns: monotonic_ns(),
            kind,
        }
    }
}

/// Appends events to one file, a whole line per `write` call, so a killed writer leaves a log
/// that is complete up to its last line.
#[derive(Debug)]
pub struct EventLog {
    file: Mutex<File>,
    path: PathBuf,
}

impl EventLog {
    /// Creates (or truncates) the log file.
    pub fn create(path: impl AsRef<Path>) -> anyhow::Result<EventLog> {
        let path = path.as_ref().to_path_buf();
        let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(EventLog {
            file: Mutex::new(file),
            path,
        })
    }

    /// Writes one event as one line. The file is unbuffered: the line reaches the kernel
    /// before this returns.
    pub fn write(&self, event: &Event) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(event)?;
        line.push(b'\n');
        self.file
            .lock()
            .unwrap()
            .write_all(&line)
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// Stamps an event now and writes it.
    pub fn log(&self, kind: EventKind) -> anyhow::Result<()> {
        self.write(&Event::now(kind))
    }
}

/// Reads and merges every `*.jsonl` file in `dir`, ordered by time. A torn last line (a
/// worker killed mid-write) is skipped; any other unreadable line is an error.
pub fn read_logs(dir: &Path) -> anyhow::Result<Vec<Event>> {
    let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    paths.sort();
    let mut events = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let lines: Vec<&str> = text.split('\n').collect();
        for (i, line) in lines.iter().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            match serde_json::from_str::<Event>(line) {
                Ok(e) => events.push(e),
                // The last piece after the final '\n' is a line the writer never finished.
                Err(_) if i == lines.len() - 1 => {}
                Err(e) => anyhow::bail!("{}:{}: unreadable event: {e}", path.display(), i + 1),
            }
        }
    }
    events.sort_by_key(|e| e.t_ns);
    Ok(events)
}

/// A lease as the checker saw it, with its certainly-held interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseInfo {
    /// Semaphore name.
    pub sem: String,
    /// The worker that held it.
    pub worker: String,
    /// Lease id.
    pub lease_id: LeaseId,
    /// Fence token.
    pub fence: u64,
    /// Seats.
    pub seats: Vec<u32>,
    /// Weight.
    pub weight: u32,
    /// When its acquire was invoked.
    pub invoked_ns: u64,
    /// Start of the certainly-held interval (the acquire returned).
    pub start_ns: u64,
    /// End of the certainly-held interval (exclusive).
    pub end_ns: u64,
}

/// Monotonic nanoseconds as seconds with nanosecond digits.
fn ns(t: u64) -> String {
    format!("{}.{:09}s", t / 1_000_000_000, t % 1_000_000_000)
}

impl fmt::Display for LeaseInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "worker {} lease {} fence {} weight {} seats {:?} held [{} .. {})",
            self.worker,
            self.lease_id,
            self.fence,
            self.weight,
            self.seats,
            ns(self.start_ns),
            ns(self.end_ns)
        )
    }
}

/// A broken property, with a witness a human can follow.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Violation {
    /// C1: more permits certainly held than the capacity at one instant.
    OverCapacity {
        /// Semaphore.
        sem: String,
        /// The instant.
        at_ns: u64,
        /// Capacity.
        capacity: u32,
        /// Weight certainly held at that instant.
        held: u32,
        /// The leases certainly held at that instant.
        leases: Vec<LeaseInfo>,
    },
    /// C2: the same fence granted to two leases.
    FenceReused {
        /// Semaphore.
        sem: String,
        /// The leases.
        first: LeaseInfo,
        /// The leases.
        second: LeaseInfo,
    },
    /// C2: a later lease on a seat got a fence not above an earlier one's.
    FenceNotIncreasing {
        /// Semaphore.
        sem: String,
        /// The shared seat.
        seat: u32,
        /// The lease that ended first.
        earlier: LeaseInfo,
        /// The lease that started after it ended.
        later: LeaseInfo,
    },
    /// Two leases certainly held at the same time on the same seat.
    SeatCollision {
        /// Semaphore.
        sem: String,
        /// The seat.
        seat: u32,
        /// One lease.
        first: LeaseInfo,
        /// The other.
        second: LeaseInfo,
    },
    /// A seat outside `0..capacity`.
    SeatOutOfRange {
        /// Semaphore.
        sem: String,
        /// The seat.
        seat: u32,
        /// Capacity.
        capacity: u32,
        /// The lease.
        lease: LeaseInfo,
    },
    /// A lease whose seats are not `weight` distinct seats, or whose weight is not the one
    /// asked for.
    BadSeatsOrWeight {
        /// What is wrong.
        problem: String,
        /// The lease.
        lease: LeaseInfo,
    },
    /// C3: a lease whose acquire was invoked after another's returned got a smaller fence.
    FenceOrder {
        /// Semaphore.
        sem: String,
        /// The lease granted first in real time.
        earlier: LeaseInfo,
        /// The lease asked for after `earlier` was granted.
        later: LeaseInfo,
    },
    /// C7: a timed acquire returned after its deadline (plus the cancel grace).
    DeadlineMissed {
        /// Semaphore.
        sem: String,
        /// The worker.
        worker: String,
        /// Its operation number.
        op: u64,
        /// The timeout asked for.
        timeout_ms: u64,
        /// How long it took.
        took_ms: u64,
    },
    /// C4: a try-acquire found no permit although, as far as the log shows, enough were free
    /// and nobody waited.
    NoPermitUnexplained {
        /// Semaphore.
        sem: String,
        /// The worker.
        worker: String,
        /// Its operation number.
        op: u64,
        /// Permits asked for.
        weight: u32,
        /// Capacity.
        capacity: u32,
        /// The most permits possibly held at one instant while the try-acquire was in flight.
        possibly_held: u32,
        /// When it was invoked.
        invoked_ns: u64,
        /// When it returned.
        returned_ns: u64,
    },
    /// No capacity known for a semaphore with grants.
    UnknownCapacity {
        /// Semaphore.
        sem: String,
    },
    /// The log itself is inconsistent (a return without an invocation, a lease id granted
    /// twice, an event about an unknown lease).
    Log {
        /// What is wrong.
        problem: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::OverCapacity {
                sem,
                at_ns,
                capacity,
                held,
                leases,
            } => {
                write!(
                    f,
                    "C1 over-grant on {sem:?}: at {} {held} permits certainly held, capacity {capacity}:",
                    ns(*at_ns)
                )?;
                for l in leases {
                    write!(f, "\n    {l}")?;
                }
                Ok(())
            }
            Violation::FenceReused { sem, first, second } => write!(
                f,
                "C2 fence reused on {sem:?}: fence {} granted twice:\n    {first}\n    {second}",
                first.fence
            ),
            Violation::FenceNotIncreasing {
                sem,
                seat,
                earlier,
                later,
            } => write!(
                f,
                "C2 fence went backwards on {sem:?} seat {seat}: fence {} after fence {}:\n    earlier: {earlier}\n    later:   {later}",
                later.fence, earlier.fence
            ),
            Violation::SeatCollision {
                sem,
                seat,
                first,
                second,
            } => write!(
                f,
                "seat collision on {sem:?} seat {seat}: held by two leases at once:\n    {first}\n    {second}"
            ),
            Violation::SeatOutOfRange {
                sem,
                seat,
                capacity,
                lease,
            } => write!(
                f,
                "seat out of range on {sem:?}: seat {seat} not in 0..{capacity}:\n    {lease}"
            ),
            Violation::BadSeatsOrWeight { problem, lease } => {
                write!(f, "bad lease on {:?}: {problem}:\n    {lease}", lease.sem)
            }
            Violation::NoPermitUnexplained {
                sem,
                worker,
                op,
                weight,
                capacity,
                possibly_held,
                invoked_ns,
                returned_ns,
            } => write!(
                f,
                "C4 unexplained \"no permit\" on {sem:?}: worker {worker} op {op} asked for {weight} \
                 during [{} .. {}], but at most {possibly_held} of {capacity} permits were possibly \
                 held and nobody possibly waited",
                ns(*invoked_ns),
                ns(*returned_ns)
            ),
            Violation::FenceOrder {
                sem,
                earlier,
                later,
            } => write!(
                f,
                "C3 fence order on {sem:?}: fence {} was asked for after fence {} was granted:\n    earlier: {earlier}\n    later:   {later}",
                later.fence, earlier.fence
            ),
            Violation::DeadlineMissed {
                sem,
                worker,
                op,
                timeout_ms,
                took_ms,
            } => write!(
                f,
                "C7 deadline missed on {sem:?}: worker {worker} op {op} asked for a {timeout_ms} ms timeout and returned after {took_ms} ms"
            ),
            Violation::UnknownCapacity { sem } => {
                write!(f, "no capacity known for {sem:?}: log a Capacity event or pass it")
            }
            Violation::Log { problem } => write!(f, "inconsistent log: {problem}"),
        }
    }
}

/// Counts over the whole log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Acquires invoked.
    pub acquires: u64,
    /// Grants.
    pub grants: u64,
    /// "No permit" answers to try-acquires.
    pub no_permit: u64,
    /// Timed acquires that timed out.
    pub timed_out: u64,
    /// Acquires that failed.
    pub errors: u64,
    /// Renewals seen.
    pub renewals: u64,
    /// Releases that returned.
    pub releases: u64,
    /// `lost()` notices.
    pub losses: u64,
    /// Per semaphore, the largest weight certainly held at one instant.
    pub max_concurrent_weight: BTreeMap<String, u32>,
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} acquires: {} granted, {} no permit, {} timed out, {} errors; {} renewals, {} releases, {} losses; max concurrent weight {:?}",
            self.acquires,
            self.grants,
            self.no_permit,
            self.timed_out,
            self.errors,
            self.renewals,
            self.releases,
            self.losses,
            self.max_concurrent_weight
        )
    }
}

/// What [`check`] found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Every broken property, with a witness.
    pub violations: Vec<Violation>,
    /// Counts.
    pub stats: Stats,
    /// Every granted lease with its certainly-held interval, in grant order.
    pub leases: Vec<LeaseInfo>,
    /// The largest time a timed acquire took beyond its timeout, in nanoseconds.
    pub max_deadline_overrun_ns: u64,
}

impl Report {
    /// True if no property was broken.
    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }

    /// Panics with every violation if any property was broken.
    pub fn assert_ok(&self) {
        assert!(self.is_ok(), "{self}");
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.stats)?;
        writeln!(f, "{} violation(s)", self.violations.len())?;
        for v in &self.violations {
            writeln!(f, "- {v}")?;
        }
        Ok(())
    }
}

/// A granted lease being reconstructed from the log.
struct LeaseRec {
    info: LeaseInfo,
    requested: Option<u32>,
    valid_until_ns: u64,
    released_ns: Option<u64>,
    lost_ns: Option<u64>,
}

impl LeaseRec {
    fn finish(mut self) -> LeaseInfo {
        let end = [Some(self.valid_until_ns), self.released_ns, self.lost_ns]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.valid_until_ns);
        self.info.end_ns = end;
        self.info
    }
}

/// Checks a merged grant log (see the module docs for the properties). `capacities` gives
/// capacities by semaphore name; `Capacity` events in the log add to them.
pub fn check(events: &[Event], capacities: &HashMap<String, u32>) -> Report {
    check_with_grace(events, capacities, CANCEL_GRACE_NS)
}

/// [`check`], with how long a timed-out or failed acquire may still wait or hold after it
/// returned (instead of [`CANCEL_GRACE_NS`]): under network faults its cancellation can fail,
/// and its queue entry then lives until its waiter TTL, and a grant that raced with it until
/// the lease TTL.
pub fn check_with_grace(
    events: &[Event],
    capacities: &HashMap<String, u32>,
    grace_ns: u64,
) -> Report {
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| e.t_ns);

    let mut report = Report::default();
    let mut caps: HashMap<String, u32> = capacities.clone();
    let mut invoked: HashMap<(String, u64), (String, u32, u64, AcquireMode)> = HashMap::new();
    let mut leases: HashMap<LeaseId, LeaseRec> = HashMap::new();
    let mut order: Vec<LeaseId> = Vec::new();
    let stats = &mut report.stats;
    let violations = &mut report.violations;

    for e in &events {
        match &e.kind {
            EventKind::Capacity { sem, capacity } => {
                caps.insert(sem.clone(), *capacity);
            }
            EventKind::AcquireInvoked {
                worker,
                op,
                sem,
                weight,
                mode,
            } => {
                stats.acquires += 1;
                invoked.insert((worker.clone(), *op), (sem.clone(), *weight, e.t_ns, *mode));
            }
            EventKind::AcquireReturned {
                worker,
                op,
                outcome,
            } => {
                let asked = invoked.remove(&(worker.clone(), *op));
                match &asked {
                    None => violations.push(Violation::Log {
                        problem: format!("worker {worker} op {op} returned but was never invoked"),
                    }),
                    Some((sem, _, t0, AcquireMode::Timeout { timeout_ms })) => {
                        let took = e.t_ns.saturating_sub(*t0);
                        let over = took.saturating_sub(timeout_ms * 1_000_000);
                        report.max_deadline_overrun_ns = report.max_deadline_overrun_ns.max(over);
                        if over > DEADLINE_GRACE_NS {
                            violations.push(Violation::DeadlineMissed {
                                sem: sem.clone(),
                                worker: worker.clone(),
                                op: *op,
                                timeout_ms: *timeout_ms,
                                took_ms: took / 1_000_000,
                            });
                        }
                    }
                    Some(_) => {}
                }
                match outcome {
                    Outcome::Granted {
                        lease_id,
                        fence,
                        seats,
                        weight,
                        valid_until_ns,
                    } => {
                        stats.grants += 1;
                        if leases.contains_key(lease_id) {
                            violations.push(Violation::Log {
                                problem: format!(
                                    "lease {lease_id} granted twice (worker {worker} op {op})"
                                ),
                            });
                            continue;
                        }
                        let (sem, requested, invoked_ns) = match asked {
                            Some((sem, w, t0, _)) => (sem, Some(w), t0),
                            None => ("?".to_string(), None, e.t_ns),
                        };
                        order.push(*lease_id);
                        leases.insert(
                            *lease_id,
                            LeaseRec {
                                info: LeaseInfo {
                                    sem,
                                    worker: worker.clone(),
                                    lease_id: *lease_id,
                                    fence: *fence,
                                    seats: seats.clone(),
                                    weight: *weight,
                                    invoked_ns,
                                    start_ns: e.t_ns,
                                    end_ns: 0,
                                },
                                requested,
                                valid_until_ns: *valid_until_ns,
                                released_ns: None,
                                lost_ns: None,
                            },
                        );
                    }
                    Outcome::NoPermit => stats.no_permit += 1,
                    Outcome::TimedOut => stats.timed_out += 1,
                    Outcome::Error { .. } => stats.errors += 1,
                }
            }
            EventKind::Renewed {
                lease_id,
                valid_until_ns,
            } => {
                stats.renewals += 1;
                match leases.get_mut(lease_id) {
                    Some(l) => l.valid_until_ns = *valid_until_ns,
                    None => violations.push(Violation::Log {
                        problem: format!("renewal of unknown lease {lease_id}"),
                    }),
                }
            }
            EventKind::ReleaseInvoked { lease_id } => match leases.get_mut(lease_id) {
                Some(l) => {
                    l.released_ns.get_or_insert(e.t_ns);
                }
                None => violations.push(Violation::Log {
                    problem: format!("release of unknown lease {lease_id}"),
                }),
            },
            EventKind::ReleaseReturned { .. } => stats.releases += 1,
            EventKind::Lost { lease_id, .. } => {
                stats.losses += 1;
                match leases.get_mut(lease_id) {
                    Some(l) => {
                        l.lost_ns.get_or_insert(e.t_ns);
                    }
                    None => violations.push(Violation::Log {
                        problem: format!("loss of unknown lease {lease_id}"),
                    }),
                }
            }
            EventKind::Fault { .. } | EventKind::ResourceWrite { .. } => {}
        }
    }

    // Per semaphore, in grant order.
    let mut by_sem: BTreeMap<String, Vec<LeaseInfo>> = BTreeMap::new();
    for id in order {
        let rec = leases.remove(&id).expect("every ordered lease is recorded");
        let requested = rec.requested;
        let info = rec.finish();
        if let Some(w) = requested {
            if w != info.weight {
                violations.push(Violation::BadSeatsOrWeight {
                    problem: format!("asked for weight {w}, granted weight {}", info.weight),
                    lease: info.clone(),
                });
            }
        }
        let mut distinct = info.seats.clone();
        distinct.sort_unstable();
        distinct.dedup();
        if distinct.len() != info.seats.len() || info.seats.len() != info.weight as usize {
            violations.push(Violation::BadSeatsOrWeight {
                problem: format!(
                    "weight {} but {} seats, {} distinct",
                    info.weight,
                    info.seats.len(),
                    distinct.len()
                ),
                lease: info.clone(),
            });
        }
        by_sem.entry(info.sem.clone()).or_default().push(info);
    }

    check_no_permits(&events, &caps, grace_ns, violations);
    for (sem, leases) in &by_sem {
        check_fences_unique(sem, leases, violations);
        check_fence_order(sem, leases, violations);
        let Some(&capacity) = caps.get(sem) else {
            violations.push(Violation::UnknownCapacity { sem: sem.clone() });
            continue;
        };
        let held: Vec<&LeaseInfo> = leases.iter().filter(|l| l.end_ns > l.start_ns).collect();
        let max = check_capacity(sem, capacity, &held, violations);
        stats.max_concurrent_weight.insert(sem.clone(), max);
        check_seats(sem, capacity, &held, violations);
    }
    report.leases = by_sem.into_values().flatten().collect();
    report.leases.sort_by_key(|l| l.start_ns);
    report
}

/// How far past its timeout a timed acquire may return: the 250 ms it may spend giving its
/// queue place back (documented on `Semaphore::acquire_many_timeout`) plus 250 ms for a busy
/// 2-core machine to schedule the caller.
pub const DEADLINE_GRACE_NS: u64 = 500_000_000;

/// C3: walks the leases by invocation; each must have a fence above every lease whose
/// acquire returned before it was invoked.
fn check_fence_order(sem: &str, leases: &[LeaseInfo], violations: &mut Vec<Violation>) {
    let mut by_start: Vec<&LeaseInfo> = leases.iter().collect();
    by_start.sort_by_key(|l| l.start_ns);
    let mut by_invoked: Vec<&LeaseInfo> = leases.iter().collect();
    by_invoked.sort_by_key(|l| l.invoked_ns);
    let mut granted = by_start.iter().peekable();
    let mut top: Option<&LeaseInfo> = None;
    for l in by_invoked {
        while let Some(&&a) = granted.peek() {
            if a.start_ns >= l.invoked_ns {
                break;
            }
            if top.is_none_or(|t| a.fence > t.fence) {
                top = Some(a);
            }
            granted.next();
        }
        if let Some(a) = top {
            if l.fence <= a.fence && a.lease_id != l.lease_id {
                violations.push(Violation::FenceOrder {
                    sem: sem.to_string(),
                    earlier: a.clone(),
                    later: l.clone(),
                });
            }
        }
    }
}

/// How long after a timed-out or failed acquire returned the checker still counts it as
/// possibly waiting or holding: its cancellation runs in the background.
pub const CANCEL_GRACE_NS: u64 = 1_000_000_000;

/// One acquire, from the log, for C3.
struct Op<'a> {
    sem: &'a str,
    worker: &'a str,
    op: u64,
    weight: u32,
    mode: AcquireMode,
    invoked_ns: u64,
    returned: Option<(u64, &'a Outcome)>,
}

/// C4: every "no permit" answer is explained by possible holders or waiters.
fn check_no_permits(
    events: &[&Event],
    caps: &HashMap<String, u32>,
    grace_ns: u64,
    violations: &mut Vec<Violation>,
) {
    let mut ops: Vec<Op> = Vec::new();
    let mut index: HashMap<(&str, u64), usize> = HashMap::new();
    // Possible end of each lease: its release's return.
    let mut released: HashMap<LeaseId, u64> = HashMap::new();
    for e in events {
        match &e.kind {
            EventKind::AcquireInvoked {
                worker,
                op,
                sem,
                weight,
                mode,
            } => {
                index.insert((worker, *op), ops.len());
                ops.push(Op {
                    sem,
                    worker,
                    op: *op,
                    weight: *weight,
                    mode: *mode,
                    invoked_ns: e.t_ns,
                    returned: None,
                });
            }
            EventKind::AcquireReturned {
                worker,
                op,
                outcome,
            } => {
                if let Some(&i) = index.get(&(worker.as_str(), *op)) {
                    ops[i].returned = Some((e.t_ns, outcome));
                }
            }
            EventKind::ReleaseReturned {
                lease_id,
                error: None,
                ..
            } => {
                released.entry(*lease_id).or_insert(e.t_ns);
            }
            _ => {}
        }
    }
    // Per semaphore: intervals of possible waiting, and of possible holding with a weight.
    let mut waiting: HashMap<&str, Vec<(u64, u64)>> = HashMap::new();
    let mut holding: HashMap<&str, Vec<(u64, u64, u32)>> = HashMap::new();
    for o in &ops {
        let try_mode = o.mode == AcquireMode::TryAcquire;
        match o.returned {
            None if !try_mode => {
                waiting
                    .entry(o.sem)
                    .or_default()
                    .push((o.invoked_ns, u64::MAX));
                holding
                    .entry(o.sem)
                    .or_default()
                    .push((o.invoked_ns, u64::MAX, o.weight));
            }
            None => {}
            Some((
                t,
                Outcome::Granted {
                    lease_id, weight, ..
                },
            )) => {
                if !try_mode {
                    waiting.entry(o.sem).or_default().push((o.invoked_ns, t));
                }
                let end = released.get(lease_id).copied().unwrap_or(u64::MAX);
                holding
                    .entry(o.sem)
                    .or_default()
                    .push((o.invoked_ns, end, *weight));
            }
            Some((t, Outcome::TimedOut | Outcome::Error { .. })) if !try_mode => {
                let end = t.saturating_add(grace_ns);
                waiting.entry(o.sem).or_default().push((o.invoked_ns, end));
                holding
                    .entry(o.sem)
                    .or_default()
                    .push((o.invoked_ns, end, o.weight));
            }
            Some(_) => {}
        }
    }
    for o in &ops {
        let Some((returned_ns, Outcome::NoPermit)) = o.returned else {
            continue;
        };
        let Some(&capacity) = caps.get(o.sem) else {
            continue; // reported as UnknownCapacity if the semaphore had grants
        };
        let (from, to) = (o.invoked_ns, returned_ns);
        let overlaps = |a: u64, b: u64| a <= to && b >= from;
        if waiting
            .get(o.sem)
            .is_some_and(|w| w.iter().any(|&(a, b)| overlaps(a, b)))
        {
            continue;
        }
        // The most weight possibly held at one instant of [from, to].
        let mut points: Vec<(u64, bool, u32)> = Vec::new();
        for &(a, b, w) in holding.get(o.sem).map(Vec::as_slice).unwrap_or(&[]) {
            if overlaps(a, b) {
                points.push((a.max(from), false, w));
                points.push((b.min(to), true, w));
            }
        }
        // Closed intervals: at equal times, starts (false) before ends (true).
        points.sort_unstable();
        let (mut sum, mut max) = (0u64, 0u64);
        for (_, is_end, w) in points {
            if is_end {
                sum -= w as u64;
            } else {
                sum += w as u64;
                max = max.max(sum);
            }
        }
        if max + o.weight as u64 <= capacity as u64 {
            violations.push(Violation::NoPermitUnexplained {
                sem: o.sem.to_string(),
                worker: o.worker.to_string(),
                op: o.op,
                weight: o.weight,
                capacity,
                possibly_held: max.min(u32::MAX as u64) as u32,
                invoked_ns: from,
                returned_ns: to,
            });
        }
    }
}

fn check_fences_unique(sem: &str, leases: &[LeaseInfo], violations: &mut Vec<Violation>) {
    let mut seen: HashMap<u64, &LeaseInfo> = HashMap::new();
    for l in leases {
        if let Some(first) = seen.insert(l.fence, l) {
            violations.push(Violation::FenceReused {
                sem: sem.to_string(),
                first: first.clone(),
                second: l.clone(),
            });
        }
    }
}

/// C1: a sweep over the interval ends. Returns the largest weight held at one instant.
/// Reports one witness per stretch of time spent over capacity.
fn check_capacity(
    sem: &str,
    capacity: u32,
    held: &[&LeaseInfo],
    violations: &mut Vec<Violation>,
) -> u32 {
    // (time, is_start, index): at equal times ends sort before starts, because intervals are
    // half-open and a lease that ends at t does not overlap one that starts at t.
    let mut points: Vec<(u64, bool, usize)> = Vec::with_capacity(held.len() * 2);
    for (i, l) in held.iter().enumerate() {
        points.push((l.start_ns, true, i));
        points.push((l.end_ns, false, i));
    }
    points.sort_unstable();
    let mut active: BTreeMap<usize, ()> = BTreeMap::new();
    let (mut sum, mut max, mut over) = (0u64, 0u64, false);
    for (t, is_start, i) in points {
        if is_start {
            active.insert(i, ());
            sum += held[i].weight as u64;
            max = max.max(sum);
            if sum > capacity as u64 && !over {
                over = true;
                violations.push(Violation::OverCapacity {
                    sem: sem.to_string(),
                    at_ns: t,
                    capacity,
                    held: sum.min(u32::MAX as u64) as u32,
                    leases: active.keys().map(|&j| held[j].clone()).collect(),
                });
            }
        } else {
            active.remove(&i);
            sum -= held[i].weight as u64;
            if sum <= capacity as u64 {
                over = false;
            }
        }
    }
    max.min(u32::MAX as u64) as u32
}

/// Seat range, seat collisions and C2 (fences increase per seat).
fn check_seats(sem: &str, capacity: u32, held: &[&LeaseInfo], violations: &mut Vec<Violation>) {
    let mut by_seat: BTreeMap<u32, Vec<&LeaseInfo>> = BTreeMap::new();
    for l in held {
        // A seat listed twice in one lease is reported once, as a bad lease, not as a
        // collision with itself.
        let mut seats = l.seats.clone();
        seats.sort_unstable();
        seats.dedup();
        for seat in seats {
            if seat >= capacity {
                violations.push(Violation::SeatOutOfRange {
                    sem: sem.to_string(),
                    seat,
                    capacity,
                    lease: (*l).clone(),
                });
            }
            by_seat.entry(seat).or_default().push(l);
        }
    }
    for (seat, mut on_seat) in by_seat {
        on_seat.sort_by_key(|l| (l.start_ns, l.end_ns));
        // Collisions: each lease against the one reaching furthest among those before it.
        let mut furthest: Option<&LeaseInfo> = None;
        for &l in &on_seat {
            if let Some(prev) = furthest {
                if prev.end_ns > l.start_ns {
                    violations.push(Violation::SeatCollision {
                        sem: sem.to_string(),
                        seat,
                        first: prev.clone(),
                        second: l.clone(),
                    });
                }
            }
            if furthest.is_none_or(|p| l.end_ns > p.end_ns) {
                furthest = Some(l);
            }
        }
        // C2: each lease against the largest fence among the leases that ended before it
        // started (walking both orders at once).
        let mut by_end = on_seat.clone();
        by_end.sort_by_key(|l| (l.end_ns, Reverse(l.fence)));
        let mut ended = by_end.iter().peekable();
        let mut top: Option<&LeaseInfo> = None;
        for &l in &on_seat {
            while let Some(&&a) = ended.peek() {
                if a.end_ns > l.start_ns {
                    break;
                }
                if top.is_none_or(|t| a.fence > t.fence) {
                    top = Some(a);
                }
                ended.next();
            }
            if let Some(a) = top {
                if l.fence <= a.fence && a.lease_id != l.lease_id {
                    violations.push(Violation::FenceNotIncreasing {
                        sem: sem.to_string(),
                        seat,
                        earlier: a.clone(),
                        later: l.clone(),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    /// Builds logs by hand: one lease per call, with its whole life.
    #[derive(Default)]
    struct Log {
        events: Vec<Event>,
        next: u64,
    }

    impl Log {
        fn new(sem: &str, capacity: u32) -> Log {
            let mut log = Log::default();
            log.push(
                0,
                EventKind::Capacity {
                    sem: sem.into(),
                    capacity,
                },
            );
            log
        }

        fn push(&mut self, t_ms: u64, kind: EventKind) {
            self.events.push(Event {
                t_ns: t_ms * MS,
                kind,
            });
        }

        /// A lease granted at `from`, released at `to` (valid well past it).
        fn lease(&mut self, from: u64, to: u64, fence: u64, seats: &[u32]) -> LeaseId {
            let id = self.grant(from, fence, seats, to + 1000);
            self.push(to, EventKind::ReleaseInvoked { lease_id: id });
            self.push(
                to + 1,
                EventKind::ReleaseReturned {
                    lease_id: id,
                    was_held: true,
                    error: None,
                },
            );
            id
        }

        /// A lease granted at `from` with validity until `valid_until`, never released.
        fn grant(&mut self, from: u64, fence: u64, seats: &[u32], valid_until: u64) -> LeaseId {
            self.next += 1;
            let (op, id) = (self.next, LeaseId::from_u128(self.next as u128));
            let worker = format!("w{op}");
            let weight = seats.len() as u32;
            self.push(
                from.saturating_sub(1),
                EventKind::AcquireInvoked {
                    worker: worker.clone(),
                    op,
                    sem: "s".into(),
                    weight,
                    mode: AcquireMode::Acquire,
                },
            );
            self.push(
                from,
                EventKind::AcquireReturned {
                    worker,
                    op,
                    outcome: Outcome::Granted {
                        lease_id: id,
                        fence,
                        seats: seats.to_vec(),
                        weight,
                        valid_until_ns: valid_until * MS,
                    },
                },
            );
            id
        }

        fn check(&self) -> Report {
            check(&self.events, &HashMap::new())
        }
    }

    fn kinds(report: &Report) -> Vec<&'static str> {
        report
            .violations
            .iter()
            .map(|v| match v {
                Violation::OverCapacity { .. } => "over_capacity",
                Violation::FenceReused { .. } => "fence_reused",
                Violation::FenceNotIncreasing { .. } => "fence_not_increasing",
                Violation::SeatCollision { .. } => "seat_collision",
                Violation::SeatOutOfRange { .. } => "seat_out_of_range",
                Violation::BadSeatsOrWeight { .. } => "bad_seats_or_weight",
                Violation::NoPermitUnexplained { .. } => "no_permit_unexplained",
                Violation::UnknownCapacity { .. } => "unknown_capacity",
                Violation::Log { .. } => "log",
                Violation::FenceOrder { .. } => "fence_order",
                Violation::DeadlineMissed { .. } => "deadline_missed",
            })
            .collect()
    }

    /// A correct log: overlapping leases within capacity, hand-offs at the same instant,
    /// fences increasing per seat.
    fn correct_log() -> Log {
        let mut log = Log::new("s", 3);
        log.lease(10, 50, 100, &[0, 1]);
        log.lease(20, 40, 101, &[2]);
        log.lease(40, 60, 102, &[2]); // starts exactly when the previous holder of seat 2 ended
        log.lease(50, 90, 103, &[0]);
        log.lease(55, 80, 104, &[1]);
        log
    }

    #[test]
    fn a_correct_log_passes() {
        let report = correct_log().check();
        report.assert_ok();
        assert_eq!(report.stats.grants, 5);
        assert_eq!(report.stats.releases, 5);
        assert_eq!(report.stats.max_concurrent_weight["s"], 3);
    }

    #[test]
    fn over_grant_beyond_capacity_is_caught_with_a_witness() {
        let mut log = Log::new("s", 2);
        log.lease(10, 50, 1, &[0]);
        log.lease(20, 60, 2, &[1]);
        log.lease(30, 40, 3, &[0]); // also collides on seat 0
        let report = log.check();
        assert!(kinds(&report).contains(&"over_capacity"), "{report}");
        let Some(Violation::OverCapacity {
            at_ns,
            held,
            leases,
            ..
        }) = report.violations.first()
        else {
            panic!("{report}")
        };
        assert_eq!((*at_ns, *held, leases.len()), (30 * MS, 3, 3));
        let text = report.violations[0].to_string();
        assert!(text.contains("C1") && text.contains("fence 3"), "{text}");
        assert_eq!(report.stats.max_concurrent_weight["s"], 3);
    }

    #[test]
    fn weighted_over_grant_is_caught_even_with_distinct_seats() {
        let mut log = Log::new("s", 3);
        log.lease(10, 50, 1, &[0, 1]);
        log.lease(20, 60, 2, &[2, 3]); // seat 3 is also out of range
        let k = kinds(&log.check());
        assert!(
            k.contains(&"over_capacity") && k.contains(&"seat_out_of_range"),
            "{k:?}"
        );
    }

    #[test]
    fn lease_ends_at_its_last_valid_until_when_never_released() {
        // A holder killed at once: its lease is certainly held only until its valid_until,
        // so a successor after that point is no over-grant.
        let mut log = Log::new("s", 1);
        log.grant(10, 1, &[0], 30);
        log.lease(35, 50, 2, &[0]);
        log.check().assert_ok();

        // But a renewal it logged extends the interval, and then the successor overlaps.
        let mut log = Log::new("s", 1);
        let id = log.grant(10, 1, &[0], 30);
        log.push(
            20,
            EventKind::Renewed {
                lease_id: id,
                valid_until_ns: 40 * MS,
            },
        );
        log.lease(35, 50, 2, &[0]);
        let k = kinds(&log.check());
        assert!(
            k.contains(&"over_capacity") && k.contains(&"seat_collision"),
            "{k:?}"
        );
    }

    #[test]
    fn lease_ends_at_its_lost_notice() {
        let mut log = Log::new("s", 1);
        let id = log.grant(10, 1, &[0], 100);
        log.push(
            20,
            EventKind::Lost {
                lease_id: id,
                reason: "gone".into(),
            },
        );
        log.lease(25, 50, 2, &[0]);
        let report = log.check();
        report.assert_ok();
        assert_eq!(report.stats.losses, 1);
    }

    #[test]
    fn reused_fence_is_caught() {
        let mut log = Log::new("s", 2);
        log.lease(10, 20, 7, &[0]);
        log.lease(30, 40, 7, &[1]);
        let report = log.check();
        // Granted one after the other, so real-time order (C3) is broken too.
        assert_eq!(kinds(&report), ["fence_reused", "fence_order"], "{report}");
        assert!(report.violations[0]
            .to_string()
            .contains("fence 7 granted twice"));
    }

    #[test]
    fn fence_going_backwards_on_a_seat_is_caught() {
        let mut log = Log::new("s", 2);
        log.lease(10, 20, 9, &[1]);
        log.lease(30, 40, 5, &[1]);
        let report = log.check();
        assert_eq!(
            kinds(&report),
            ["fence_order", "fence_not_increasing"],
            "{report}"
        );
        let Violation::FenceNotIncreasing {
            seat,
            earlier,
            later,
            ..
        } = &report.violations[1]
        else {
            unreachable!()
        };
        assert_eq!((*seat, earlier.fence, later.fence), (1, 9, 5));
    }

    #[test]
    fn fences_may_go_backwards_across_different_seats() {
        // Fences increase per seat, not across seats: grant order is not end order.
        let mut log = Log::new("s", 2);
        log.lease(10, 20, 9, &[1]);
        log.lease(5, 40, 5, &[0]);
        log.check().assert_ok();
    }

    #[test]
    fn colliding_seats_are_caught() {
        let mut log = Log::new("s", 3);
        log.lease(10, 50, 1, &[0, 1]);
        log.lease(20, 30, 2, &[1]);
        let report = log.check();
        assert_eq!(kinds(&report), ["seat_collision"], "{report}");
    }

    #[test]
    fn seat_out_of_range_is_caught() {
        let mut log = Log::new("s", 2);
        log.lease(10, 20, 1, &[2]);
        let report = log.check();
        assert_eq!(kinds(&report), ["seat_out_of_range"], "{report}");
        assert!(report.violations[0]
            .to_string()
            .contains("seat 2 not in 0..2"));
    }

    #[test]
    fn a_lease_must_hold_weight_distinct_seats() {
        let mut log = Log::new("s", 3);
        log.lease(10, 20, 1, &[1, 1]);
        let report = log.check();
        assert_eq!(kinds(&report), ["bad_seats_or_weight"], "{report}");
    }

    #[test]
    fn capacity_may_be_passed_instead_of_logged() {
        let mut log = Log::default();
        log.lease(10, 20, 1, &[0]);
        assert_eq!(kinds(&log.check()), ["unknown_capacity"]);
        let caps = HashMap::from([("s".to_string(), 1)]);
        check(&log.events, &caps).assert_ok();
    }

    #[test]
    fn outcomes_are_counted() {
        let mut log = correct_log();
        let timeout = AcquireMode::Timeout { timeout_ms: 1 };
        for (op, outcome, mode) in [
            // Explained by the timed-out waiter next to it.
            (90, Outcome::NoPermit, AcquireMode::TryAcquire),
            (91, Outcome::TimedOut, timeout),
            (
                92,
                Outcome::Error {
                    message: "boom".into(),
                },
                AcquireMode::Acquire,
            ),
        ] {
            log.push(
                100,
                EventKind::AcquireInvoked {
                    worker: "x".into(),
                    op,
                    sem: "s".into(),
                    weight: 1,
                    mode,
                },
            );
            log.push(
                101,
                EventKind::AcquireReturned {
                    worker: "x".into(),
                    op,
                    outcome,
                },
            );
        }
        let report = log.check();
        report.assert_ok();
        let s = &report.stats;
        assert_eq!(
            (s.acquires, s.grants, s.no_permit, s.timed_out, s.errors),
            (8, 5, 1, 1, 1)
        );
    }

    /// A try-acquire of `weight` in flight over `[from, to]` that found no permit.
    fn no_permit(log: &mut Log, from: u64, to: u64, weight: u32) {
        log.next += 1;
        let op = log.next;
        log.push(
            from,
            EventKind::AcquireInvoked {
                worker: "t".into(),
                op,
                sem: "s".into(),
                weight,
                mode: AcquireMode::TryAcquire,
            },
        );
        log.push(
            to,
            EventKind::AcquireReturned {
                worker: "t".into(),
                op,
                outcome: Outcome::NoPermit,
            },
        );
    }

    #[test]
    fn no_permit_while_permits_are_held_is_explained() {
        let mut log = Log::new("s", 3);
        log.lease(10, 50, 1, &[0, 1]);
        no_permit(&mut log, 20, 21, 2);
        // The release was invoked at 50 but returns at 51: until then it is possibly held.
        no_permit(&mut log, 49, 50, 2);
        log.check().assert_ok();
    }

    #[test]
    fn no_permit_while_someone_waits_is_explained() {
        // Free permits, but an acquire is in flight: it may be queued, and a try-acquire
        // never jumps the queue.
        let mut log = Log::new("s", 3);
        log.push(
            10,
            EventKind::AcquireInvoked {
                worker: "waiter".into(),
                op: 0,
                sem: "s".into(),
                weight: 3,
                mode: AcquireMode::Acquire,
            },
        );
        no_permit(&mut log, 20, 21, 1);
        log.check().assert_ok();
    }

    #[test]
    fn no_permit_with_free_permits_and_no_waiter_is_caught() {
        let mut log = Log::new("s", 3);
        log.lease(10, 50, 1, &[0, 1]);
        no_permit(&mut log, 20, 21, 1);
        no_permit(&mut log, 60, 61, 3);
        let report = log.check();
        assert_eq!(
            kinds(&report),
            ["no_permit_unexplained", "no_permit_unexplained"],
            "{report}"
        );
        assert!(
            report.violations[0].to_string().contains("at most 2 of 3"),
            "{report}"
        );
    }

    #[test]
    fn logs_round_trip_and_a_torn_last_line_is_tolerated() {
        let dir = tempfile::tempdir().unwrap();
        let log = correct_log();
        let (a, b) = log.events.split_at(log.events.len() / 2);
        let w = EventLog::create(dir.path().join("a.jsonl")).unwrap();
        a.iter().for_each(|e| w.write(e).unwrap());
        let w = EventLog::create(dir.path().join("b.jsonl")).unwrap();
        b.iter().for_each(|e| w.write(e).unwrap());
        drop(w);
        // A worker killed in the middle of a line.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("b.jsonl"))
            .unwrap();
        f.write_all(br#"{"t_ns":5,"event":"acqu"#).unwrap();
        std::fs::write(dir.path().join("ignored.txt"), "not a log").unwrap();

        let mut expected = log.events.clone();
        expected.sort_by_key(|e| e.t_ns);
        assert_eq!(read_logs(dir.path()).unwrap(), expected);

        // A broken line that is not the last one is an error.
        std::fs::write(dir.path().join("c.jsonl"), "garbage\n{}\n").unwrap();
        assert!(read_logs(dir.path()).is_err());
    }

    #[test]
    fn instants_convert_to_the_monotonic_clock() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let now = monotonic_ns();
            let later =
                instant_to_ns(tokio::time::Instant::now() + std::time::Duration::from_secs(1));
            let d = later as i64 - now as i64 - 1_000_000_000;
            assert!(d.abs() < 50 * MS as i64, "off by {d} ns");
        });
    }

    #[test]
    fn a_fence_below_one_granted_earlier_in_real_time_is_caught() {
        // Seats differ, so C2 cannot see it; C3 does.
        let mut log = Log::new("s", 2);
        log.lease(10, 20, 7, &[0]);
        log.lease(30, 40, 6, &[1]);
        let report = log.check();
        assert_eq!(kinds(&report), ["fence_order"], "{report}");
        assert!(report.violations[0].to_string().contains("C3 fence order"));
    }

    #[test]
    fn a_timed_acquire_returning_late_is_caught() {
        let mut log = Log::new("s", 1);
        for (op, took) in [(1, 100), (2, 2000)] {
            log.push(
                10,
                EventKind::AcquireInvoked {
                    worker: "x".into(),
                    op,
                    sem: "s".into(),
                    weight: 1,
                    mode: AcquireMode::Timeout { timeout_ms: 100 },
                },
            );
            log.push(
                10 + took,
                EventKind::AcquireReturned {
                    worker: "x".into(),
                    op,
                    outcome: Outcome::TimedOut,
                },
            );
        }
        let report = log.check();
        assert_eq!(kinds(&report), ["deadline_missed"], "{report}");
        assert_eq!(report.max_deadline_overrun_ns, 1900 * MS);
    }
}
