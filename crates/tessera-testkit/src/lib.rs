//! The tessera test kit: the conformance suite every store runs, per-store harnesses, fault
//! injection at the store seam, and helpers that hold permits from other processes.

pub mod conformance;
pub mod faults;
pub mod harness;
pub mod hold;
