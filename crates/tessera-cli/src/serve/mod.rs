//! `tessera serve`: the semaphores and rate limits of one store for programs in any language,
//! over HTTP/JSON, with Prometheus metrics and a live dashboard.
//!
//! One file per concern: `semaphores.rs` and `rates.rs` (the `/v1` handlers and their types),
//! `hold.rs` (a lease held by an open event stream), `error.rs` (the one error shape),
//! `extract.rs` (request parsing), `auth.rs` (bearer tokens per name prefix), `listen.rs`
//! (TCP/TLS, HTTP/1.1 and HTTP/2, graceful stop), `metrics.rs` (`/metrics`), `dashboard.rs`
//! (`/`), `pace.rs` (the `Retry-After` of a full queue). The OpenAPI document (`/v1/openapi.json`) is generated from the handlers'
//! annotations and types, so it cannot drift from them.
//!
//! # Stopping
//!
//! On SIGTERM or SIGINT the server stops accepting, answers waiting acquires with
//! `shutting_down`, ends every event stream with a `lost` event after releasing its lease,
//! lets the requests in flight finish (up to 10 s), then closes the store (which releases
//! anything still held through it). Leases handed to clients by a plain acquire are theirs,
//! not the server's: they stay held, and the clients renew and release them through any
//! server on the same store.

mod admissions;
mod auth;
mod dashboard;
mod error;
mod extract;
mod health;
mod hold;
mod listen;
mod metrics;
mod pace;
mod ratelimit;
mod rates;
mod semaphores;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::Router;
use tessera::Store;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::exit::{self, Failure};
use error::ApiError;

/// The largest request body taken (bodies are small JSON objects).
const BODY_LIMIT: usize = 64 * 1024;
/// Longest request URI (path and query) answered, in bytes: far above any route's (a name is
/// at most 128 bytes, a lease id 32), and below hyper's own limit (64 KiB), which refuses
/// with an empty 414 before the application sees the request.
const URI_LIMIT: usize = 8 * 1024;
/// How long requests in flight get to finish at a stop.
const DRAIN: Duration = Duration::from_secs(10);

/// What `tessera serve` was asked to do.
#[derive(Debug)]
pub struct ServeArgs {
    pub listen: SocketAddr,
    pub tokens: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub request_timeout: Duration,
    pub store_timeout: Duration,
}

/// What every handler shares.
pub struct App {
    pub store: Store,
    pub tokens: Option<auth::Tokens>,
    /// Cancelled when the server starts stopping.
    pub shutdown: CancellationToken,
    /// The tasks holding leases for event streams.
    pub holds: TaskTracker,
    /// How long a store call may take before the request fails with `store_unavailable`.
    pub request_timeout: Duration,
    /// Whether the store answers (`health.rs`).
    pub health: Arc<health::Health>,
    /// The pace of each queue, as this server's waiters measured it (`pace.rs`).
    pub paces: pace::Paces,
    pub prometheus: Option<metrics_exporter_prometheus::PrometheusHandle>,
}

impl App {
    /// Runs one store call bounded by the request timeout, the store going down (at once if
    /// it is down) and the stop.
    pub async fn bounded<T>(
        &self,
        what: &str,
        f: impl Future<Output = tessera::Result<T>>,
    ) -> Result<tessera::Result<T>, ApiError> {
        self.bounded_for(what, self.request_timeout, f)
            .await
            .map_err(|e| e.unwrap_or_else(|| ApiError::timeout(what, self.request_timeout)))
    }

