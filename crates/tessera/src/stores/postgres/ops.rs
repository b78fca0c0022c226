//! The operations: one statement each, calling one PL/pgSQL function of `sql/` (the step runs
//! on the server, see `common.sql`), and the checks of what comes back. Every value read is
//! checked; a wrong one is [`Error::Corrupt`], never a panic.

use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::{admission, rate};
use tessera_core::error::{Error, InvalidInput, Result};
use tessera_core::model::*;
use tessera_core::stores::sql::Snapshot;

/// The step's helpers, then one function per operation: created by migration 1 and again by
/// every migration that changes them (`CREATE OR REPLACE`).
pub(crate) const STEP: &[&str] = &[
    include_str!("sql/common.sql"),
    include_str!("sql/acquire.sql"),
    include_str!("sql/heartbeat.sql"),
    include_str!("sql/heartbeat_many.sql"),
    include_str!("sql/cancel.sql"),
    include_str!("sql/release.sql"),
    include_str!("sql/renew.sql"),
    include_str!("sql/status.sql"),
    include_str!("sql/resize.sql"),
    include_str!("sql/revoke.sql"),
    include_str!("sql/delete.sql"),
    include_str!("sql/limits.sql"),
];

/// Migration 1: the tables, then the step.
pub(crate) const MIGRATION_1: &[&[&str]] = &[&[include_str!("sql/schema.sql")], STEP];

/// Migration 4: the lean step (`sql/schema_4.sql`: the `purge_at` bound), then the step again.
pub(crate) const MIGRATION_4: &[&[&str]] = &[&[include_str!("sql/schema_4.sql")], STEP];

/// Migration 8 (`sql/schema_8.sql`): fair shares' tags (the waiters' `tag`, the semaphore
/// row's `vtime`, `finish` and `tenants`, the table `tessera_tenants`); then the step, the
/// rate functions and the admission's again, with step revision 7 (`tessera_acquire` and
/// `tessera_admit` take the tenant and its share).
pub(crate) const MIGRATION_8: &[&[&str]] = &[
    &[include_str!("sql/schema_8.sql")],
    STEP,
    rate::FUNCTIONS,
    admission::FUNCTIONS,
];

/// Migration 9 (`sql/schema_9.sql`): the tenant a request named, on its waiter's row and on
/// its holder's (`tenant`); then the step, the rate functions and the admission's again, with
/// step revision 8 (the functions that return a lease return its tenant too).
pub(crate) const MIGRATION_9: &[&[&str]] = &[
    &[include_str!("sql/schema_9.sql")],
    STEP,
    rate::FUNCTIONS,
    admission::FUNCTIONS,
];

/// Migration 10 (`sql/schema_10.sql`): tenants' ceilings and floors, in the table
/// `tessera_limits` (kept for the name, not with its row), counted on the semaphore's row
/// (`limits`); the queue's lower bound `tag_low`; then the step, the rate functions and the
/// admission's again, with step revision 9 (the limits' rules, `tessera_set_tenant_limits`).
pub(crate) const MIGRATION_10: &[&[&str]] = &[
    &[include_str!("sql/schema_10.sql")],
    STEP,
    rate::FUNCTIONS,
    admission::FUNCTIONS,
];

/// Migration 11 (`sql/schema_11.sql`): tenants' window ceilings, kept in `tessera_limits`
/// (`window_ceiling`, and `capped_until`, when the tenant's own limiter last refused it
/// until), each tenant's own limiter a row of the rate tables under its own key; then the
/// step, the rate functions and the admission's again, with step revision 10.
pub(crate) const MIGRATION_11: &[&[&str]] = &[
    &[include_str!("sql/schema_11.sql")],
    STEP,
    rate::FUNCTIONS,
    admission::FUNCTIONS,
];

