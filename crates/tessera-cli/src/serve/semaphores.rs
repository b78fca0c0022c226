//! `/v1/semaphores`: acquire (long-poll, or held by an event stream: `hold.rs`), renew,
//! release, status, list, resize, revoke, delete.
//!
//! # Who keeps a lease alive
//!
//! A lease granted by a plain acquire belongs to the client: the server hands it over
//! ([`tessera::Permit::detach`]) and keeps nothing, so the client renews it (before
//! `expires_in_ms` runs out) and releases it by id, through this server or any other on the
//! same store. A client that dies leaves the lease to expire by its TTL, exactly as a library
//! holder would: once the answer is written, nothing tells the server whether the client
//! read it (a client that leaves while it waits is noticed: its connection closes and the
//! wait is dropped, giving its place back). A lease held through an event stream belongs to the stream: the server keeps
//! it alive while the stream is open and releases it when it closes (`hold.rs`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use tessera::backend::{Name, RenewReply};
use tessera::{LeaseId, Semaphore, SemaphoreOptions};
use utoipa::ToSchema;

use super::auth::Principal;
use super::error::{ApiError, ErrorBody};
use super::extract::{duration_or, JsonBody, PathArgs};
use super::hold::{self, LeaseBody};
use super::App;

/// The default lease TTL.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The longest `wait` one request may ask for; longer waits are a loop of requests.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// An acquire: `weight` permits of a semaphore of `capacity`, as one lease.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// The semaphore's capacity, as every client declares it (1..=1,000,000). A capacity
    /// differing from the stored one is `capacity_mismatch`; changing it is a resize.
    #[schema(example = 4, minimum = 1, maximum = 1_000_000)]
    pub capacity: u32,
    /// Permits to take as one lease (1..=capacity; default 1).
    #[serde(default)]
    #[schema(example = 1, minimum = 1, maximum = 1_000_000)]
    pub weight: Option<u32>,
    /// Lease TTL (100ms..24h; default 30s): how long the lease outlives a client that stops
    /// renewing it.
    #[serde(default)]
    #[schema(example = "30s")]
    pub ttl: Option<String>,
    /// How long to wait in the queue (0s..5m; default 0s: only if a permit is free now and
    /// nobody waits). The answer comes when the permit is granted, or `no_permit` (408) when
    /// the wait runs out; the place in the queue is given up then.
    #[serde(default)]
    #[schema(example = "10s")]
    pub wait: Option<String>,
    /// Holder label shown by status and the dashboard (default `http:ADDRESS:PORT` of the
    /// client).
    #[serde(default)]
    #[schema(example = "billing-worker-3")]
    pub holder: Option<String>,
    /// With `Accept: text/event-stream` and a `wait`: open the stream at once and send a
    /// `waiting` event (`position`, `queued`, `expected_wait_ms`) each time the place or the
    /// expected wait changes, then `grant`; a wait that runs out (or any error) is an `error`
    /// event with the error answer's body, then the end of the stream (default false: the
    /// stream opens with `grant`, and errors are answers).
    #[serde(default)]
    pub waiting_events: bool,
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
    /// With a `wait`: the most waiters this acquire queues behind (1..=1,000,000; default
    /// 10,000). With that many already waiting the answer is `queue_full` (429), with a
    /// `Retry-After` of about the time one place takes to free.
    #[serde(default)]
    #[schema(example = 100, minimum = 1, maximum = 1_000_000)]
    pub queue_cap: Option<u32>,
}

/// A renewal.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The new TTL from now (100ms..24h; default 30s). A renewal never shortens the lease: it
    /// expires at the later of its current expiry and this TTL from now.
    #[serde(default)]
    #[schema(example = "30s")]
    pub ttl: Option<String>,
}

/// The lease after a renewal.
#[derive(Debug, Serialize, ToSchema)]
pub struct RenewedBody {
    pub lease_id: String,
    /// How long the lease is certainly valid from when this answer left, in milliseconds
    /// (as in the acquire's answer: less the round trip and 2% for clock-rate drift).
    pub expires_in_ms: u64,
    /// The expiry on the store's clock (µs since the Unix epoch).
    pub expires_at_us: u64,
}

/// Whether a release, revoke or delete found what it named.
#[derive(Debug, Serialize, ToSchema)]
pub struct DoneBody {
    /// `true` if the lease (or semaphore) was there and is now gone; `false` if it was not
    /// there (already released, expired, revoked or never existed) — nothing changed.
    pub done: bool,
}