    /// `f` bounded by `limit`, the store going down and the stop: `Err(None)` when `limit`
    /// passed, `Err(Some(answer))` for the other two.
    pub async fn bounded_for<T>(
        &self,
        what: &str,
        limit: Duration,
        f: impl Future<Output = T>,
    ) -> Result<T, Option<ApiError>> {
        if let Some(why) = self.health.down() {
            return Err(Some(ApiError::store_down(what, &why)));
        }
        tokio::select! {
            r = tokio::time::timeout(limit, f) => r.map_err(|_| None),
            why = self.health.gone_down() => Err(Some(ApiError::store_down(what, &why))),
            _ = self.shutdown.cancelled() => Err(Some(ApiError::shutting_down())),
        }
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "tessera",
        description = "Distributed semaphores and rate limits over HTTP. Errors are one JSON shape, `{\"kind\", \"message\"}` (see `ErrorBody`); 429 answers carry `Retry-After`. With `--tokens`, send `Authorization: Bearer TOKEN`; each token covers a name prefix.\n\nError kinds: `invalid_input` 400 (nothing changed), `unauthorized` 401, `forbidden` 403 (the token does not cover the name), `not_found` 404 (semaphore, limiter or route), `method_not_allowed` 405, `no_permit` and `not_admitted` 408, `capacity_mismatch` and `rate_mismatch` 409, `lease_gone` 410, `payload_too_large` 413, `uri_too_long` 414, `unsupported_media_type` 415, `queue_full` and `limited` 429 (with `Retry-After` and `retry_after_ms`), `corrupt` and `internal` 500, `unsupported` 501, `store_unavailable` and `shutting_down` 503. A connection idle for 10 s between requests is closed.",
    ),
    modifiers(&BearerAuth),
    tags(
        (name = "semaphores", description = "Leases on permits: acquire, renew, release, status; admin: resize, revoke, delete"),
        (name = "rates", description = "Rate limits: acquire (waits up to max_wait), try, status, delete"),
        (name = "admissions", description = "Permits and rate windows in one step: acquire (the lease is a semaphore lease: renew and release it there), give back one not used in time, settle what a call cost"),
    )
)]
struct ApiDoc;

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The `/v1` API with its OpenAPI document.
fn api() -> (Router<Arc<App>>, utoipa::openapi::OpenApi) {
    let (router, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(semaphores::acquire))
        .routes(routes!(semaphores::renew))
        .routes(routes!(semaphores::release))
        .routes(routes!(semaphores::revoke))
        .routes(routes!(semaphores::status, semaphores::delete))
        .routes(routes!(semaphores::list))
        .routes(routes!(semaphores::resize))
        .routes(routes!(semaphores::set_tenant_limits))
        .routes(routes!(semaphores::tenant_limits))
        .routes(routes!(rates::acquire))
        .routes(routes!(rates::try_acquire))
        .routes(routes!(rates::status, rates::delete))
        .routes(routes!(rates::list))
        .routes(routes!(admissions::acquire))
        .routes(routes!(admissions::give_back))
        .routes(routes!(admissions::settle))
        .split_for_parts();
    (router, with_common_errors(doc))
}

/// Adds to every operation of `doc` the answers the server's layers give before a handler
/// runs, in the one error shape: 401 where the operation takes a bearer token (any operation
/// of a server started with `--tokens`), 413 and 415 where it takes a body (above
/// [`BODY_LIMIT`], or not sent as JSON), and 414 everywhere (a URI above [`URI_LIMIT`]). (A 405 belongs to a path and a method the document does
/// not list, so no operation can name it; the error table in the description does.)
fn with_common_errors(mut doc: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::openapi::{ContentBuilder, Ref, ResponseBuilder};
    let error = |what: &str| {
        ResponseBuilder::new()
            .description(what)
            .content(
                "application/json",
                ContentBuilder::new()
                    .schema(Some(Ref::from_schema_name("ErrorBody")))
                    .build(),
            )
            .build()
    };
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in operations.into_iter().flatten() {
            let answers = &mut op.responses.responses;
            answers.entry("414".into()).or_insert_with(|| {
                let what = format!(
                    "`uri_too_long`: the URI (path and query) is above {} KiB",
                    URI_LIMIT / 1024
                );
                error(&what).into()
            });
            if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                answers.entry("401".into()).or_insert_with(|| {
                    error("`unauthorized`: with `--tokens`, no bearer token or an unknown one")
                        .into()
                });
            }
            if op.request_body.is_some() {
                answers.entry("413".into()).or_insert_with(|| {
                    let what = format!(
                        "`payload_too_large`: the body is above {} KiB",
                        BODY_LIMIT / 1024
                    );
                    error(&what).into()
                });
                answers.entry("415".into()).or_insert_with(|| {
                    error(
                        "`unsupported_media_type`: a body without `Content-Type: \
                         application/json` (or another JSON type)",
                    )
                    .into()
                });
            }
        }
    }
    doc
}

/// The OpenAPI document, as served at `/v1/openapi.json`.
pub fn openapi_json() -> String {
    api().1.to_pretty_json().unwrap_or_default()
}

/// `/healthz`: 200 `ok` while the store answers the server's probe, 503 with the reason
/// while it does not (`health.rs`), so a load balancer routes around this instance.
async fn health_answer(
    axum::extract::State(app): axum::extract::State<Arc<App>>,
) -> axum::response::Response {
    match app.health.down() {
        None => "ok\n".into_response(),
        Some(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "1")],
            format!("store down: {why}\n"),
        )
            .into_response(),
    }
}

