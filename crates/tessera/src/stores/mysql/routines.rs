//! The hot path in one round trip: the stored procedures of `routines.sql`.
//!
//! An acquire of one permit ([`acquire_one_call`]), a release ([`release_call`]), also one
//! that hands the permit to the queue head, a renewal ([`renew_call`]) and a waiter's
//! heartbeat that the read-only probe could not answer ([`heartbeat_call`]) are each one
//! `CALL`: the procedure locks the semaphore's row, reads the clock, decides, writes and
//! commits on the server, so the row lock is held for the procedure's own run instead of
//! across the two or three client round trips of the client-side step (`ops.rs`), and a
//! client frozen in the middle of a call holds no lock. Every other operation, and any case the
//! procedures leave out (they answer [`Fast::Fallback`], having changed nothing), runs the
//! client-side step, which is the reference: see the header of `routines.sql` for the cases.
//!
//! Every value a procedure returns is checked here as the client-side step checks the rows
//! it reads (a lease that does not decode is [`crate::Error::Corrupt`]).

use std::time::Duration;

use sqlx::mysql::{MySqlConnection, MySqlRow};
use sqlx::Row;

use super::error::map_err;
use super::ops::{render, Lit};
use tessera_core::error::{Error, Result};
use tessera_core::model::{
    AcquireReply, AcquireRequest, Grant, LeaseId, RenewReply, StoreTime, WaitReply,
};
use tessera_core::stores::sql::lease_of_row;

/// What a procedure answered.
#[derive(Debug)]
pub(crate) enum Fast<T> {
    /// The operation ran and committed (or changed nothing).
    Done(T),
    /// The procedure left this case to the client-side step; nothing changed.
    Fallback,
}

/// A release's outcome: whether the lease was held, the grant it handed to the queue head
/// with that waiter's doorbell address, and whether the release rang that doorbell itself
/// (routine version 10, [`RING_VERSION`]).
#[derive(Debug)]
pub(crate) struct Released {
    pub(crate) held: bool,
    pub(crate) handed_off: Option<(Grant, String)>,
    pub(crate) rung: Rung,
}

/// What a release of routine version 10 did with the doorbell of the waiter it granted
/// (`routines_v10.sql`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rung {
    /// Not tried (an older routine, no hand-off, no doorbell, or a doorbell of this
    /// process): the client rings as before (`notify::ring`).
    NotTried,
    /// Rung, or no such connection: nothing left to do.
    Done,
    /// Connected but not parked with that token, or the ring failed: the client looks again
    /// (`notify::ring_each`).
    LookAgain,
}

/// The routine version whose procedures this build calls (`routines.sql`); a database that
/// records a lower one runs every operation client side.
pub(crate) const VERSION: i64 = 4;

/// The routine version that adds `tessera_v5_heartbeat_many` (`routines_v5.sql`,
/// `heartbeats.rs`); the procedures of [`VERSION`] stay the ones called for the rest.
pub(crate) const HEARTBEAT_MANY_VERSION: i64 = 5;

/// The routine version whose acquire, release and gathered heartbeats keep fair shares'
/// tags (`routines_v6.sql`): the ones a client of schema version 6 calls.
pub(crate) const FAIR_VERSION: i64 = 6;

/// The routine version whose procedures keep the tenant on holder and waiter rows
/// (`routines_v7.sql`): the ones a client of schema version 7 calls, and no others.
pub(crate) const TENANT_VERSION: i64 = 7;

/// The routine version whose acquire and release leave a name with tenants' limits to the
/// client-side step (`routines_v8.sql`): the ones a client of schema version 8 calls (its
/// keep-alive and gathered heartbeats stay version 7's).
pub(crate) const LIMITS_VERSION: i64 = 8;

/// The routine version whose procedures run on the tables of schema version 10, the
/// semaphore's row split in two (`routines_v9.sql`, `docs/sql-queue.md`): acquire, release,
/// keep-alive and gathered heartbeats, the ones a client of schema version 10 calls.
pub(crate) const TAILS_VERSION: i64 = 9;