/// A resize.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResizeBody {
    /// The new capacity (1..=1,000,000). Growing grants to the queue at once; shrinking
    /// never revokes, it only stops grants until the holders fit.
    #[schema(example = 8, minimum = 1, maximum = 1_000_000)]
    pub capacity: u32,
}

/// The capacity before a resize.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResizedBody {
    pub old_capacity: u32,
    pub capacity: u32,
}

/// A tenant's ceiling and floor on a semaphore (`docs/fair-shares.md`).
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantLimitsBody {
    /// At most this many permits held at once by the tenant (1..=1,000,000); absent or
    /// null: no ceiling.
    #[schema(example = 2, minimum = 1, maximum = 1_000_000)]
    #[serde(default)]
    pub ceiling: Option<u32>,
    /// Permits kept for the tenant while it holds fewer (at most the ceiling); 0: none.
    /// Required, so that an empty body changes nothing. No ceiling and a floor of 0 remove
    /// the tenant's limits.
    #[schema(example = 1)]
    pub floor: u32,
    /// At most this percentage (1..=100) of each rate window of the name's admissions for
    /// the tenant (`docs/fair-shares.md`, "A ceiling on a share of the windows"); absent or
    /// null: none.
    #[schema(example = 20, minimum = 1, maximum = 100)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_ceiling: Option<u8>,
}

/// The tenants' ceilings and floors set on a semaphore, by tenant.
#[derive(Debug, Serialize, ToSchema)]
pub struct TenantLimitsListBody {
    pub tenants: std::collections::BTreeMap<String, TenantLimitsBody>,
}

/// A holder in a status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HolderBody {
    pub lease_id: String,
    pub weight: u32,
    pub seats: Vec<u32>,
    pub fence: u64,
    pub holder: String,
    /// When it was granted (store clock, µs since the Unix epoch).
    pub acquired_at_us: u64,
    /// When it expires unless renewed (store clock, µs since the Unix epoch).
    pub expires_at_us: u64,
    /// Time left, in milliseconds, at the snapshot.
    pub expires_in_ms: u64,
    /// The tenant it was granted to; absent when the request named none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A waiter in a status, in queue order.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct WaiterBody {
    pub lease_id: String,
    pub weight: u32,
    pub holder: String,
    /// When it joined the queue (store clock, µs since the Unix epoch).
    pub enqueued_at_us: u64,
    /// The tenant it asks as; absent when the request named none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// One tenant's part of a semaphore at the snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TenantBody {
    /// The tenant; `""` for requests that named none.
    pub tenant: String,
    /// Leases it holds, and the permits they hold.
    pub holders: u32,
    pub used: u32,
    /// Its queued requests, and the permits they ask for.
    pub waiters: u32,
    pub waiting: u32,
    /// Its ceiling and floor, when set (`PUT …/tenants/{tenant}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceiling: Option<u32>,
    #[serde(skip_serializing_if = "is_zero")]
    pub floor: u32,
    /// Its window ceiling (a percentage of each rate window), when set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window_ceiling: Option<u8>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// A semaphore's snapshot.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StatusBody {
    pub name: String,
    pub capacity: u32,
    /// Permits held by unexpired leases.
    pub used: u32,
    pub available: u32,
    /// The store's time of the snapshot (µs since the Unix epoch).
    pub now_us: u64,
    pub holders: Vec<HolderBody>,
    /// The queue, head first.
    pub queue: Vec<WaiterBody>,
    /// Holders, waiters and permits per tenant (`""`: requests that named none first, then
    /// by name); empty when nobody holds or waits.
    pub tenants: Vec<TenantBody>,
}

/// Names.
#[derive(Debug, Serialize, ToSchema)]
pub struct NamesBody {
    pub names: Vec<String>,
}

