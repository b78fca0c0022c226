//! The etcd store (`etcd://`, `etcds://` for TLS): consensus-backed semaphores.
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]…][/prefix]
//! etcds://[user:password@]host[:port][,…][/prefix][?ca=FILE][&cert=FILE&key=FILE][&domain=NAME]
//! ```
//!
//! - Several endpoints: the client talks to one member at a time and moves to the next
//!   when it dies or stops answering (each request attempt is bounded by 2 s), so it goes
//!   on through the loss of a member, or of its own connection to one. The port defaults
//!   to 2379.
//! - `user:password` (percent-encoded) authenticates with etcd's auth; the password never
//!   appears in a message. An expired token (idle past `--auth-token-ttl`, or a JWT's end)
//!   is renewed on the request that finds it refused.
//! - `prefix` (default `tessera`; `A-Z a-z 0-9 . _ -` and inner `/`) roots every key, so
//!   tenants sharing a cluster are isolated (with etcd roles granting `prefix/` only).
//! - `etcds://`: TLS (rustls). `ca` is the PEM file of the CA that signed the members'
//!   certificates (default: none, so give it), `cert` and `key` a client certificate for
//!   etcd's `--client-cert-auth`, `domain` the name the certificates are checked against.
//!
//! Cargo feature `etcd`; building it needs `protoc` (Debian: `protobuf-compiler`), which this
//! repository brings itself (`scripts/protoc`, see `.cargo/config.toml`).
//!
//! # Implementation details
//!
//! The semaphore lives in etcd's keyspace (layout in [`ops`]): one record per acquire,
//! `q/<lease id>`, holding the request and, once granted, its seats; one key per held seat;
//! the capacity. Every expiry is an etcd lease expiring on the cluster's leader: no clock of
//! a client decides anything.
//!
//! - **Sessions.** Each client (one [`EtcdBackend`]) keeps one etcd lease per TTL, as
//!   etcd's own `concurrency` sessions do: waiting records sit on the session of the waiter
//!   TTL, granted records and their seats on the session of the lease TTL. Heartbeats and
//!   renewals keep them alive (a keep-alive on the lease's stream is not a Raft write);
//!   callers that ask together share one keep-alive sent after the last of them asked
//!   (`session.rs`), so thousands of waiters cost one exchange per round trip. A
//!   client that crashes or freezes renews nothing, and etcd ends its sessions with every
//!   record on them, atomically. A grant or wait that nobody in a live client renews for its
//!   TTL is ended by that client's next operation (see `sweep`), so it does not live on
//!   the session other leases keep alive.
//! - **Order** is the create revision of the `q/` record. A waiter may be granted when the
//!   weights of *all* records created before it (holders and waiters) plus its own fit the
//!   capacity: strict FIFO, and a large request at the head is never overtaken.
//! - **A grant** is one transaction that compares the waiter's record (its mod revision:
//!   still there, still waiting), the capacity (its value) and each seat it takes (absent),
//!   then puts the record with its seats and the seat keys on the holder's session. A
//!   conflict fails the compares; the caller reads again and retries. The **fence** is that
//!   transaction's revision (the record's mod revision, never written again while it holds):
//!   etcd's revision never goes back, across leader changes and the loss of members. One
//!   transaction grants at most one lease, so no two grants share a fence.
//! - **Never over-grant.** Take the granted record created last, `G`. When `G` was granted,
//!   the records created before it, plus `G`, fitted the capacity, which the grant compared.
//!   Every record granted now was created no later than `G` and existed then (a record is
//!   never created again with an old revision), so the holders now weigh no more than then.
//!   A resize changes the capacity value, so a grant decided on the old one fails.
//! - **Hand-off.** An uncontended acquire is granted in its first transaction (which
//!   compares that no `q/` record exists at all). A release reads the semaphore and, in one
//!   transaction, deletes its record and seats and grants the head of the queue if it fits.
//!   Permits freed without a release (a session that ended, a waiter that left) reach the
//!   queue in the *next* step: the woken head grants itself ([`HandOff::NextStep`] is what
//!   the store declares).
//! - **A hand-off grant is provisional** (the contract's rule, as on every store): the
//!   release puts it, record and seats, on the etcd lease the head's queue entry is on, its
//!   client's session of the *waiter* TTL, so a waiter whose process died in the queue gives
//!   the permits back when that session ends, within its waiter TTL, not its lease TTL. The
//!   holder's first renewal (its keeper's, 100 ms after the grant) moves record and seats,
//!   in one transaction compared on the record's mod revision, to its session of the lease
//!   TTL. The move writes the record again, so it keeps the grant's revision, the fence, in
//!   the record (`ops::Granted::f`); every step that ends a grant knows it by that fence and
//!   compares the mod revision it just read. A waiter whose waiter TTL is not below its
//!   lease TTL, or whose record was written by a client before this (no `wt`), is granted
//!   on its client's session of the lease TTL (named in its record), as before.
//! - **Joining the queue** costs the same at any length: the acquire's transaction writes
//!   the record and reads only the number of records, the seats (at most the capacity) and
//!   the tail key (the record that joined last; `ops.rs`). A record with more records ahead
//!   than the capacity leaves room for cannot fit; its position is the records ahead less
//!   the holders; behind other waiters it watches the one the tail names, unread: its
//!   watch checks that it still waits in the one read it makes once started (see
//!   `EtcdBackend::join`, `notify.rs`), so a join costs two requests. Only a record that
//!   might fit, or a tail that names no waiter, reads the semaphore. Reading the whole
//!   queue on every join made one process queue 171 waiters in 90 s where it asked for
//!   10,000 (`s10-reclaim`). What etcd does for a join still grows with the queue where a
//!   range is involved: its count of the records, and the uncontended grant's compare
//!   that no record exists, which etcd 3.4 evaluates by reading every record. A client
//!   that just found a queue long (`EtcdBackend::long_queue`) sends the join without that
//!   branch.
//! - **Waking.** Each waiter watches only what can let it in: the head watches deletions of
//!   `q/` records and the capacity; every other waiter the waiter just ahead of it (its grant
//!   makes this one the head; its deletion moves this one up). A release wakes one waiter,
//!   not the queue. A woken waiter's heartbeat re-reads the semaphore, its own record and its
//!   leases before it believes or makes a grant (the mutex recipe's known fault is to trust
//!   a watch event without re-reading). The watchers of every waiter of one backend share
//!   one watch stream; after a disconnect they are created again on the next one, and a
//!   waiter that may have missed something (or whose watch the server ended) is woken to
//!   read again (see `notify.rs`); the heartbeat, every `min(waiter TTL/3, TTL/4)`, is the
//!   safety net.
//! - **Leases are whole seconds, at least 2 s** ([`Capabilities::min_ttl`],
//!   [`Capabilities::ttl_granularity`]): a semaphore with a shorter or fractional TTL is
//!   refused at [`crate::Semaphore::new`] with [`crate::InvalidInput::Ttl`] (etcd would
//!   silently raise a TTL below its minimum, and a holder must not believe a TTL the store
//!   does not keep). The seam's calls round a TTL up to whole seconds, at least 2.
//! - **Renewal** is a keep-alive of the session (its TTL restarts when etcd receives it) and
//!   a read of the record in the same round trip: the reply says `expires_at - now` = the
//!   TTL, so the keeper's "certainly valid until the send time + TTL − margin" holds. Every
//!   grant is preceded by a keep-alive of its session sent after the caller's request, so
//!   the first bound holds too (for a provisional grant, the waiter session's keep-alive by
//!   the waiter's last heartbeat). A revoked, deleted or expired grant answers `Gone`. The
//!   first renewal of a provisional grant is its move (above), on a session kept alive after
//!   the renewal was sent.
//! - **Member loss.** Requests go to one member named in the URL at a time (`members.rs`);
//!   one that cannot reach its member, or gets no answer within 2 s, is sent again on the
//!   next member, which every operation allows: writes are transactions whose compares fail
//!   when run twice, and callers read again. Keep-alive streams are reopened on the next
//!   member when an exchange fails or times out, and the watch stream follows the backend
//!   to its new member, each watcher checked against the read its waiter decided on (see
//!   `notify.rs`).
//!
//! # Files
//!
//! `url.rs` parses the URL, `error.rs` maps the client's errors, `conns.rs` connects and
//! sends requests (`members.rs`: which member), `session.rs` keeps this client's sessions
//! and renews grants, `ops.rs` lays out the keys and records, `grant.rs` holds the
//! transactions that grant, hand off and end grants, `held.rs` what this backend holds and
//! waits on, `notify.rs` the waiters' watches; this file is the [`Backend`] glue.
//!
//! # How each Backend operation maps
//!
//! | operation | etcd |
//! |---|---|
//! | `acquire` | keep-alive of the sessions; one transaction: grant at once if the queue is empty (not tried onto a queue this client just found long), else write the record and read the count of records, the seats and the tail; a waiter that cannot fit and is behind others: nothing more (its watch, once started, reads the record the tail names and its own); otherwise (it may fit, or the tail does not name a waiter) a read of the semaphore, then a grant transaction if it fits |
//! | `heartbeat` | while its watch is quiet (`notify.rs`), keep-alives of the sessions only (shared with the other callers); otherwise keep-alives and a read of the semaphore, then a grant transaction if it fits |
//! | `cancel` | (a marker first if an acquire of this id was dropped on its way) read the record; delete it if waiting, end the grant if granted (compared on its mod revision) |
//! | `release`, `revoke` | read, then one transaction: delete the record and seats, grant the head |
//! | `renew` | keep-alive + read of the record; a provisional grant: read, keep-alive, one transaction that moves it |
//! | `status` | one read, one time-to-live per etcd lease the records are on (a client's records share its sessions) |
//! | `resize` | put the capacity, compared on its mod revision (wakes the head) |
//! | `delete` | delete every key of the semaphore (records, seats, capacity) |
//!
//! Where the seam's model does not map one to one:
//!
//! - The **queue cap** is checked on the snapshot of the acquire's own transaction (the
//!   waiters created before it), so it is exact for that acquire.
//! - **Capacity**: an idle semaphore (no `q/` record) takes the capacity of the next
//!   acquire, as on every store, in a transaction that compares the queue empty. A release,
//!   cancel, revoke or purge that removes the last record deletes the capacity key in the
//!   same transaction (a nested one that compares the rest of the queue empty,
//!   `Keys::drop_capacity_if_last`), so a semaphore nobody holds or waits on leaves no key.
//!   A record can also go by expiry (its client died), with no step of tessera's; so while
//!   the only record is a settled grant, the capacity key is on that grant's etcd lease
//!   (`Keys::capacity_on`), and etcd deletes both together. The grant that finds the queue
//!   empty puts it there; the acquire that writes a second record takes it off (on no lease:
//!   it must outlive the first client); a step that leaves one settled grant alone (a
//!   release or a try that leaves, a waiter granted alone, a hand-off's first renewal) puts
//!   it back on that grant's lease (`Keys::attach_capacity_if_only`, compared on the rest of
//!   the queue empty). A resize keeps the key's lease. The key (a few bytes) still stays
//!   after a crash when the records before the last one also ended without a step that
//!   saw the last alone (two holders dying, or a waiter's timed-out cancel, which reads only
//!   its own record, leaving one holder that then dies): until the name's next acquire, or
//!   `delete`.
//! - **Waiter TTL** is per client: all waiters of one client share one session, so a client
//!   that dies loses them all within the waiter TTL; one waiter that stops heartbeating in a
//!   live client is removed by that client's next operation after its TTL.
//! - **Hand-off**: a head waiter whose client froze or died is still granted by a release,
//!   provisionally, on the session of its queue entry, which then runs out within the
//!   waiter TTL; a grant whose move is still to come lives on that session for as long as
//!   its client keeps the session alive for other waiters.
//! - **Leader changes**: a new leader restarts every lease at its full TTL, so a crashed
//!   holder's permit can come back up to one TTL (plus the election) later than its TTL
//!   after the crash. The bound is 2 × TTL + 3 × election timeout from the crash. Measured
//!   on a local 3-member cluster (election timeout 500 ms, TTL 3 s, the holder's process and
//!   the leader SIGKILLed together, a waiter on another client): the permit came back after
//!   4.2–5.2 s in six runs (bound 7.5 s; test
//!   `a_killed_holder_and_leader_give_the_permit_back_within_the_documented_bound`). Holders
//!   are not affected (their leases only get longer).
//! - **No rate limiter.** etcd has no clock that a transaction can read (a transaction
//!   compares and writes keys; only lease expiry runs on the leader's clock, in whole
//!   seconds), so "never more than N in any window of length L" cannot be decided on the
//!   store's clock, and deciding it on clients' clocks would let their skew over-admit.
//!   [`crate::Store::rate_limiter`] on etcd fails with [`crate::Error::Unsupported`]
//!   saying so ([`RATE_UNSUPPORTED`], through `Backend::rate_unsupported`).
//! - **Cancel of an acquire dropped on its way**: etcd runs requests of one connection
//!   concurrently, so a cancel's read can overtake the acquire's write; the cancel writes a
//!   marker first, which every acquire transaction compares absent.
//!
//! [`HandOff::NextStep`]: tessera_core::seam::HandOff::NextStep

