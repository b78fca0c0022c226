//! Request extractors that reject in the API's one error shape ([`ApiError`]), and the parsing
//! of the API's duration strings.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body. Any content type is taken (so `curl -d '{...}'` works); an empty body (no
/// bytes; whitespace alone is refused like any other non-object) reads as `{}`, so requests whose fields all have defaults may send none. Every body of the API
/// is an object: anything else (an array, which serde would read as the struct's fields in
/// order, or a bare value) is refused before it can reach the store.
pub struct JsonBody<T>(pub T);

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    "the body is larger than the server accepts",
                )
            } else {
                ApiError::invalid(format!("could not read the body: {}", r.body_text()))
            }
        })?;
        // Only a body of no bytes at all is "no body": whitespace alone is not JSON.
        let text: &[u8] = if bytes.is_empty() { b"{}" } else { &bytes };
        if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(ApiError::invalid("invalid JSON body: expected an object"));
        }
        serde_json::from_slice(text)
            .map(JsonBody)
            .map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
    }
}

/// Path parameters.
pub struct PathArgs<T>(pub T);

impl<S, T> FromRequestParts<S> for PathArgs<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(t)| PathArgs(t))
            .map_err(ApiError::from)
    }
}

/// A duration field: `"30s"`, `"500ms"`, `"1m 30s"` (humantime).
pub fn duration(field: &str, text: &str) -> Result<Duration, ApiError> {
    humantime::parse_duration(text.trim()).map_err(|e| {
        ApiError::invalid(format!(
            "invalid {field} {text:?}: {e} (write e.g. \"30s\", \"500ms\", \"2m\")"
        ))
    })
}

/// An optional duration field with a default.
pub fn duration_or(
    field: &str,
    text: Option<&str>,
    default: Duration,
) -> Result<Duration, ApiError> {
    match text {
        Some(t) => duration(field, t),
        None => Ok(default),
    }
}
