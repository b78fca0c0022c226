//! The permit guard: a held lease, kept alive in the background, released on drop.
//!
//! # When a lease is certainly valid
//!
//! The holder never compares its clock with the store's. Each renewal reply carries the
//! store's `now` and the new `expires_at`; the lease is certainly valid until
//! `sent + (expires_at - now) - margin`, where `sent` is the local monotonic time at which the
//! renewal was *sent* (the store renewed it no earlier than that) and `margin` is 2% of the
//! lease's span for clock-rate drift between the two machines. That instant is
//! [`Permit::valid_until`].
//!
//! The *span* is the lease's length as the last grant or renewal gave it,
//! `min(expires_at - now, TTL)`: the TTL, except for a grant the store made by handing the
//! permit to a queued waiter. Such a grant is provisional: it expires when the waiter's queue
//! entry would have (its heartbeat expiry), so that a waiter that died in the queue does not
//! hold the permit for a whole TTL. Its first renewal, 100 ms after the permit starts (a
//! shorter hold ends before and renews nothing), makes it a full lease.
//!
//! # When `lost()` fires
//!
//! - at once when the store says the lease is gone (expired, revoked, deleted, store state
//!   lost): a renewal answers `Gone`, and revocations are also pushed to the holder;
//! - when renewals have kept failing (errors or no answer) until `valid_until - span/3`, so a
//!   holder that stops at `lost()` has a third of the span (of the TTL, once renewed) to stop
//!   before the lease could expire and another holder could be granted it.
//!
//! After `lost()` the keep-alive stops for good: a lost lease is never renewed or re-acquired
//! silently, even if the store would still accept it.
//!
//! The renewals of every permit of a runtime are run by one background task, the lease keeper
//! (`crate::lease::keeper`), so a grant spawns nothing.

use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cleanup::{self, Job};
use crate::conn::Conn;
use crate::lease::keeper::Held;
use crate::lease::SemaphoreConfig;
use tessera_core::error::{LossReason, Result};
use tessera_core::model::*;
use tessera_core::wake;

/// A held lease on one or more permits. Released when dropped (in the background, see
/// [`crate::Store::close`] for what happens at the end of a program) or by
/// [`Permit::release`]; renewed in the background while it lives.
#[must_use = "the permit is released as soon as it is dropped"]
#[derive(Debug)]
pub struct Permit {
    held: Arc<Held>,
    /// The wake-up registration on the lease id, for revocations pushed to the holder.
    _wake: PermitWake,
}

/// The acquire's registration, handed over; or, for a lease granted without a wait, the
/// registration of the keeper's hook alone.
#[derive(Debug)]
enum PermitWake {
    Slot { _reg: wake::Registration },
    Hook { _reg: wake::HookRegistration },
}

impl Permit {
    /// Starts keeping a granted lease alive. `registration` is the acquire's wake-up
    /// registration on the lease id, if it had one; it passes to the permit.
    pub(crate) fn start(
        conn: &Conn,
        config: Arc<SemaphoreConfig>,
        grant: Grant,
        sent: Instant,
        registration: Option<wake::Registration>,
    ) -> Permit {
        let lease = grant.lease.lease_id;
        let held = Held::start(conn.clone(), config, grant, sent);
        let hook: Arc<dyn wake::Hook> = held.clone();
        let wake = match registration {
            // A revocation pushed between the grant and this hand-over only wakes the
            // acquire's slot, which nobody awaits any more; the next renewal finds the lease
            // gone.
            Some(registration) => {
                registration.hand_to(Arc::downgrade(&hook));
                PermitWake::Slot { _reg: registration }
            }
            // Registered after the grant: a revocation pushed before reaches the hook at once.
            None => PermitWake::Hook {
                _reg: wake::HookRegistration::new(lease, &hook),
            },
        };
        Permit { held, _wake: wake }
    }

    /// The semaphore's name, for a step on this lease outside the keeper
    /// (`crate::admission`).
    pub(crate) fn semaphore_name(&self) -> &tessera_core::model::Name {
        &self.held.config.name
    }

    /// The connection the lease was granted through.
    pub(crate) fn conn(&self) -> &crate::conn::Conn {
        &self.held.conn
    }