/// Migration 12 (`sql/schema_12.sql`): the queue's tail in a row of its own,
/// `tessera_tails` (`next_seq`, `enqueued`, the finish tag of requests without a tenant, the
/// waiters' expiry bound), and the semaphore's row counting `dequeued` instead of `queued`
/// (docs/sql-queue.md); then the step, the rate functions and the admission's again, with
/// step revision 11 (an enqueue that would not lead takes only the tail's lock).
pub(crate) const MIGRATION_12: &[&[&str]] = &[
    &[include_str!("sql/schema_12.sql")],
    STEP,
    rate::FUNCTIONS,
    admission::FUNCTIONS,
];

/// Migration 5 (`sql/schema_5.sql`): the queue head's bound `head_seq`, indexes that lookups
/// by lease or seq cannot mistake for their own, and grants to the releasing process's
/// waiters in the release's reply; then the step again.
pub(crate) const MIGRATION_5: &[&[&str]] = &[&[include_str!("sql/schema_5.sql")], STEP];

/// The step's revision, which `sql/common.sql` returns from `tessera__step_revision()`.
/// Raised whenever the step's functions change while the tables stay as they are: a connect
/// that finds a lower revision (or none) creates the step again, without a migration, so a
/// build that knows only the tables' version still connects and calls the new functions
/// (rolling upgrades). Revision 1: a hand-off grant expires with the waiter's queue entry
/// until it is renewed (`tessera__hand_off`). Revision 2: `tessera_heartbeat_many`, the
/// heartbeats of several waiters of one semaphore in one call (`heartbeats.rs`). Revision 3:
/// a `queued` acquire and a `waiting` heartbeat answer the semaphore's `purge_at` in
/// `expires_at`, when an expiry may next free permits (`Backend::next_expiry`). Revision 4
/// (with migration 6, which adds the waiters' `gate`): the hand-off stops at an admission
/// waiter and wakes it, and the admission's functions (`admission.rs`) with the rate step
/// they share. Revision 5: `tessera_settle` (`sql/settle.sql`), an admission's release and
/// the settle of its cost in one call. Revision 6 (with migration 7, which adds the limiters'
/// `expired`): `tessera_give_back` counts an admission given back past its use-by instant
/// and `tessera_rate_status` answers the count. Revision 7 (with migration 8, which adds fair
/// shares' tags): the queue is ordered by start tags, `(tag, seq)` (`docs/fair-shares.md`),
/// and `tessera_acquire` and `tessera_admit` take a tenant and its share (arguments with
/// defaults, so a call of revision 6's arguments is a request without a tenant). Revision 8
/// (with migration 9, which adds the holders' and waiters' `tenant`): a request's tenant is
/// kept on its waiter and its lease, and returned in a last column `tenant` by
/// `tessera_acquire`, `tessera_heartbeat`, `tessera_heartbeat_many` and `tessera_admit`, in
/// `tessera_status`'s holders and queue, and in a hand-off's wake-up payload. Revision 9 (with
/// migration 10, which adds `tessera_limits`): tenants' ceilings and floors in every step of a
/// name that has some (`docs/fair-shares.md`, "Ceilings and floors"), set by
/// `tessera_set_tenant_limits`; a name without limits runs the statements it ran before.
/// Revision 10 (with migration 11, which adds `tessera_limits`' `window_ceiling` and
/// `capped_until`): tenants' window ceilings in `tessera_admit`, `tessera_give_back` and
/// `tessera_settle`, and window-capped tenants' admission waiters passed over for the head
/// (`docs/fair-shares.md`, "A ceiling on a share of the windows"); a name none of whose
/// tenants has one runs the statements it ran before. Revision 11 (with migration 12, which
/// moves the queue's tail to `tessera_tails`): an acquire that would not lead, without a
/// tenant, enqueues under the tail's lock alone (`sql/acquire.sql`); every other step locks
/// the semaphore's row, then the tail before it compares a newcomer with the queue or
/// commits with free permits (`tessera__tail`, `tessera__requeue` in `sql/common.sql`).
pub(crate) const STEP_REVISION: i32 = 11;

/// The step alone, for a connect that finds an older revision: the semaphore's functions, the
/// rate functions and the admission's, which call both.
pub(crate) const STEP_AGAIN: &[&[&str]] = &[STEP, rate::FUNCTIONS, admission::FUNCTIONS];

