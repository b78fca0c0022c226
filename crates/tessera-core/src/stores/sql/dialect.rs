//! The dialect seam: the row operations one semaphore's step needs, each one statement (or
//! two, see below) that a SQL store writes in its own SQL, and the raw rows they carry.
//!
//! A [`SemRows`] value is bound to one semaphore name and to one open transaction; every
//! statement is about that name (`?1` / `$1` in the store's placeholder style). Values cross
//! the seam as the database's integers and text, unchecked: the step (`step.rs`) checks
//! every one and answers [`crate::error::Error::Corrupt`] for a wrong one. A dialect turns a column
//! of the wrong type or a NULL where none is allowed into `Error::Corrupt` too, and its own
//! driver errors into the crate's store errors.
//!
//! **What every statement may assume:** the transaction holds the semaphore's lock from
//! [`SemRows::load`] (or [`SemRows::lock_for_delete`]) until the caller commits, so the rows
//! of this name change only through this transaction. That is what lets a dialect without
//! `RETURNING` (MySQL 8 has none, MariaDB has `DELETE … RETURNING` since 10.5 but no
//! `UPDATE … RETURNING`) run a `SELECT` and then the `DELETE`/`UPDATE` with the same
//! predicate: both see the same rows. Times are microseconds since the Unix epoch on the
//! store's clock, as [`crate::model::StoreTime`].

use std::future::Future;

use crate::error::Result;
use crate::model::StoreTime;

/// What [`SemRows::load`] finds.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The store's time, read once the lock is held (SQLite: the host's clock read after
    /// `BEGIN IMMEDIATE`; PostgreSQL: `clock_timestamp()`; MySQL: `UTC_TIMESTAMP(6)`).
    pub now: StoreTime,
    /// The wall clock (µs since the Unix epoch) read with `now`: only the fences' floor. The
    /// same as `now` where the store's time is wall time (PostgreSQL, MySQL); SQLite keeps
    /// leases on the boot clock and reads the wall clock beside it.
    pub wall: StoreTime,
    /// The store-wide fence high-water mark (`tessera_meta.fence_hwm`).
    pub hwm: i64,
    /// The semaphore's row, `None` if it has none.
    pub sem: Option<SemRow>,
    /// How many tenants have ceilings or floors on this name (`docs/fair-shares.md`,
    /// "Ceilings and floors"), read by the same statement as the row (a subquery on the
    /// limits table), so a name without them costs no statement more. 0 on a store whose
    /// tables keep no limits.
    pub limits: i64,
}

/// One tenant's ceiling and floor as stored (`tessera_tenant_limits`; a NULL ceiling: none),
/// with its window ceiling (a percentage; NULL: none) and the instant until which its own
/// limiter refused it (`docs/fair-shares.md`, "A ceiling on a share of the windows"; NULL:
/// not capped). A store whose rows keep no window ceilings reads both as NULL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitRow {
    pub tenant: String,
    pub ceiling: Option<i64>,
    pub floor: i64,
    pub window_ceiling: Option<i64>,
    pub window_capped_until: Option<i64>,
}

/// A waiter as the hand-off with tenants' limits reads the queue: its key, weight, tenant
/// and gate (`None`: a plain waiter).
#[derive(Debug, Clone)]
pub struct QueueRow {
    pub lease_id: String,
    pub weight: i64,
    pub tenant: Option<String>,
    pub gate: Option<i64>,
    pub tag: i64,
    pub seq: i64,
}

