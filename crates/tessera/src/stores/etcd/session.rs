//! This client's sessions: one etcd lease per TTL, kept alive on keep-alive streams kept
//! open; the renewals of the grants on them (a provisional grant's first renewal moves it
//! to the holder's session).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Compare, CompareOp, LeaseKeepAliveStream, LeaseKeeper, Txn, TxnResponse};

use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::*;

use super::conns::{revision, EtcdBackend};
use super::error::is_lease_not_found;
use super::grant::MAX_ROUNDS;
use super::held::HeldHere;
use super::members::ATTEMPT_TIMEOUT;
use super::ops::{Entry, Keys};

/// How long one attempt of a renewal of a lease of `ttl` seconds may take on one member:
/// TTL/8, between 250 ms and [`ATTEMPT_TIMEOUT`]. The keeper bounds a renewal by the moment
/// `lost()` is due (about TTL/3 after it starts), so a renewal whose member stopped
/// answering must give up on it early enough to be sent again on the next one in time.
pub(super) fn renewal_attempt(ttl: i64) -> Duration {
    (Duration::from_secs(ttl.max(1) as u64) / 8).clamp(Duration::from_millis(250), ATTEMPT_TIMEOUT)
}

/// An etcd lease and its TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EtcdLease {
    pub(super) id: i64,
    pub(super) ttl: i64,
}

/// The keep-alives of one etcd lease: a stream kept open between them, with the member it
/// was opened on, and the exchanges sent on it, so that callers who arrive together share
/// one (see [`EtcdBackend::keep_alive_within`]).
#[derive(Default)]
pub(super) struct KeepAliveSlot {
    stream: tokio::sync::Mutex<Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>>,
    /// Exchanges sent so far: the number of the latest one, taken just before it is sent.
    sent: AtomicU64,
    /// The latest exchange that answered "the lease lives" or "the lease is gone", and
    /// which.
    answered: std::sync::Mutex<(u64, bool)>,
}

impl EtcdBackend {
    pub(super) async fn grant_lease(&self, ttl: i64) -> Result<EtcdLease> {
        let resp = self
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await
            .map_err(|e| self.err(e))?;
        Ok(EtcdLease {
            id: resp.id(),
            ttl: resp.ttl().max(ttl),
        })
    }

    /// One keep-alive of an etcd lease, on its keep-alive stream (opened on first use and
    /// kept): `true` if the lease lives (etcd restarted its TTL when it received the
    /// request), `false` if it is gone.
    pub(super) async fn keep_alive(&self, lease: i64) -> Result<bool> {
        self.keep_alive_within(lease, ATTEMPT_TIMEOUT).await
    }