pub(crate) const ACQUIRE: &str = "SELECT outcome, now_us, weight, seats, fence, holder, \
     acquired_at, expires_at, \"position\", available, queued, stored_capacity, tenant \
     FROM tessera_acquire($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
pub(crate) const HEARTBEAT: &str = "SELECT outcome, now_us, weight, seats, fence, holder, \
     acquired_at, expires_at, tenant FROM tessera_heartbeat($1, $2, $3)";
pub(crate) const HEARTBEAT_MANY: &str = "SELECT lease_id, outcome, now_us, weight, seats, fence, \
     holder, acquired_at, expires_at, tenant FROM tessera_heartbeat_many($1, $2, $3)";
pub(crate) const CANCEL: &str = "SELECT tessera_cancel($1, $2)";
pub(crate) const RELEASE: &str = "SELECT held, grants FROM tessera_release($1, $2, $3)";
pub(crate) const RENEW: &str = "SELECT expires_at, now_us FROM tessera_renew($1, $2, $3)";
pub(crate) const STATUS: &str = "SELECT tessera_status($1)";

/// The queue's order in [`READ_STATUS`]: by start tag, then arrival (`docs/fair-shares.md`;
/// without tenants the tags grow with arrival, so it is FIFO), as `tessera_status`
/// (`sql/status.sql`) and the hand-off (`tessera__hand_off`, step revision 7) order it.
/// Change all three together.
macro_rules! queue_order {
    () => {
        "w.tag, w.seq"
    };
}

/// `status` without the row lock (`stores/sql/snapshot.rs`): the semaphore's row, its
/// holders and its waiters (with their gates) in one statement, so in one snapshot, and the
/// clock read while the statement runs, after its snapshot was taken. A plain query, not a
/// function: one row, whose one column is NULL without a semaphore row, else the JSON text
/// of `tessera_status`, whose arrays end with the holder's tenant and the waiter's gate (NULL: a
/// plain waiter) and tenant (NULL: none), with the row's `queued`.
pub(crate) const READ_STATUS: &str = concat!(
    "SELECT (SELECT json_build_object(\
     'capacity', s.capacity, 'used', s.used, 'queued', t.enqueued - s.dequeued, \
     'now', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, \
     'holders', coalesce((SELECT json_agg(json_build_array(h.lease_id, h.weight, h.seats, \
         h.fence, h.holder, h.acquired_at, h.expires_at, h.tenant) \
         ORDER BY h.acquired_at, h.fence) \
         FROM tessera_holders h WHERE h.name = s.name), '[]'::json), \
     'queue', coalesce((SELECT json_agg(json_build_array(w.lease_id, w.weight, w.holder, \
         w.enqueued_at, w.expires_at, w.gate, w.tenant) ORDER BY ",
    queue_order!(),
    ") FROM tessera_waiters w WHERE w.name = s.name), '[]'::json))::text \
     FROM tessera_semaphores s JOIN tessera_tails t ON t.name = s.name WHERE s.name = $1)"
);
pub(crate) const RESIZE: &str = "SELECT tessera_resize($1, $2)";
pub(crate) const REVOKE: &str = "SELECT tessera_revoke($1, $2)";
pub(crate) const DELETE: &str = "SELECT tessera_delete($1)";
pub(crate) const SET_TENANT_LIMITS: &str = "SELECT outcome, floors, capacity, grants \
     FROM tessera_set_tenant_limits($1, $2, $3, $4, $5, $6)";
/// The limits kept for a name, by tenant: a plain read (no lock, no step).
pub(crate) const TENANT_LIMITS: &str = "SELECT tenant, ceiling, floor, window_ceiling \
     FROM tessera_limits WHERE name = $1 ORDER BY tenant";
pub(crate) const LIST: &str = "SELECT name FROM tessera_semaphores ORDER BY name";

pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

/// A column that must be there and not NULL.
pub(crate) fn get<'r, T>(row: &'r PgRow, col: &str) -> Result<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<Option<T>, _>(col)
        .map_err(|e| corrupt(format!("column {col}: {e}")))?
        .ok_or_else(|| corrupt(format!("column {col} is NULL")))
}

