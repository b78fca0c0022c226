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

use super::semaphores::LeaseBody;
use super::App;

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
