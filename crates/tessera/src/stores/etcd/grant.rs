//! The transactions that grant, hand off and end grants, and place a new acquire (see the
//! [store's docs](super) for why they never over-grant).

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use tessera_core::error::{Error, Result};
use tessera_core::model::*;

use super::conns::{revision, EtcdBackend, LONG_QUEUE};
use super::error::{is_lease_not_found, is_out_of_space};
use super::ops::{Entry, Joined, Keys, Place, Snapshot, DROP_OR_ATTACH_OPS};
use super::session::EtcdLease;

/// Read-decide-write rounds of one operation before it reports contention.
pub(super) const MAX_ROUNDS: usize = 64;

/// Reads and transactions a release tries to hand its permits off in before it just ends.
pub(super) const HAND_OFF_ROUNDS: usize = 4;

/// etcd's default `--max-txn-ops`: it refuses a transaction with more compares, or more
/// operations in either branch ("too many operations in txn request").
pub(super) const MAX_TXN_OPS: usize = 128;

impl EtcdBackend {
    /// The grant transaction: `entry` (waiting, seen in `snap`) takes the lowest free seats,
    /// on `holder` (a session kept alive after the caller's request was sent). `None` if
    /// the compares failed (someone changed the semaphore since `snap`): read again.
    pub(super) async fn claim(
        &self,
        keys: &Keys,
        snap: &Snapshot,
        entry: &Entry,
        holder: EtcdLease,
    ) -> Result<Option<Grant>> {
        let (Some(cap), Some(seats)) = (snap.capacity(), snap.free_seats(entry.record.w)) else {
            return Ok(None);
        };
        let now = StoreTime::host_now();
        let record = entry.record.granted(seats, now);
        let mut when = vec![
            Compare::mod_revision(keys.lease(entry.id), CompareOp::Equal, entry.mod_rev),
            keys.capacity_is(cap),
        ];
        when.extend(keys.seats_free(record.seats()));
        let mut ops = keys.grant_ops(entry.id, &record, holder.id)?;
        // A waiter granted alone (the holders ahead of it expired): a settled grant.
        ops.push(keys.attach_capacity_if_only(&[], entry.id, entry.mod_rev, holder.id));
        let txn = Txn::new().when(when).and_then(ops);
        let Some(resp) = self.txn_on(txn, &[holder]).await? else {
            return Ok(None);
        };
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(Some(self.granted(
            keys,
            &Entry::written(entry.id, record, revision(resp.header()), holder.id),
            now,
        )))
    }

    /// Ends a grant and hands its permits to the head of the queue in the same transaction
    /// (see the module docs): `true` if the record of `id` was still the grant of `fence`.
    /// Each waiter granted here gets its grant on its own client's session
    /// ([`Entry::hand_off_lease`]: provisionally the one of its queue entry); if that lease
    /// ended meanwhile, the grant is ended alone, and the waiter grants itself when its
    /// watch fires.
    pub(super) async fn end_grant(&self, keys: &Keys, id: LeaseId, fence: i64) -> Result<bool> {
        let mut seen = None;
        for _ in 0..HAND_OFF_ROUNDS {
            let snap = self.read(keys).await?;
            let rev = match snap.entry(id) {
                Some(e) if e.fence() == fence && e.is_holder() => e.mod_rev,
                _ => return Ok(false),
            };
            seen = Some((rev, snap.seats_of(id), snap.settled_left_after(id).cloned()));
            // One grant per transaction: its revision is its fence, so two grants in one
            // would share a fence. Waiters behind it that also fit grant themselves when
            // their watch sees this grant.
            let mut grants = snap.hand_off_after(id);
            grants.truncate(1);
            if grants.is_empty() {
                break;
            }
            let Some(cap) = snap.capacity() else { break };
            let now = StoreTime::host_now();
            let mut when = vec![
                Compare::mod_revision(keys.lease(id), CompareOp::Equal, rev),
                keys.capacity_is(cap),
            ];
            let freed = snap.seats_of(id);
            let mut ops = vec![TxnOp::delete(keys.lease(id), None)];
            // A seat this release frees and a grantee takes is overwritten, not deleted
            // (one transaction may not both delete and put a key).
            let taken: Vec<u32> = grants.iter().flat_map(|(_, s)| s.iter().copied()).collect();
            ops.extend(
                freed
                    .iter()
                    .filter(|s| !taken.contains(s))
                    .map(|&s| TxnOp::delete(keys.seat(s), None)),
            );
            for (w, seats) in &grants {
                when.push(Compare::mod_revision(
                    keys.lease(w.id),
                    CompareOp::Equal,
                    w.mod_rev,
                ));
                // Seats this release frees are free at commit; the others must be.
                let others: Vec<u32> = seats
                    .iter()
                    .copied()
                    .filter(|s| !freed.contains(s))
                    .collect();
                when.extend(keys.seats_free(&others));
                ops.extend(keys.grant_ops(
                    w.id,
                    &w.record.handed_off(seats.clone(), now),
                    w.hand_off_lease(),
                )?);
            }
            // A release and a hand-off of two heavy leases may not fit one transaction: the
            // grant is then ended alone, and the head grants itself when its watch fires.
            if when.len() > MAX_TXN_OPS || ops.len() > MAX_TXN_OPS {
                break;
            }
            // A grantee left alone and settled at once (not provisional): the capacity key
            // goes on its etcd lease, if the transaction has room (a provisional one's
            // first renewal does it).
            if let [(w, seats)] = grants.as_slice() {
                let settled = !w.record.handed_off(seats.clone(), now).is_provisional();
                let alone = snap.entries.len() == 2;
                let room = when.len().max(ops.len() + 1) + 5 <= MAX_TXN_OPS;
                if settled && alone && room && w.hand_off_lease() != 0 {
                    ops.push(keys.attach_capacity_if_only(
                        &[id],
                        w.id,
                        w.mod_rev,
                        w.hand_off_lease(),
                    ));
                }
            }
            let txn = Txn::new().when(when).and_then(ops);
            match self
                .call(|mut c| {
                    let txn = txn.clone();
                    async move { c.txn(txn).await }
                })
                .await
            {
                Ok(r) if r.succeeded() => return Ok(true),
                Ok(_) => continue,
                // A grantee's session ended: end the grant alone.
                Err(e) if is_lease_not_found(&e) => break,
                // A cluster over its space quota refuses the grant's puts, not the deletes:
                // end the grant alone; the head's own grant then meets the full cluster.
                Err(e) if is_out_of_space(&e) => break,
                Err(e) => return Err(self.err(e)),
            }
        }
        self.end_grant_alone(keys, id, fence, seen).await
    }

