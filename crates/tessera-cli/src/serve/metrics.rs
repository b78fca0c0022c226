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
    register_at_start();
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

/// Describes every series (Prometheus `# HELP`), and registers at their starting value those
/// whose labels are known before the first call, so a fresh server's `/metrics` already lists
/// them: the renewal and loss counters per outcome and reason, the streams gauge, and
/// `tessera_build_info{version}`. Series labelled by a semaphore or limiter `name`, or by a
/// store call, appear with their first event.
fn register_at_start() {
    use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, Unit};
    describe_counter!(
        "tessera_grants_total",
        "Leases granted (acquire and try-acquire), per semaphore (and tenant, for requests that name one)"
    );
    describe_histogram!(
        "tessera_acquire_wait_seconds",
        Unit::Seconds,
        "From an acquire's call to its grant, per semaphore (and tenant, for requests that name one)"
    );
    describe_counter!(
        "tessera_acquire_outcomes_total",
        "Acquires by outcome: granted, no_permit (try), timed_out, error"
    );
    describe_counter!("tessera_waits_total", "Acquires that joined the queue");
    describe_gauge!(
        "tessera_queue_length",
        "The queue length the last waiter found when it joined (its position + 1)"
    );
    describe_counter!(
        "tessera_renewals_total",
        "Keep-alive renewals by outcome: ok, gone, error"
    );
    describe_counter!(
        "tessera_losses_total",
        "Leases lost by reason: gone, renewals_failing, stalled, closed"
    );
    describe_histogram!(
        "tessera_store_call_seconds",
        Unit::Seconds,
        "Latency of each call to the store, per operation"
    );
    describe_counter!(
        "tessera_store_errors_total",
        "Store calls that failed, per operation and kind"
    );
    describe_counter!(
        "tessera_rate_decisions_total",
        "Rate requests admitted or limited, per limiter"
    );
    describe_counter!(
        "tessera_admissions_expired_total",
        "Admissions given back unused past their use-by instant, per name"
    );
    describe_gauge!(
        "tessera_serve_streams_holding",
        "Leases this server holds for open event streams"
    );
    describe_gauge!(
        "tessera_build_info",
        "Always 1; the version of the tessera serving, as a label"
    );
    for outcome in ["ok", "gone", "error"] {
        counter!("tessera_renewals_total", "outcome" => outcome).increment(0);
    }
    for reason in ["gone", "renewals_failing", "stalled", "closed"] {
        counter!("tessera_losses_total", "reason" => reason).increment(0);
    }
    gauge!("tessera_serve_streams_holding").increment(0.0);
    gauge!("tessera_build_info", "version" => env!("CARGO_PKG_VERSION")).set(1.0);
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
