//! `/metrics`: what the library reports through the `metrics` facade (see the table in the
//! library's `telemetry` module: grants, waits, queue length, renewals, losses, store call
//! latency, rate decisions), plus the server's own (`tessera_serve_*`), in Prometheus' text
//! format. Latencies are histograms with fixed buckets from 100 µs to 30 s.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use super::auth::Principal;
use super::error::ApiError;
use super::App;

const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];

/// Installs the Prometheus recorder for this process; `None` if another recorder is already
/// installed (then `/metrics` answers 501).
pub fn install() -> Option<PrometheusHandle> {
    let builder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".to_string()), BUCKETS)
        .ok()?;
    let handle = builder.install_recorder().ok()?;
    // Histograms are summarised lazily; keep their memory bounded between scrapes.
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Some(handle)
}

pub fn routes() -> Router<Arc<App>> {
    Router::new().route("/metrics", get(render))
}

async fn render(State(app): State<Arc<App>>, principal: Principal) -> Result<Response, ApiError> {
    principal.check_all()?;
    let Some(handle) = &app.prometheus else {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "unsupported",
            "no metrics recorder in this process",
        ));
    };
    Ok((
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        handle.render(),
    )
        .into_response())
}
