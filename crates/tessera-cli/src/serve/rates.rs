//! `/v1/rates`: rate limits. Acquire (reserve the earliest admissible time within
//! `max_wait` and answer when it comes, or 429 at once), try (an answer, never a wait),
//! status, list, delete.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use tessera::{RateDecision, RateLimiter, RateMode, RateOptions, RateSpec};
use utoipa::ToSchema;

use super::auth::Principal;
use super::error::{ApiError, ErrorBody};
use super::extract::{duration, duration_or, JsonBody, PathArgs};
use super::ratelimit;
use super::semaphores::{DoneBody, NamesBody};
use super::App;

/// The longest `max_wait` one request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// A rate request.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RateBody {
    /// The limits, all charged at once: `N/PERIOD` with PERIOD `ms`, `s`, `min`, `h`, `d` or
    /// a duration (`"50/s"`, `"1000/min"`, `"5/250ms"`). Every client of a limiter declares
    /// the same limits (else `rate_mismatch`, unless `update`).
    #[schema(example = json!(["50/s", "1000/min"]))]
    pub limits: Vec<String>,
    /// The request's cost, charged to every limit (1..=the smallest N; default 1).
    #[serde(default)]
    #[schema(example = 1, minimum = 1)]
    pub cost: Option<u32>,
    /// Acquire only: how long the caller is willing to wait (0s..5m; default 0s). The server
    /// reserves the earliest admissible time if it is within `max_wait` and answers at that
    /// time; otherwise it answers 429 at once, reserving nothing.
    #[serde(default)]
    #[schema(example = "2s")]
    pub max_wait: Option<String>,
    /// `exact` (default: at most N in any window of PERIOD) or `smooth` (GCRA pacing).
    #[serde(default)]
    #[schema(example = "exact")]
    pub mode: Option<String>,
    /// Smooth mode: units admitted at once after an idle period (default 1).
    #[serde(default)]
    #[schema(minimum = 1)]
    pub burst: Option<u32>,
    /// Margin between admission and use (0s..1s, at most the shortest period; default 20ms
    /// in exact mode): the limits hold for calls made within it.
    #[serde(default)]
    #[schema(example = "20ms")]
    pub margin: Option<String>,
    /// Replace the limits stored under this name if they differ (default false).
    #[serde(default)]
    pub update: Option<bool>,
}

/// Admitted.
#[derive(Debug, Serialize, ToSchema)]
pub struct AdmittedBody {
    /// Always true here.
    pub admitted: bool,
    /// The admission time on the store's clock (µs since the Unix epoch); it has passed when
    /// the answer arrives: make the call now.
    pub admitted_at_us: u64,
}

/// The answer of a try: admitted, or when to retry.
#[derive(Debug, Serialize, ToSchema)]
pub struct DecisionBody {
    pub admitted: bool,
    /// Admitted: the admission time (store clock, µs since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admitted_at_us: Option<u64>,
    /// Limited: the exact wait, in milliseconds (rounded up), before the request would be
    /// admitted if nobody else came first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
}

/// One limit's usage.
#[derive(Debug, Serialize, ToSchema)]
pub struct LimitBody {
    #[schema(example = "50/s")]
    pub limit: String,
    /// Exact: cost admitted in the current window; smooth: units still draining.
    pub used: u64,
    /// Exact: cost reserved for later times.
    pub reserved: u64,
    /// The earliest time a request of cost 1 would pass this limit (store clock, µs).
    pub next_free_us: u64,
    /// The same, as a wait from the snapshot, in milliseconds.
    pub next_free_in_ms: u64,
}

/// A limiter's snapshot.
#[derive(Debug, Serialize, ToSchema)]
pub struct RateStatusBody {
    pub name: String,
    /// `exact` or `smooth`.
    pub mode: String,
    pub margin_ms: u64,
    pub limits: Vec<LimitBody>,
    /// When a request of cost 1 would next be admitted (store clock, µs).
    pub next_free_us: u64,
    pub next_free_in_ms: u64,
    /// The store's time of the snapshot (µs since the Unix epoch).
    pub now_us: u64,
    /// Admissions of this name given back past their use-by instant, counted by the store
    /// since the limiter's state began (it is forgotten once the limiter is idle for its
    /// longest window plus margin). Absent where the store does not count them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expired_unused: Option<u64>,
}

