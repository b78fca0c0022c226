//! Waiters' heartbeats, gathered per semaphore into one call (`routines_v5.sql`,
//! `tessera_v5_heartbeat_many`).
//!
//! Every waiter heartbeats once per third of its waiter TTL (and polls more often right after
//! it queued), each heartbeat a read of its own, and a `CALL` that commits when its entry is
//! due for renewal. One process with 10,000 waiters on one semaphore (3 s waiter TTL) did not
//! keep up through its few connections: on a local MariaDB 10.11 its queue reached 3,856
//! after 5 s, then fell back to a few hundred, waiters expiring and queueing again, with the
//! server nearly idle (`tessera-worker --store mysql://… --waiters 10000 --waiter-ttl-ms
//! 3000`).
//!
//! The heartbeats of one semaphore go through one queue of a [`Batcher`]; a call carries the
//! heartbeats that arrived while the previous one ran. A call of one heartbeat runs it alone
//! ([`alone`]: a read when its entry is fresh, else one `CALL`); a call of several is one
//! `CALL`, which answers each lease 'waiting' (without a lock or a write when every entry is
//! fresh, else purging expired waiters and renewing every entry in one transaction) or
//! leaves it to a heartbeat alone (not queued: granted or gone; or the step has more to do:
//! an expired holder, a hand-off), which its caller then sends. The lone heartbeat runs in
//! the sending task, not in its caller: heartbeats that arrive meanwhile wait for the next
//! call. Answered at once and run by their callers, lone heartbeats went out one by one
//! whenever they arrived spread out, each on a keep-alive connection, and the gathered calls
//! waited behind them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::Row;

use super::conns::Conns;
use super::error::map_err;
use super::migrate::Migrated;
use super::ops::{render, Lit, MysqlRows};
use super::routines::{self, Fast};
use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::{LeaseId, StoreTime, WaitReply};
use tessera_core::stores::batch::{BatchCall, Batcher};
use tessera_core::stores::sql;

/// The heartbeats of this backend's waiters, by semaphore.
pub(crate) type Heartbeats = Batcher<HeartbeatMany>;

const HEARTBEAT_MANY: &str = "CALL tessera_v5_heartbeat_many(?, ?, ?)";
/// [`HEARTBEAT_MANY`] on the tables of schema version 6 (`routines_v6.sql`).
const HEARTBEAT_MANY_FAIR: &str = "CALL tessera_v6_heartbeat_many(?, ?, ?)";
/// [`HEARTBEAT_MANY_FAIR`] on the tables of schema version 7 (`routines_v7.sql`).
const HEARTBEAT_MANY_TENANT: &str = "CALL tessera_v7_heartbeat_many(?, ?, ?)";
/// [`HEARTBEAT_MANY_TENANT`] on the tables of schema version 10 (the tail rows).
const HEARTBEAT_MANY_TAILS: &str = "CALL tessera_v9_heartbeat_many(?, ?, ?)";

/// What a gathered call answered for one heartbeat.
#[derive(Debug, PartialEq)]
pub(crate) enum Answer {
    /// The heartbeat's reply.
    Reply(WaitReply),
    /// Left to a heartbeat alone, which its caller sends ([`alone`], then the step if
    /// needed).
    Alone,
    /// A heartbeat alone already ran and left the case to the client-side step, which its
    /// caller runs.
    Step,
}

/// One call of `tessera_v5_heartbeat_many`: items are a lease and its waiter TTL in µs.
pub(crate) struct HeartbeatMany {
    pub(crate) conns: Conns,
    /// This client's doorbell address (`None` with `wake=poll`).
    pub(crate) doorbell: Option<Arc<Mutex<String>>>,
    /// The schema and routine versions: which procedure is called
    /// (`Migrated::heartbeat_many`), and how a heartbeat alone runs ([`alone`]).
    pub(crate) db: Migrated,
}

impl BatchCall for HeartbeatMany {
    type Item = (LeaseId, i64);
    type Reply = Answer;

    async fn call(&self, name: &str, items: &[(LeaseId, i64)]) -> Result<Vec<Result<Answer>>> {
        let doorbell = self
            .doorbell
            .as_ref()
            .map(|a| a.lock().unwrap().clone())
            .unwrap_or_default();
        if let [(lease, ttl_us)] = *items {
            let ttl = Duration::from_micros(ttl_us.max(0) as u64);
            let reply = alone(&self.conns, &doorbell, self.db, name, lease, ttl).await;
            return Ok(vec![reply.map(|r| r.map_or(Answer::Step, Answer::Reply))]);
        }
        let leases: Vec<String> = items
            .iter()
            .map(|(lease, ttl)| format!("[\"{lease}\",{ttl}]"))
            .collect();
        let leases = format!("[{}]", leases.join(","));
        let call = render(
            match self
                .db
                .heartbeat_many()
                .unwrap_or(routines::HEARTBEAT_MANY_VERSION)
            {
                routines::TAILS_VERSION => HEARTBEAT_MANY_TAILS,
                routines::TENANT_VERSION => HEARTBEAT_MANY_TENANT,
                routines::FAIR_VERSION => HEARTBEAT_MANY_FAIR,
                _ => HEARTBEAT_MANY,
            },
            &[Lit::Text(name), Lit::Text(&leases), Lit::Text(&doorbell)],
        );
        let Some(rows) = self.conns.call(call, true).await? else {
            // The procedure is gone (dropped by hand): each heartbeat alone.
            return Ok(items.iter().map(|_| Ok(Answer::Alone)).collect());
        };
        // One answer per row: the batcher checks there is one per lease.
        Ok(rows
            .iter()
            .enumerate()
            .map(|(i, row)| parse_row(row, i))
            .collect())
    }
}

