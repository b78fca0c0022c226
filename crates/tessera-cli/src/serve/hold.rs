//! A lease held by a connection: the answer to an acquire with `Accept: text/event-stream`.
//!
//! The stream's first event is `grant` (the lease, as JSON). While the stream is open the
//! server keeps the lease alive (the library's keep-alive, every third of the TTL) and sends a
//! comment line every [`PING`], so a client that is gone is noticed at the next write. The
//! stream ends in one of three ways:
//!
//! - the client closes it, or dies (its kernel closes the socket): the body is dropped, the
//!   task holding the permit sees its channel close and releases the lease at once;
//! - the lease is lost (revoked, deleted, renewals failing): a `lost` event with the reason,
//!   sent when the library's `lost()` fires — before the lease could expire — then the end;
//! - the server shuts down: a `lost` event (`kind: shutdown`), the lease is released, then
//!   the end.
//!
//! A client must treat the end of the stream like `lost`: stop using the resource.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use serde::Serialize;
use tessera::{LossReason, Permit};
use tokio::sync::mpsc;
use utoipa::ToSchema;

use super::App;

/// A granted lease.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LeaseBody {
    /// The semaphore.
    pub name: String,
    /// The lease id: renew and release name it.
    #[schema(example = "5f0c3f4e9b0a4d21a3c1e2f3a4b5c6d7")]
    pub lease_id: String,
    /// Permits held.
    pub weight: u32,
    /// The seats held: `weight` distinct numbers in `0..capacity`.
    pub seats: Vec<u32>,
    /// Fence token: strictly increasing per semaphore, never reused. Pass it to the protected
    /// resource so it can refuse a stale holder.
    pub fence: u64,
    /// Holder label.
    pub holder: String,
    /// The lease TTL asked for, in milliseconds. A renewal extends the lease by the `ttl` it
    /// names (30s when it names none), so send this one to keep the same TTL.
    pub ttl_ms: u64,
    /// How long the lease is certainly valid from when this answer left, in milliseconds:
    /// the time left on the store's clock, less the request's round trip and 2% for
    /// clock-rate drift (as for a library holder). Renew before it runs out (about every
    /// third of the TTL).
    pub expires_in_ms: u64,
    /// The expiry on the store's clock, in microseconds since the Unix epoch (for display:
    /// compute deadlines from `expires_in_ms`, on your own clock).
    pub expires_at_us: u64,
}

impl LeaseBody {
    pub fn new(name: &str, lease: &tessera::Lease, ttl: Duration, expires_in: Duration) -> Self {
        LeaseBody {
            name: name.to_string(),
            lease_id: lease.lease_id.to_string(),
            weight: lease.weight,
            seats: lease.seats.clone(),
            fence: lease.fence,
            holder: lease.holder.clone(),
            ttl_ms: ttl.as_millis() as u64,
            expires_in_ms: expires_in.as_millis() as u64,
            expires_at_us: lease.expires_at.as_micros(),
        }
    }
}

/// How often an idle stream gets a comment line (which detects a vanished client).
pub const PING: Duration = Duration::from_millis(200);

/// The data of a `lost` event.
#[derive(Debug, Serialize, ToSchema)]
pub struct LostEvent {
    /// `gone` (expired, revoked, deleted), `renewals_failing`, `stalled`, `closed` or
    /// `shutdown` (the server is stopping; the lease was released).
    pub kind: &'static str,
    /// One line for a human.
    pub reason: String,
}

fn lost_event(reason: &LossReason) -> LostEvent {
    let kind = match reason {
        LossReason::Gone => "gone",
        LossReason::RenewalsFailing(_) => "renewals_failing",
        LossReason::Stalled(_) => "stalled",
        LossReason::Closed => "closed",
        _ => "lost",
    };
    LostEvent {
        kind,
        reason: reason.to_string(),
    }
}

fn event(name: &str, data: &impl Serialize) -> Event {
    Event::default()
        .event(name)
        .json_data(data)
        .unwrap_or_else(|_| Event::default().event(name).data("{}"))
}

/// The response holding `permit` for as long as the client keeps it open.
pub fn hold(
    app: Arc<App>,
    permit: Permit,
    ttl: Duration,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, mut rx) = mpsc::channel::<Event>(4);
    let expires_in = permit
        .valid_until()
        .saturating_duration_since(tokio::time::Instant::now());
    let grant = LeaseBody::new(permit.name(), permit.lease(), ttl, expires_in);
    // The first event is queued before the task starts: the channel has room.
    let _ = tx.try_send(event("grant", &grant));
    let shutdown = app.shutdown.clone();
    metrics::gauge!("tessera_serve_streams_holding").increment(1.0);
    app.holds.spawn(async move {
        let lost = permit.lost();
        tokio::select! {
            // The client closed the stream or vanished: give the permit back now.
            _ = tx.closed() => {
                let _ = permit.release().await;
            }
            reason = lost => {
                let _ = tx.send(event("lost", &lost_event(&reason))).await;
            }
            _ = shutdown.cancelled() => {
                let released = permit.release().await;
                let reason = match released {
                    Ok(_) => "the server is shutting down; the lease was released".to_string(),
                    Err(e) => format!("the server is shutting down; releasing the lease failed ({e}), it expires by its TTL"),
                };
                let _ = tx.send(event("lost", &LostEvent { kind: "shutdown", reason })).await;
            }
        }
        metrics::gauge!("tessera_serve_streams_holding").decrement(1.0);
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(PING).text("ping"))
}