impl RateStatusBody {
    pub fn from_status(s: tessera::RateStatus) -> RateStatusBody {
        let now = s.now;
        let mode = match s.mode {
            RateMode::Exact => "exact".to_string(),
            RateMode::Smooth { burst } => format!("smooth (burst {burst})"),
            _ => "other".to_string(),
        };
        RateStatusBody {
            name: s.name,
            mode,
            margin_ms: s.margin.as_millis() as u64,
            limits: s
                .limits
                .into_iter()
                .map(|l| LimitBody {
                    limit: l.limit.to_string(),
                    used: l.used,
                    reserved: l.reserved,
                    next_free_us: l.next_free.as_micros(),
                    next_free_in_ms: ceil_ms(l.next_free.since(now)),
                })
                .collect(),
            next_free_us: s.next_free.as_micros(),
            next_free_in_ms: ceil_ms(s.next_free.since(now)),
            now_us: now.as_micros(),
            expired_unused: s.expired_unused,
        }
    }
}

fn ceil_ms(d: Duration) -> u64 {
    d.as_micros().div_ceil(1000) as u64
}

fn limiter(app: &App, name: &str, body: &RateBody) -> Result<(RateLimiter, u32), ApiError> {
    let limits = body
        .limits
        .iter()
        .map(|l| l.parse::<RateSpec>())
        .collect::<Result<Vec<_>, _>>()?;
    let mode = match body.mode.as_deref() {
        None | Some("exact") => {
            if body.burst.is_some() {
                return Err(ApiError::invalid("burst applies to smooth mode only"));
            }
            RateMode::Exact
        }
        Some("smooth") => RateMode::Smooth {
            burst: body.burst.unwrap_or(1),
        },
        Some(other) => {
            return Err(ApiError::invalid(format!(
                "invalid mode {other:?}: exact or smooth"
            )))
        }
    };
    let mut opts = RateOptions::default()
        .mode(mode)
        .update(body.update.unwrap_or(false));
    if let Some(m) = &body.margin {
        opts = opts.margin(duration("margin", m)?);
    }
    let limiter = RateLimiter::new(&app.store, name, &limits, opts)?;
    Ok((limiter, body.cost.unwrap_or(1)))
}