pub(crate) fn opt<'r, T>(row: &'r PgRow, col: &str) -> Result<Option<T>>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<Option<T>, _>(col)
        .map_err(|e| corrupt(format!("column {col}: {e}")))
}

pub(crate) fn u32_of(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is out of range")))
}

pub(crate) fn u64_of(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| corrupt(format!("{what} = {v} is negative")))
}

pub(crate) fn time_of(v: i64, what: &str) -> Result<StoreTime> {
    u64_of(v, what).map(StoreTime)
}

/// Seats read back: as many as the weight, ascending, below the capacity limit.
fn seats_of(seats: &[i32], weight: u32) -> Result<Vec<u32>> {
    let bad = || corrupt(format!("seats {seats:?} for weight {weight}"));
    if seats.len() as u64 != weight as u64 {
        return Err(bad());
    }
    let mut out = Vec::with_capacity(seats.len());
    for &s in seats {
        let s = u32::try_from(s).map_err(|_| bad())?;
        if s >= MAX_CAPACITY || out.last().is_some_and(|&l| l >= s) {
            return Err(bad());
        }
        out.push(s);
    }
    Ok(out)
}

fn lease_of(s: &str) -> Result<LeaseId> {
    s.parse().map_err(|_| {
        corrupt(format!(
            "lease id {:?} is not 32 hex digits",
            s.chars().take(64).collect::<String>()
        ))
    })
}

/// The lease of a `granted` row (acquire, heartbeat, admit), with its `tenant` (NULL: none).
pub(crate) fn lease_of_row(row: &PgRow, lease_id: LeaseId) -> Result<Lease> {
    let weight = u32_of(get(row, "weight")?, "weight")?;
    if weight == 0 {
        return Err(corrupt("weight = 0"));
    }
    let seats: Vec<i32> = get(row, "seats")?;
    Ok(Lease {
        lease_id,
        weight,
        seats: seats_of(&seats, weight)?,
        fence: u64_of(get(row, "fence")?, "fence")?,
        holder: get(row, "holder")?,
        acquired_at: time_of(get(row, "acquired_at")?, "acquired_at")?,
        expires_at: time_of(get(row, "expires_at")?, "expires_at")?,
        tenant: opt(row, "tenant")?,
    })
}

