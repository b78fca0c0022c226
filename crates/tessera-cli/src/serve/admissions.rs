//! `/v1/admissions`: permits of a semaphore and rate windows of the limiter of the same name,
//! taken in one atomic step (`tessera::Admission`, `docs/admission.md`), and the give-back of
//! an admission its client could not use before its use-by instant.
//!
//! A granted admission is a semaphore lease (renew and release it under
//! `/v1/semaphores/{name}/leases/{lease_id}`) and a charge of every window made at the
//! same store instant. The answer says how long the call still counts inside the windows
//! (`use_by_ms`, from when the answer left): a client that cannot start its call within it
//! gives the admission back (`give-back`) and asks again, instead of calling late.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tessera::backend::GiveBack;
use tessera::{Admission, Admitted, RateOptions, RateSpec, SemaphoreOptions, StoreTime};
use utoipa::ToSchema;

use super::auth::Principal;
use super::error::{ApiError, ErrorBody};
use super::extract::{duration, duration_or, JsonBody, PathArgs};
use super::hold::{self, LeaseBody};
use super::ratelimit;
use super::semaphores::{
    hand_over, lease_id, name, wait_of, wants_event_stream, with_queue_cap, with_tenant,
    within_wait, DoneBody, DEFAULT_TTL,
};
use super::App;

/// An admission: `weight` permits of a semaphore of `capacity` and `cost` of every limit,
/// all at once.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AdmissionBody {
    /// The semaphore's capacity, as every client declares it (1..=1,000,000).
    #[schema(example = 4, minimum = 1, maximum = 1_000_000)]
    pub capacity: u32,
    /// Permits to take as one lease (1..=capacity; default 1).
    #[serde(default)]
    #[schema(example = 1, minimum = 1, maximum = 1_000_000)]
    pub weight: Option<u32>,
    /// The limits, all charged at once (exact windows): `N/PERIOD` (`"50/s"`,
    /// `"1000/min"`). Every client declares the same limits (else `rate_mismatch`, unless
    /// `update`).
    #[schema(example = json!(["50/s", "1000/min"]))]
    pub limits: Vec<String>,
    /// The cost charged to every limit (1..=the smallest N; default 1).
    #[serde(default)]
    #[schema(example = 1, minimum = 1)]
    pub cost: Option<u32>,
    /// Margin between admission and use (0s..1s, at most the shortest period; default
    /// 100ms): the limits hold for calls started within it, the admission's use-by time.
    #[serde(default)]
    #[schema(example = "100ms")]
    pub margin: Option<String>,
    /// Replace the limits stored under this name if they differ (default false).
    #[serde(default)]
    pub update: Option<bool>,
    /// Lease TTL (100ms..24h; default 30s).
    #[serde(default)]
    #[schema(example = "30s")]
    pub ttl: Option<String>,
    /// How long to wait in the semaphore's queue (0s..5m; default 0s: only if a permit is
    /// free now, nobody waits and every window has room). `not_admitted` (408) when it runs
    /// out; nothing is held or charged then.
    #[serde(default)]
    #[schema(example = "10s")]
    pub wait: Option<String>,
    /// Holder label (default `http:ADDRESS:PORT` of the client).
    #[serde(default)]
    #[schema(example = "billing-worker-3")]
    pub holder: Option<String>,
    /// With `Accept: text/event-stream` and a `wait`: `waiting` events before the `grant`,
    /// and an `error` event for a wait that runs out (as for a semaphore's acquire).
    #[serde(default)]
    pub waiting_events: bool,
    /// An admission of this name this client could not use before its use-by, given back in
    /// the same request: if its lease was still held, this request waits first in the queue
    /// (the place the late one had), else at the tail.
    #[serde(default)]
    pub given_back: Option<GivenBackLease>,
    /// The tenant this acquire counts against (docs/fair-shares.md): under contention,
    /// permits go to the waiting tenants in proportion to their `share`, FIFO within each.
    /// A store that cannot order by shares answers 501 `unsupported`.
    #[serde(default)]
    #[schema(example = "billing")]
    pub tenant: Option<String>,
    /// The tenant's share (1..=1000; default 1); only with `tenant`.
    #[serde(default)]
    #[schema(example = 2, minimum = 1, maximum = 1000)]
    pub share: Option<u32>,
    /// With a `wait`: the most waiters this admission queues behind (1..=1,000,000; default
    /// 10,000), as for a semaphore's acquire.
    #[serde(default)]
    #[schema(example = 100, minimum = 1, maximum = 1_000_000)]
    pub queue_cap: Option<u32>,
}

