//! Admission in the PostgreSQL store: [`AdmissionBackend`] as one PL/pgSQL function call per
//! step, `tessera_admit` (`sql/admit.sql`), `tessera_give_back` (`sql/give_back.sql`) and
//! `tessera_settle` (`sql/settle.sql`, step revision 5), each one statement in its own
//! implicit transaction like every other operation (see `docs/admission.md`).
//!
//! A step locks the semaphore's row (`tessera__load` in `sql/common.sql`: purge, hand-off)
//! and then, on the request's turn only, the limiter's row of the same name through the rate
//! step that `tessera_rate_acquire` runs too (`tessera__rate_step` in `sql/rate_common.sql`,
//! asked for now only); the step goes on at the instant the rate step read once it held that
//! row, so the lease and the windows' charge carry one instant. Every step that takes both
//! rows takes them in that order, and the semaphore's and the rate functions take one each,
//! so none of them deadlock.
//!
//! An admission waiter is a queue row whose `gate` is set (migration 6, `sql/schema_6.sql`):
//! every hand-off stops at it and, once its permits fit and its windows' instant has come,
//! wakes it without a grant (its bare lease id on its process's channel, or in a release's
//! reply to its own process, routed by `notify.rs` exactly as a plain waiter's grant); its
//! own step then charges and grants. The functions live in the schema, so from the commit of
//! migration 6 every process runs a hand-off that knows gates, whatever its build: an older
//! build refuses to connect to that schema, and its processes already connected call the new
//! functions.
//!
//! The waiting itself is `crate::semaphore::admit`: a queued admission asks again with the
//! same request on its wake-up, at the instant its windows admit it, and on its poll.

use async_trait::async_trait;
use sqlx::postgres::PgRow;

use super::ops::{self, get, opt, time_of, u32_of, u64_of};
use super::rate::limit_args;
use super::PostgresBackend;
use tessera_core::admission::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, GiveBack, Settlement,
};
use tessera_core::error::{Error, InvalidInput, Result};
use tessera_core::model::{Grant, LeaseId, Name};
use tessera_core::rate::spec::RateConfig;
use tessera_core::stores::sql::rate::db;

/// The admission's functions, created by migration 6 after the step and the rate functions
/// they call, and again by every newer step revision (`ops::STEP_AGAIN`): `tessera_settle`
/// came with revision 5, a function over the same tables, so no migration.
pub(crate) const FUNCTIONS: &[&str] = &[
    include_str!("sql/admit.sql"),
    include_str!("sql/give_back.sql"),
    include_str!("sql/settle.sql"),
];

/// Migration 6 (`sql/schema_6.sql`): the waiters' `gate`, then the step (whose hand-off knows
/// gates), the rate functions (the decision and the undo the admission shares) and the
/// admission's functions.
pub(crate) const MIGRATION_6: &[&[&str]] = &[
    &[include_str!("sql/schema_6.sql")],
    ops::STEP,
    super::rate::FUNCTIONS,
    FUNCTIONS,
];

/// Migration 7 (`sql/schema_7.sql`): the limiters' `expired`, then everything migration 6
/// creates (the give-back and the rate status change their signatures).
pub(crate) const MIGRATION_7: &[&[&str]] = &[
    &[include_str!("sql/schema_7.sql")],
    ops::STEP,
    super::rate::FUNCTIONS,
    FUNCTIONS,
];

const ADMIT: &str = "SELECT outcome, now_us, weight, seats, fence, holder, acquired_at, \
     expires_at, reservation, \"position\", window_at, available, queued, stored_capacity, \
     stored_limits, tenant \
     FROM tessera_admit($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, \
     $18, $19)";
const GIVE_BACK: &str = "SELECT held, grants FROM tessera_give_back($1, $2, $3, $4, $5, $6)";
const SETTLE: &str = "SELECT held, grants FROM tessera_settle($1, $2, $3, $4, $5, $6, $7)";