    /// Ends a grant without a hand-off: `true` if the record was still the grant of
    /// `fence`. `seen`: its mod revision and seats as just read, if it was, and the settled
    /// grant it leaves alone, if so (the capacity key goes on that one's etcd lease).
    pub(super) async fn end_grant_alone(
        &self,
        keys: &Keys,
        id: LeaseId,
        fence: i64,
        mut seen: Option<(i64, Vec<u32>, Option<Entry>)>,
    ) -> Result<bool> {
        for _ in 0..HAND_OFF_ROUNDS {
            let (rev, seats, left) = match seen.take() {
                Some(s) => s,
                None => match self.read_one(keys, id).await? {
                    Some(e) if e.fence() == fence && e.is_holder() => {
                        (e.mod_rev, e.record.seats().to_vec(), None)
                    }
                    _ => return Ok(false),
                },
            };
            let mut ops = vec![TxnOp::delete(keys.lease(id), None)];
            ops.extend(seats.iter().map(|&s| TxnOp::delete(keys.seat(s), None)));
            // etcd counts a nested transaction's compares against what the outer one leaves:
            // a release of a lease too heavy for the attach leaves the capacity key's lease
            // as it is.
            ops.push(match left {
                Some(l) if ops.len() + 1 + DROP_OR_ATTACH_OPS <= MAX_TXN_OPS => {
                    keys.drop_capacity_if_last_else_attach(id, &l)
                }
                _ => keys.drop_capacity_if_last(id),
            });
            let txn = Txn::new()
                .when([Compare::mod_revision(keys.lease(id), CompareOp::Equal, rev)])
                .and_then(ops);
            if self.txn(txn).await?.succeeded() {
                return Ok(true);
            }
            // Changed since the read (a provisional grant moved): read again.
        }
        Ok(false)
    }