/// The routine version whose release rings the doorbell of the waiter it hands the permit to
/// itself, after its commit (`routines_v10.sql`): no round trip of the client's between the
/// commit and the waiter's wake-up. The rest stay version 9's.
pub(crate) const RING_VERSION: i64 = 10;

const ACQUIRE_ONE: &str = "CALL tessera_v4_acquire_one(?, ?, ?, ?, ?, ?, ?, ?, ?)";
const RELEASE: &str = "CALL tessera_v4_release(?, ?)";
/// [`ACQUIRE_ONE`] and [`RELEASE`] on the tables of schema version 6.
/// Also the tenant (`NULL`: none) and its share.
const ACQUIRE_ONE_FAIR: &str = "CALL tessera_v6_acquire_one(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const RELEASE_FAIR: &str = "CALL tessera_v6_release(?, ?)";
const KEEP_ALIVE: &str = "CALL tessera_v4_keep_alive(?, ?, ?, ?, ?)";
/// [`ACQUIRE_ONE_FAIR`], [`RELEASE_FAIR`] and [`KEEP_ALIVE`] on the tables of schema version
/// 7: their rows keep the tenant, and their answers carry it.
const ACQUIRE_ONE_TENANT: &str = "CALL tessera_v7_acquire_one(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const RELEASE_TENANT: &str = "CALL tessera_v7_release(?, ?)";
const KEEP_ALIVE_TENANT: &str = "CALL tessera_v7_keep_alive(?, ?, ?, ?, ?)";
/// [`ACQUIRE_ONE_TENANT`] and [`RELEASE_TENANT`] on the tables of schema version 8.
const ACQUIRE_ONE_LIMITS: &str = "CALL tessera_v8_acquire_one(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const RELEASE_LIMITS: &str = "CALL tessera_v8_release(?, ?)";
/// The acquire, release and keep-alive of routine version 9 (schema version 10).
const ACQUIRE_ONE_TAILS: &str = "CALL tessera_v9_acquire_one(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
const RELEASE_TAILS: &str = "CALL tessera_v9_release(?, ?)";
const KEEP_ALIVE_TAILS: &str = "CALL tessera_v9_keep_alive(?, ?, ?, ?, ?)";
/// The release of routine version 10, with the doorbells of this process (not to be rung).
const RELEASE_RING: &str = "CALL tessera_v10_release(?, ?, ?)";

/// MariaDB / MySQL "PROCEDURE … does not exist" (someone dropped it) and "execute command
/// denied" (a user without `EXECUTE` on it): the client-side step still works.
const NO_SUCH_PROCEDURE: u16 = 1305;
const NO_EXECUTE: u16 = 1370;

fn corrupt(msg: impl Into<String>) -> Error {
    Error::Corrupt(msg.into())
}

/// Runs one `CALL` and returns its result rows; `None` when the procedure is missing or
/// this user may not run it.
pub(crate) async fn call(conn: &mut MySqlConnection, sql: String) -> Result<Option<Vec<MySqlRow>>> {
    use futures::TryStreamExt;
    let mut rows = Vec::new();
    let mut stream = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).fetch_many(&mut *conn);
    loop {
        match stream.try_next().await {
            Ok(Some(sqlx::Either::Right(row))) => rows.push(row),
            Ok(Some(sqlx::Either::Left(_))) => {}
            Ok(None) => break,
            Err(sqlx::Error::Database(db))
                if db
                    .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                    .is_some_and(|e| [NO_SUCH_PROCEDURE, NO_EXECUTE].contains(&e.number())) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(map_err(e)),
        }
    }
    Ok(Some(rows))
}

fn int(row: &MySqlRow, i: usize) -> Result<Option<i64>> {
    row.try_get::<Option<i64>, _>(i)
        .map_err(|e| corrupt(format!("procedure column {i}: {e}")))
}