/// A semaphore's two rows (`docs/sql-queue.md`): the running counters of the step. The
/// semaphore row (`tessera_semaphores`) holds `capacity`, `used`, `dequeued`, `last_fence`,
/// `seat_high`, `vtime` and `tenants`; its tail row (`tessera_tails`) holds `next_seq`,
/// `enqueued` and `finish`. The queue holds `enqueued - dequeued` waiters. A store whose
/// tables keep one row (MySQL below schema version 10) reads its `queued` as `enqueued`
/// with `dequeued` 0 and writes back `enqueued - dequeued`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SemRow {
    pub capacity: i64,
    pub used: i64,
    /// Waiters ever inserted (monotone; the tail row).
    pub enqueued: i64,
    /// Waiters ever removed: granted, purged, cancelled (monotone; the semaphore row).
    pub dequeued: i64,
    pub last_fence: i64,
    /// The next queue sequence number (the tail row).
    pub next_seq: i64,
    pub seat_high: i64,
    /// The virtual time `V` of fair shares (`docs/fair-shares.md`): the start tag of the
    /// latest grant.
    pub vtime: i64,
    /// The finish tag of the latest request that named no tenant (the tenant `""`; the tail
    /// row).
    pub finish: i64,
    /// How many rows the semaphore has in the tenants table.
    pub tenants: i64,
}

/// Which of a semaphore's two rows [`SemRows::save`] writes: the fields of the semaphore
/// row, of the tail row, or both (both for a semaphore not stored yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dirty {
    pub sem: bool,
    pub tail: bool,
}

/// A holder row (`tessera_holders`); `seats` in the text form of [`super::encode_seats`].
#[derive(Debug, Clone)]
pub struct HolderRow {
    pub lease_id: String,
    pub weight: i64,
    pub seats: String,
    pub fence: i64,
    pub holder: String,
    pub acquired_at: i64,
    pub expires_at: i64,
    /// The tenant the lease was granted to (`None`: the request named none, or the store's
    /// rows keep no tenant).
    pub tenant: Option<String>,
}

/// A new holder row, borrowed from the lease it records.
#[derive(Debug, Clone)]
pub struct NewHolder<'a> {
    pub lease_id: &'a str,
    pub weight: i64,
    pub seats: &'a str,
    pub fence: i64,
    pub holder: &'a str,
    pub acquired_at: i64,
    pub expires_at: i64,
    /// The tenant the lease is granted to (`None`: none named; written as NULL).
    pub tenant: Option<&'a str>,
}

/// What a removed holder gives back: its weight and seats.
#[derive(Debug, Clone)]
pub struct Freed {
    pub weight: i64,
    pub seats: String,
}

/// A waiter row (`tessera_waiters`) as inspection shows it.
#[derive(Debug, Clone)]
pub struct WaiterRow {
    pub lease_id: String,
    pub weight: i64,
    pub holder: String,
    pub enqueued_at: i64,
    pub expires_at: i64,
    /// The tenant the waiter asks for (`None`: none named, or the store's rows keep none).
    pub tenant: Option<String>,
}

/// A new waiter row; `ttl` is the lease TTL (µs) to grant with at hand-off.
#[derive(Debug, Clone)]
pub struct NewWaiter<'a> {
    /// The start tag; the queue is ordered by `(tag, seq)`.
    pub tag: i64,
    pub seq: i64,
    pub lease_id: &'a str,
    pub weight: i64,
    pub holder: &'a str,
    pub ttl: i64,
    pub enqueued_at: i64,
    pub expires_at: i64,
    /// An admission waiter's gate (`crate::admission::seam`): the hand-off never pops it,
    /// and wakes it once it fits and the store time is at least this. `None`: a plain
    /// waiter. Only a dialect with admission is given `Some` (SQLite, MySQL).
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    pub gate: Option<i64>,
    /// The tenant the request named (`None`: none; written as NULL), which its holder row
    /// keeps once granted.
    pub tenant: Option<&'a str>,
}

/// The queue head popped by a hand-off.
#[derive(Debug, Clone)]
pub struct HeadRow {
    /// Its start tag: a grant moves the virtual time to it.
    pub tag: i64,
    pub lease_id: String,
    pub weight: i64,
    pub holder: String,
    pub ttl: i64,
    /// The waiter's heartbeat expiry: the hand-off grant's expiry until it is renewed.
    pub expires_at: i64,
    /// The waiter's tenant, which the holder row it becomes keeps.
    pub tenant: Option<String>,
}