    /// The lease id (shown by `status`, used by `revoke`).
    pub fn lease_id(&self) -> LeaseId {
        self.held.lease.lease_id
    }
    /// The fence token: strictly increasing per semaphore, never reused. Pass it to the
    /// protected resource so it can refuse a stale holder.
    pub fn fence(&self) -> u64 {
        self.held.lease.fence
    }
    /// The seats this lease occupies: `weight` distinct numbers in `0..capacity`, ascending.
    pub fn seats(&self) -> &[u32] {
        &self.held.lease.seats
    }
    /// Number of permits held.
    pub fn weight(&self) -> u32 {
        self.held.lease.weight
    }
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.held.config.name.as_str()
    }
    /// The lease as granted.
    pub fn lease(&self) -> &Lease {
        &self.held.lease
    }
    /// When the lease expires on the store's clock, as of the last renewal.
    pub fn expires_at(&self) -> StoreTime {
        self.held.clock().0
    }
    /// Until when, on this process's monotonic clock, the lease is certainly valid.
    pub fn valid_until(&self) -> Instant {
        self.held.clock().1
    }
    /// Resolves when the lease is lost (see the module docs), with the reason. Cancel-safe;
    /// may be awaited from another task (the future owns what it needs).
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let held = Arc::clone(&self.held);
        async move {
            held.lost_token().cancelled().await;
            held.loss().unwrap_or(LossReason::Gone)
        }
    }
    /// A token cancelled when the lease is lost, for `select!` and child tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.held.lost_token().child_token()
    }
    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// Releases the lease now; `true` if the store still held it (`false` after a loss, or
    /// after [`crate::Store::close`] released it). A transient fault (a connection the
    /// store's restart closed, a busy store) is retried for up to [`RELEASE_RETRY`] (a
    /// release is idempotent; if a failed attempt did reach the store, the retry answers
    /// `false`). On error the lease expires by its TTL (no renewal happens any more).
    pub async fn release(self) -> Result<bool> {
        let h = &self.held;
        if !h.claim_release() {
            return Ok(false);
        }
        h.stop();
        let backend = h.conn.backend();
        let first = match backend.release_now(&h.config.name, h.lease.lease_id) {
            Some(r) => r,
            None => backend.release(&h.config.name, h.lease.lease_id).await,
        };
        match first {
            Err(e) if e.is_transient() => {
                release_retried(&**backend, &h.config.name, h.lease.lease_id, e).await
            }
            other => other,
        }
    }

    /// Stops keeping the lease alive and hands it over without releasing it: the store keeps
    /// it until someone releases it by id, or until it expires at [`Lease::expires_at`]
    /// unless renewed by id. For a server that grants leases to remote clients who renew and
    /// release them themselves (`tessera serve`), and for handing a lease to another process,
    /// which takes it over with [`crate::Semaphore::adopt`] before it expires. Returns the
    /// lease as last renewed, or `None` (nothing handed over) if it was lost, released or
    /// dropped already.
    ///
    /// After this call nobody watches the lease in this process: `lost()` never fires for it
    /// and [`crate::Store::close`] does not release it.
    pub fn detach(self) -> Option<Lease> {
        let h = &self.held;
        if h.is_lost() || !h.claim_release() {
            return None;
        }
        h.stop();
        let mut lease = h.lease.clone();
        lease.expires_at = h.clock().0;
        Some(lease)
    }
}

impl Drop for Permit {
    /// Releases in the background: on this runtime if it goes on, else on tessera's clean-up
    /// thread, which a normal process exit waits for (see [`crate::Store::close`]).
    fn drop(&mut self) {
        let h = &self.held;
        if !h.claim_release() {
            return;
        }
        h.stop();
        cleanup::spawn(
            &h.conn,
            Job::Release {
                name: h.config.name.clone(),
                lease: h.lease.lease_id,
            },
        );
    }
}

/// How long a release that met a transient fault is tried again before it fails.
pub const RELEASE_RETRY: std::time::Duration = std::time::Duration::from_secs(3);

/// Tries a release again after the transient fault `e`, backing off from 10 to 250 ms, until
/// an answer, another kind of error, or [`RELEASE_RETRY`]; each attempt bounded by what is
/// left of it. The last error if none answered.
pub(crate) async fn release_retried(
    backend: &dyn tessera_core::seam::Backend,
    name: &Name,
    lease: LeaseId,
    mut e: tessera_core::error::Error,
) -> Result<bool> {
    let deadline = Instant::now() + RELEASE_RETRY;
    let mut backoff = std::time::Duration::from_millis(10);
    while e.is_transient() && Instant::now() + backoff < deadline {
        tracing::debug!(%name, %lease, error = %e, "release failed; retrying");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(std::time::Duration::from_millis(250));
        match tokio::time::timeout_at(deadline, backend.release(name, lease)).await {
            Ok(Err(next)) => e = next,
            Ok(answer) => return answer,
            Err(_) => break,
        }
    }
    Err(e)
}