fn need_int(row: &MySqlRow, i: usize) -> Result<i64> {
    int(row, i)?.ok_or_else(|| corrupt(format!("procedure column {i} is NULL")))
}

/// Column `i`, NULL or text; `None` too when the row has no such column (a procedure of
/// before routine version 7).
fn opt_text(row: &MySqlRow, i: usize) -> Result<Option<String>> {
    if row.len() <= i {
        return Ok(None);
    }
    row.try_get::<Option<String>, _>(i)
        .map_err(|e| corrupt(format!("procedure column {i}: {e}")))
}

fn text(row: &MySqlRow, i: usize) -> Result<String> {
    row.try_get::<Option<String>, _>(i)
        .map_err(|e| corrupt(format!("procedure column {i}: {e}")))?
        .ok_or_else(|| corrupt(format!("procedure column {i} is NULL")))
}

fn now_of(row: &MySqlRow) -> Result<StoreTime> {
    let v = need_int(row, 1)?;
    u64::try_from(v)
        .map(StoreTime)
        .map_err(|_| corrupt(format!("the server's clock reads {v} µs before 1970")))
}

/// The lease in columns 4 to 10 and its tenant in column 12 (routine version 7), checked as
/// the step checks a holder row.
fn grant_of(row: &MySqlRow) -> Result<Grant> {
    let mut holder = super::ops::holder_from(row, 4)?;
    holder.tenant = opt_text(row, 12)?;
    Ok(Grant {
        lease: lease_of_row(&holder)?,
        now: now_of(row)?,
    })
}

/// The call that acquires one permit with the procedure of routine `version`
/// (`Migrated::calls`: `tessera_v4_acquire_one` of `routines.sql`, `tessera_v6_…` of
/// `routines_v6.sql` or `tessera_v7_…` of `routines_v7.sql`, the last two with the tenant);
/// its row is read by [`acquire_one_answer`].
pub(crate) fn acquire_one_call(
    name: &str,
    capacity: u32,
    req: &AcquireRequest,
    doorbell: &str,
    version: i64,
) -> String {
    let lease = req.lease_id.to_string();
    let (wait, waiter_ttl, queue_cap) = match req.wait {
        Some(w) => (1, micros(w.waiter_ttl), i64::from(w.queue_cap)),
        None => (0, 0, 0),
    };
    let mut args = vec![
        Lit::Text(name),
        Lit::Int(capacity.into()),
        Lit::Text(&lease),
        Lit::Int(micros(req.ttl)),
        Lit::Text(&req.holder),
        Lit::Int(wait),
        Lit::Int(waiter_ttl),
        Lit::Int(queue_cap),
        Lit::Text(doorbell),
    ];
    let sql = match version {
        TAILS_VERSION => ACQUIRE_ONE_TAILS,
        LIMITS_VERSION => ACQUIRE_ONE_LIMITS,
        TENANT_VERSION => ACQUIRE_ONE_TENANT,
        FAIR_VERSION => ACQUIRE_ONE_FAIR,
        _ => return render(ACQUIRE_ONE, &args),
    };
    match &req.tenant {
        Some(t) => args.extend([Lit::Text(t.name()), Lit::Int(t.share().into())]),
        None => args.extend([Lit::Null, Lit::Int(1)]),
    }
    render(sql, &args)
}