/// The queue head's key, and the lowest `seq` of the queue (a waiter that joins at the head
/// takes the head's tag and the `seq` below that one, so `seq` stays unique).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeadKey {
    pub tag: i64,
    pub seq: i64,
    pub min_seq: i64,
}

/// A waiter's place: how many waiters are ahead of it, and its start tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub ahead: i64,
    pub tag: i64,
}

/// The row operations of one semaphore inside one locked transaction (see the module docs).
///
/// Methods return `impl Future + Send` so the step can run inside the `Send` futures of
/// [`crate::seam::Backend`].
pub trait SemRows: Send {
    /// The first statement of every step but delete: takes the semaphore's lock (if
    /// `BEGIN` has not already) and then its tail row's (`docs/sql-queue.md`: semaphore row,
    /// then tail row; the client-side step always takes both), reads the store's time once the lock is held, and returns
    /// the row and the fence high-water mark (a missing `fence_hwm` is `Error::Corrupt`).
    ///
    /// `create` is `Some(capacity)` for an acquire, which creates the semaphore. A dialect
    /// that locks with `SELECT … FOR UPDATE` needs a row to lock: it may first insert a
    /// placeholder (`capacity`, nothing used or queued, `last_fence` = the high-water mark,
    /// `ON CONFLICT DO NOTHING` / `INSERT IGNORE`) and return it; the step treats a row with
    /// neither holders nor waiters exactly as a missing one. If a concurrent delete removes
    /// the row between that insert and the lock, insert again. Without `create`, a missing
    /// row needs no lock: the step changes nothing then.
    ///
    /// Read the time only once the lock is granted. In PostgreSQL a `clock_timestamp()` in
    /// the select list of the locking `SELECT … FOR UPDATE` itself may be evaluated before
    /// the wait for the lock ends: read it in the statement after (or, in PL/pgSQL, after
    /// the `SELECT … FOR UPDATE INTO`).
    fn load(&mut self, create: Option<u32>) -> impl Future<Output = Result<Loaded>> + Send;

    /// The first statement of delete, which runs without [`SemRows::load`]: a dialect that
    /// locks by row locks the semaphore row here (`SELECT … FOR UPDATE`), so a concurrent
    /// acquire cannot insert a holder the delete misses. SQLite's `BEGIN IMMEDIATE` already
    /// holds the lock.
    fn lock_for_delete(&mut self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }

    /// Inserts or updates the semaphore row and its tail row, each only if `dirty` says it
    /// changed (a store with one row writes it if either did).
    fn save(&mut self, sem: &SemRow, dirty: Dirty) -> impl Future<Output = Result<()>> + Send;

    /// Deletes the semaphore row and its tail row; whether there was a semaphore row.
    fn drop_semaphore(&mut self) -> impl Future<Output = Result<bool>> + Send;

    /// Raises the store-wide fence high-water mark to `hwm` (never lowers it: a dialect
    /// whose meta row is not locked by the step writes `max(value, hwm)`).
    fn raise_hwm(&mut self, hwm: i64) -> impl Future<Output = Result<()>> + Send;

    /// Deletes the holders with `expires_at <= now`, returning what each held, in any order
    /// (`DELETE … RETURNING weight, seats`, or `SELECT` then `DELETE`).
    fn purge_holders(&mut self, now: i64) -> impl Future<Output = Result<Vec<Freed>>> + Send;

    /// Deletes the waiters with `expires_at <= now`; how many.
    fn purge_waiters(&mut self, now: i64) -> impl Future<Output = Result<u64>> + Send;

    /// The holder row of `lease`, if held.
    fn holder(&mut self, lease: &str) -> impl Future<Output = Result<Option<HolderRow>>> + Send;

    /// Every holder row, ordered by `(acquired_at, fence)`.
    fn holders(&mut self) -> impl Future<Output = Result<Vec<HolderRow>>> + Send;