    /// [`EtcdBackend::keep_alive`] with attempts of at most `attempt` (a renewal's are
    /// shorter, see [`renewal_attempt`]).
    ///
    /// Callers share exchanges (a group commit): a caller is answered by the first exchange
    /// *sent after it arrived*, its own or one another caller sent meanwhile, so "the TTL
    /// restarted after the call began" holds for every caller. One process with 10,000
    /// waiters keeps its two sessions alive with one exchange per round trip, where one
    /// exchange per heartbeat, one at a time on the lease's stream, could not keep up
    /// (20,000 a second with a heartbeat a second).
    pub(super) async fn keep_alive_within(&self, lease: i64, attempt: Duration) -> Result<bool> {
        let slot: Arc<KeepAliveSlot> =
            Arc::clone(self.keep_alives.lock().unwrap().entry(lease).or_default());
        // Any exchange numbered above this one is sent after this call began.
        let arrived = slot.sent.load(Ordering::SeqCst);
        let mut guard = slot.stream.lock().await;
        let (number, alive) = *slot.answered.lock().unwrap();
        if number > arrived {
            if !alive {
                drop(guard);
                self.forget_keep_alive(lease);
            }
            return Ok(alive);
        }
        let number = slot.sent.fetch_add(1, Ordering::SeqCst) + 1;
        let answer = |alive: bool| {
            let mut answered = slot.answered.lock().unwrap();
            if answered.0 < number {
                *answered = (number, alive);
            }
        };
        // Taken out while in use: if this call is dropped half-way, the stream goes with
        // it, so a later call never reads a reply meant for an earlier request.
        if let Some((member, mut keeper, mut stream)) = guard.take() {
            let exchange = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            match tokio::time::timeout(attempt, exchange).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => {
                    *guard = Some((member, keeper, stream));
                    answer(true);
                    return Ok(true);
                }
                Ok(Ok(Some(_))) => {
                    answer(false);
                    drop(guard);
                    self.forget_keep_alive(lease);
                    return Ok(false);
                }
                // The stream broke, or its member gave no answer in time: open a new one
                // below, on the next member.
                Ok(Ok(None)) | Ok(Err(_)) | Err(_) => self.members.failed(member),
            }
        }
        match self
            .call_at(
                attempt,
                |mut c| async move { c.lease_keep_alive(lease).await },
            )
            .await
        {
            Ok((member, (keeper, stream))) => {
                *guard = Some((member, keeper, stream));
                answer(true);
                Ok(true)
            }
            Err(e) if is_lease_not_found(&e) => {
                answer(false);
                drop(guard);
                self.forget_keep_alive(lease);
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    pub(super) fn forget_keep_alive(&self, lease: i64) {
        self.keep_alives.lock().unwrap().remove(&lease);
    }

    /// This backend's session lease of `ttl` seconds, kept alive by this call: its TTL
    /// restarted after the call began, so a key written on it lives at least until then
    /// plus `ttl`. A session that ended is replaced.
    pub(super) async fn session(&self, ttl: i64) -> Result<EtcdLease> {
        self.sweep().await?;
        for _ in 0..3 {
            let known = self.sessions.lock().await.get(&ttl).copied();
            match known {
                Some(l) if self.keep_alive(l.id).await? => return Ok(l),
                Some(l) => self.drop_session(l).await,
                None => {
                    let mut sessions = self.sessions.lock().await;
                    if sessions.contains_key(&ttl) {
                        continue;
                    }
                    // Granted now: its TTL runs from after this call began.
                    let l = self.grant_lease(ttl).await?;
                    sessions.insert(ttl, l);
                    return Ok(l);
                }
            }
        }
        Err(Error::store(
            StoreErrorKind::Connection,
            "etcd: the session lease kept ending",
        ))
    }

    /// Forgets a session lease that ended.
    pub(super) async fn drop_session(&self, lease: EtcdLease) {
        let mut sessions = self.sessions.lock().await;
        if sessions.get(&lease.ttl) == Some(&lease) {
            sessions.remove(&lease.ttl);
        }
        self.forget_keep_alive(lease.id);
    }

    /// A transaction that may name a session lease that just ended: on "lease not found"
    /// the session is forgotten and `None` returned (the caller writes again on a new one).
    pub(super) async fn txn_on(
        &self,
        txn: Txn,
        sessions: &[EtcdLease],
    ) -> Result<Option<TxnResponse>> {
        match self
            .call(|mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await
        {
            Ok(r) => Ok(Some(r)),
            Err(e) if is_lease_not_found(&e) => {
                for &l in sessions {
                    self.drop_session(l).await;
                }
                Ok(None)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    /// A renewal of a grant on `session` (not provisional): the keep-alive restarts the
    /// session's TTL, and the read in the same round trip proves the grant is still there,
    /// the same (a revoke or a delete removes it; the session may live on).
    pub(super) async fn renew_on(
        &self,
        keys: &Keys,
        id: LeaseId,
        session: EtcdLease,
        fence: i64,
    ) -> Result<RenewReply> {
        let attempt = renewal_attempt(session.ttl);
        let (alive, entry) = tokio::join!(
            self.keep_alive_within(session.id, attempt),
            self.read_one_within(keys, id, attempt)
        );
        let now = StoreTime::host_now();
        let (alive, entry) = (alive?, entry?);
        if !alive {
            self.drop_session(session).await;
        }
        if !alive || entry.is_none_or(|e| e.fence() != fence || e.lease != session.id) {
            self.held.lock().unwrap().remove(&id);
            return Ok(RenewReply::Gone);
        }
        let expires_at = now.plus(Duration::from_secs(session.ttl as u64));
        if let Some(h) = self.held.lock().unwrap().get_mut(&id) {
            h.expires_at = expires_at;
            h.deadline = Instant::now() + Duration::from_secs(session.ttl as u64);
        }
        Ok(RenewReply::Renewed { expires_at, now })
    }

    /// The first renewal of a provisional grant (see [`ops::Granted::p`]): one transaction
    /// moves the record and its seats from the waiter's session to this backend's session
    /// of the lease TTL, kept alive after this call began, and keeps the fence in the
    /// record (the move is the record's new mod revision). `Gone` if the grant ended
    /// meanwhile: its waiter's session ran out, or a revoke.
    pub(super) async fn settle(&self, keys: &Keys, id: LeaseId, fence: i64) -> Result<RenewReply> {
        for _ in 0..MAX_ROUNDS {
            let entry = match self.read_one(keys, id).await? {
                Some(e) if e.is_holder() && e.fence() == fence => e,
                _ => {
                    self.held.lock().unwrap().remove(&id);
                    return Ok(RenewReply::Gone);
                }
            };
            if !entry.record.is_provisional() {
                // Moved meanwhile, by a renewal through another backend.
                let session = EtcdLease {
                    id: entry.lease,
                    ttl: entry.record.ttl,
                };
                return self.renew_on(keys, id, session, fence).await;
            }
            let holder = self.session(entry.record.ttl).await?;
            let record = entry.record.settled(fence);
            let mut ops = keys.grant_ops(id, &record, holder.id)?;
            // Settled and alone: the capacity key goes on its new etcd lease.
            ops.push(keys.attach_capacity_if_only(&[], id, entry.mod_rev, holder.id));
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.lease(id),
                    CompareOp::Equal,
                    entry.mod_rev,
                )])
                .and_then(ops);
            let Some(resp) = self.txn_on(txn, &[holder]).await? else {
                continue;
            };
            if !resp.succeeded() {
                continue;
            }
            let now = StoreTime::host_now();
            let moved = Entry::written(id, record, revision(resp.header()), holder.id);
            let (held, grant) = HeldHere::new(keys, &moved, now);
            if let Some(h) = self.held.lock().unwrap().get_mut(&id) {
                *h = held;
            }
            return Ok(RenewReply::Renewed {
                expires_at: grant.lease.expires_at,
                now,
            });
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            "etcd: a hand-off grant's first renewal kept conflicting with other clients",
        ))
    }
}