/// Answers 414 `uri_too_long` (the usual error body, saying the limit) to a request whose URI
/// is over [`URI_LIMIT`], before any route, token check or store call.
async fn uri_limit(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > URI_LIMIT {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            "uri_too_long",
            format!(
                "the request URI is {len} bytes; the limit is {URI_LIMIT} (a name is at most {} bytes)",
                tessera::MAX_NAME_LEN
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// The whole application.
fn router(app: Arc<App>) -> Router {
    let (api, doc) = api();
    let doc = Arc::new(doc.to_pretty_json().unwrap_or_default());
    let authenticated = api
        .merge(dashboard::routes())
        .merge(metrics::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&app),
            auth::authenticate,
        ));
    Router::new()
        .route(
            "/v1/openapi.json",
            axum::routing::get(move || {
                let doc = Arc::clone(&doc);
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        (*doc).clone(),
                    )
                }
            }),
        )
        .route(
            "/healthz",
            axum::routing::get(health_answer).with_state(Arc::clone(&app)),
        )
        .merge(authenticated)
        .fallback(error::no_route)
        .method_not_allowed_fallback(error::wrong_method)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(uri_limit))
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "the server hit a bug handling this request",
                )
                .into_response()
            },
        ))
        .with_state(app)
}

/// Runs `tessera serve` until SIGTERM or SIGINT.
pub async fn serve(store_url: Option<&str>, args: ServeArgs) -> exit::Outcome {
    // Everything is checked before the store is opened: bad input touches nothing.
    let tokens = match &args.tokens {
        Some(path) => Some(auth::Tokens::load(path).map_err(|e| Failure::new(exit::USAGE, e))?),
        None => None,
    };
    if tokens.is_none() && !listen::is_loopback(&args.listen) {
        return Err(Failure::new(
            exit::USAGE,
            format!(
                "refusing to listen on {} without --tokens: anyone who can reach it could take and revoke permits; give --tokens FILE, or listen on loopback (127.0.0.1 or [::1])",
                args.listen
            ),
        ));
    }
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            Some(listen::tls_acceptor(cert, key).map_err(|e| Failure::new(exit::USAGE, e))?)
        }
        (None, None) => None,
        _ => {
            return Err(Failure::new(
                exit::USAGE,
                "--tls-cert and --tls-key go together",
            ))
        }
    };
    for (flag, d) in [
        ("--request-timeout", args.request_timeout),
        ("--store-timeout", args.store_timeout),
    ] {
        if d.is_zero() {
            return Err(Failure::new(exit::USAGE, format!("{flag} must be above 0")));
        }
    }
    let prometheus = metrics::install();
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| {
            Failure::new(
                exit::OS_ERROR,
                format!("cannot listen on {}: {e}", args.listen),
            )
        })?;
    let local = listener
        .local_addr()
        .map_err(|e| Failure::new(exit::OS_ERROR, format!("cannot listen: {e}")))?;
    let store = crate::store_url::connect(store_url).await?;
    let shutdown = CancellationToken::new();
    let health = health::Health::start(store.clone(), args.store_timeout, shutdown.clone());
    let app = Arc::new(App {
        store: store.clone(),
        tokens,
        shutdown,
        holds: TaskTracker::new(),
        request_timeout: args.request_timeout,
        health,
        paces: pace::Paces::default(),
        prometheus,
    });
    let scheme = if tls.is_some() { "https" } else { "http" };
    // One line a script can wait for, with the port actually bound (for --listen …:0).
    println!(
        "tessera serve: listening on {scheme}://{local} (store {}){}",
        store.url(),
        if app.tokens.is_some() {
            ", bearer tokens required"
        } else {
            ", loopback only, no tokens"
        }
    );
    let stop = CancellationToken::new();
    let signals = {
        let stop = stop.clone();
        tokio::spawn(async move {
            wait_for_stop_signal().await;
            stop.cancel();
        })
    };
    let server = tokio::spawn(listen::serve(
        listener,
        tls,
        router(Arc::clone(&app)),
        stop.clone(),
        DRAIN,
    ));
    stop.cancelled().await;
    signals.abort();
    eprintln!("tessera serve: stopping; releasing the leases held for event streams");
    // Waiting acquires answer `shutting_down`; streams release their leases and end.
    app.shutdown.cancel();
    app.holds.close();
    if tokio::time::timeout(DRAIN, app.holds.wait()).await.is_err() {
        tracing::warn!("some event streams did not end within {DRAIN:?}");
    }
    let _ = server.await;
    store
        .close()
        .await
        .map_err(|e| Failure::new(exit::UNAVAILABLE, format!("closing the store: {e}")))?;
    eprintln!("tessera serve: stopped");
    Ok(exit::OK)
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without handlers the default action (exit) applies; nothing to wait for here.
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