/// What [`acquire_one_call`] answered (`None`: the procedure is missing): the reply, a
/// capacity mismatch or a full queue as the step answers them, or [`Fast::Fallback`]; and
/// whether the client is to run the locked step at once: the waiter was enqueued without the
/// semaphore row's lock while permits were freed (routine version 9's `queued_step`,
/// `docs/sql-queue.md`).
pub(crate) fn acquire_one_answer(
    row: Option<MySqlRow>,
    name: &str,
    capacity: u32,
    req: &AcquireRequest,
) -> Result<(Fast<Result<AcquireReply>>, bool)> {
    let Some(row) = row else {
        return Ok((Fast::Fallback, false));
    };
    let outcome = text(&row, 0)?;
    let step_now = outcome == "queued_step";
    let outcome = if step_now {
        "queued".to_string()
    } else {
        outcome
    };
    let reply = match outcome.as_str() {
        "fallback" => return Ok((Fast::Fallback, false)),
        "granted" | "held" => {
            let grant = grant_of(&row)?;
            if grant.lease.lease_id != req.lease_id {
                return Err(corrupt("the procedure granted another lease id"));
            }
            Ok(AcquireReply::Granted(grant))
        }
        "queued" => {
            let position = need_int(&row, 2)?;
            let position =
                u64::try_from(position).map_err(|_| corrupt(format!("position = {position}")))?;
            Ok(AcquireReply::Queued { position })
        }
        "no_permit" => {
            let available = need_int(&row, 2)?;
            let queued = need_int(&row, 3)?;
            Ok(AcquireReply::NoPermit {
                available: u32::try_from(available)
                    .map_err(|_| corrupt(format!("available = {available}")))?,
                queued: u64::try_from(queued).map_err(|_| corrupt(format!("queued = {queued}")))?,
            })
        }
        "mismatch" => {
            let stored = need_int(&row, 2)?;
            Err(Error::CapacityMismatch {
                name: name.to_string(),
                stored: u32::try_from(stored)
                    .map_err(|_| corrupt(format!("capacity = {stored}")))?,
                declared: capacity,
            })
        }
        "queue_full" => Err(Error::QueueFull {
            name: name.to_string(),
            cap: req.wait.map_or(0, |w| w.queue_cap),
        }),
        other => return Err(corrupt(format!("unknown procedure outcome {other:?}"))),
    };
    Ok((Fast::Done(reply), step_now))
}

/// The call that releases `lease` with the procedure of routine `version` (as
/// [`acquire_one_call`]); its row is read by [`release_reply`]. `local`: this process's
/// doorbell addresses, separated by commas, which a release of [`RING_VERSION`] leaves alone.
pub(crate) fn release_call(name: &str, lease: &str, version: i64, local: &str) -> String {
    if version == RING_VERSION {
        return render(
            RELEASE_RING,
            &[Lit::Text(name), Lit::Text(lease), Lit::Text(local)],
        );
    }
    let sql = match version {
        TAILS_VERSION => RELEASE_TAILS,
        LIMITS_VERSION => RELEASE_LIMITS,
        TENANT_VERSION => RELEASE_TENANT,
        FAIR_VERSION => RELEASE_FAIR,
        _ => RELEASE,
    };
    render(sql, &[Lit::Text(name), Lit::Text(lease)])
}

/// What [`release_call`] answered (`None`: the procedure is missing), or [`Fast::Fallback`].
pub(crate) fn release_reply(row: Option<MySqlRow>) -> Result<Fast<Released>> {
    let Some(row) = row else {
        return Ok(Fast::Fallback);
    };
    let outcome = text(&row, 0)?;
    match outcome.as_str() {
        "fallback" => Ok(Fast::Fallback),
        "not_held" => Ok(Fast::Done(Released {
            held: false,
            handed_off: None,
            rung: Rung::NotTried,
        })),
        "released" => {
            // A hand-off fills the lease columns; a release without one leaves them NULL.
            let handed_off = match int(&row, 5)? {
                None => None,
                Some(_) => Some((grant_of(&row)?, text(&row, 11)?)),
            };
            // Version 10's fourteenth column: 1 rung, -1 no such connection, 0 look again,
            // NULL (or an older routine's row) not tried.
            let rung = match (row.len() > 13)
                .then(|| int(&row, 13))
                .transpose()?
                .flatten()
            {
                Some(1 | -1) => Rung::Done,
                Some(0) => Rung::LookAgain,
                None => Rung::NotTried,
                Some(other) => return Err(corrupt(format!("release rang {other}"))),
            };
            Ok(Fast::Done(Released {
                held: true,
                handed_off,
                rung,
            }))
        }
        other => Err(corrupt(format!("unknown procedure outcome {other:?}"))),
    }
}