/// The reply of `tessera_acquire`.
pub(crate) fn parse_acquire(
    row: &PgRow,
    name: &Name,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<AcquireReply> {
    let outcome: String = get(row, "outcome")?;
    let now = time_of(get(row, "now_us")?, "now_us")?;
    match outcome.as_str() {
        "granted" => Ok(AcquireReply::Granted(Grant {
            lease: lease_of_row(row, req.lease_id)?,
            now,
        })),
        "queued" => Ok(AcquireReply::Queued {
            position: u64_of(get(row, "position")?, "position")?,
        }),
        "no_permit" => Ok(AcquireReply::NoPermit {
            available: u32_of(get(row, "available")?, "available")?,
            queued: u64_of(get(row, "queued")?, "queued")?,
        }),
        "mismatch" => Err(Error::CapacityMismatch {
            name: name.to_string(),
            stored: u32_of(get(row, "stored_capacity")?, "capacity")?,
            declared: capacity,
        }),
        "queue_full" => Err(Error::QueueFull {
            name: name.to_string(),
            cap: req.wait.map_or(0, |w| w.queue_cap),
        }),
        other => Err(corrupt(format!("acquire outcome {other:?}"))),
    }
}

/// How long until an expiry may free permits, from a `queued` acquire or `waiting` heartbeat
/// row (its `expires_at` holds the semaphore's `purge_at`, a lower bound of every expiry;
/// NULL from a step of revision 2 or older).
pub(crate) fn expiry_in(row: &PgRow) -> Option<Duration> {
    let outcome: String = row.try_get("outcome").ok()?;
    if outcome != "queued" && outcome != "waiting" {
        return None;
    }
    let at: Option<i64> = row.try_get("expires_at").ok()?;
    let now: i64 = row.try_get("now_us").ok()?;
    // At or before `now`: expired entries are left to purge (in bounded batches), and the
    // head of the queue was woken to go on; every waiter need not.
    let after = at?.checked_sub(now).filter(|&d| d > 0)?;
    Some(Duration::from_micros(after as u64))
}

/// The reply of `tessera_heartbeat`.
pub(crate) fn parse_heartbeat(row: &PgRow, lease: LeaseId) -> Result<WaitReply> {
    let outcome: String = get(row, "outcome")?;
    let now = time_of(get(row, "now_us")?, "now_us")?;
    match outcome.as_str() {
        "granted" => Ok(WaitReply::Granted(Grant {
            lease: lease_of_row(row, lease)?,
            now,
        })),
        "waiting" => Ok(WaitReply::Waiting),
        "gone" => Ok(WaitReply::Gone),
        other => Err(corrupt(format!("heartbeat outcome {other:?}"))),
    }
}

pub(crate) fn parse_cancel(reply: &str) -> Result<CancelReply> {
    match reply {
        "dequeued" => Ok(CancelReply::Dequeued),
        "released" => Ok(CancelReply::Released),
        "not_found" => Ok(CancelReply::NotFound),
        other => Err(corrupt(format!("cancel outcome {other:?}"))),
    }
}

/// A release's reply: whether the lease was held, and the wake-up payloads of the grants it
/// made to waiters of this process (read by the listener's router, as a NOTIFY would be).
pub(crate) fn parse_release(row: &PgRow) -> Result<(bool, Vec<String>)> {
    let held = get::<bool>(row, "held")?;
    let grants = opt::<Vec<String>>(row, "grants")?.unwrap_or_default();
    Ok((held, grants))
}

/// The reply of `tessera_set_tenant_limits`: the wake-up payloads of the grants it made to
/// this process's waiters, or [`InvalidInput`] when the floors would exceed the capacity of
/// the live semaphore (nothing changed).
pub(crate) fn parse_set_tenant_limits(row: &PgRow, name: &Name) -> Result<Vec<String>> {
    let outcome: String = get(row, "outcome")?;
    match outcome.as_str() {
        "set" => Ok(opt::<Vec<String>>(row, "grants")?.unwrap_or_default()),
        "floors" => Err(Error::InvalidInput(InvalidInput::Other(format!(
            "the floors on {name} would add up to {}, above its capacity {}",
            get::<i64>(row, "floors")?,
            get::<i64>(row, "capacity")?
        )))),
        other => Err(corrupt(format!("set_tenant_limits outcome {other:?}"))),
    }
}

/// The rows of [`TENANT_LIMITS`], each checked as [`TenantLimits::new`] checks.
pub(crate) fn parse_tenant_limits(
    rows: &[PgRow],
) -> Result<std::collections::BTreeMap<String, TenantLimits>> {
    let mut out = std::collections::BTreeMap::new();
    for row in rows {
        let tenant: String = get(row, "tenant")?;
        let ceiling = opt::<i64>(row, "ceiling")?
            .map(|c| u32_of(c, "ceiling"))
            .transpose()?;
        let floor = u32_of(get(row, "floor")?, "floor")?;
        let window = opt::<i64>(row, "window_ceiling")?
            .map(|w| {
                u8::try_from(w).map_err(|_| corrupt(format!("window ceiling {w} of {tenant:?}")))
            })
            .transpose()?;
        let limits = TenantLimits::new(ceiling, floor)
            .and_then(|l| l.with_window_ceiling(window))
            .map_err(|e| corrupt(format!("limits of tenant {tenant:?}: {e}")))?;
        out.insert(tenant, limits);
    }
    Ok(out)
}

pub(crate) fn parse_renew(row: &PgRow) -> Result<RenewReply> {
    let now = time_of(get(row, "now_us")?, "now_us")?;
    Ok(match opt::<i64>(row, "expires_at")? {
        Some(at) => RenewReply::Renewed {
            expires_at: time_of(at, "expires_at")?,
            now,
        },
        None => RenewReply::Gone,
    })
}

/// The JSON snapshot of `tessera_status` (see `status.sql`).
pub(crate) fn parse_status(json: &str, name: &Name) -> Result<SemaphoreStatus> {
    use serde_json::Value;
    let bad = |what: &str| corrupt(format!("status of {name}: {what}"));
    let v: Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
    let int = |v: &Value, what: &str| v.as_i64().ok_or_else(|| bad(what));
    let text = |v: &Value, what: &str| v.as_str().map(str::to_string).ok_or_else(|| bad(what));
    // A tenant: a string, or null (or absent, from a step before revision 8) for none.
    let tenant = |v: &Value| match v {
        Value::Null => Ok(None),
        Value::String(t) => Ok(Some(t.clone())),
        _ => Err(bad("tenant")),
    };
    let capacity = u32_of(int(&v["capacity"], "capacity")?, "capacity")?;
    if capacity == 0 || capacity > MAX_CAPACITY {
        return Err(bad("capacity out of range"));
    }
    let used = u32_of(int(&v["used"], "used")?, "used")?;
    let now = time_of(int(&v["now"], "now")?, "now")?;
    let mut holders = Vec::new();
    for h in v["holders"].as_array().ok_or_else(|| bad("holders"))? {
        let weight = u32_of(int(&h[1], "weight")?, "weight")?;
        let seats: Vec<i32> = h[2]
            .as_array()
            .ok_or_else(|| bad("seats"))?
            .iter()
            .map(|s| {
                s.as_i64()
                    .and_then(|s| i32::try_from(s).ok())
                    .ok_or_else(|| bad("seat"))
            })
            .collect::<Result<_>>()?;
        holders.push(Lease {
            lease_id: lease_of(&text(&h[0], "lease id")?)?,
            weight,
            seats: seats_of(&seats, weight)?,
            fence: u64_of(int(&h[3], "fence")?, "fence")?,
            holder: text(&h[4], "holder")?,
            acquired_at: time_of(int(&h[5], "acquired_at")?, "acquired_at")?,
            expires_at: time_of(int(&h[6], "expires_at")?, "expires_at")?,
            tenant: tenant(&h[7])?,
        });
    }
    let mut queue = Vec::new();
    for w in v["queue"].as_array().ok_or_else(|| bad("queue"))? {
        queue.push(Waiter {
            lease_id: lease_of(&text(&w[0], "lease id")?)?,
            weight: u32_of(int(&w[1], "weight")?, "weight")?,
            holder: text(&w[2], "holder")?,
            enqueued_at: time_of(int(&w[3], "enqueued_at")?, "enqueued_at")?,
            expires_at: time_of(int(&w[4], "expires_at")?, "expires_at")?,
            tenant: tenant(&w[6])?,
        });
    }
    Ok(SemaphoreStatus::new(
        name, capacity, used, now, holders, queue,
    ))
}

/// The JSON of [`READ_STATUS`] as the snapshot `stores/sql/snapshot.rs` decides on; every
/// value is checked as in [`parse_status`] (a wrong one is [`Error::Corrupt`], which leaves
/// the answer to the step).
pub(crate) fn parse_snapshot(json: &str, name: &Name) -> Result<Snapshot> {
    use serde_json::Value;
    let bad = |what: &str| corrupt(format!("status of {name}: {what}"));
    let v: Value = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
    let int = |v: &Value, what: &str| v.as_i64().ok_or_else(|| bad(what));
    let status = parse_status(json, name)?;
    let head_gate = match v["queue"].get(0).map(|head| &head[5]) {
        None | Some(Value::Null) => None,
        Some(gate) => Some(int(gate, "gate")?),
    };
    Ok(Snapshot {
        now: status.now,
        capacity: status.capacity.into(),
        used: status.used.into(),
        queued: int(&v["queued"], "queued")?,
        holders: status.holders,
        queue: status.queue,
        head_gate,
    })
}

/// A duration in µs as the functions take it.
pub(crate) fn micros(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}
