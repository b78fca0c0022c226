//! Admission in the Redis store: [`AdmissionBackend`] as one `FCALL` (or `EVALSHA`) per
//! step, `scripts/admit.lua`, `scripts/give_back.lua` and `scripts/settle.lua` behind the
//! semaphore's prelude and `scripts/admission.lua` (which holds the rate prelude and the
//! settle's rate step), over the semaphore's keys and the limiter's of the same name: one
//! hash tag, so one Cluster slot (see `docs/admission.md`).
//!
//! An admission waiter is a queue entry whose record carries a gate (see `prelude.lua`):
//! every hand-off stops at it and wakes it, without a grant, once its permits fit and its
//! windows' instant has come; its own step then charges and grants. A version of tessera
//! before admissions would grant such a waiter without charging its windows, so every client
//! of one Redis must run a version that knows gates before any of them admits.
//!
//! Tenants' window ceilings (`docs/fair-shares.md`, "A ceiling on a share of the windows")
//! live in the same steps (see the section in `scripts/admission.lua`): the percentage with
//! the tenant's limits, the tenant's own limiter beside the shared one under the same hash
//! tag, asked on the admission's turn and charged under the shared charge's id; a cost above
//! the tenant's scaled largest cost is `InvalidInput::Cost` (reply `cost`), nothing charged.
//! A client of a version before window ceilings cannot read a tenant's limits that carry one
//! and fails every step on that name as corrupt: it admits nothing past a ceiling it does
//! not know.

use async_trait::async_trait;
use redis::Value;

use super::ops::{self, corrupt, int, items, micros, text, Op};
use super::rate::{burst_arg, limits_arg};
use super::RedisBackend;
use tessera_core::admission::seam::{
    AdmissionBackend, AdmitReply, AdmitRequest, GiveBack, Settlement,
};
use tessera_core::error::{Error, InvalidInput, Result};
use tessera_core::model::{Grant, LeaseId, Name, StoreTime};
use tessera_core::rate::spec::RateConfig;

/// A flag argument of the admission scripts.
fn flag(b: bool) -> String {
    if b { "1" } else { "0" }.to_string()
}

/// The reply of `admit.lua` (see its header); anything else is [`Error::Corrupt`].
pub(crate) fn parse_admit(
    v: Value,
    name: &Name,
    capacity: u32,
    config: &RateConfig,
    req: &AdmitRequest,
) -> Result<AdmitReply> {
    const W: &str = "admit";
    let shown = v.clone();
    let f = items(v, W)?;
    let get = |i: usize| f.get(i).ok_or_else(|| corrupt(W, &shown));
    let n = |i: usize| get(i).and_then(|v| int(v, W));
    // 0: no instant (the permits do not fit, or the windows were not asked).
    let window_at = |i: usize| n(i).map(|t| (t > 0).then_some(StoreTime(t)));
    match text(get(0)?, W)?.as_str() {
        "granted" => Ok(AdmitReply::Granted {
            grant: Grant {
                now: StoreTime(n(1)?),
                lease: ops::decode_lease(req.acquire.lease_id, &text(get(2)?, W)?)?,
            },
            reservation: n(3)?,
        }),
        "queued" => Ok(AdmitReply::Queued {
            position: n(1)?,
            now: StoreTime(n(2)?),
            window_at: window_at(4)?,
        }),
        "nopermit" => Ok(AdmitReply::Refused {
            available: u32::try_from(n(1)?).map_err(|_| corrupt(W, &shown))?,
            queued: n(2)?,
            now: StoreTime(n(3)?),
            window_at: window_at(4)?,
        }),
        "mismatch" => Err(Error::CapacityMismatch {
            name: name.to_string(),
            stored: u32::try_from(n(1)?).map_err(|_| corrupt(W, &shown))?,
            declared: capacity,
        }),
        // Above the largest cost of the tenant's own limiter (a window ceiling).
        "cost" => Err(Error::InvalidInput(InvalidInput::Cost {
            cost: req.cost,
            max: u32::try_from(n(1)?).map_err(|_| corrupt(W, &shown))?,
        })),
        "ratemismatch" => Err(Error::RateMismatch {
            name: name.to_string(),
            stored: text(get(1)?, W)?,
            declared: config.encode(),
        }),
        "queuefull" => Err(Error::QueueFull {
            name: name.to_string(),
            cap: req.acquire.wait.map(|w| w.queue_cap).unwrap_or(0),
        }),
        _ => Err(corrupt(W, &shown)),
    }
}

#[async_trait]
impl AdmissionBackend for RedisBackend {
    async fn admit(
        &self,
        name: &Name,
        capacity: u32,
        config: &RateConfig,
        req: &AdmitRequest,
    ) -> Result<AdmitReply> {
        let a = &req.acquire;
        let (waiter_ttl, queue_cap) = match a.wait {
            Some(w) => (micros(w.waiter_ttl).max(1), w.queue_cap),
            None => (0, 0),
        };
        self.listen_on(name).await?;
        let args = [
            capacity.to_string(),
            a.lease_id.to_string(),
            a.weight.to_string(),
            micros(a.ttl).to_string(),
            a.holder.clone(),
            self.client_id.clone(),
            waiter_ttl.to_string(),
            queue_cap.to_string(),
            config.encode(),
            limits_arg(config),
            burst_arg(config).to_string(),
            req.cost.to_string(),
            flag(req.update),
            flag(req.at_head),
        ];
        // A tenant and its share follow; without one the call is as before tenants.
        let with_tenant;
        let args: &[String] = match &a.tenant {
            None => &args,
            Some(t) => {
                with_tenant = ops::with_tenant_and_mark(&args, Some(t), false);
                &with_tenant
            }
        };
        let v = self.caller.run_admission(Op::Admit, name, args).await?;
        self.caller.note_expiry(name, &v);
        let reply = parse_admit(v, name, capacity, config, req)?;
        self.set_waiting(a.lease_id, matches!(reply, AdmitReply::Queued { .. }));
        Ok(reply)
    }

    async fn give_back(&self, name: &Name, lease: LeaseId, g: GiveBack) -> Result<bool> {
        let v = self
            .caller
            .run_admission(
                Op::GiveBack,
                name,
                &[
                    lease.to_string(),
                    g.reservation.to_string(),
                    g.at.0.to_string(),
                    flag(g.expired),
                ],
            )
            .await?;
        ops::parse_bool(v, "give back")
    }

    async fn settle(&self, name: &Name, lease: LeaseId, settlement: &Settlement) -> Result<bool> {
        let v = self
            .caller
            .run_admission(
                Op::Settle,
                name,
                &[
                    lease.to_string(),
                    settlement.reservation.to_string(),
                    settlement.at.0.to_string(),
                    settlement.charged.to_string(),
                    settlement.actual.to_string(),
                ],
            )
            .await?;
        ops::parse_bool(v, "settle")
    }
}
