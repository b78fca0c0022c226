//! The tessera test kit: the conformance suite and the differential test against the
//! reference model that every store runs, per-store harnesses, fault
//! injection at the store seam, holders in other processes, the grant-log checker with the
//! worker process that writes grant logs, the chaos runner with its fault proxy, the rate-log
//! checker, heartbeats of many waiters at once for the stores that gather them, statuses
//! read while another session holds a step's lock, and throwaway servers on free loopback
//! ports.

pub mod chaos;
pub mod conformance;
pub mod differential;
pub mod faults;
pub mod gathered;
pub mod grantlog;
pub mod harness;
pub mod hold;
pub mod proxy;
pub mod ratelog;
pub mod seam;
pub mod servers;
pub mod status_locks;
pub mod window;
pub mod worker;