    /// Deletes a waiting record if it is still as read; `true` if it was. `left`: the
    /// settled grant it leaves alone, if known (the capacity key goes on its etcd lease).
    pub(super) async fn dequeue(
        &self,
        keys: &Keys,
        entry: &Entry,
        left: Option<&Entry>,
    ) -> Result<bool> {
        let ops = vec![
            TxnOp::delete(keys.lease(entry.id), None),
            match left {
                Some(l) => keys.drop_capacity_if_last_else_attach(entry.id, l),
                None => keys.drop_capacity_if_last(entry.id),
            },
        ];
        let txn = Txn::new()
            .when([Compare::mod_revision(
                keys.lease(entry.id),
                CompareOp::Equal,
                entry.mod_rev,
            )])
            .and_then(ops);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// Places the record `entry` that this acquire's transaction just wrote, from what that
    /// transaction read (`joined`: counts, seats, the tail) and, behind other waiters in a
    /// queue shorter than [`LONG_QUEUE`], one read of the record the tail named: what it
    /// sends does not grow with the queue. `None` when that is not enough to decide, and
    /// the caller reads the semaphore.
    ///
    /// - Every record weighs at least 1, so with `records - 1` records ahead of it a record
    ///   that `records - 1 + w` would not fit into `capacity` cannot fit; one that might is
    ///   decided on the records (`None`).
    /// - Its position is the records ahead less the leases holding seats.
    /// - At position 0 it is the head and watches the queue. Behind, it watches the record
    ///   the tail named: it joined before this one, so it is ahead; while it waits, this
    ///   one cannot fit before it does, and it then grants itself (a put the watch sees) or
    ///   leaves (a deletion). It is the waiter just ahead unless a client of an earlier
    ///   version, which writes no tail, joined in between; watching one further ahead only
    ///   wakes this waiter later to read the semaphore, from which it watches the one just
    ///   ahead. In a queue of [`LONG_QUEUE`] records or more, whether that record still
    ///   waits is not read here but by the watch, once its watchers have started, in the
    ///   one read it makes anyway to cover the joins between this transaction and its start
    ///   (`notify.rs`): a tail that names a holder or a record gone wakes the waiter there,
    ///   to read the semaphore. (Reading it here as well made a join three requests, and
    ///   kept one of the joins in flight waiting for it.) In a shorter queue, where the
    ///   waiter that joined last is often granted already (a lock handed from client to
    ///   client), it is read here, and one that no longer waits makes the caller read the
    ///   semaphore at once rather than start a watch to learn it. A tail that names nothing,
    ///   a holder or a record gone: `None`.
    pub(super) async fn join(
        &self,
        name: &Name,
        keys: &Keys,
        req: &AcquireRequest,
        capacity: u32,
        (entry, joined): (&Entry, &Joined),
        (holder, waiter_ttl): (EtcdLease, i64),
    ) -> Result<Option<AcquireReply>> {
        let ahead = joined.records.saturating_sub(1);
        if ahead + u64::from(req.weight) <= u64::from(capacity) {
            return Ok(None);
        }
        let position = ahead.saturating_sub(joined.holders);
        let refuse = match req.wait {
            None => None,
            Some(w) if position >= u64::from(w.queue_cap) => Some(w.queue_cap),
            Some(_) => {
                let tail = if position == 0 {
                    None
                } else {
                    let Some(tail) = joined.tail.filter(|&t| t != entry.id) else {
                        return Ok(None);
                    };
                    Some(tail)
                };
                match tail {
                    None => self.watch_after(keys, joined.revision, None, entry.id),
                    Some(tail) if joined.records >= LONG_QUEUE => {
                        self.watch_tail(keys, joined.revision, tail, entry.id)
                    }
                    Some(tail) => match self.read_one(keys, tail).await? {
                        // A waiting record is written again only by its grant, so the one
                        // read here was as it is now at the transaction's revision too.
                        Some(t) if !t.is_holder() => {
                            self.watch_after(keys, joined.revision, Some(t.id), entry.id)
                        }
                        _ => return Ok(None),
                    },
                }
                self.note_waiting(entry, keys, (holder.ttl, waiter_ttl), 0);
                return Ok(Some(AcquireReply::Queued { position }));
            }
        };
        // A try that cannot fit, or a queue at its cap: the record goes again. With one
        // record ahead, that one may be left alone (`Snapshot::settled_left_after`).
        if ahead < 2 || !self.dequeue(keys, entry, None).await? {
            return Ok(None);
        }
        match refuse {
            Some(cap) => Err(Error::QueueFull {
                name: name.to_string(),
                cap,
            }),
            None => Ok(Some(AcquireReply::NoPermit {
                available: capacity.saturating_sub(joined.seats.min(u64::from(u32::MAX)) as u32),
                queued: position,
            })),
        }
    }

    /// The rest of an acquire whose waiting record was written in this call, seen in
    /// `snap`: grant it if it fits, refuse a try that does not, or leave it queued.
    pub(super) async fn place_new(
        &self,
        name: &Name,
        keys: &Keys,
        snap: &Snapshot,
        req: &AcquireRequest,
        holder: EtcdLease,
        waiter_ttl: i64,
    ) -> Result<Option<AcquireReply>> {
        let id = req.lease_id;
        let (
            Some(entry),
            Place::Waiting {
                position,
                fits,
                ahead,
            },
        ) = (snap.entry(id), snap.place(id))
        else {
            return Ok(None);
        };
        if fits {
            return Ok(self
                .claim(keys, snap, entry, holder)
                .await?
                .map(AcquireReply::Granted));
        }
        let refuse = match req.wait {
            None => None,
            Some(w) if position >= u64::from(w.queue_cap) => Some(w.queue_cap),
            Some(_) => {
                self.note_waiting(entry, keys, (holder.ttl, waiter_ttl), 0);
                self.watch(keys, snap, ahead, id);
                return Ok(Some(AcquireReply::Queued { position }));
            }
        };
        // A try that does not fit, or a queue at its cap: the record goes again.
        if !self
            .dequeue(keys, entry, snap.settled_left_after(id))
            .await?
        {
            return Ok(None);
        }
        match refuse {
            Some(cap) => Err(Error::QueueFull {
                name: name.to_string(),
                cap,
            }),
            None => {
                let cap = snap.capacity().unwrap_or(0);
                Ok(Some(AcquireReply::NoPermit {
                    available: cap.saturating_sub(snap.used()),
                    queued: snap.waiters().saturating_sub(1),
                }))
            }
        }
    }
}