impl StatusBody {
    /// The body of `s`, with the tenants' ceilings and floors in `limits`.
    pub fn from_status(
        s: tessera::SemaphoreStatus,
        limits: &std::collections::BTreeMap<String, tessera::TenantLimits>,
    ) -> StatusBody {
        let now = s.now;
        let tenants = s
            .tenants_with(limits)
            .into_iter()
            .map(|t| TenantBody {
                tenant: t.tenant,
                holders: t.holders,
                used: t.used,
                waiters: t.waiters,
                waiting: t.waiting,
                ceiling: t.ceiling,
                floor: t.floor,
                window_ceiling: t.window_ceiling,
            })
            .collect();
        StatusBody {
            name: s.name,
            capacity: s.capacity,
            used: s.used,
            available: s.available,
            now_us: now.as_micros(),
            holders: s
                .holders
                .into_iter()
                .map(|l| HolderBody {
                    lease_id: l.lease_id.to_string(),
                    weight: l.weight,
                    seats: l.seats,
                    fence: l.fence,
                    holder: l.holder,
                    acquired_at_us: l.acquired_at.as_micros(),
                    expires_at_us: l.expires_at.as_micros(),
                    expires_in_ms: l.expires_at.since(now).as_millis() as u64,
                    tenant: l.tenant,
                })
                .collect(),
            queue: s
                .queue
                .into_iter()
                .map(|w| WaiterBody {
                    lease_id: w.lease_id.to_string(),
                    weight: w.weight,
                    holder: w.holder,
                    enqueued_at_us: w.enqueued_at.as_micros(),
                    tenant: w.tenant,
                })
                .collect(),
            tenants,
        }
    }
}

/// Set a tenant's ceiling and floor on a semaphore (admin; `docs/fair-shares.md`): kept for
/// the name until changed or the semaphore is deleted.
#[utoipa::path(
    put,
    path = "/v1/semaphores/{name}/tenants/{tenant}",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("tenant" = String, Path, description = "Tenant (1 to 64 bytes)")),
    request_body = TenantLimitsBody,
    responses((status = 200, body = TenantLimitsListBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, description = "No tenant in the path", body = ErrorBody), (status = 501, description = "The store keeps no tenant limits", body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn set_tenant_limits(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, tenant)): PathArgs<(String, String)>,
    JsonBody(body): JsonBody<TenantLimitsBody>,
) -> Result<Json<TenantLimitsListBody>, ApiError> {
    principal.check(&sem)?;
    let limits = tessera::TenantLimits::new(body.ceiling, body.floor)?
        .with_window_ceiling(body.window_ceiling)?;
    app.bounded(
        "the tenant limits",
        app.store.set_tenant_limits(&sem, &tenant, limits),
    )
    .await??;
    list_tenant_limits(&app, &sem).await
}

/// The tenants' ceilings and floors set on a semaphore.
#[utoipa::path(
    get,
    path = "/v1/semaphores/{name}/tenants",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = TenantLimitsListBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn tenant_limits(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(sem): PathArgs<String>,
) -> Result<Json<TenantLimitsListBody>, ApiError> {
    principal.check(&sem)?;
    list_tenant_limits(&app, &sem).await
}

async fn list_tenant_limits(app: &App, sem: &str) -> Result<Json<TenantLimitsListBody>, ApiError> {
    let kept = app
        .bounded("the tenant limits", app.store.tenant_limits(sem))
        .await??;
    let tenants = kept
        .into_iter()
        .map(|(t, l)| {
            let body = TenantLimitsBody {
                ceiling: l.ceiling,
                floor: l.floor,
                window_ceiling: l.window_ceiling,
            };
            (t, body)
        })
        .collect();
    Ok(Json(TenantLimitsListBody { tenants }))
}

/// What is certainly left of `remaining` on the store's clock, on a clock that may run up to
/// 2% slower (`tessera::Permit::valid_until`'s margin).
fn certain(remaining: Duration) -> Duration {
    remaining - remaining / 50
}

pub(super) fn name(text: &str) -> Result<Name, ApiError> {
    Ok(Name::new(text)?)
}

pub(super) fn lease_id(text: &str) -> Result<LeaseId, ApiError> {
    Ok(text.parse::<LeaseId>()?)
}

/// A request's `wait` (default 0s), at most [`MAX_WAIT`].
pub(super) fn wait_of(text: Option<&str>) -> Result<Duration, ApiError> {
    let wait = duration_or("wait", text, Duration::ZERO)?;
    if wait > MAX_WAIT {
        return Err(ApiError::invalid(format!(
            "invalid wait {}: at most {} per request",
            humantime::format_duration(wait),
            humantime::format_duration(MAX_WAIT)
        )));
    }
    Ok(wait)
}

/// `f` (an acquire that waits up to `wait`), bounded by `wait` plus the request timeout for
/// the store to answer, and ended by the store going down or the server's shutdown.
/// Dropping `f` at any point gives its queue place (or a grant that raced with it) back: the
/// library's acquires are cancel-safe.
pub(super) async fn within_wait<T>(
    app: &App,
    wait: Duration,
    what: &str,
    f: impl std::future::Future<Output = tessera::Result<T>>,
) -> Result<T, ApiError> {
    match app.bounded_for(what, wait + app.request_timeout, f).await {
        Ok(r) => Ok(r?),
        Err(Some(e)) => Err(e),
        Err(None) => Err(ApiError::timeout(what, wait + app.request_timeout)),
    }
}

