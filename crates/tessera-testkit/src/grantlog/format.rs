//! The log format: [`Event`]s as JSON lines, written by [`EventLog`] and read back by
//! [`read_logs`], stamped on the host's monotonic clock ([`monotonic_ns`]).

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
    /// A worker's acquires all name this tenant (`docs/fair-shares.md`); its leases count
    /// against the ceiling of `{sem}/tenant:{tenant}` when a [`EventKind::Capacity`] names one.
    Tenant {
        /// The worker.
        worker: String,
        /// The tenant.
        tenant: String,
    },
}

/// The pseudo-semaphore whose capacity is `tenant`'s ceiling on `sem` in a grant log: its
/// leases are the tenant's leases of `sem`, checked against the ceiling as a capacity.
pub fn tenant_sem(sem: &str, tenant: &str) -> String {
    format!("{sem}/tenant:{tenant}")
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
