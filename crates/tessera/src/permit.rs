//! The permit guard: a held lease, kept alive in the background, released on drop.
//!
//! # When a lease is certainly valid
//!
//! The holder never compares its clock with the store's. Each renewal reply carries the
//! store's `now` and the new `expires_at`; the lease is certainly valid until
//! `sent + (expires_at - now) - margin`, where `sent` is the local monotonic time at which the
//! renewal was *sent* (the store renewed it no earlier than that) and `margin` is 2% of the
//! TTL for clock-rate drift between the two machines. That instant is [`Permit::valid_until`].
//!
//! # When `lost()` fires
//!
//! - at once when the store says the lease is gone (expired, revoked, deleted, store state
//!   lost): a renewal answers `Gone`, and revocations are also pushed to the holder;
//! - when renewals have kept failing (errors or no answer) until `valid_until - TTL/3`, so a
//!   holder that stops at `lost()` has a third of the TTL to stop before the lease could
//!   expire and another holder could be granted it.
//!
//! After `lost()` the keep-alive stops for good: a lost lease is never renewed or re-acquired
//! silently, even if the store would still accept it.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{LossReason, Result};
use crate::model::*;
use crate::semaphore::Config;
use crate::store::Backend;
use crate::wake;

/// A held lease on one or more permits. Released when dropped (in the background) or by
/// [`Permit::release`]; renewed in the background while it lives.
#[must_use = "the permit is released as soon as it is dropped"]
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    released: bool,
}

#[derive(Debug)]
struct Shared {
    backend: Arc<dyn Backend>,
    config: Arc<Config>,
    lease: Lease,
    clock: Mutex<LeaseClock>,
    lost: CancellationToken,
    loss: Mutex<Option<LossReason>>,
    stop: CancellationToken,
}

#[derive(Debug, Clone, Copy)]
struct LeaseClock {
    expires_at: StoreTime,
    valid_until: Instant,
}

fn margin(ttl: Duration) -> Duration {
    ttl / 50
}

impl Permit {
    pub(crate) fn start(backend: Arc<dyn Backend>, config: Arc<Config>, grant: Grant, sent: Instant) -> Permit {
        let remaining = grant.lease.expires_at.since(grant.now);
        let clock = LeaseClock {
            expires_at: grant.lease.expires_at,
            valid_until: sent + remaining.saturating_sub(margin(config.ttl)),
        };
        let shared = Arc::new(Shared {
            backend,
            config,
            lease: grant.lease,
            clock: Mutex::new(clock),
            lost: CancellationToken::new(),
            loss: Mutex::new(None),
            stop: CancellationToken::new(),
        });
        tokio::spawn(keep_alive(Arc::clone(&shared)));
        Permit {
            shared,
            released: false,
        }
    }

    /// The lease id (shown by `status`, used by `revoke`).
    pub fn lease_id(&self) -> LeaseId {
        self.shared.lease.lease_id
    }
    /// The fence token: strictly increasing per semaphore, never reused. Pass it to the
    /// protected resource so it can refuse a stale holder.
    pub fn fence(&self) -> u64 {
        self.shared.lease.fence
    }
    /// The seats this lease occupies: `weight` distinct numbers in `0..capacity`, ascending.
    pub fn seats(&self) -> &[u32] {
        &self.shared.lease.seats
    }
    /// Number of permits held.
    pub fn weight(&self) -> u32 {
        self.shared.lease.weight
    }
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.shared.config.name.as_str()
    }
    /// The lease as granted.
    pub fn lease(&self) -> &Lease {
        &self.shared.lease
    }
    /// When the lease expires on the store's clock, as of the last renewal.
    pub fn expires_at(&self) -> StoreTime {
        self.shared.clock.lock().unwrap().expires_at
    }
    /// Until when, on this process's monotonic clock, the lease is certainly valid.
    pub fn valid_until(&self) -> Instant {
        self.shared.clock.lock().unwrap().valid_until
    }
    /// Resolves when the lease is lost (see the module docs), with the reason. Cancel-safe;
    /// may be awaited from another task (the future owns what it needs).
    pub fn lost(&self) -> impl Future<Output = LossReason> + Send + 'static {
        let shared = Arc::clone(&self.shared);
        async move {
            shared.lost.cancelled().await;
            shared
                .loss
                .lock()
                .unwrap()
                .clone()
                .unwrap_or(LossReason::Gone)
        }
    }
    /// A token cancelled when the lease is lost, for `select!` and child tasks.
    pub fn lost_token(&self) -> CancellationToken {
        self.shared.lost.child_token()
    }
    /// Whether the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.is_cancelled()
    }

    /// Releases the lease now; `true` if the store still held it (`false` after a loss).
    /// On error the lease expires by its TTL (no renewal happens any more).
    pub async fn release(mut self) -> Result<bool> {
        self.released = true;
        self.shared.stop.cancel();
        let s = &self.shared;
        s.backend.release(&s.config.name, s.lease.lease_id).await
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.shared.stop.cancel();
        let shared = Arc::clone(&self.shared);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let (name, id) = (&shared.config.name, shared.lease.lease_id);
                if let Err(e) = shared.backend.release(name, id).await {
                    tracing::warn!(%name, lease = %id, error = %e, "release on drop failed; the lease expires by its TTL");
                }
            });
        }
    }
}