/// Acquire a turn within rate limits.
///
/// Reserves the earliest time every limit allows; if it is within `max_wait` the answer
/// comes at that time (make the call then), otherwise 429 at once with the exact wait in
/// `retry_after_ms` and `Retry-After` (seconds, rounded up), and nothing is charged. A client
/// that disconnects while waiting gives its reservation back if it is still the latest.
#[utoipa::path(
    post,
    path = "/v1/rates/{name}/acquire",
    tag = "rates",
    params(("name" = String, Path, description = "Limiter name")),
    request_body = RateBody,
    responses(
        (status = 200, description = "Admitted; the admission time has passed", body = AdmittedBody),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 409, description = "The stored limits differ", body = ErrorBody),
        (status = 429, description = "Not within max_wait; nothing charged", body = ErrorBody, headers(("Retry-After" = u64, description = "Seconds, rounded up"))),
        (status = 501, description = "The store has no rate limits", body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn acquire(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<RateBody>,
) -> Result<(HeaderMap, Json<AdmittedBody>), ApiError> {
    principal.check(&name)?;
    let max_wait = duration_or("max_wait", body.max_wait.as_deref(), Duration::ZERO)?;
    if max_wait > MAX_WAIT {
        return Err(ApiError::invalid(format!(
            "invalid max_wait {}: at most {} per request",
            humantime::format_duration(max_wait),
            humantime::format_duration(MAX_WAIT)
        )));
    }
    let (limiter, cost) = limiter(&app, &name, &body)?;
    let bound = max_wait + app.request_timeout;
    let what = "the rate acquire";
    let decision = match app
        .bounded_for(what, bound, limiter.acquire_within(cost, max_wait))
        .await
    {
        Ok(r) => r?,
        Err(Some(e)) => return Err(e),
        Err(None) => return Err(ApiError::timeout(what, bound)),
    };
    match decision {
        RateDecision::Admitted { at } => Ok((
            ratelimit::policy(&limiter),
            Json(AdmittedBody {
                admitted: true,
                admitted_at_us: at.as_micros(),
            }),
        )),
        RateDecision::Limited { retry_after, .. } => {
            let fields = ratelimit::fields(&limiter).await;
            Err(limited(&name, retry_after).with_headers(fields))
        }
    }
}

fn limited(name: &str, retry_after: Duration) -> ApiError {
    // Whole milliseconds, rounded up, so a client that waits exactly this is not early.
    let exact = Duration::from_millis(ceil_ms(retry_after));
    ApiError::too_many(
        "limited",
        format!(
            "{name:?} is at its limit; admissible in {}",
            humantime::format_duration(exact)
        ),
        exact,
    )
}

/// Try a request now: admitted (charged) or not (nothing charged, with the wait).
#[utoipa::path(
    post,
    path = "/v1/rates/{name}/try",
    tag = "rates",
    params(("name" = String, Path, description = "Limiter name")),
    request_body = RateBody,
    responses(
        (status = 200, description = "The decision (being limited is an answer, not an error)", body = DecisionBody),
        (status = 400, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 409, body = ErrorBody),
        (status = 501, body = ErrorBody),
        (status = 503, body = ErrorBody),
    ),
    security((), ("bearer" = []))
)]
pub async fn try_acquire(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
    JsonBody(body): JsonBody<RateBody>,
) -> Result<(HeaderMap, Json<DecisionBody>), ApiError> {
    principal.check(&name)?;
    if body.max_wait.is_some() {
        return Err(ApiError::invalid(
            "try never waits: max_wait belongs to /acquire",
        ));
    }
    let (limiter, cost) = limiter(&app, &name, &body)?;
    let decision = app
        .bounded("the rate try", limiter.try_acquire(cost))
        .await??;
    let fields = match decision {
        RateDecision::Admitted { .. } => ratelimit::policy(&limiter),
        RateDecision::Limited { .. } => ratelimit::fields(&limiter).await,
    };
    Ok((
        fields,
        Json(match decision {
            RateDecision::Admitted { at } => DecisionBody {
                admitted: true,
                admitted_at_us: Some(at.as_micros()),
                retry_after_ms: None,
            },
            RateDecision::Limited { retry_after, .. } => DecisionBody {
                admitted: false,
                admitted_at_us: None,
                retry_after_ms: Some(ceil_ms(retry_after)),
            },
        }),
    ))
}

/// A limiter's usage per window and next free time.
#[utoipa::path(
    get,
    path = "/v1/rates/{name}",
    tag = "rates",
    params(("name" = String, Path, description = "Limiter name")),
    responses((status = 200, body = RateStatusBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody), (status = 501, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn status(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Result<Json<RateStatusBody>, ApiError> {
    principal.check(&name)?;
    match app
        .bounded("the rate status", app.store.rate_status(&name))
        .await??
    {
        Some(s) => Ok(Json(RateStatusBody::from_status(s))),
        None => Err(ApiError::not_found(format!(
            "no rate limiter {name:?} (never used, or idle past its longest window)"
        ))),
    }
}

/// The rate limiters the store holds state for (those the token covers).
#[utoipa::path(
    get,
    path = "/v1/rates",
    tag = "rates",
    responses((status = 200, body = NamesBody), (status = 501, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn list(
    State(app): State<Arc<App>>,
    principal: Principal,
) -> Result<Json<NamesBody>, ApiError> {
    let mut names = app.bounded("the list", app.store.rate_list()).await??;
    names.retain(|n| principal.covers(n));
    names.sort();
    Ok(Json(NamesBody { names }))
}

/// Delete a limiter's state (admin): its history and reservations.
#[utoipa::path(
    delete,
    path = "/v1/rates/{name}",
    tag = "rates",
    params(("name" = String, Path, description = "Limiter name")),
    responses((status = 200, body = DoneBody), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 501, body = ErrorBody), (status = 503, body = ErrorBody)),
    security((), ("bearer" = []))
)]
pub async fn delete(
    State(app): State<Arc<App>>,
    principal: Principal,
    PathArgs(name): PathArgs<String>,
) -> Result<Json<DoneBody>, ApiError> {
    principal.check(&name)?;
    let done = app
        .bounded("the delete", app.store.delete_rate_limiter(&name))
        .await??;
    Ok(Json(DoneBody { done }))
}
