//! What the checker reports: the leases it reconstructed, every broken property
//! ([`Violation`]) with a witness, and counts.

use std::collections::BTreeMap;
use std::fmt;

use tessera::LeaseId;

#[cfg(doc)]
use super::check;

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
