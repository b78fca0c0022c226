//! The one error shape of the HTTP API: `{"kind": "...", "message": "..."}` with a status
//! code, mapped from the library's typed errors. Every rejection the framework makes (a body
//! that is not JSON, too large, a path that does not parse, an unknown route) takes the same
//! shape, so a client needs one parser.
//!
//! | kind | status | when |
//! |---|---|---|
//! | `invalid_input` | 400 | a malformed body, name, lease id, duration, rate limit, weight, capacity, cost… nothing changed |
//! | `unauthorized` | 401 | no bearer token, or an unknown one (with `--tokens`) |
//! | `forbidden` | 403 | the token does not cover this name |
//! | `not_found` | 404 | no such semaphore, limiter, route |
//! | `method_not_allowed` | 405 | the route exists, not with this method |
//! | `no_permit` | 408 | no permit came within `wait` (or none was free, with no `wait`) |
//! | `capacity_mismatch`, `rate_mismatch` | 409 | the stored capacity or limits differ; resize, or send `"update": true` |
//! | `lease_gone` | 410 | the lease expired, was revoked or released: renew cannot bring it back |
//! | `payload_too_large` | 413 | the body is above the server's limit |
//! | `uri_too_long` | 414 | the URI (path and query) is over 8 KiB; over 64 KiB hyper refuses it first, with an empty 414 |
//! | `unsupported_media_type` | 415 | a body without `Content-Type: application/json` |
//! | `queue_full`, `limited` | 429 | with `Retry-After` (seconds, rounded up) and `retry_after_ms`: for `queue_full` the time one place took to free (`pace.rs`) |
//! | `store_unavailable` | 503 | the store failed or did not answer within the request timeout |
//! | `shutting_down` | 503 | the server is stopping |
//! | `unsupported` | 501 | the store lacks the operation (rate limits) |
//! | `corrupt` | 500 | the store holds data tessera did not write |
//! | `internal` | 500 | a bug (a handler panicked); never expected |

use std::time::Duration;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

/// The kind of a 429 for a queue at its cap.
pub const QUEUE_FULL: &str = "queue_full";

/// The body of every error answer.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable class (listed with its status in the API's description).
    #[schema(example = "invalid_input")]
    pub kind: &'static str,
    /// One line for a human; never contains a password or a token.
    #[schema(example = "invalid weight 0: must be between 1 and the capacity 4")]
    pub message: String,
    /// For `queue_full` and `limited`: how long to wait before trying again, in milliseconds
    /// (exact; the `Retry-After` header rounds it up to whole seconds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_ms: Option<u64>,
    /// For `no_permit` and `not_admitted` after a wait: the place in the queue when the wait
    /// ran out (0: the head); absent if it was never read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// With `position`: the expected wait that was left then, in milliseconds; absent while
    /// unknown (see `waiting` events).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_wait_ms: Option<u64>,
}

/// An error answer: a status, a kind, a message, and for 429 a retry-after.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub retry_after: Option<Duration>,
    /// More header fields of the answer (see [`ApiError::with_headers`]); boxed, as most
    /// errors have none.
    pub headers: Option<Box<HeaderMap>>,
    /// Where a wait stood when it ran out (see [`ApiError::with_place`]).
    pub place: Option<tessera::QueuePlace>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            message: message.into(),
            retry_after: None,
            headers: None,
            place: None,
        }
    }

    /// Adds where the wait stood when it ran out (`position`, `expected_wait_ms`).
    pub fn with_place(mut self, place: Option<tessera::QueuePlace>) -> Self {
        self.place = place;
        self
    }

    /// The body of the answer (also an event stream's `error` event).
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            kind: self.kind,
            message: self.message.clone(),
            retry_after_ms: self.retry_after.map(|d| d.as_millis() as u64),
            position: self.place.map(|p| p.position),
            expected_wait_ms: self
                .place
                .and_then(|p| p.expected_wait)
                .map(|d| d.as_millis() as u64),
        }
    }

    /// Adds `headers` to the answer (the `RateLimit` fields of a rate decision).
    pub fn with_headers(mut self, headers: HeaderMap) -> Self {
        self.headers.get_or_insert_default().extend(headers);
        self
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_input", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub fn timeout(what: &str, after: Duration) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!(
                "the store did not answer {what} within {}",
                humantime::format_duration(after)
            ),
        )
    }

    /// The store is taken as down (`health.rs`): 503 with `Retry-After`, at once.
    pub fn store_down(what: &str, why: &str) -> Self {
        ApiError {
            retry_after: Some(Duration::from_secs(1)),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                format!(
                    "{what} cannot reach the store: {why}; try another instance or again shortly"
                ),
            )
        }
    }

    pub fn shutting_down() -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "the server is shutting down; try another instance or again shortly",
        )
    }

    pub fn too_many(kind: &'static str, message: impl Into<String>, after: Duration) -> Self {
        ApiError {
            retry_after: Some(after),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, kind, message)
        }
    }
}