mod conns;
mod error;
mod grant;
mod held;
mod members;
mod notify;
pub(crate) mod ops;
mod session;
pub(crate) mod url;

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};

use tessera_core::error::{Error, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{Backend, Capabilities, FenceSource, HandOff};
use tessera_core::wake;

use conns::revision;
pub use conns::EtcdBackend;
use grant::{MAX_ROUNDS, MAX_TXN_OPS};
use ops::{lease_secs, Entry, Joined, Keys, Place, Record, Snapshot, MIN_LEASE_SECS};
use session::EtcdLease;

/// How long a cancel's marker (see [`EtcdBackend::cancel`]) outlives the request it stops.
const MARKER_TTL: i64 = 30;

/// Unfinished cancels tried again per acquire or heartbeat (see [`EtcdBackend::finish_cancels`]).
const UNFINISHED_PER_CALL: usize = 16;

impl EtcdBackend {
    /// [`Backend::acquire`], once this call is noted as under way.
    /// One attempt of [`Backend::cancel`].
    async fn cancel_once(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        let keys = self.keys(name);
        // Stays pending until the marker is written, so that a retry writes it.
        let dropped = self.pending.lock().unwrap().contains_key(&lease);
        if dropped {
            let mut done = false;
            for _ in 0..3 {
                let marker_lease = self.session(MARKER_TTL).await?;
                let put = Txn::new().and_then([TxnOp::put(
                    keys.marker(lease),
                    "",
                    Some(PutOptions::new().with_lease(marker_lease.id)),
                )]);
                if self.txn_on(put, &[marker_lease]).await?.is_some() {
                    done = true;
                    break;
                }
            }
            if !done {
                return Err(Error::store(
                    StoreErrorKind::Connection,
                    "etcd: could not write the cancel marker",
                ));
            }
            self.pending.lock().unwrap().remove(&lease);
        }
        self.end_wait(lease);
        self.held.lock().unwrap().remove(&lease);
        for _ in 0..MAX_ROUNDS {
            let Some(entry) = self.read_one(&keys, lease).await? else {
                return Ok(CancelReply::NotFound);
            };
            if entry.is_holder() {
                if self.end_grant(&keys, lease, entry.fence()).await? {
                    return Ok(CancelReply::Released);
                }
            } else if self.dequeue(&keys, &entry, None).await? {
                return Ok(CancelReply::Dequeued);
            }
            // Changed since the read (granted meanwhile): read again.
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            format!("etcd: cancel on {name} kept conflicting with other clients"),
        ))
    }

    /// Tries the cancels that did not finish again (see [`EtcdBackend::unfinished`]), a few
    /// per call; one that fails again stays for the next call.
    async fn finish_cancels(&self) {
        let due: Vec<(LeaseId, Name)> = {
            let unfinished = self.unfinished.lock().unwrap();
            if unfinished.is_empty() {
                return;
            }
            unfinished
                .iter()
                .take(UNFINISHED_PER_CALL)
                .map(|(l, n)| (*l, n.clone()))
                .collect()
        };
        for (lease, name) in due {
            if let Err(e) = Backend::cancel(self, &name, lease).await {
                tracing::debug!(%name, %lease, error = %e, "an unfinished cancel failed again");
                return;
            }
        }
    }

    async fn acquire_inner(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        let keys = self.keys(name);
        let id = req.lease_id;
        let now = StoreTime::host_now();
        let mut record = Record {
            w: req.weight,
            h: req.holder.clone(),
            ttl: lease_secs(req.ttl),
            e: now.0,
            hl: 0,
            wt: 0,
            g: None,
        };
        let waiter_ttl = req.wait.map(|w| lease_secs(w.waiter_ttl));
        let first_seats: Vec<u32> = (0..req.weight).collect();
        let get_all = || TxnOp::get(keys.all.clone(), Some(GetOptions::new().with_prefix()));
        // What a new record needs to know of the queue it joins, read in its own
        // transaction without reading the records (see `EtcdBackend::join`).
        let joined_reads = || {
            [
                TxnOp::get(
                    keys.queue.clone(),
                    Some(GetOptions::new().with_prefix().with_count_only()),
                ),
                TxnOp::get(keys.seats(), Some(GetOptions::new().with_prefix())),
            ]
        };
        // Whether an earlier round of this call wrote the waiting record.
        let mut wrote = false;
        for _ in 0..MAX_ROUNDS {
            // The sessions, kept alive now: a grant's TTL runs from after this call began.
            let (holder, waiter) = match waiter_ttl {
                Some(ws) => {
                    let (h, w) = tokio::join!(self.session(record.ttl), self.session(ws));
                    (h?, w?)
                }
                None => {
                    let h = self.session(record.ttl).await?;
                    (h, h)
                }
            };
            record.hl = holder.id;
            // Only a record that waits (on the waiter's session) is handed a grant.
            record.wt = if waiter_ttl.is_some() { waiter.ttl } else { 0 };
            let granted = record.granted(first_seats.clone(), now);
            // Granted at once if nobody holds or waits; otherwise (same capacity, record
            // not written yet) the record is written and the semaphore read, in one step.
            let mut when = vec![
                keys.capacity_is(capacity),
                keys.queue_is_empty(),
                keys.not_cancelled(id),
            ];
            when.extend(keys.seats_free(&first_seats));
            let nested = Txn::new()
                .when([
                    keys.capacity_is(capacity),
                    Compare::create_revision(keys.lease(id), CompareOp::Equal, 0),
                    keys.not_cancelled(id),
                ])
                .and_then([
                    TxnOp::put(
                        keys.lease(id),
                        record.encode()?,
                        Some(PutOptions::new().with_lease(waiter.id)),
                    ),
                    // A second record: the capacity must outlive the first one's lease.
                    keys.capacity_shared(capacity),
                    TxnOp::put(
                        keys.tail.clone(),
                        id.to_string(),
                        Some(PutOptions::new().with_lease(waiter.id)),
                    ),
                ])
                .or_else([get_all()]);
            // The only record: the capacity key goes on its etcd lease (`Keys::capacity_on`);
            // a tail left by records gone meanwhile goes.
            let mut ops = keys.grant_ops(id, &granted, holder.id)?;
            ops.push(keys.capacity_on(capacity, holder.id));
            ops.push(TxnOp::delete(keys.tail.clone(), None));
            // The tail is read before the nested transaction replaces it. etcd counts these
            // reads against the outer transaction (W + 3 compares leave room for them), not
            // against the nested one, whose room is what `MAX_WEIGHT` is built on.
            let [count, seats] = joined_reads();
            let join = [
                TxnOp::get(keys.tail.clone(), None),
                TxnOp::txn(nested),
                count,
                seats,
            ];
            // Onto a queue this client just found long, the join alone, without the
            // uncontended grant's compare of the whole queue (`EtcdBackend::long_queue`).
            let long = self.long_queue(&keys);
            let txn = if long {
                Txn::new().and_then(join)
            } else {
                Txn::new().when(when).and_then(ops).or_else(join)
            };
            let Some(resp) = self.txn_on(txn, &[holder, waiter]).await? else {
                continue;
            };
            if resp.succeeded() && !long {
                let fence = revision(resp.header());
                return Ok(AcquireReply::Granted(self.granted(
                    &keys,
                    &Entry::written(id, granted.clone(), fence, holder.id),
                    now,
                )));
            }
            let snap = match Joined::parse(&keys, &resp)? {
                Ok(joined) => {
                    wrote = true;
                    self.note_queue(&keys, joined.records);
                    let entry = Entry {
                        create_rev: joined.revision,
                        ..Entry::written(id, record.clone(), joined.revision, waiter.id)
                    };
                    let placed = self
                        .join(
                            name,
                            &keys,
                            req,
                            capacity,
                            (&entry, &joined),
                            (holder, waiter.ttl),
                        )
                        .await?;
                    match placed {
                        Some(reply) => return Ok(reply),
                        // Not decided without the records: read them all.
                        None => self.read(&keys).await?,
                    }
                }
                Err(snap) => snap,
            };
            if snap.cancelled.contains(&id) {
                return Err(Error::store(
                    StoreErrorKind::Other,
                    format!("etcd: the acquire of {id} on {name} was cancelled"),
                ));
            }
            if let Some(entry) = snap.entry(id) {
                match snap.place(id) {
                    Place::Absent => unreachable!("the entry exists"),
                    // A retry of an acquire whose reply was lost (by the caller, or by this
                    // call when a request was sent again): what it already has.
                    Place::Holder => match self.existing_grant(&keys, entry).await? {
                        Some(grant) => return Ok(AcquireReply::Granted(grant)),
                        None => continue,
                    },
                    // Written in this call (this round, or an earlier one whose grant
                    // conflicted), or a try's record some earlier call left: decide it.
                    Place::Waiting { .. } if wrote || req.wait.is_none() => {
                        let placed = self
                            .place_new(name, &keys, &snap, req, holder, waiter.ttl)
                            .await?;
                        match placed {
                            Some(reply) => return Ok(reply),
                            None => continue,
                        }
                    }
                    Place::Waiting {
                        position, ahead, ..
                    } => {
                        self.note_waiting(entry, &keys, (record.ttl, waiter.ttl), 0);
                        self.watch(&keys, &snap, ahead, id);
                        return Ok(AcquireReply::Queued { position });
                    }
                }
            }
            match snap.capacity() {
                Some(stored) if stored != capacity && !snap.entries.is_empty() => {
                    return Err(Error::CapacityMismatch {
                        name: name.to_string(),
                        stored,
                        declared: capacity,
                    });
                }
                // Capacity as declared and the record not there: it changed meanwhile.
                Some(stored) if stored == capacity => continue,
                // No capacity yet, or an idle semaphore: this client's capacity, and the
                // grant, in one step, if the queue is still empty.
                _ => {
                    let seen = snap.capacity.map_or(0, |(_, rev)| rev);
                    let mut when = vec![
                        Compare::mod_revision(keys.cap.clone(), CompareOp::Equal, seen),
                        keys.queue_is_empty(),
                        keys.not_cancelled(id),
                    ];
                    when.extend(keys.seats_free(&first_seats));
                    let mut ops = vec![keys.capacity_on(capacity, holder.id)];
                    ops.extend(keys.grant_ops(id, &granted, holder.id)?);
                    ops.push(TxnOp::delete(keys.tail.clone(), None));
                    let txn = Txn::new().when(when).and_then(ops);
                    if let Some(resp) = self.txn_on(txn, &[holder]).await? {
                        if resp.succeeded() {
                            let fence = revision(resp.header());
                            return Ok(AcquireReply::Granted(self.granted(
                                &keys,
                                &Entry::written(id, granted.clone(), fence, holder.id),
                                now,
                            )));
                        }
                    }
                }
            }
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            format!("etcd: acquire on {name} kept conflicting with other clients"),
        ))
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        self.finish_cancels().await;
        let id = req.lease_id;
        // A few joins at a time: the rest wait here, not in etcd's queue, where the
        // renewals, heartbeats and reads of this client and of every other would wait
        // behind them (10,000 acquires sent at once kept a status read of another client
        // unanswered past its retries).
        let _turn = self.joins.acquire().await;
        self.pending.lock().unwrap().insert(id, ());
        let outcome = self.acquire_inner(name, capacity, req).await;
        // Not reached if the caller dropped this call: the entry stays for its cancel.
        self.pending.lock().unwrap().remove(&id);
        outcome
    }

    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        self.finish_cancels().await;
        let keys = self.keys(name);
        let (known, quiet) = {
            let waiting = self.waiting.lock().unwrap();
            let w = waiting.get(&lease);
            let quiet = w
                .filter(|w| self.watches.quiet_since(lease, w.read_at))
                .map(|w| w.lease);
            (w.map(|w| w.ttls), quiet)
        };
        if let (Some((hs, ws)), Some(on)) = (known, quiet) {
            // Nothing that can let it in happened since the last read, and its own record
            // was neither written (a grant) nor deleted: its watch, which reports both, is
            // quiet (`notify.rs`). The sessions are kept alive (keep-alives shared with the
            // other callers, no read): a record on the waiter session just kept alive waits
            // on; a session that ended and was replaced takes the full read below.
            let (h, w) = tokio::join!(self.session(hs), self.session(ws));
            let w = (h?, w?).1;
            if w.id == on {
                if let Some(here) = self.waiting.lock().unwrap().get_mut(&lease) {
                    here.deadline = Instant::now() + Duration::from_secs(ws as u64);
                }
                return Ok(WaitReply::Waiting);
            }
        }
        for _ in 0..MAX_ROUNDS {
            let read_at = self.watches.now();
            // The read, and this backend's sessions kept alive, in one round trip: the
            // waiter session (the heartbeat renews the waiting record) and the holder session
            // (a grant below runs on it).
            let (snap, sessions) = match known {
                Some((hs, ws)) => {
                    let (snap, h, w) =
                        tokio::join!(self.read(&keys), self.session(hs), self.session(ws));
                    (snap?, Some((h?, w?)))
                }
                None => (self.read(&keys).await?, None),
            };
            let Some(entry) = snap.entry(lease) else {
                self.end_wait(lease);
                return Ok(WaitReply::Gone);
            };
            match snap.place(lease) {
                Place::Absent => unreachable!("the entry exists"),
                Place::Holder => {
                    let renewed: Vec<EtcdLease> = sessions.map_or(vec![], |(h, w)| vec![h, w]);
                    return Ok(
                        match self.existing_grant_after(&keys, entry, &renewed).await? {
                            Some(grant) => WaitReply::Granted(grant),
                            None => {
                                self.end_wait(lease);
                                WaitReply::Gone
                            }
                        },
                    );
                }
                Place::Waiting { fits: true, .. } => {
                    // Re-read above: the record is there and waiting, so the lease under it
                    // lives; the grant compares that it is unchanged since.
                    let holder = match sessions {
                        Some((h, _)) => h,
                        None => self.session(entry.record.ttl).await?,
                    };
                    match self.claim(&keys, &snap, entry, holder).await? {
                        Some(grant) => return Ok(WaitReply::Granted(grant)),
                        None => continue,
                    }
                }
                Place::Waiting { ahead, .. } => {
                    // Its waiter lease must live on: renewed here if it is this backend's
                    // session, else (a heartbeat through another connection) directly.
                    let renewed = match sessions {
                        Some((_, w)) if w.id == entry.lease => true,
                        _ => self.keep_alive(entry.lease).await?,
                    };
                    if !renewed {
                        self.end_wait(lease);
                        return Ok(WaitReply::Gone);
                    }
                    let ws = known.map_or(lease_secs(waiter_ttl), |(_, ws)| ws);
                    self.note_waiting(entry, &keys, (entry.record.ttl, ws), read_at);
                    self.watch(&keys, &snap, ahead, lease);
                    return Ok(WaitReply::Waiting);
                }
            }
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            format!("etcd: heartbeat on {name} kept conflicting with other clients"),
        ))
    }

    /// Removes the waiter, or ends the grant. If an acquire of this lease id through this
    /// backend was dropped half-way, its transaction may still be on its way: a marker key
    /// goes first, which every acquire transaction compares absent, so that transaction
    /// either landed before the marker (and the read below finds its record) or does
    /// nothing.
    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        self.unfinished.lock().unwrap().insert(lease, name.clone());
        // A few at a time, as joins are (see `acquire`); one dropped while it waits for its
        // turn stays in `unfinished`.
        let _turn = self.leaving.acquire().await;
        let reply = self.cancel_once(name, lease).await;
        // Not reached if the caller dropped this call: the entry stays, to be tried again.
        if reply.is_ok() {
            self.unfinished.lock().unwrap().remove(&lease);
        }
        reply
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let keys = self.keys(name);
        let known = self.held.lock().unwrap().remove(&lease);
        if let Some(h) = known {
            return self.end_grant(&keys, lease, h.fence).await;
        }
        for _ in 0..MAX_ROUNDS {
            match self.read_one(&keys, lease).await? {
                Some(e) if e.is_holder() => {
                    if self.end_grant(&keys, lease, e.fence()).await? {
                        return Ok(true);
                    }
                }
                _ => return Ok(false),
            }
        }
        Ok(false)
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let _ = ttl; // an etcd lease keeps the TTL it was granted with
        let keys = self.keys(name);
        let known = self.held.lock().unwrap().get(&lease).cloned();
        let (session, fence) = match known {
            Some(h) if h.provisional => return self.settle(&keys, lease, h.fence).await,
            Some(h) => (h.session, h.fence),
            None => match self.read_one(&keys, lease).await? {
                Some(e) if e.record.is_provisional() => {
                    return self.settle(&keys, lease, e.fence()).await
                }
                Some(e) if e.is_holder() => (
                    EtcdLease {
                        id: e.lease,
                        ttl: e.record.ttl,
                    },
                    e.fence(),
                ),
                _ => return Ok(RenewReply::Gone),
            },
        };
        self.renew_on(&keys, lease, session, fence).await
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let keys = self.keys(name);
        let snap = self.read(&keys).await?;
        if snap.entries.is_empty() {
            return Ok(None);
        }
        // One time-to-live per etcd lease, not per record: the records of one client share
        // its sessions (asking once per record made a status of 10,000 waiters 10,000 calls).
        let leases: Vec<i64> = snap
            .entries
            .iter()
            .map(|e| e.lease)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let ttls: HashMap<i64, i64> =
            futures::future::join_all(leases.into_iter().map(|lease| async move {
                let ttl = self
                    .call(|mut c| async move { c.lease_time_to_live(lease, None).await })
                    .await
                    .map(|r| r.ttl().max(0))
                    .unwrap_or(0);
                (lease, ttl)
            }))
            .await
            .into_iter()
            .collect();
        let now = StoreTime::host_now();
        let mut holders = Vec::new();
        let mut queue = Vec::new();
        let known = self.held.lock().unwrap().clone();
        for e in &snap.entries {
            let ttl = ttls.get(&e.lease).copied().unwrap_or(0);
            // Exact for the leases this backend renews; otherwise etcd's whole seconds left.
            let expires_at = match known.get(&e.id) {
                Some(h) if h.fence == e.fence() => h.expires_at,
                _ => now.plus(Duration::from_secs(ttl as u64)),
            };
            if e.is_holder() {
                holders.push(e.lease(expires_at));
            } else {
                queue.push(Waiter {
                    lease_id: e.id,
                    weight: e.record.w,
                    holder: e.record.h.clone(),
                    enqueued_at: StoreTime(e.record.e),
                    expires_at,
                    tenant: None,
                });
            }
        }
        holders.sort_by_key(|l| l.fence);
        let capacity = snap.capacity().unwrap_or(0);
        let used = snap.used();
        Ok(Some(SemaphoreStatus::new(
            name, capacity, used, now, holders, queue,
        )))
    }

    /// One key name under the semaphores' prefix (keys only, at most one): a linearizable
    /// read, so it goes through the leader like every step, and a member cut off from its
    /// quorum does not answer it. It reads no values and writes nothing.
    async fn ping(&self) -> Result<()> {
        self.get(
            Keys::sems(&self.root),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(1),
            ),
        )
        .await
        .map(drop)
    }

    async fn list(&self) -> Result<Vec<String>> {
        let resp = self
            .get(
                Keys::sems(&self.root),
                Some(GetOptions::new().with_prefix().with_keys_only()),
            )
            .await?;
        let mut names: Vec<String> = resp
            .kvs()
            .iter()
            .filter_map(|kv| Keys::name_of(&self.root, kv.key()))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        let keys = self.keys(name);
        for _ in 0..MAX_ROUNDS {
            let snap = self.read(&keys).await?;
            let (Some((old, rev)), false) = (snap.capacity, snap.entries.is_empty()) else {
                return Err(not_found(name));
            };
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.cap.clone(),
                    CompareOp::Equal,
                    rev,
                )])
                // On the etcd lease it is on, if any (`Keys::capacity_on`).
                .and_then([TxnOp::put(
                    keys.cap.clone(),
                    capacity.to_string(),
                    Some(PutOptions::new().with_ignore_lease()),
                )]);
            if self.txn(txn).await?.succeeded() {
                return Ok(old);
            }
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            format!("etcd: resize of {name} kept conflicting with other clients"),
        ))
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let keys = self.keys(name);
        for _ in 0..MAX_ROUNDS {
            let Some(entry) = self.read_one(&keys, lease).await? else {
                return Ok(false);
            };
            if !entry.is_holder() {
                return Ok(false);
            }
            if self.end_grant(&keys, lease, entry.fence()).await? {
                // A holder in this process hears of it at once; others at their next
                // renewal, which finds the grant gone.
                wake::notify(lease);
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        let keys = self.keys(name);
        let resp = self
            .call(|mut c| {
                let all = keys.all.clone();
                async move {
                    c.delete(
                        all,
                        Some(DeleteOptions::new().with_prefix().with_prev_key()),
                    )
                    .await
                }
            })
            .await
            .map_err(|e| self.err(e))?;
        let snap = Snapshot::parse(&keys, revision(resp.header()), resp.prev_kvs())?;
        for e in &snap.entries {
            wake::notify(e.id);
        }
        // A capacity key alone (its last lease expired) is an idle semaphore: none, as on
        // every store; it is deleted all the same.
        Ok(!snap.entries.is_empty())
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }

    fn rate_unsupported(&self) -> Option<&'static str> {
        Some(RATE_UNSUPPORTED)
    }
}

