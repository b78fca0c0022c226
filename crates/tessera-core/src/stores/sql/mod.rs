//! The semaphore step shared by the SQL stores, written once over a small dialect seam.
//!
//! # The step
//!
//! Every semaphore operation of a SQL store is one transaction that runs one step, the
//! shape of the seam's model (`store.rs`) and of the reference model (`stores/memory/ops.rs`):
//!
//! 1. **lock and load**: take the semaphore's lock, read the store's clock once the lock is
//!    held, load the semaphore row and the store-wide fence high-water mark
//!    ([`SemRows::load`]);
//! 2. **purge** holders whose lease expired and waiters whose heartbeat expired (both
//!    indexed by `(name, expires_at)`), returning their seats to the free set;
//! 3. **hand off**: while the queue head fits in `capacity - used`, pop it and grant it
//!    (lowest free seats, next fence, expiry = `min(now + its TTL, its heartbeat expiry)`:
//!    provisional until renewed, see `crate::lease::permit`). A head that does not fit blocks
//!    everyone behind it (strict FIFO);
//! 4. **decide** the operation (acquire, heartbeat, cancel, release, renew, status, resize,
//!    revoke; delete runs alone, without purging, as in the model);
//! 5. **hand off again** when the operation freed permits or removed the head;
//! 6. **finish**: write the semaphore row back if it changed, or delete it (and any free
//!    seats) when it has neither holders nor waiters; raise the high-water mark if a fence
//!    was issued. The caller commits, then wakes the lease ids the step collected (granted
//!    waiters, revoked or deleted holders) — after the commit, so a woken task sees its
//!    grant.
//!
//! # Invariants
//!
//! - **The lock is held from the first read.** The transaction holds the semaphore's lock
//!   from [`SemRows::load`] until the commit (SQLite: `BEGIN IMMEDIATE`, the file's write
//!   lock; PostgreSQL/MySQL: `SELECT … FOR UPDATE` on the semaphore row, created first by an
//!   acquire). Every statement may therefore assume that the rows of its semaphore change
//!   only through this transaction: a `SELECT` and a following `DELETE` with the same
//!   predicate see the same rows, which is how a dialect without `RETURNING` works.
//! - **Running counters, no scans.** The row carries `used` (the sum of the holders'
//!   weights) and `queued` (the number of waiters), so no statement sums or counts rows;
//!   each touches O(log n) index entries plus the rows it changes. `used <= capacity`
//!   except after a shrinking resize, when no grant happens until it fits again.
//! - **Seats** follow the model exactly: every seat at or above `seat_high` is free, the
//!   free-seats table holds the returned seats below it, and a lease takes the lowest free
//!   seats below the capacity; seats right below `seat_high` lower it instead of being
//!   stored. A holder's seats are stored as ascending ranges (`"0-3,7"`, [`encode_seats`]).
//! - **Fences** are `max(last_fence + 1, wall clock in µs, hwm + 1)`: strictly increasing per
//!   semaphore, above every fence the store ever issued (the high-water mark outlives
//!   deleted semaphores) and above the time floor (a store that lost its state).
//! - **`status` may read without the lock**, and only then: from one consistent snapshot,
//!   when the step would change nothing at that snapshot's instant, which is then the
//!   step's own answer; otherwise it runs the step (`snapshot.rs` states the invariant).
//!   `rate_status` always reads so, and computes the rate step's answer, prune and expiry
//!   included, from that snapshot (`rate_snapshot.rs`).
//! - **Nothing read is trusted.** Every value read back is checked here; a wrong range or
//!   shape is [`crate::error::Error::Corrupt`], never a panic. Only delete skips unreadable lease
//!   ids instead, since deleting is how an admin clears damaged rows.
//!
//! # Tenants' ceilings and floors
//!
//! A name may carry tenants' limits (`docs/fair-shares.md`, "Ceilings and floors"), kept in a
//! table of their own that outlives the semaphore's row. [`SemRows::load`] reports how many
//! (a subquery of the statement that loads the row, [`Loaded::limits`]): at 0 every step is
//! the one above, statement for statement. Otherwise the step reads the limits, then, when a
//! decision needs them, the permits each tenant holds (one `GROUP BY`, read again after a
//! holder went) and the queue in order, and grants as the reference model's
//! `hand_off_limited`: a waiter within its tenant's floor first, then the first waiter not at
//! its ceiling, while it may be granted. O(queue) per hand-off, for names with limits only.
//!
//! # Tenants' window ceilings
//!
//! A tenant's limits may carry a window ceiling (`docs/fair-shares.md`, "A ceiling on a share
//! of the windows"), read with them, so a name without any runs the steps above statement
//! for statement. On an admission's turn, a tenant with one asks its own limiter first
//! ([`rate::tenant_refuses`]: the name's configuration scaled, no charge). Refused, it is
//! window-capped until the instant it would be admitted, kept on its limits' row
//! ([`SemRows::cap_window`]): nothing is charged, and the hand-off runs, skipping that
//! tenant's admission waiters for the head until then (plain waiters are never skipped).
//! Admitted, the name's limiter decides as without it, and its admission is charged to the
//! tenant's limiter too under the same id ([`rate::charge_tenant`]). The tenant's limiter is
//! a limiter of its own in the rate tables ([`rate::TENANT_KEY_SEPARATOR`]), reached by
//! pointing the admission's rate statements at its key ([`rate::TenantLimiterRows`]). A
//! give-back or a settle ([`give_back`], [`settle`]) reads the lease's tenant before the
//! release while the name has window ceilings, and returns or settles its charge there too.
//!
//! # What a SQL store supplies
//!
//! Its statements, behind the row operations of [`SemRows`] (`dialect.rs`): one method per
//! statement, bound to one semaphore name and one transaction, carrying raw integers and
//! text. The placeholder style (`?1`, `$1`), `max()` or `GREATEST()`, `RETURNING` or a
//! `SELECT` first, and the clock expression all stay inside the store's statements; the
//! store also opens the locking transaction and commits it (then wakes the collected lease
//! ids). `tests.rs` holds a dialect without `RETURNING` (`NoReturning`, on SQLite) that
//! runs the same steps as SQLite's own statements: the shape a MySQL dialect takes. A
//! store that runs the step on the server (a PL/pgSQL function, a stored procedure)
//! mirrors `step.rs` statement for statement, and is checked against the same reference
//! model by the differential test.
//!
//! Why row operations and not one step generic over sqlx's `Database`: the dialects differ
//! in more than text. Without `RETURNING` an operation is two statements; sqlx's generic
//! `QueryResult` has no `rows_affected`; PostgreSQL has no unsigned types; and a
//! server-side step uses no client statements at all. One method per statement keeps each
//! of these inside the store that has it, and the step free of sqlx.