impl From<tessera::Error> for ApiError {
    fn from(e: tessera::Error) -> Self {
        use tessera::Error as E;
        let message = e.to_string();
        match &e {
            E::InvalidInput(_) => ApiError::invalid(message),
            E::CapacityMismatch { .. } => {
                ApiError::new(StatusCode::CONFLICT, "capacity_mismatch", message)
            }
            // The library names its API (`RateOptions::update`); here the body field does it.
            E::RateMismatch {
                name,
                stored,
                declared,
            } => ApiError::new(
                StatusCode::CONFLICT,
                "rate_mismatch",
                crate::exit::rate_mismatch(
                    name,
                    stored,
                    declared,
                    "this request",
                    "send \"update\": true",
                ),
            ),
            // One second until the handler knows the queue's pace (`pace.rs`).
            E::QueueFull { .. } => ApiError::too_many(QUEUE_FULL, message, Duration::from_secs(1)),
            E::NotFound(_) => ApiError::not_found(message),
            E::Lost(_) => ApiError::new(StatusCode::GONE, "lease_gone", message),
            E::Unsupported(_) => ApiError::new(StatusCode::NOT_IMPLEMENTED, "unsupported", message),
            E::Corrupt(_) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "corrupt", message),
            // Store faults, and anything a newer library adds: the store is the cause.
            _ => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "store_unavailable",
                message,
            ),
        }
    }
}

impl From<tessera::InvalidInput> for ApiError {
    fn from(e: tessera::InvalidInput) -> Self {
        ApiError::invalid(e.to_string())
    }
}

impl From<JsonRejection> for ApiError {
    fn from(r: JsonRejection) -> Self {
        match r {
            JsonRejection::MissingJsonContentType(_) => ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "the body must be JSON (Content-Type: application/json)",
            ),
            JsonRejection::BytesRejection(b) if b.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the body is larger than the server accepts",
                )
            }
            other => ApiError::invalid(format!("invalid body: {}", other.body_text())),
        }
    }
}

impl From<PathRejection> for ApiError {
    fn from(r: PathRejection) -> Self {
        ApiError::invalid(format!("invalid path: {}", r.body_text()))
    }
}

impl From<QueryRejection> for ApiError {
    fn from(r: QueryRejection) -> Self {
        ApiError::invalid(format!("invalid query: {}", r.body_text()))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = self.body();
        let mut response = (self.status, Json(body)).into_response();
        if let Some(headers) = self.headers {
            response.headers_mut().extend(*headers);
        }
        if let Some(after) = self.retry_after {
            let secs = after.as_secs() + u64::from(after.subsec_nanos() > 0);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

/// Unknown routes.
pub async fn no_route() -> ApiError {
    ApiError::not_found("no such route (the API is under /v1; see /v1/openapi.json)")
}

/// A known route with another method.
pub async fn wrong_method() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method (see /v1/openapi.json)",
    )
}
