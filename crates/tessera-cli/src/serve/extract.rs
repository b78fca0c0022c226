//! Request extractors that reject in the API's one error shape ([`ApiError`]), and the parsing
//! of the API's duration strings.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// A JSON body, sent with `Content-Type: application/json` (or another JSON type,
/// `application/*+json`, parameters such as `charset` allowed). Any other content type, or a
/// body without one, is refused with 415 `unsupported_media_type` before the body is read:
/// the types a web page may send to another origin without the browser asking it first
/// (`text/plain`, forms) thus never reach the store. An empty body with no content type
/// (`curl -X POST URL`) reads as `{}`, so requests whose fields all have defaults may send
/// none; whitespace alone is refused like any other non-object. Every body of the API is an
/// object: anything else (an array, which serde would read as the struct's fields in order,
/// or a bare value) is refused before it can reach the store.
pub struct JsonBody<T>(pub T);

/// Whether `content_type` names JSON: `application/json` or `application/*+json`, with any
/// parameters.
fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || essence
            .strip_prefix("application/")
            .is_some_and(|sub| sub.ends_with("+json"))
}

/// The 415 answer; `sent` is what the request declared, if anything.
fn not_json(sent: Option<&str>) -> ApiError {
    let what = match sent {
        // Echo a short, printable header only.
        Some(t) if t.len() <= 100 && t.chars().all(|c| c.is_ascii_graphic() || c == ' ') => {
            format!("Content-Type {t:?}")
        }
        Some(_) => "another Content-Type".to_string(),
        None => "no Content-Type".to_string(),
    };
    ApiError::new(
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "unsupported_media_type",
        format!(
            "the body must be JSON sent with Content-Type: application/json; this request sent \
             {what} (curl: -H 'Content-Type: application/json')"
        ),
    )
}

impl<S, T> FromRequest<S> for JsonBody<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let typed = match req.headers().get(header::CONTENT_TYPE) {
            None => false,
            Some(v) => match v.to_str() {
                Ok(t) if is_json(t) => true,
                Ok(t) => return Err(not_json(Some(t))),
                // Not text: not echoed (see `not_json`).
                Err(_) => return Err(not_json(Some("\u{fffd}"))),
            },
        };
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
        if !typed && !bytes.is_empty() {
            return Err(not_json(None));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_content_types_are_told_from_others() {
        for t in [
            "application/json",
            "Application/JSON",
            "application/json; charset=utf-8",
            "application/merge-patch+json",
        ] {
            assert!(is_json(t), "{t}");
        }
        for t in [
            "text/plain",
            "text/json",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
            "application/jsonx",
            "",
        ] {
            assert!(!is_json(t), "{t}");
        }
    }
}