// A build with PostgreSQL as its only SQL store uses neither step (both run on the server,
// as PL/pgSQL functions), only the rate module's value helpers.
#![cfg_attr(
    not(any(feature = "sqlite", feature = "mysql")),
    allow(dead_code, unused_imports)
)]

mod dialect;
pub mod errors;
pub mod rate;
mod rate_snapshot;
mod snapshot;
mod step;

pub use dialect::{
    Dirty, Freed, HeadKey, HeadRow, HolderRow, LimitRow, Loaded, NewHolder, NewWaiter, Place,
    QueueRow, SemRow, SemRows, WaiterRow,
};
pub use rate_snapshot::{read_rate_status, RateRead, RateSnapshot};
pub use snapshot::{read_status, Read, Snapshot};
/// The MySQL store's procedures hand back holder rows that are checked like the step's own.
#[cfg(feature = "mysql")]
pub use step::lease_of_row;
pub use step::{
    acquire, cancel, delete, heartbeat, read_grant, release, renew, resize, revoke,
    set_tenant_limits, status, tenant_limits_of,
};
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub use step::{admit, give_back, settle};

use crate::error::Result;
use step::corrupt;

/// Encodes ascending seats as ranges: `[0, 1, 2, 3, 7]` → `"0-3,7"`.
pub fn encode_seats(seats: &[u32]) -> String {
    let mut out = String::new();
    for (lo, hi) in runs(seats) {
        if !out.is_empty() {
            out.push(',');
        }
        if lo == hi {
            out.push_str(&lo.to_string());
        } else {
            out.push_str(&format!("{lo}-{hi}"));
        }
    }
    out
}

/// Decodes [`encode_seats`]; the seats must be strictly ascending and number `weight`.
pub fn decode_seats(text: &str, weight: u32) -> Result<Vec<u32>> {
    let bad = || corrupt(format!("seats {:?} for weight {weight}", truncate(text)));
    if weight > crate::limits::MAX_CAPACITY {
        return Err(bad());
    }
    let mut seats: Vec<u32> = Vec::new();
    if !text.is_empty() {
        for part in text.split(',') {
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (a, b),
                None => (part, part),
            };
            let lo: u32 = lo.parse().map_err(|_| bad())?;
            let hi: u32 = hi.parse().map_err(|_| bad())?;
            if lo > hi || seats.last().is_some_and(|&l| l >= lo) {
                return Err(bad());
            }
            if seats.len() as u64 + (hi - lo) as u64 + 1 > weight as u64 {
                return Err(bad());
            }
            seats.extend(lo..=hi);
        }
    }
    if seats.len() as u64 != weight as u64 {
        return Err(bad());
    }
    Ok(seats)
}

/// Maximal runs of consecutive values in an ascending slice, as `(first, last)`.
fn runs(seats: &[u32]) -> Vec<(u32, u32)> {
    let mut out: Vec<(u32, u32)> = Vec::new();
    for &s in seats {
        match out.last_mut() {
            Some((_, hi)) if hi.checked_add(1) == Some(s) => *hi = s,
            _ => out.push((s, s)),
        }
    }
    out
}

/// At most 64 characters of a value read back, for an error message.
fn truncate(s: &str) -> String {
    s.chars().take(64).collect()
}