/// Whether the client asked for an event stream.
pub(super) fn wants_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("text/event-stream"))
}

/// Acquire permits.
///
/// Waits up to `wait` in the semaphore's fair FIFO queue. With `Accept: application/json`
/// (or none) the answer is the lease, which the client renews and releases. With `Accept:
/// text/event-stream` the answer is a stream whose first event `grant` carries the lease; the
/// server keeps the lease alive while the stream is open, sends `lost` if it cannot (before
/// the lease could expire), and releases it as soon as the stream closes.
#[utoipa::path(
    post,
    path = "/v1/semaphores/{name}/acquire",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name: A-Z a-z 0-9 . _ - : / @ (percent-encode /), first character a letter or digit, at most 200 bytes")),
    request_body = AcquireBody,
    responses(
        (status = 200, description = "Granted (JSON), or the event stream holding the lease", content(
            (LeaseBody = "application/json"),
            (String = "text/event-stream", example = "event: grant\ndata: {\"lease_id\":\"...\"}\n\n")
        )),
        (status = 400, description = "Invalid input; nothing changed", body = ErrorBody),
        (status = 403, description = "The token does not cover this name", body = ErrorBody),
        (status = 408, description = "No permit within `wait`; nothing is held or queued", body = ErrorBody),
        (status = 409, description = "The stored capacity differs", body = ErrorBody),
        (status = 429, description = "The queue is full", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds: about the time one place took to free, as this server's waiters measured it (1 to 30; 1 when unknown)"))),
        (status = 503, description = "Store unavailable, or the server is stopping", body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn acquire(
    State(app): State<Arc<App>>,
    principal: Principal,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    PathArgs(sem): PathArgs<String>,
    JsonBody(body): JsonBody<AcquireBody>,
) -> Result<Response, ApiError> {
    principal.check(&sem)?;
    let stream = wants_event_stream(&headers);
    let ttl = duration_or("ttl", body.ttl.as_deref(), DEFAULT_TTL)?;
    let wait = wait_of(body.wait.as_deref())?;
    let holder = body.holder.unwrap_or_else(|| format!("http:{peer}"));
    let opts = with_tenant(
        with_queue_cap(
            SemaphoreOptions::default().ttl(ttl).holder(holder),
            body.queue_cap,
        ),
        body.tenant.as_deref(),
        body.share,
    )?;
    let semaphore = Semaphore::new(&app.store, &sem, body.capacity, opts)?;
    let weight = body.weight.unwrap_or(1);

    // Every store call is bounded: the wait, plus the request timeout for the store to
    // answer. Dropping the acquire at any point gives the place in the queue (or a grant
    // that raced with it) back: the library's acquires are cancel-safe. A wait publishes its
    // place, which an error answer and `waiting` events carry, and the queue's pace is
    // learnt from it (`pace.rs`).
    let (place, places) = tokio::sync::watch::channel(None);
    let acquire = {
        let (app, sem) = (Arc::clone(&app), sem.clone());
        async move {
            let permit = if wait.is_zero() {
                within_wait(
                    &app,
                    wait,
                    "the acquire",
                    semaphore.try_acquire_many(weight),
                )
                .await?
            } else {
                let deadline = tokio::time::Instant::now() + wait;
                let waiting = semaphore.acquire_many_watching(weight, Some(deadline), &place);
                tokio::select! {
                    r = within_wait(&app, wait, "the acquire", waiting) => {
                        r.map_err(|e| app.paces.paced(&sem, e))?
                    }
                    never = app.paces.follow(&sem, place.subscribe()) => match never {},
                }
            };
            permit.ok_or_else(|| no_permit(&sem, weight, wait).with_place(*place.borrow()))
        }
    };
    if stream && body.waiting_events && !wait.is_zero() {
        return Ok(hold::wait_then_hold(app, ttl, places, acquire).into_response());
    }
    let permit = acquire.await?;
    if stream {
        return Ok(hold::hold(app, permit, ttl).into_response());
    }
    Ok(Json(hand_over(&app, &sem, permit, ttl).await?).into_response())
}

/// The 408 of an acquire that got no permit within its wait.
fn no_permit(sem: &str, weight: u32, wait: Duration) -> ApiError {
    let message = if wait.is_zero() {
        format!(
            "no {weight} permit(s) of {sem:?} free now, or others are queued (set wait to queue)"
        )
    } else {
        format!(
            "no {weight} permit(s) of {sem:?} within {}",
            humantime::format_duration(wait)
        )
    };
    ApiError::new(StatusCode::REQUEST_TIMEOUT, "no_permit", message)
}

/// Hands a granted permit to the client that asked for it (see the module docs): the server
/// keeps nothing, and the lease runs its whole TTL from here.
pub(super) async fn hand_over(
    app: &App,
    sem: &str,
    permit: tessera::Permit,
    ttl: Duration,
) -> Result<LeaseBody, ApiError> {
    let mut expires_in = permit
        .valid_until()
        .saturating_duration_since(tokio::time::Instant::now());
    let gone = || {
        ApiError::new(
            StatusCode::GONE,
            "lease_gone",
            "the lease was lost as it was granted",
        )
    };
    let mut lease = permit.detach().ok_or_else(gone)?;
    // A grant handed to this request while it waited in the queue is provisional: it expires
    // with the queue entry unless renewed (`tessera::Permit`). The client gets a lease of its
    // whole TTL, as from any other acquire.
    if expires_in < ttl / 2 {
        let (n, sent) = (name(sem)?, tokio::time::Instant::now());
        let renewal = app.store.backend().renew(&n, lease.lease_id, ttl);
        match app.bounded("the renewal", renewal).await?? {
            RenewReply::Renewed { expires_at, now } => {
                lease.expires_at = expires_at;
                expires_in = certain(expires_at.since(now)).saturating_sub(sent.elapsed());
            }
            RenewReply::Gone => return Err(gone()),
        }
    }
    Ok(LeaseBody::new(sem, &lease, ttl, expires_in))
}

/// Renew a lease.
///
/// Extends the lease to `ttl` from now on the store's clock (never shortening it). `lease_gone` (410) if it
/// expired, was revoked or released: it cannot come back; acquire again.
#[utoipa::path(
    post,
    path = "/v1/semaphores/{name}/leases/{lease_id}/renew",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("lease_id" = String, Path, description = "Lease id (32 hex digits)")),
    request_body(content = RenewBody, description = "Optional; an empty body renews for 30s"),
    responses(
        (status = 200, body = RenewedBody),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 410, description = "The lease is gone", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn renew(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, lease)): PathArgs<(String, String)>,
    JsonBody(body): JsonBody<RenewBody>,
) -> Result<Json<RenewedBody>, ApiError> {
    principal.check(&sem)?;
    let (n, id) = (name(&sem)?, lease_id(&lease)?);
    let ttl = duration_or("ttl", body.ttl.as_deref(), DEFAULT_TTL)?;
    check_ttl(&app, ttl)?;
    let sent = tokio::time::Instant::now();
    match app
        .bounded("the renewal", app.store.backend().renew(&n, id, ttl))
        .await??
    {
        RenewReply::Renewed { expires_at, now } => Ok(Json(RenewedBody {
            lease_id: id.to_string(),
            expires_in_ms: certain(expires_at.since(now))
                .saturating_sub(sent.elapsed())
                .as_millis() as u64,
            expires_at_us: expires_at.as_micros(),
        })),
        RenewReply::Gone => Err(ApiError::new(
            StatusCode::GONE,
            "lease_gone",
            format!("lease {id} of {sem:?} is gone (expired, revoked or released); acquire again"),
        )),
    }
}

/// A renewal's TTL must be one an acquire could have asked for.
fn check_ttl(app: &App, ttl: Duration) -> Result<(), ApiError> {
    let min = app
        .store
        .backend()
        .capabilities()
        .min_ttl
        .max(tessera::MIN_TTL);
    if ttl < min || ttl > tessera::MAX_TTL {
        return Err(tessera::InvalidInput::Ttl {
            ttl,
            min,
            max: tessera::MAX_TTL,
        }
        .into());
    }
    Ok(())
}

/// Release a lease (idempotent).
///
/// `done: false` if it was not held any more (released, expired, revoked): releasing twice
/// is harmless.
#[utoipa::path(
    delete,
    path = "/v1/semaphores/{name}/leases/{lease_id}",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("lease_id" = String, Path, description = "Lease id (32 hex digits)")),
    responses((status = 200, body = DoneBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn release(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, lease)): PathArgs<(String, String)>,
) -> Result<Json<DoneBody>, ApiError> {
    principal.check(&sem)?;
    let (n, id) = (name(&sem)?, lease_id(&lease)?);
    let done = app
        .bounded("the release", app.store.backend().release(&n, id))
        .await??;
    Ok(Json(DoneBody { done }))
}