/// A duration in µs, as the procedures take TTLs.
fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The call that renews `lease` for `ttl` with the keep-alive of routine `version`
/// (`Migrated::keep_alive`: `tessera_v4_keep_alive` of `routines.sql` or `tessera_v7_…`);
/// its row is read by [`renew_reply`].
pub(crate) fn renew_call(name: &str, lease: &str, ttl: Duration, version: i64) -> String {
    keep_alive_call(name, lease, ttl, false, "", version)
}

/// The one keep-alive call behind [`renew_call`] (`waiter` 0) and [`heartbeat_call`]
/// (`waiter` 1, with the waiter's doorbell address).
fn keep_alive_call(
    name: &str,
    lease: &str,
    ttl: Duration,
    waiter: bool,
    doorbell: &str,
    version: i64,
) -> String {
    let sql = match version {
        TAILS_VERSION => KEEP_ALIVE_TAILS,
        TENANT_VERSION => KEEP_ALIVE_TENANT,
        _ => KEEP_ALIVE,
    };
    render(
        sql,
        &[
            Lit::Text(name),
            Lit::Text(lease),
            Lit::Int(micros(ttl)),
            Lit::Int(waiter.into()),
            Lit::Text(doorbell),
        ],
    )
}

/// What [`renew_call`] answered (`None`: the procedure is missing), or [`Fast::Fallback`].
pub(crate) fn renew_reply(row: Option<MySqlRow>) -> Result<Fast<RenewReply>> {
    let Some(row) = row else {
        return Ok(Fast::Fallback);
    };
    let outcome = text(&row, 0)?;
    match outcome.as_str() {
        "fallback" => Ok(Fast::Fallback),
        "gone" => Ok(Fast::Done(RenewReply::Gone)),
        "renewed" => {
            let now = now_of(&row)?;
            let expires_at = need_int(&row, 2)?;
            let expires_at = u64::try_from(expires_at)
                .ok()
                .filter(|&e| e >= now.0)
                .ok_or_else(|| corrupt(format!("renewed until {expires_at}, before now")))?;
            Ok(Fast::Done(RenewReply::Renewed {
                expires_at: StoreTime(expires_at),
                now,
            }))
        }
        other => Err(corrupt(format!("unknown procedure outcome {other:?}"))),
    }
}

/// The call that runs waiter `lease`'s heartbeat with the keep-alive of routine `version`
/// (as [`renew_call`]); its row is read by [`heartbeat_reply`].
pub(crate) fn heartbeat_call(
    name: &str,
    lease: &str,
    waiter_ttl: Duration,
    doorbell: &str,
    version: i64,
) -> String {
    keep_alive_call(name, lease, waiter_ttl, true, doorbell, version)
}

/// What [`heartbeat_call`] for `lease` answered (`None`: the procedure is missing), or
/// [`Fast::Fallback`].
pub(crate) fn heartbeat_reply(row: Option<MySqlRow>, lease: LeaseId) -> Result<Fast<WaitReply>> {
    let Some(row) = row else {
        return Ok(Fast::Fallback);
    };
    let outcome = text(&row, 0)?;
    match outcome.as_str() {
        "fallback" => Ok(Fast::Fallback),
        "gone" => Ok(Fast::Done(WaitReply::Gone)),
        "waiting" => Ok(Fast::Done(WaitReply::Waiting)),
        "granted" => {
            let grant = grant_of(&row)?;
            if grant.lease.lease_id != lease {
                return Err(corrupt("the procedure answered another lease id"));
            }
            Ok(Fast::Done(WaitReply::Granted(grant)))
        }
        other => Err(corrupt(format!("unknown procedure outcome {other:?}"))),
    }
}
