//! Bearer tokens, each limited to a name prefix (`--tokens FILE`).
//!
//! The file holds one token per line, then whitespace, then the prefix of the names it may
//! touch (`*` for every name); blank lines and lines starting with `#` are skipped:
//!
//! ```text
//! # token                              names
//! 3f1c0e4c9a7b4d2e8f6a5b4c3d2e1f00     sms-
//! 9a8b7c6d5e4f30211203948576abcdef     *
//! ```
//!
//! A request names its token as `Authorization: Bearer TOKEN`. The dashboard page and its
//! event stream (which a browser opens without headers) also take `?access_token=TOKEN`.
//! Lists (of semaphores, limiters, the dashboard) show only the names the token covers;
//! `/metrics` needs a token for every name (`*`). Tokens are compared in constant time and
//! never printed.

use std::path::Path;

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::App;
use std::sync::Arc;

/// The tokens of `--tokens FILE`.
#[derive(Clone)]
pub struct Tokens {
    entries: Vec<(String, Prefix)>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} tokens)", self.entries.len())
    }
}

/// The names a request may touch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prefix {
    /// Every name.
    All,
    /// Names starting with this.
    Starting(String),
}

/// Who is asking: the names the request's token covers (every name without `--tokens`).
#[derive(Debug, Clone)]
pub struct Principal(pub Prefix);

impl Principal {
    /// Whether the token covers `name`.
    pub fn covers(&self, name: &str) -> bool {
        match &self.0 {
            Prefix::All => true,
            Prefix::Starting(p) => name.starts_with(p.as_str()),
        }
    }

    /// `Ok` if the token covers `name`, else a `forbidden` answer.
    pub fn check(&self, name: &str) -> Result<(), ApiError> {
        if self.covers(name) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!("this token does not cover the name {name:?}"),
        ))
    }

    /// `Ok` if the token covers every name.
    pub fn check_all(&self) -> Result<(), ApiError> {
        match self.0 {
            Prefix::All => Ok(()),
            Prefix::Starting(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "this needs a token for every name (*)",
            )),
        }
    }
}

impl Tokens {
    /// Reads a tokens file. Errors name the line, never the token.
    pub fn load(path: &Path) -> Result<Tokens, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tokens file {}: {e}", path.display()))?;
        Tokens::parse(&text).map_err(|e| format!("tokens file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Tokens, String> {
        let mut entries = Vec::new();
        let mut lines = std::collections::HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(token), Some(prefix), None) = (words.next(), words.next(), words.next())
            else {
                return Err(format!(
                    "line {}: expected a token and a name prefix (or *), separated by whitespace",
                    i + 1
                ));
            };
            if token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "line {}: a token must be at least 16 printable characters",
                    i + 1
                ));
            }
            if let Some(first) = lines.insert(token, i + 1) {
                return Err(format!(
                    "line {}: the token of line {first} again; give each token one line (one prefix)",
                    i + 1
                ));
            }
            let prefix = if prefix == "*" {
                Prefix::All
            } else {
                Prefix::Starting(prefix.to_string())
            };
            entries.push((token.to_string(), prefix));
        }
        if entries.is_empty() {
            return Err("no tokens in the file".to_string());
        }
        Ok(Tokens { entries })
    }

    /// The prefix of `token`, if it is one of ours.
    fn find(&self, token: &str) -> Option<&Prefix> {
        // Every entry is compared, each in constant time, so the timing tells nothing.
        let mut found = None;
        for (t, prefix) in &self.entries {
            if constant_time_eq(t.as_bytes(), token.as_bytes()) {
                found = Some(prefix);
            }
        }
        found
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of a request: the `Authorization: Bearer` header, else (for the dashboard) the
/// `access_token` query parameter.
fn token_of(req: &Request) -> Option<String> {
    if let Some(v) = req.headers().get(header::AUTHORIZATION) {
        let v = v.to_str().ok()?;
        let (scheme, token) = v.split_once(' ')?;
        return scheme
            .eq_ignore_ascii_case("bearer")
            .then(|| token.trim().to_string());
    }
    let query = req.uri().query()?;
    query.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "access_token").then(|| v.to_string())
    })
}

/// Middleware: finds the request's [`Principal`] (refusing unknown tokens) and stores it in
/// the request's extensions for the handlers.
pub async fn authenticate(State(app): State<Arc<App>>, mut req: Request, next: Next) -> Response {
    let principal = match &app.tokens {
        None => Principal(Prefix::All),
        Some(tokens) => match token_of(&req).as_deref().and_then(|t| tokens.find(t)) {
            Some(prefix) => Principal(prefix.clone()),
            None => {
                return ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "a valid bearer token is required (Authorization: Bearer TOKEN)",
                )
                .into_response()
            }
        },
    };
    req.extensions_mut().insert(principal);
    next.run(req).await
}

impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        parts.extensions.get::<Principal>().cloned().ok_or_else(|| {
            ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "no credentials were checked for this request",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_covers_only_its_prefix() {
        let t = Tokens::parse("# c\n\naaaaaaaaaaaaaaaa sms-\nbbbbbbbbbbbbbbbb *\n").unwrap();
        assert_eq!(
            t.find("aaaaaaaaaaaaaaaa"),
            Some(&Prefix::Starting("sms-".into()))
        );
        assert_eq!(t.find("bbbbbbbbbbbbbbbb"), Some(&Prefix::All));
        assert_eq!(t.find("cccccccccccccccc"), None);
        let p = Principal(Prefix::Starting("sms-".into()));
        assert!(p.covers("sms-api") && !p.covers("gpus"));
    }

    #[test]
    fn a_malformed_tokens_file_names_the_line_not_the_token() {
        let e = Tokens::parse("short sms-\n").unwrap_err();
        assert!(e.contains("line 1") && !e.contains("short"), "{e}");
        let e = Tokens::parse("aaaaaaaaaaaaaaaa\n").unwrap_err();
        assert!(e.contains("line 1") && !e.contains("aaaa"), "{e}");
        assert!(Tokens::parse("# only a comment\n").is_err());
        // A token given twice would keep only one prefix, silently.
        let e = Tokens::parse("aaaaaaaaaaaaaaaa a-\n# b\naaaaaaaaaaaaaaaa b-\n").unwrap_err();
        assert!(
            e.contains("line 3") && e.contains("line 1") && !e.contains("aaaa"),
            "{e}"
        );
    }
}