/// Revoke another holder's lease (admin).
///
/// The holder learns it at its next renewal (`lease_gone`), or at once through its event
/// stream (`lost`).
#[utoipa::path(
    post,
    path = "/v1/semaphores/{name}/leases/{lease_id}/revoke",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name"), ("lease_id" = String, Path, description = "Lease id (32 hex digits)")),
    responses((status = 200, body = DoneBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn revoke(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs((sem, lease)): PathArgs<(String, String)>,
) -> Result<Json<DoneBody>, ApiError> {
    principal.check(&sem)?;
    let (n, id) = (name(&sem)?, lease_id(&lease)?);
    let done = app
        .bounded("the revoke", app.store.backend().revoke(&n, id))
        .await??;
    Ok(Json(DoneBody { done }))
}

/// A semaphore's holders and queue.
#[utoipa::path(
    get,
    path = "/v1/semaphores/{name}",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = StatusBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, description = "The store holds nothing for this name", body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn status(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(sem): PathArgs<String>,
) -> Result<Json<StatusBody>, ApiError> {
    principal.check(&sem)?;
    let n = name(&sem)?;
    match app
        .bounded("the status", app.store.backend().status(&n))
        .await??
    {
        Some(s) => {
            let limits = app
                .bounded("the tenant limits", app.store.backend().tenant_limits(&n))
                .await??;
            Ok(Json(StatusBody::from_status(s, &limits)))
        }
        None => Err(ApiError::not_found(format!(
            "no semaphore {sem:?} (nobody holds or waits for it)"
        ))),
    }
}

/// The semaphores that have holders or waiters (those the token covers).
#[utoipa::path(
    get,
    path = "/v1/semaphores",
    tag = "semaphores",
    responses((status = 200, body = NamesBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn list(
    State(app): State<Arc<App>>,
    principal: Principal,
) -> Result<Json<NamesBody>, ApiError> {
    let mut names = app.bounded("the list", app.store.list()).await??;
    names.retain(|n| principal.covers(n));
    names.sort();
    Ok(Json(NamesBody { names }))
}

/// Change a semaphore's capacity (admin).
#[utoipa::path(
    put,
    path = "/v1/semaphores/{name}/capacity",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    request_body = ResizeBody,
    responses((status = 200, body = ResizedBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn resize(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(sem): PathArgs<String>,
    JsonBody(body): JsonBody<ResizeBody>,
) -> Result<Json<ResizedBody>, ApiError> {
    principal.check(&sem)?;
    let old = app
        .bounded("the resize", app.store.resize(&sem, body.capacity))
        .await??;
    Ok(Json(ResizedBody {
        old_capacity: old,
        capacity: body.capacity,
    }))
}

/// Delete a semaphore with its holders and waiters (admin).
#[utoipa::path(
    delete,
    path = "/v1/semaphores/{name}",
    tag = "semaphores",
    params(("name" = String, Path, description = "Semaphore name")),
    responses((status = 200, body = DoneBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn delete(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(sem): PathArgs<String>,
) -> Result<Json<DoneBody>, ApiError> {
    principal.check(&sem)?;
    let done = app.bounded("the delete", app.store.delete(&sem)).await??;
    Ok(Json(DoneBody { done }))
}

/// `opts` with the request's queue cap, if it names one (checked by `Semaphore::new`).
pub(super) fn with_queue_cap(opts: SemaphoreOptions, cap: Option<u32>) -> SemaphoreOptions {
    match cap {
        Some(cap) => opts.queue_cap(cap),
        None => opts,
    }
}

/// `opts` with the request's tenant and share (`docs/fair-shares.md`); a share without a
/// tenant is refused.
pub(super) fn with_tenant(
    opts: SemaphoreOptions,
    tenant: Option<&str>,
    share: Option<u32>,
) -> Result<SemaphoreOptions, ApiError> {
    match (tenant, share) {
        (None, None) => Ok(opts),
        (None, Some(_)) => Err(ApiError::invalid("share: only with a tenant")),
        (Some(t), share) => {
            Ok(opts
                .tenant(tessera::Tenant::new(t, share.unwrap_or(1)).map_err(tessera::Error::from)?))
        }
    }
}