/// The reply of `tessera_admit` (see `admit.sql`); anything else is [`Error::Corrupt`].
fn parse_admit(
    row: &PgRow,
    name: &Name,
    capacity: u32,
    config: &RateConfig,
    req: &AdmitRequest,
) -> Result<AdmitReply> {
    let outcome: String = get(row, "outcome")?;
    let now = time_of(get(row, "now_us")?, "now_us")?;
    let window_at = || {
        opt::<i64>(row, "window_at")?
            .map(|t| time_of(t, "window_at"))
            .transpose()
    };
    match outcome.as_str() {
        "granted" => Ok(AdmitReply::Granted {
            grant: Grant {
                lease: ops::lease_of_row(row, req.acquire.lease_id)?,
                now,
            },
            reservation: u64_of(get(row, "reservation")?, "reservation")?,
        }),
        "queued" => Ok(AdmitReply::Queued {
            position: u64_of(get(row, "position")?, "position")?,
            window_at: window_at()?,
            now,
        }),
        "refused" => Ok(AdmitReply::Refused {
            available: u32_of(get(row, "available")?, "available")?,
            queued: u64_of(get(row, "queued")?, "queued")?,
            window_at: window_at()?,
            now,
        }),
        "mismatch" => Err(Error::CapacityMismatch {
            name: name.to_string(),
            stored: u32_of(get(row, "stored_capacity")?, "capacity")?,
            declared: capacity,
        }),
        "ratemismatch" => Err(Error::RateMismatch {
            name: name.to_string(),
            stored: get(row, "stored_limits")?,
            declared: config.encode(),
        }),
        "queue_full" => Err(Error::QueueFull {
            name: name.to_string(),
            cap: req.acquire.wait.map_or(0, |w| w.queue_cap),
        }),
        other => Err(ops::corrupt(format!(
            "admit outcome {:?}",
            other.chars().take(32).collect::<String>()
        ))),
    }
}

#[async_trait]
impl AdmissionBackend for PostgresBackend {
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply> {
        let a = &req.acquire;
        if a.weight == 0 {
            // The client checks 1 <= weight <= capacity; the step relies on weight >= 1.
            return Err(InvalidInput::Weight {
                weight: 0,
                capacity,
            }
            .into());
        }
        let (waiter_ttl, queue_cap) = match a.wait {
            Some(w) => (
                Some(ops::micros(w.waiter_ttl).max(1)),
                i64::from(w.queue_cap),
            ),
            None => (None, 0),
        };
        // Registered before the call, as for an acquire: a wake-up that overtakes the reply
        // is not lost after a listener reconnect either.
        if waiter_ttl.is_some() {
            self.listener.set_waiting(a.lease_id, true);
        }
        let (n, l, t, burst) = limit_args(config);
        let row = self
            .run_settled(
                a.lease_id,
                sqlx::query(ADMIT)
                    .bind(name.to_string())
                    .bind(i64::from(capacity))
                    .bind(a.lease_id.to_string())
                    .bind(i64::from(a.weight))
                    .bind(ops::micros(a.ttl))
                    .bind(a.holder.clone())
                    .bind(self.listener.client_id().to_string())
                    .bind(waiter_ttl)
                    .bind(queue_cap)
                    .bind(config.encode())
                    .bind(n)
                    .bind(l)
                    .bind(t)
                    .bind(burst)
                    .bind(i64::from(req.cost))
                    .bind(req.update)
                    .bind(req.at_head)
                    .bind(a.tenant.as_ref().map(|t| t.name().to_string()))
                    .bind(a.tenant.as_ref().map_or(1, |t| i64::from(t.share()))),
            )
            .await;
        let reply = row.and_then(|row| {
            if let Some(after) = ops::expiry_in(&row) {
                self.expiries.note(name, after);
            }
            parse_admit(&row, name, capacity, config, req)
        });
        let queued = matches!(reply, Ok(AdmitReply::Queued { .. }));
        if !queued && !matches!(reply, Err(ref e) if e.is_transient()) {
            self.listener.set_waiting(a.lease_id, false);
        }
        reply
    }

    /// The release and the return of the charge in one call; the grants it makes to this
    /// process's waiters come back in its reply, as a release's do.
    async fn give_back(&self, name: &Name, lease: LeaseId, g: GiveBack) -> Result<bool> {
        self.settle(lease).await;
        let row = self
            .row(
                sqlx::query(GIVE_BACK)
                    .bind(name.as_str())
                    .bind(lease.to_string())
                    .bind(db(g.reservation))
                    .bind(db(g.at.0))
                    .bind(self.listener.client_id())
                    .bind(g.expired),
            )
            .await;
        self.released(row)
    }

    /// The release and the settle of the charge in one call (`sql/settle.sql`); its grants to
    /// this process's waiters come back in its reply, as a release's do. A schema whose
    /// functions a role without the right to replace them keeps at an older revision has no
    /// `tessera_settle` (SQLSTATE 42883): `Unsupported`, and `Admitted::settle` releases.
    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        PostgresBackend::settle(self, lease).await;
        let row = self
            .row(
                sqlx::query(SETTLE)
                    .bind(name.as_str())
                    .bind(lease.to_string())
                    .bind(db(settlement.reservation))
                    .bind(db(settlement.at.0))
                    .bind(i64::from(settlement.charged))
                    .bind(i64::from(settlement.actual))
                    .bind(self.listener.client_id()),
            )
            .await;
        match row {
            Err(Error::Store { message, .. }) if message.contains("SQLSTATE 42883") => {
                Err(Error::Unsupported(format!(
                    "settling an admission's cost on this PostgreSQL schema: its functions \
                     predate tessera_settle (connect once as the schema's owner to create \
                     them): {message}"
                )))
            }
            row => self.released(row),
        }
    }
}