/// An admission given back by an acquire (`given_back`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GivenBackLease {
    /// Its `lease_id`.
    pub lease_id: String,
    /// Its `reservation`.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub reservation: u64,
    /// Its `admitted_at_us`.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub admitted_at_us: u64,
}

/// A granted admission: the lease, and the charge of every window.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdmittedLeaseBody {
    #[serde(flatten)]
    pub lease: LeaseBody,
    /// The store instant at which the permits were granted and every window charged (µs
    /// since the Unix epoch).
    pub admitted_at_us: u64,
    /// How long from when this answer left a call still counts inside the windows, in
    /// milliseconds (rounded down); absent with a margin of 0. Past it, give the admission
    /// back and ask again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_by_ms: Option<u64>,
    /// Names the charge for `give-back`.
    pub reservation: u64,
}

/// A give-back of an admission not used in time.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GiveBackBody {
    /// `reservation` of the admission.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub reservation: u64,
    /// `admitted_at_us` of the admission.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub admitted_at_us: u64,
    /// True when it is given back because it was past its use-by instant: counted in the
    /// limiter's status (`expired_unused`) and in `tessera_admissions_expired_total`.
    #[serde(default)]
    pub expired: bool,
}

/// A settle: what the admitted call actually cost.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettleBody {
    /// `reservation` of the admission.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub reservation: u64,
    /// `admitted_at_us` of the admission.
    #[schema(minimum = 0, maximum = 9_223_372_036_854_775_807_i64)]
    pub admitted_at_us: u64,
    /// The cost the admission asked for (its `cost`, default 1).
    #[serde(default)]
    #[schema(example = 4000, minimum = 1, maximum = 1_000_000)]
    pub cost: Option<u32>,
    /// What the call actually cost (0..=1,000,000).
    #[schema(example = 1500, minimum = 0, maximum = 1_000_000)]
    pub actual: u32,
}

fn admission(
    app: &App,
    sem: &str,
    body: &AdmissionBody,
    ttl: std::time::Duration,
    holder: String,
) -> Result<Admission, ApiError> {
    let mut limits = body.limits.iter().map(|l| l.parse::<RateSpec>());
    let Some(first) = limits.next() else {
        return Err(ApiError::invalid("limits: at least one limit, as \"50/s\""));
    };
    let mut rate_opts = RateOptions::default().update(body.update.unwrap_or(false));
    if let Some(m) = &body.margin {
        rate_opts = rate_opts.margin(duration("margin", m)?);
    }
    let mut adm = app
        .store
        .admission(sem)
        .permits(body.capacity)
        .semaphore_options(with_tenant(
            with_queue_cap(
                SemaphoreOptions::default().ttl(ttl).holder(holder),
                body.queue_cap,
            ),
            body.tenant.as_deref(),
            body.share,
        )?)
        .rate_options(rate_opts)
        .rate(first?)?;
    for l in limits {
        adm = adm.rate(l?)?;
    }
    Ok(adm
        .weight(body.weight.unwrap_or(1))?
        .cost(body.cost.unwrap_or(1))?)
}