impl Shared {
    fn lose(&self, reason: LossReason) {
        let mut loss = self.loss.lock().unwrap();
        if loss.is_none() {
            tracing::warn!(name = %self.config.name, lease = %self.lease.lease_id, %reason, "lease lost");
            *loss = Some(reason);
        }
        drop(loss);
        self.lost.cancel();
    }

    fn clock(&self) -> LeaseClock {
        *self.clock.lock().unwrap()
    }
}

/// Renews every keep-alive interval; on failure retries quickly; fires `lost()` as the module
/// docs say. Ends when the permit is released or dropped, or the lease is lost.
async fn keep_alive(shared: Arc<Shared>) {
    let registration = wake::Registration::new(shared.lease.lease_id);
    let ttl = shared.config.ttl;
    let interval = shared.config.keep_alive;
    let retry = (interval / 8).max(Duration::from_millis(10));
    let lead = ttl / 3;
    let mut last_ok = Instant::now();
    let mut failing: Option<String> = None;
    loop {
        let LeaseClock { valid_until, .. } = shared.clock();
        let lost_at = valid_until.checked_sub(lead).unwrap_or(valid_until);
        let due = match failing {
            Some(_) => Instant::now() + retry,
            // Renew early if the lease came with less than half its TTL left.
            None => (last_ok + interval).min(valid_until.checked_sub(ttl / 2).unwrap_or(valid_until)),
        };
        tokio::select! {
            biased;
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep_until(lost_at), if failing.is_some() => {
                shared.lose(LossReason::RenewalsFailing(failing.unwrap_or_default()));
                return;
            }
            // A push about this lease (a revocation): ask the store now.
            _ = registration.notified() => {}
            _ = tokio::time::sleep_until(due) => {}
        }
        let deadline = if Instant::now() < lost_at { lost_at } else { valid_until };
        let sent = Instant::now();
        let reply = tokio::select! {
            biased;
            _ = shared.stop.cancelled() => return,
            _ = tokio::time::sleep_until(deadline) => {
                let why = failing.take().unwrap_or_else(|| "the store did not answer".to_string());
                shared.lose(LossReason::RenewalsFailing(why));
                return;
            }
            r = shared.backend.renew(&shared.config.name, shared.lease.lease_id, ttl) => r,
        };
        match reply {
            Ok(RenewReply::Renewed { expires_at, now }) => {
                let mut c = shared.clock.lock().unwrap();
                c.expires_at = expires_at;
                c.valid_until = c
                    .valid_until
                    .max(sent + expires_at.since(now).saturating_sub(margin(ttl)));
                last_ok = sent;
                failing = None;
            }
            Ok(RenewReply::Gone) => {
                shared.lose(LossReason::Gone);
                return;
            }
            Err(e) => {
                tracing::debug!(lease = %shared.lease.lease_id, error = %e, "renewal failed; retrying");
                failing = Some(e.to_string());
            }
        }
    }
}
