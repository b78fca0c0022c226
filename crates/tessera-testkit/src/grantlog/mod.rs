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

mod checker;
mod format;
#[cfg(test)]
mod tests;
mod violation;

pub use checker::{check, check_with_grace, CANCEL_GRACE_NS, DEADLINE_GRACE_NS};
pub use format::{
    instant_to_ns, monotonic_ns, read_logs, tenant_sem, AcquireMode, Event, EventKind, EventLog,
    FaultPhase, Outcome,
};
pub use violation::{LeaseInfo, Report, Stats, Violation};