/// Acquire an admission: permits and rate windows in one step.
///
/// Waits up to `wait` in the semaphore's FIFO queue (shared with plain acquires) until, at
/// one instant, the permits are free and every window has room; then the lease is written
/// and every window charged together. Nothing is held while the windows are full, nothing
/// charged while no permit is free. With `Accept: text/event-stream` the answer is a stream
/// holding the lease, as for a semaphore acquire.
#[utoipa::path(
    post,
    path = "/v1/admissions/{name}/acquire",
    tag = "admissions",
    params(("name" = String, Path, description = "Name of the semaphore and of the limiter")),
    request_body = AdmissionBody,
    responses(
        (status = 200, description = "Admitted (JSON), or the event stream holding the lease", content(
            (AdmittedLeaseBody = "application/json"),
            (String = "text/event-stream", example = "event: grant\ndata: {\"lease_id\":\"...\"}\n\n")
        )),
        (status = 400, description = "Invalid input; nothing changed", body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 408, description = "Not admitted within `wait`; nothing is held, queued or charged", body = ErrorBody),
        (status = 409, description = "The stored capacity or limits differ", body = ErrorBody),
        (status = 429, description = "The queue is full", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds: about the time one place took to free, as this server's waiters measured it (1 to 30; 1 when unknown)"))),
        (status = 501, description = "The store has no admission", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn acquire(
    State(app): State<Arc<App>>,
    principal: Principal,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    PathArgs(sem): PathArgs<String>,
    JsonBody(body): JsonBody<AdmissionBody>,
) -> Result<Response, ApiError> {
    principal.check(&sem)?;
    let stream = wants_event_stream(&headers);
    let ttl = duration_or("ttl", body.ttl.as_deref(), DEFAULT_TTL)?;
    let wait = wait_of(body.wait.as_deref())?;
    let holder = body
        .holder
        .clone()
        .unwrap_or_else(|| format!("http:{peer}"));
    let adm = admission(&app, &sem, &body, ttl, holder)?;
    let given_back = match &body.given_back {
        None => None,
        Some(g) => {
            let id = lease_id(&g.lease_id)?;
            check_charge(g.reservation, g.admitted_at_us)?;
            Some((id, g.reservation, StoreTime(g.admitted_at_us)))
        }
    };
    let deadline = tokio::time::Instant::now() + wait;
    // A wait publishes its place, which the error answer and `waiting` events carry.
    let (place, places) = tokio::sync::watch::channel(None);
    let admit = {
        let (app, adm, sem) = (Arc::clone(&app), adm.clone(), sem.clone());
        async move {
            let waiting = async {
                let mut ticket = match (given_back, wait.is_zero()) {
                    (Some((id, reservation, at)), _) => {
                        adm.give_back_and_readmit_timeout(id, reservation, at, wait)
                            .await?
                    }
                    (None, true) => adm.try_acquire().await?,
                    (None, false) => adm.acquire_watching(wait, &place).await?,
                };
                // Used right now or given back: one that went stale on its way here is taken
                // again, first in the queue, within what is left of the wait.
                while let Some(t) = ticket.take_if(|t| !t.is_fresh()) {
                    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                    ticket = adm.readmit_timeout(t, left).await?;
                }
                Ok::<Option<Admitted>, tessera::Error>(ticket)
            };
            let admitted = tokio::select! {
                r = within_wait(&app, wait, "the admission", waiting) => {
                    r.map_err(|e| app.paces.paced(&sem, e))?
                }
                never = app.paces.follow(&sem, place.subscribe()) => match never {},
            };
            match admitted {
                Some(ticket) => Ok(ticket),
                None => {
                    let fields = ratelimit::fields(adm.limiter()).await;
                    Err(ApiError::new(
                        StatusCode::REQUEST_TIMEOUT,
                        "not_admitted",
                        format!(
                            "no admission to {sem:?} within {}: no permit free, others queued, or the windows full",
                            humantime::format_duration(wait)
                        ),
                    )
                    .with_headers(fields)
                    .with_place(*place.borrow()))
                }
            }
        }
    };
    if stream && body.waiting_events && !wait.is_zero() {
        let policy = ratelimit::policy(adm.limiter());
        let permit = async move { admit.await.map(Admitted::into_permit) };
        return Ok((policy, hold::wait_then_hold(app, ttl, places, permit)).into_response());
    }
    let ticket = admit.await?;
    let admitted_at_us = ticket.admitted_at().as_micros();
    let use_by = ticket.use_by();
    let reservation = ticket.reservation();
    let policy = ratelimit::policy(adm.limiter());
    if stream {
        return Ok((policy, hold::hold(app, ticket.into_permit(), ttl)).into_response());
    }
    let lease = hand_over(&app, &sem, ticket.into_permit(), ttl).await?;
    let use_by_ms = use_by.map(|t| {
        t.saturating_duration_since(tokio::time::Instant::now())
            .as_millis() as u64
    });
    Ok((
        policy,
        Json(AdmittedLeaseBody {
            lease,
            admitted_at_us,
            use_by_ms,
            reservation,
        }),
    )
        .into_response())
}

/// Give back an admission not used in time.
///
/// Releases the lease and, while the admission is still the limiter's latest charge,
/// returns the charge to every window. `done: false` if the lease was not held any more.
#[utoipa::path(
    post,
    path = "/v1/admissions/{name}/leases/{lease_id}/give-back",
    tag = "admissions",
    params(("name" = String, Path, description = "Name of the semaphore and of the limiter"), ("lease_id" = String, Path, description = "Lease id (32 hex digits)")),
    request_body = GiveBackBody,
    responses(
        (status = 200, body = DoneBody),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 501, description = "The store has no admission", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn give_back(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, lease)): PathArgs<(String, String)>,
    JsonBody(body): JsonBody<GiveBackBody>,
) -> Result<Json<DoneBody>, ApiError> {
    let (n, id) = charge_of(
        &principal,
        &sem,
        &lease,
        body.reservation,
        body.admitted_at_us,
    )?;
    let give_back = GiveBack {
        reservation: body.reservation,
        at: StoreTime(body.admitted_at_us),
        expired: body.expired,
    };
    let done = app
        .bounded(
            "the give-back",
            app.store.give_back_admission(n.as_str(), id, give_back),
        )
        .await??;
    Ok(Json(DoneBody { done }))
}

/// Settle an admission's cost and release it.
///
/// For costs known only after the call (tokens of a reply, bytes sent): releases the lease
/// and makes the admission's charge `actual` instead of `cost`, in one step. A larger cost
/// charges the excess to every window now (later admissions wait for it); a smaller one
/// gives the difference back if the lease was still held (so a settle sent twice gives
/// back once). The windows never count less than was used. `done: false` if the lease was
/// not held any more (an excess is charged all the same).
#[utoipa::path(
    post,
    path = "/v1/admissions/{name}/leases/{lease_id}/settle",
    tag = "admissions",
    params(("name" = String, Path, description = "Name of the semaphore and of the limiter"), ("lease_id" = String, Path, description = "Lease id (32 hex digits)")),
    request_body = SettleBody,
    responses(
        (status = 200, body = DoneBody),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 501, description = "The store has no admission", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn settle(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, lease)): PathArgs<(String, String)>,
    JsonBody(body): JsonBody<SettleBody>,
) -> Result<Json<DoneBody>, ApiError> {
    let (n, id) = charge_of(
        &principal,
        &sem,
        &lease,
        body.reservation,
        body.admitted_at_us,
    )?;
    let charged = body.cost.unwrap_or(1);
    if charged == 0 || charged > tessera::MAX_RATE_COUNT {
        return Err(tessera::Error::from(tessera::InvalidInput::Cost {
            cost: charged,
            max: tessera::MAX_RATE_COUNT,
        })
        .into());
    }
    if body.actual > tessera::MAX_RATE_COUNT {
        return Err(tessera::Error::from(tessera::InvalidInput::SettleCost {
            actual: body.actual,
            max: tessera::MAX_RATE_COUNT,
        })
        .into());
    }
    let admission = admission_step(&app)?;
    let settlement = tessera::backend::Settlement {
        reservation: body.reservation,
        at: StoreTime(body.admitted_at_us),
        charged,
        actual: body.actual,
    };
    let done = app
        .bounded("the settle", admission.settle(&n, id, &settlement))
        .await??;
    Ok(Json(DoneBody { done }))
}

/// The name and lease id of a give-back or a settle, the caller allowed, its charge checked.
fn charge_of(
    principal: &Principal,
    sem: &str,
    lease: &str,
    reservation: u64,
    admitted_at_us: u64,
) -> Result<(tessera::backend::Name, tessera::LeaseId), ApiError> {
    principal.check(sem)?;
    let (n, id) = (name(sem)?, lease_id(lease)?);
    check_charge(reservation, admitted_at_us)?;
    Ok((n, id))
}

/// The store's admission step; 501 `unsupported` where it has none.
fn admission_step(app: &App) -> Result<&dyn tessera::backend::AdmissionBackend, ApiError> {
    app.store.backend().admission().ok_or_else(|| {
        tessera::Error::Unsupported(format!(
            "admission is not available on {} yet",
            app.store.url()
        ))
        .into()
    })
}

/// A charge's `reservation` and `admitted_at_us` come from an admission's answer, which never
/// holds more than 2^63 - 1.
fn check_charge(reservation: u64, admitted_at_us: u64) -> Result<(), ApiError> {
    for (field, value) in [
        ("reservation", reservation),
        ("admitted_at_us", admitted_at_us),
    ] {
        if value > i64::MAX as u64 {
            return Err(ApiError::invalid(format!(
                "invalid {field} {value}: at most {}",
                i64::MAX
            )));
        }
    }
    Ok(())
}
