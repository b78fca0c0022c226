//! What this backend holds and waits on: its grants and waiters as last seen, the watch of
//! each waiter, and the sweep that ends those nobody renewed for their TTL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use tessera_core::error::Result;
use tessera_core::model::*;

use super::conns::EtcdBackend;
use super::notify::Target;
use super::ops::{Entry, Keys, Snapshot};
use super::session::EtcdLease;

/// A lease held through this backend, as granted.
#[derive(Debug, Clone)]
pub(super) struct HeldHere {
    /// The etcd lease the record and its seats are on.
    pub(super) session: EtcdLease,
    /// The grant's revision ([`Entry::fence`]).
    pub(super) fence: i64,
    /// A provisional grant, on the waiter's session until its first renewal moves it.
    pub(super) provisional: bool,
    /// The expiry the last grant or renewal reported (what `status` shows).
    pub(super) expires_at: StoreTime,
    pub(super) keys: Keys,
    /// One TTL after the last grant or renewal was answered: past it, nobody renews the
    /// lease any more (its permit was abandoned in a process that lives on), and the next
    /// operation of this backend ends the grant, since other leases keep the session alive.
    pub(super) deadline: Instant,
}

impl HeldHere {
    /// The grant of `entry` (as written or read), found `now`, with the session it is on
    /// kept alive after the request that learns of it was sent: certainly held until that
    /// send plus the session's TTL.
    pub(super) fn new(keys: &Keys, entry: &Entry, now: StoreTime) -> (HeldHere, Grant) {
        let ttl = entry.record.session_ttl();
        let span = Duration::from_secs(ttl.max(0) as u64);
        let expires_at = now.plus(span);
        let held = HeldHere {
            session: EtcdLease {
                id: entry.lease,
                ttl,
            },
            fence: entry.fence(),
            provisional: entry.record.is_provisional(),
            expires_at,
            keys: keys.clone(),
            deadline: Instant::now() + span,
        };
        let grant = Grant {
            lease: entry.lease(expires_at),
            now,
        };
        (held, grant)
    }
}

/// The leases held through one backend, shared with its watches (which learn of grants a
/// release made).
pub(super) type HeldMap = Arc<Mutex<HashMap<LeaseId, HeldHere>>>;

/// A waiter of this backend, as its heartbeats see it.
#[derive(Debug, Clone)]
pub(super) struct WaitHere {
    /// The holder and waiter TTLs, seconds.
    pub(super) ttls: (i64, i64),
    /// The mod revision of its waiting record (a grant writes the record again).
    pub(super) rev: i64,
    /// The etcd lease its waiting record is on.
    pub(super) lease: i64,
    pub(super) keys: Keys,
    /// One waiter TTL after its last heartbeat: past it, the record goes (as above).
    pub(super) deadline: Instant,
    /// The wake-up stamp ([`Watches::now`]) taken before the read that noted it last (0:
    /// an acquire's read): its watch has been quiet since then, or the heartbeat reads again
    /// (see [`EtcdBackend::heartbeat`]).
    pub(super) read_at: u64,
}

impl EtcdBackend {
    /// A grant made or found now, its session kept alive after the caller's request was
    /// sent: noted as held through this backend, its waiting ended.
    pub(super) fn granted(&self, keys: &Keys, entry: &Entry, now: StoreTime) -> Grant {
        let (held, grant) = HeldHere::new(keys, entry, now);
        self.held.lock().unwrap().insert(entry.id, held);
        self.end_wait(entry.id);
        grant
    }

    /// The grant of a key that already holds (a retried acquire or a heartbeat after a
    /// grant whose reply was lost): its lease is kept alive first, so the reply's TTL runs
    /// from after the caller's request was sent. `None` if the lease just ended.
    pub(super) async fn existing_grant(&self, keys: &Keys, entry: &Entry) -> Result<Option<Grant>> {
        self.existing_grant_after(keys, entry, &[]).await
    }

    /// [`EtcdBackend::existing_grant`], sparing the keep-alive when one of `renewed` (the
    /// sessions this call already kept alive) is the lease the record is on.
    pub(super) async fn existing_grant_after(
        &self,
        keys: &Keys,
        entry: &Entry,
        renewed: &[EtcdLease],
    ) -> Result<Option<Grant>> {
        let fresh = renewed.iter().any(|l| l.id == entry.lease);
        if !fresh && !self.keep_alive(entry.lease).await? {
            return Ok(None);
        }
        Ok(Some(self.granted(keys, entry, StoreTime::host_now())))
    }

    /// Watches what can let `id` in (see the module docs), from after `snap`.
    pub(super) fn watch(&self, keys: &Keys, snap: &Snapshot, ahead: Option<LeaseId>, id: LeaseId) {
        self.watch_after(keys, snap.revision, ahead, id);
    }