/// Why the etcd store has no rate limiter (see the module docs).
pub const RATE_UNSUPPORTED: &str = "etcd has no clock that a transaction can read, so \
    whether a request falls inside a window (\"never more than N in any window of length \
    L\") cannot be decided on the store's clock; deciding it on clients' clocks would let \
    their skew over-admit. Use a Redis, SQLite, PostgreSQL, MySQL/MariaDB or memory store for rate \
    limits";

/// The most permits one lease takes on etcd. An acquire's first transaction compares the
/// capacity, the queue, the cancel marker and each of the W seats it would take (W + 3
/// compares; its W + 3 operations in the other case: the record, the seats, the capacity
/// and the tail), and carries in its other branch 4 reads and a transaction of 3 compares
/// (and 3 puts) that writes the waiting record, which etcd counts against what the outer
/// one leaves: W + 6 <= 128.
/// A heavier request is refused before it reaches the store.
pub const MAX_WEIGHT: u32 = MAX_TXN_OPS as u32 - 6;

/// What the etcd store declares: watch wake-ups, whole-second leases of at least 2 s,
/// revision fences, the hand-off in the waiter's next step, at most [`MAX_WEIGHT`] permits
/// per lease.
pub const CAPABILITIES: Capabilities = Capabilities::push()
    .with_ttls(
        Duration::from_secs(MIN_LEASE_SECS as u64),
        Duration::from_secs(1),
    )
    .with_order(FenceSource::Revision, HandOff::NextStep)
    .with_max_weight(MAX_WEIGHT);

fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore \"{name}\" has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}
