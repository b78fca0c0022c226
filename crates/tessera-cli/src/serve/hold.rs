//! A lease held by a connection: the answer to an acquire with `Accept: text/event-stream`.
//!
//! The stream's first event is `grant` (the lease, as JSON); an acquire that asked for
//! `"waiting_events": true` gets its stream at once, with `waiting` events (its place and
//! expected wait) before the `grant`, or an `error` event if it is not granted. While the stream is open the
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
use tessera::{LossReason, Permit, QueuePlace};
use tokio::sync::{mpsc, watch};
use utoipa::ToSchema;

use super::error::ApiError;
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
    let (tx, rx) = mpsc::channel::<Event>(4);
    // The first event is queued before the task starts: the channel has room.
    let _ = tx.try_send(grant_event(&permit, ttl));
    let task_app = Arc::clone(&app);
    app.holds.spawn(keep(task_app, permit, tx));
    sse(rx)
}

/// The response to an acquire that asked for `waiting` events: open at once, a `waiting`
/// event each time the place or the expected wait changes (the place is read every
/// [`tessera::READ_EVERY`]), then `grant` and the hold as in [`hold`]; or an `error` event
/// (the body an error answer has) and the end, when `acquire` fails or its wait runs out.
pub fn wait_then_hold(
    app: Arc<App>,
    ttl: Duration,
    mut place: watch::Receiver<Option<QueuePlace>>,
    acquire: impl std::future::Future<Output = Result<Permit, ApiError>> + Send + 'static,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (tx, rx) = mpsc::channel::<Event>(4);
    let task_app = Arc::clone(&app);
    app.holds.spawn(async move {
        tokio::pin!(acquire);
        let acquired = loop {
            tokio::select! {
                r = &mut acquire => break r,
                changed = place.changed() => {
                    let current = *place.borrow_and_update();
                    if let (Ok(()), Some(p)) = (changed, current) {
                        if tx.send(event("waiting", &WaitingEvent::new(p))).await.is_err() {
                            // The client left: dropping the acquire gives its place back.
                            return;
                        }
                    }
                }
                _ = tx.closed() => return,
            }
        };
        match acquired {
            Ok(permit) => {
                if tx.send(grant_event(&permit, ttl)).await.is_ok() {
                    keep(task_app, permit, tx).await;
                }
            }
            Err(e) => {
                let _ = tx.send(event("error", &e.body())).await;
            }
        }
    });
    sse(rx)
}

/// The data of a `waiting` event.
#[derive(Debug, Serialize, ToSchema)]
pub struct WaitingEvent {
    /// The place in the queue: 0 is the head.
    pub position: u64,
    /// Waiters in the queue, this one included.
    pub queued: u64,
    /// About how long until the grant, in milliseconds; absent while unknown (until the place
    /// has moved once, or the store has said when the rate windows admit the head).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected_wait_ms: Option<u64>,
}

impl WaitingEvent {
    fn new(p: QueuePlace) -> Self {
        WaitingEvent {
            position: p.position,
            queued: p.queued,
            expected_wait_ms: p.expected_wait.map(|d| d.as_millis() as u64),
        }
    }
}

fn grant_event(permit: &Permit, ttl: Duration) -> Event {
    let expires_in = permit
        .valid_until()
        .saturating_duration_since(tokio::time::Instant::now());
    let grant = LeaseBody::new(permit.name(), permit.lease(), ttl, expires_in);
    event("grant", &grant)
}

/// Keeps `permit` while the client keeps the stream open (see the module docs).
async fn keep(app: Arc<App>, permit: Permit, tx: mpsc::Sender<Event>) {
    let shutdown = app.shutdown.clone();
    metrics::gauge!("tessera_serve_streams_holding").increment(1.0);
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
}

fn sse(mut rx: mpsc::Receiver<Event>) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|e| e.map(Ok)));
    Sse::new(stream).keep_alive(KeepAlive::new().interval(PING).text("ping"))
}