    /// [`EtcdBackend::watch`], from after revision `read` (the read `ahead` was decided on).
    pub(super) fn watch_after(&self, keys: &Keys, read: i64, ahead: Option<LeaseId>, id: LeaseId) {
        let target = match ahead {
            None => Target::Head {
                queue: keys.queue.clone(),
                cap: keys.cap.clone(),
            },
            Some(a) => Target::Behind {
                ahead: keys.lease(a),
                known_waiting: true,
            },
        };
        self.watches.set(id, target, keys, read + 1);
    }

    /// Makes `id`, whose record a join wrote at revision `joined`, watch the record `tail`
    /// (the one that joined last before it) without having read it: the watch reads it
    /// once its watchers have started and wakes `id` unless it still waits (`notify.rs`).
    pub(super) fn watch_tail(&self, keys: &Keys, joined: i64, tail: LeaseId, id: LeaseId) {
        let target = Target::Behind {
            ahead: keys.lease(tail),
            known_waiting: false,
        };
        self.watches.set(id, target, keys, joined + 1);
    }

    /// Notes (or renews) a waiter of this backend, `entry` as its heartbeat or acquire read
    /// it.
    pub(super) fn note_waiting(&self, entry: &Entry, keys: &Keys, ttls: (i64, i64), read_at: u64) {
        let deadline = Instant::now() + Duration::from_secs(ttls.1 as u64);
        let mut waiting = self.waiting.lock().unwrap();
        // Under the map's lock, so that a sweep's new bound accounts for this deadline.
        let mut due = self.waits_due.lock().unwrap();
        *due = Some(due.map_or(deadline, |d| d.min(deadline)));
        drop(due);
        waiting.insert(
            entry.id,
            WaitHere {
                ttls,
                rev: entry.mod_rev,
                lease: entry.lease,
                keys: keys.clone(),
                deadline,
                read_at,
            },
        );
    }

    /// Ends the grants and waits of this backend that nobody renewed for their TTL. The
    /// session they share is kept alive by this backend's other leases and waiters, so
    /// without this a permit abandoned in a process that lives on (its runtime ended, its
    /// keeper stopped) would outlive its TTL; a process that died or froze renews nothing,
    /// and etcd ends its session, records and all. The deadline counts from when the last
    /// renewal was *answered*, later than the holder's own bound (sent + TTL − margin), so
    /// a holder still within `valid_until` is never cut off.
    pub(super) async fn sweep(&self) -> Result<()> {
        let now = Instant::now();
        let held: Vec<(LeaseId, HeldHere)> = {
            let mut map = self.held.lock().unwrap();
            let overdue: Vec<LeaseId> = map
                .iter()
                .filter(|(_, h)| h.deadline < now)
                .map(|(id, _)| *id)
                .collect();
            overdue
                .into_iter()
                .filter_map(|id| map.remove(&id).map(|h| (id, h)))
                .collect()
        };
        // The waiters are looked through only once one may be overdue: every heartbeat and
        // acquire comes here (through `session`), and a scan of 10,000 waiters per call,
        // twice a heartbeat, was 200 million steps a second.
        let waits: Vec<(LeaseId, WaitHere)> = {
            let mut map = self.waiting.lock().unwrap();
            let mut due = self.waits_due.lock().unwrap();
            if due.is_none_or(|d| d >= now) {
                vec![]
            } else {
                let overdue: Vec<LeaseId> = map
                    .iter()
                    .filter(|(_, w)| w.deadline < now)
                    .map(|(id, _)| *id)
                    .collect();
                let overdue: Vec<(LeaseId, WaitHere)> = overdue
                    .into_iter()
                    .filter_map(|id| map.remove(&id).map(|w| (id, w)))
                    .collect();
                *due = map.values().map(|w| w.deadline).min();
                overdue
            }
        };
        for (id, h) in held {
            tracing::debug!(lease = %id, "etcd: ending a grant nobody renewed");
            self.end_grant(&h.keys, id, h.fence).await?;
        }
        for (id, w) in waits {
            tracing::debug!(lease = %id, "etcd: removing a waiter that stopped heartbeating");
            self.watches.stop(id);
            // Only while it still waits: a grant (a provisional one stays on the waiter's
            // session) wrote the record again.
            let key = w.keys.lease(id);
            let txn = Txn::new()
                .when([Compare::mod_revision(key.clone(), CompareOp::Equal, w.rev)])
                .and_then([TxnOp::delete(key, None), w.keys.drop_capacity_if_last(id)]);
            self.txn(txn).await?;
        }
        Ok(())
    }

    /// `id` waits no more through this backend (granted, gone, cancelled).
    pub(super) fn end_wait(&self, id: LeaseId) {
        self.watches.stop(id);
        self.waiting.lock().unwrap().remove(&id);
    }
}