/// Row `i` of `tessera_v5_heartbeat_many`: `(ord, outcome)`, ord counting from 1.
fn parse_row(row: &sqlx::mysql::MySqlRow, i: usize) -> Result<Answer> {
    let ord: Option<i64> = row
        .try_get(0)
        .map_err(|e| Error::Corrupt(format!("tessera_v5_heartbeat_many column 0: {e}")))?;
    if ord != Some(i as i64 + 1) {
        return Err(Error::Corrupt(format!(
            "tessera_v5_heartbeat_many answered row {ord:?} in the place of {}",
            i + 1
        )));
    }
    let outcome: Option<String> = row
        .try_get(1)
        .map_err(|e| Error::Corrupt(format!("tessera_v5_heartbeat_many column 1: {e}")))?;
    match outcome.as_deref() {
        Some("waiting") => Ok(Answer::Reply(WaitReply::Waiting)),
        Some("alone") => Ok(Answer::Alone),
        other => Err(Error::Corrupt(format!(
            "tessera_v5_heartbeat_many answered {other:?}"
        ))),
    }
}

/// One heartbeat alone, short of the client-side step: the read-only [`probe`], else the
/// procedure ([`fast`]); `None` when the step must run. `db`: what the database holds.
pub(crate) async fn alone(
    conns: &Conns,
    doorbell: &str,
    db: Migrated,
    name: &str,
    lease: LeaseId,
    waiter_ttl: Duration,
) -> Result<Option<WaitReply>> {
    let probed = match probe(conns, doorbell, db, name, lease, waiter_ttl).await {
        // A dead pooled connection (the server closed it): the procedure, which tries the
        // next ones.
        Err(Error::Store {
            kind: StoreErrorKind::Connection,
            ..
        }) => None,
        other => other?,
    };
    if probed.is_some() {
        return Ok(probed);
    }
    Ok(
        match fast(conns, doorbell, db, name, lease, waiter_ttl).await? {
            Fast::Done(reply) => Some(reply),
            Fast::Fallback => None,
        },
    )
}

/// A waiter's heartbeat in one round trip (the keep-alive of `Migrated::keep_alive`:
/// `tessera_v4_keep_alive`, or `tessera_v7_…` whose grant carries the tenant);
/// [`Fast::Fallback`] without it or when the procedure leaves the case to the client-side
/// step.
pub(crate) async fn fast(
    conns: &Conns,
    doorbell: &str,
    db: Migrated,
    name: &str,
    lease: LeaseId,
    waiter_ttl: Duration,
) -> Result<Fast<WaitReply>> {
    let Some(version) = db.keep_alive() else {
        return Ok(Fast::Fallback);
    };
    let call = routines::heartbeat_call(name, &lease.to_string(), waiter_ttl, doorbell, version);
    routines::heartbeat_reply(conns.call_one(call, true).await?, lease)
}

/// See [`probe`].
const HEARTBEAT_PROBE: &str = include_str!("heartbeat_probe.sql");

/// [`HEARTBEAT_PROBE`] reading the queue head in the order of fair shares (schema version 6).
static HEARTBEAT_PROBE_FAIR: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    HEARTBEAT_PROBE.replace("ORDER BY hd.seq", "ORDER BY hd.tag, hd.seq")
});

/// The read-only part of a heartbeat, one statement outside any transaction: `Some(Waiting)`
/// when a full step would change nothing but this waiter's expiry (the waiter is queued with
/// this client's current doorbell, no holder or waiter of the semaphore has expired, the
/// queue head does not fit, so no hand-off is due) and that expiry still has at least half
/// of `waiter_ttl` to run; `Some(Granted)` when the lease is no longer queued because it
/// holds unexpired permits (one more read, see [`sql::read_grant`]). Otherwise `None`: run
/// the full step.
///
/// The probe reads the latest committed rows in one consistent read (`READ COMMITTED`, one
/// statement) without the row lock; a grant committed just after it is seen at the next
/// poll, exactly as if this heartbeat had run just before that grant.
pub(crate) async fn probe(
    conns: &Conns,
    doorbell: &str,
    db: Migrated,
    name: &str,
    lease: LeaseId,
    waiter_ttl: Duration,
) -> Result<Option<WaitReply>> {
    let mut conn = conns.keep_alive().await?;
    let lease_text = lease.to_string();
    let sql: &'static str = if db.fair() {
        HEARTBEAT_PROBE_FAIR.as_str()
    } else {
        HEARTBEAT_PROBE
    };
    let row = sqlx::query(sql)
        .bind(name)
        .bind(name)
        .bind(name)
        .bind(name)
        .bind(&lease_text)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
    let int = |i| row.try_get::<Option<i64>, _>(i).ok().flatten();
    let Some(now) = int(0).filter(|&t| t >= 0) else {
        return Ok(None);
    };
    let now = StoreTime(now as u64);
    let Some(expires_at) = int(1) else {
        // Not queued: granted, or the full step decides.
        let rows = &mut MysqlRows::new(&mut conn, name, doorbell, false)
            .with_tenant_rows(db.tenant_rows());
        let grant = sql::read_grant(rows, lease, now).await?;
        return Ok(grant.map(WaitReply::Granted));
    };
    let queued_on: Option<String> = row.try_get(2).ok();
    if queued_on.as_deref() != Some(doorbell) {
        // The doorbell reconnected: the full step moves the waiter to the new one.
        return Ok(None);
    }
    let (Some(0), Some(0), Some(1)) = (int(3), int(4), int(5)) else {
        return Ok(None);
    };
    let fresh_until = now.plus(waiter_ttl / 2).0;
    Ok((expires_at >= 0 && expires_at as u64 >= fresh_until).then_some(WaitReply::Waiting))
}