    /// Inserts a holder row.
    fn insert_holder(&mut self, row: &NewHolder<'_>) -> impl Future<Output = Result<()>> + Send;

    /// Deletes the holder row of `lease`, returning what it held.
    fn remove_holder(&mut self, lease: &str) -> impl Future<Output = Result<Option<Freed>>> + Send;

    /// Sets the holder's `expires_at` to `max(expires_at, at)` (`GREATEST` outside SQLite)
    /// and returns the new value, `None` if `lease` is not held (`UPDATE … RETURNING`, or
    /// `UPDATE` then `SELECT`).
    fn renew_holder(
        &mut self,
        lease: &str,
        at: i64,
    ) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Deletes and returns the queue head (lowest `(tag, seq)`) if its weight is at most
    /// `available` and it is not an admission waiter (its gate is NULL); `None` if the queue
    /// is empty or the head does not fit or is gated.
    fn pop_head_if_fits(
        &mut self,
        available: i64,
    ) -> impl Future<Output = Result<Option<HeadRow>>> + Send;

    /// For a dialect with admission: if the queue head is an admission waiter whose weight
    /// is at most `available` and whose gate is at most `now`, sets its gate to the end of
    /// time (woken; its next step sets it again) and returns its lease id, to be woken after
    /// the commit. The default (no admission waiters ever) returns `None` without a
    /// statement.
    fn wake_gated_head(
        &mut self,
        _available: i64,
        _now: i64,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async { Ok(None) }
    }

    /// For a dialect with admission: sets the gate of `lease`'s waiter row.
    #[cfg_attr(not(any(feature = "sqlite", feature = "mysql")), allow(dead_code))]
    fn set_gate(&mut self, _lease: &str, _gate: i64) -> impl Future<Output = Result<()>> + Send {
        async {
            Err(super::step::corrupt(
                "internal: admission waiters on a store without admission",
            ))
        }
    }

    /// The queue head's key (lowest `(tag, seq)`) and the queue's lowest `seq`; `None` if
    /// the queue is empty.
    fn head_key(&mut self) -> impl Future<Output = Result<Option<HeadKey>>> + Send;

    /// The finish tag stored for `tenant` (`docs/fair-shares.md`), `None` if it has no row.
    fn tenant_finish(&mut self, tenant: &str) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Inserts or updates `tenant`'s finish tag.
    fn save_tenant(&mut self, tenant: &str, finish: i64)
        -> impl Future<Output = Result<()>> + Send;

    /// Deletes the tenant rows whose finish tag is at most `vtime`; how many.
    fn prune_tenants(&mut self, vtime: i64) -> impl Future<Output = Result<u64>> + Send;

    /// Deletes every tenant row of the semaphore.
    fn drop_tenants(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// Inserts a waiter row.
    fn insert_waiter(&mut self, row: &NewWaiter<'_>) -> impl Future<Output = Result<()>> + Send;

    /// Deletes the waiter row of `lease`; how many (0 or 1).
    fn remove_waiter(&mut self, lease: &str) -> impl Future<Output = Result<u64>> + Send;

    /// Sets the waiter's `expires_at` to `max(expires_at, at)`; how many rows (0 or 1).
    fn refresh_waiter(&mut self, lease: &str, at: i64) -> impl Future<Output = Result<u64>> + Send;

    /// The place of `lease`'s waiter in the queue (order `(tag, seq)`), `None` if it is not
    /// queued.
    fn waiter_place(&mut self, lease: &str) -> impl Future<Output = Result<Option<Place>>> + Send;

    /// How many waiters are ahead of the key `(tag, seq)`.
    fn waiters_ahead(&mut self, tag: i64, seq: i64) -> impl Future<Output = Result<i64>> + Send;

    /// Every waiter row, in queue order (`(tag, seq)`).
    fn waiters(&mut self) -> impl Future<Output = Result<Vec<WaiterRow>>> + Send;

    /// Removes and returns the (at most) `n` lowest free seats below `below`, ascending.
    fn take_free_seats(
        &mut self,
        below: i64,
        n: i64,
    ) -> impl Future<Output = Result<Vec<i64>>> + Send;

    /// Inserts the free seats `lo..=hi`.
    fn insert_free_seats(&mut self, lo: i64, hi: i64) -> impl Future<Output = Result<()>> + Send;

    /// The (at most) `limit` highest free seats below `below`, descending.
    fn top_free_seats(
        &mut self,
        below: i64,
        limit: i64,
    ) -> impl Future<Output = Result<Vec<i64>>> + Send;

    /// Deletes the free seats `>= seat`.
    fn drop_free_seats_from(&mut self, seat: i64) -> impl Future<Output = Result<()>> + Send;

    /// Deletes every free seat of the semaphore.
    fn drop_free_seats(&mut self) -> impl Future<Output = Result<()>> + Send;

    /// Deletes every holder, returning their lease ids (as stored, unchecked, in any order).
    fn drop_holders(&mut self) -> impl Future<Output = Result<Vec<String>>> + Send;

    /// Deletes every waiter, returning their lease ids (as stored, unchecked, in any order).
    fn drop_waiters(&mut self) -> impl Future<Output = Result<Vec<String>>> + Send;

    // Tenants' ceilings and floors (`docs/fair-shares.md`, "Ceilings and floors"): run only
    // for a name whose [`Loaded::limits`] is above 0 (and by `set_tenant_limits` and
    // `delete`). The defaults are those of a store whose tables keep no limits.

    /// The tenants' limits of the name, by tenant.
    fn tenant_limits(&mut self) -> impl Future<Output = Result<Vec<LimitRow>>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Inserts or replaces `tenant`'s limits.
    fn save_tenant_limits(&mut self, _row: &LimitRow) -> impl Future<Output = Result<()>> + Send {
        async { Err(no_limits()) }
    }

    /// Sets `tenant`'s window-capped-until instant on its limits' row (`None`: not capped).
    /// Only for a tenant with a window ceiling, so only on a store that keeps them.
    fn cap_window(
        &mut self,
        _tenant: &str,
        _until: Option<i64>,
    ) -> impl Future<Output = Result<()>> + Send {
        async { Err(no_limits()) }
    }

    /// Deletes `tenant`'s limits.
    fn drop_tenant_limits(&mut self, _tenant: &str) -> impl Future<Output = Result<()>> + Send {
        async { Err(no_limits()) }
    }

    /// Deletes every tenant's limits of the name; how many.
    fn drop_all_tenant_limits(&mut self) -> impl Future<Output = Result<u64>> + Send {
        async { Ok(0) }
    }

    /// The permits held per named tenant (`SELECT tenant, SUM(weight) … GROUP BY tenant`;
    /// holders without a tenant left out).
    fn held_by_tenant(&mut self) -> impl Future<Output = Result<Vec<(String, i64)>>> + Send {
        async { Err(no_limits()) }
    }

    /// Every waiter in queue order (`(tag, seq)`), as [`QueueRow`].
    fn queue(&mut self) -> impl Future<Output = Result<Vec<QueueRow>>> + Send {
        async { Err(no_limits()) }
    }

    /// Deletes and returns `lease`'s waiter row (as [`SemRows::pop_head_if_fits`] returns
    /// the head); `None` if it is not queued.
    fn pop_waiter(&mut self, _lease: &str) -> impl Future<Output = Result<Option<HeadRow>>> + Send {
        async { Err(no_limits()) }
    }

    /// If `lease`'s waiter is an admission waiter whose gate is at most `now`, marks it woken
    /// (as [`SemRows::wake_gated_head`] does the head) and returns its lease id.
    fn wake_gated(
        &mut self,
        _lease: &str,
        _now: i64,
    ) -> impl Future<Output = Result<Option<String>>> + Send {
        async { Err(no_limits()) }
    }
}

fn no_limits() -> crate::error::Error {
    super::step::corrupt("internal: tenant limits on a store whose tables keep none")
}
