//! The etcd store's data: its key layout, the record each key holds, a semaphore's snapshot
//! read in one range, and the pure decisions made on a snapshot (who is ahead, what fits,
//! which seats are free). The calls that read and write etcd are in `mod.rs`; every write is
//! one transaction built here ([`Keys`]) whose compares make it valid only on the snapshot
//! it was decided on.
//!
//! # Keys of one semaphore `NAME` under prefix `P`
//!
//! ```text
//! P/sem/NAME#cap            capacity, decimal; on the etcd lease of the only record while that
//!                           is a settled grant (gone with it when its client dies), else on
//!                           no lease (removed with the last record by a release, cancel,
//!                           revoke or purge, and by delete)
//! P/sem/NAME#q/<lease id>   one per acquire: a Record (JSON), attached to its etcd lease
//! P/sem/NAME#s/<seat>       one per held seat (10 digits): the lease id, attached to the
//!                           holder's etcd lease
//! P/sem/NAME#x/<lease id>   a cancel's marker: an acquire of that id still on its way
//!                           must not write (on the cancelling client's session, 30 s)
//! P/sem/NAME#tail           the lease id of the record that joined the queue last, on the
//!                           etcd lease that record is on; removed with the capacity key
//!                           (and by the next uncontended grant)
//! ```
//!
//! The tail lets a new waiter find the waiter ahead of it (the one it watches) without reading
//! the queue: see `EtcdBackend::join` for why it may be stale and what a stale one costs.
//!
//! Names never contain `#`, so `P/sem/NAME#` is a prefix of exactly one semaphore's keys.
//! A `q/` key is created once per lease id, so its create revision is the arrival order;
//! putting it again (a waiter moving to its holder lease at the grant, a provisional grant
//! moving to it at its first renewal) keeps it.

use std::collections::BTreeSet;

use etcd_client::{
    Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use serde::{Deserialize, Serialize};

use tessera_core::error::{Error, Result};
use tessera_core::model::*;

/// The keys of one semaphore.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    /// `P/sem/NAME#`: every key of the semaphore.
    pub(crate) all: String,
    /// `P/sem/NAME#cap`.
    pub(crate) cap: String,
    /// `P/sem/NAME#q/`: the queue and the holders.
    pub(crate) queue: String,
    /// `P/sem/NAME#tail`: the lease id of the record that joined the queue last.
    pub(crate) tail: String,
}

impl Keys {
    pub(crate) fn new(root: &str, name: &Name) -> Keys {
        let all = format!("{root}/sem/{name}#");
        Keys {
            cap: format!("{all}cap"),
            queue: format!("{all}q/"),
            tail: format!("{all}tail"),
            all,
        }
    }

    pub(crate) fn lease(&self, id: LeaseId) -> String {
        format!("{}{id}", self.queue)
    }

    /// A cancel's marker: an acquire of `id` still on its way must not write.
    pub(crate) fn marker(&self, id: LeaseId) -> String {
        format!("{}x/{id}", self.all)
    }

    /// Compares that hold while no cancel marked `id`.
    pub(crate) fn not_cancelled(&self, id: LeaseId) -> Compare {
        Compare::create_revision(self.marker(id), CompareOp::Equal, 0)
    }

    pub(crate) fn seat(&self, seat: u32) -> String {
        format!("{}s/{seat:010}", self.all)
    }

    /// `P/sem/NAME#s/`: the seats held.
    pub(crate) fn seats(&self) -> String {
        format!("{}s/", self.all)
    }

    /// `P/sem/`: the keys of every semaphore, for `list`.
    pub(crate) fn sems(root: &str) -> String {
        format!("{root}/sem/")
    }

    /// The semaphore name of a `q/` key found under [`Keys::sems`], if it is one.
    pub(crate) fn name_of(root: &str, key: &[u8]) -> Option<String> {
        let key = std::str::from_utf8(key).ok()?;
        let rest = key.strip_prefix(&Keys::sems(root))?;
        let (name, tail) = rest.split_once('#')?;
        tail.starts_with("q/").then(|| name.to_string())
    }

    /// Compares that hold while the semaphore has no `q/` key at all (etcd compares every
    /// key of a range, and an empty range as one absent key: version 0).
    pub(crate) fn queue_is_empty(&self) -> Compare {
        Compare::version(self.queue.clone(), CompareOp::Equal, 0).with_prefix()
    }

    /// A transaction to nest in one that deletes `id`'s record: it deletes the capacity key
    /// when no other `q/` key is left at commit, so a semaphore whose last lease or waiter
    /// leaves through a release, a cancel, a revoke or a purge leaves no key behind. (Two
    /// range compares, before and after the record's own key, which the outer transaction
    /// deletes: the compares see the keys as they were before it.) An acquire meanwhile
    /// compares the capacity's value or revision, so it fails and reads again rather than
    /// grant on a capacity deleted under it.
    pub(crate) fn drop_capacity_if_last(&self, id: LeaseId) -> TxnOp {
        TxnOp::txn(
            Txn::new()
                .when(self.queue_holds_only(&[id]))
                .and_then(self.drop_capacity()),
        )
    }

    /// The keys that go with the last record: the capacity and the tail.
    fn drop_capacity(&self) -> [TxnOp; 2] {
        [
            TxnOp::delete(self.cap.clone(), None),
            TxnOp::delete(self.tail.clone(), None),
        ]
    }

    /// Compares that hold while the semaphore has no `q/` key but those of `ids`.
    fn queue_holds_only(&self, ids: &[LeaseId]) -> Vec<Compare> {
        let mut own: Vec<String> = ids.iter().map(|&id| self.lease(id)).collect();
        own.sort();
        let mut end = self.queue.clone().into_bytes();
        // `…#q/` → `…#q0`: the end of the queue's range.
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let mut from = self.queue.clone().into_bytes();
        let mut compares = Vec::with_capacity(own.len() + 1);
        for key in own {
            compares.push(Compare::version(from, CompareOp::Equal, 0).with_range(key.clone()));
            from = key.into_bytes();
            from.push(0);
        }
        compares.push(Compare::version(from, CompareOp::Equal, 0).with_range(end));
        compares
    }

    /// The capacity key on `lease`, the etcd lease of the semaphore's only record: etcd
    /// deletes it with that record when the lease runs out (its client died), so a
    /// semaphore whose last holder crashed leaves no key either. Only an uncontended grant
    /// writes it so (the queue compared empty); [`Keys::capacity_shared`] takes it off the
    /// lease when a second record comes, and [`Keys::attach_capacity_if_only`] puts it back
    /// on when one settled grant is left.
    pub(crate) fn capacity_on(&self, cap: u32, lease: i64) -> TxnOp {
        let on = PutOptions::new().with_lease(lease);
        TxnOp::put(self.cap.clone(), cap.to_string(), Some(on))
    }

    /// The capacity key on no lease: a second record joins the semaphore, so the key must
    /// outlive the first one's etcd lease.
    pub(crate) fn capacity_shared(&self, cap: u32) -> TxnOp {
        TxnOp::put(self.cap.clone(), cap.to_string(), None)
    }

    /// A transaction to nest in one that leaves `left` (a settled grant whose record's mod
    /// revision is `rev`) as the only `q/` key besides those of `gone`, which the outer
    /// transaction deletes: it puts the capacity key, value kept, on `lease`, the etcd lease
    /// `left` is on after the outer transaction (see [`Keys::capacity_on`]). Its compares
    /// see the keys as they were before the outer transaction; any other record, or `left`
    /// changed, and it does nothing.
    pub(crate) fn attach_capacity_if_only(
        &self,
        gone: &[LeaseId],
        left: LeaseId,
        rev: i64,
        lease: i64,
    ) -> TxnOp {
        let mut ids = gone.to_vec();
        ids.push(left);
        let mut when = self.queue_holds_only(&ids);
        when.push(Compare::mod_revision(
            self.lease(left),
            CompareOp::Equal,
            rev,
        ));
        when.push(Compare::version(self.cap.clone(), CompareOp::Greater, 0));
        let on = PutOptions::new().with_lease(lease).with_ignore_value();
        TxnOp::txn(
            Txn::new()
                .when(when)
                .and_then([TxnOp::put(self.cap.clone(), "", Some(on))]),
        )
    }

    /// [`Keys::drop_capacity_if_last`], or else [`Keys::attach_capacity_if_only`] with
    /// `left` the one record left: one nested transaction, as etcd refuses a capacity key
    /// written in two (even when their compares exclude each other). etcd counts
    /// [`DROP_OR_ATTACH_OPS`] more operations for it than the outer transaction's own.
    pub(crate) fn drop_capacity_if_last_else_attach(&self, id: LeaseId, left: &Entry) -> TxnOp {
        TxnOp::txn(
            Txn::new()
                .when(self.queue_holds_only(&[id]))
                .and_then(self.drop_capacity())
                .or_else([self.attach_capacity_if_only(&[id], left.id, left.mod_rev, left.lease)]),
        )
    }

    /// Compares that hold while the stored capacity is `cap`.
    pub(crate) fn capacity_is(&self, cap: u32) -> Compare {
        Compare::value(self.cap.clone(), CompareOp::Equal, cap.to_string())
    }

    /// The puts of a grant: the record (now holding `seats`) and one key per seat, all on
    /// the holder's etcd lease `holder_lease`.
    pub(crate) fn grant_ops(
        &self,
        id: LeaseId,
        record: &Record,
        holder_lease: i64,
    ) -> Result<Vec<TxnOp>> {
        let on = Some(PutOptions::new().with_lease(holder_lease));
        let mut ops = vec![TxnOp::put(self.lease(id), record.encode()?, on.clone())];
        for &s in record.seats() {
            ops.push(TxnOp::put(self.seat(s), id.to_string(), on.clone()));
        }
        Ok(ops)
    }

    /// Compares that hold while every seat of `seats` is free.
    pub(crate) fn seats_free(&self, seats: &[u32]) -> Vec<Compare> {
        seats
            .iter()
            .map(|&s| Compare::create_revision(self.seat(s), CompareOp::Equal, 0))
            .collect()
    }
}

/// What a `q/` key holds: the request, and the grant once there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Weight.
    pub(crate) w: u32,
    /// Holder label.
    pub(crate) h: String,
    /// The holder lease's TTL, whole seconds.
    pub(crate) ttl: i64,
    /// When it was enqueued, µs on the enqueuing client's clock (shown only).
    pub(crate) e: u64,
    /// The session lease (of TTL `ttl`) of the waiter's client, on which a releaser that
    /// hands it the permits puts its grant (0: none; it then grants itself), unless the
    /// grant is provisional (see `wt`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) hl: i64,
    /// The waiter TTL of its queue entry, whole seconds (0: not recorded, as by clients
    /// before provisional hand-offs). A release hands a waiter whose `wt` is below `ttl` a
    /// provisional grant: on the etcd lease its waiting record is on, so that it ends when
    /// the queue entry would have, until the holder's first renewal moves it to `ttl`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) wt: i64,
    /// The grant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) g: Option<Granted>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// The grant part of a [`Record`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Granted {
    /// Seats, ascending.
    pub(crate) s: Vec<u32>,
    /// When it was granted, µs on the granting client's clock (shown only).
    pub(crate) a: u64,
    /// Provisional: a release put it on the waiter's session of the waiter TTL, where it
    /// stays until the holder's first renewal moves it to its session of the lease TTL.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) p: bool,
    /// The fence, once the grant was moved: the record's mod revision is then the move's,
    /// no longer the grant's. `None`: the mod revision is the fence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) f: Option<i64>,
}

impl Record {
    pub(crate) fn encode(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|e| Error::Corrupt(format!("etcd record: {e}")))
    }

    pub(crate) fn decode(v: &[u8]) -> Result<Record> {
        serde_json::from_slice(v)
            .map_err(|e| Error::Corrupt(format!("unreadable etcd record: {e}")))
    }

    pub(crate) fn seats(&self) -> &[u32] {
        self.g.as_ref().map_or(&[], |g| &g.s)
    }

    /// This record granted `seats` at `now`, for the lease TTL.
    pub(crate) fn granted(&self, seats: Vec<u32>, now: StoreTime) -> Record {
        Record {
            g: Some(Granted {
                s: seats,
                a: now.0,
                p: false,
                f: None,
            }),
            ..self.clone()
        }
    }

    /// This waiting record handed `seats` at `now` by a release: provisional when its
    /// queue entry's TTL is below the lease TTL.
    pub(crate) fn handed_off(&self, seats: Vec<u32>, now: StoreTime) -> Record {
        let mut r = self.granted(seats, now);
        if let Some(g) = &mut r.g {
            g.p = self.wt > 0 && self.wt < self.ttl;
        }
        r
    }

    /// A provisional grant moved to the holder's session: `fence` kept in the record.
    pub(crate) fn settled(&self, fence: i64) -> Record {
        let mut r = self.clone();
        if let Some(g) = &mut r.g {
            g.p = false;
            g.f = Some(fence);
        }
        r
    }

    /// A grant still on the waiter's session (see [`Granted::p`]).
    pub(crate) fn is_provisional(&self) -> bool {
        self.g.as_ref().is_some_and(|g| g.p)
    }

    /// The TTL, whole seconds, of the etcd lease a grant of this record is on.
    pub(crate) fn session_ttl(&self) -> i64 {
        if self.is_provisional() {
            self.wt
        } else {
            self.ttl
        }
    }
}

/// What [`Keys::drop_capacity_if_last_else_attach`] takes of etcd's operation limit beyond
/// the outer transaction's own count: its 2 compares, then the 5 of the attach inside it.
pub(crate) const DROP_OR_ATTACH_OPS: usize = 2 + 5;

/// One `q/` key as read.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) id: LeaseId,
    pub(crate) record: Record,
    pub(crate) create_rev: i64,
    pub(crate) mod_rev: i64,
    /// The etcd lease the key is attached to.
    pub(crate) lease: i64,
}

impl Entry {
    /// `record` as a transaction of revision `rev` wrote it on the etcd lease `lease`.
    pub(crate) fn written(id: LeaseId, record: Record, rev: i64, lease: i64) -> Entry {
        Entry {
            id,
            record,
            create_rev: 0,
            mod_rev: rev,
            lease,
        }
    }

    pub(crate) fn is_holder(&self) -> bool {
        self.record.g.is_some()
    }

    /// The grant's fence: the revision of the grant, which is the record's mod revision
    /// until a provisional grant is moved to its holder's session (once, by its first
    /// renewal), and is kept in the record from then on.
    pub(crate) fn fence(&self) -> i64 {
        self.record
            .g
            .as_ref()
            .and_then(|g| g.f)
            .unwrap_or(self.mod_rev)
    }

    /// The etcd lease a release that hands this waiter the permits puts the grant on: the
    /// one its waiting record is on for a provisional grant, else the session of the lease
    /// TTL its record names (0: none).
    pub(crate) fn hand_off_lease(&self) -> i64 {
        if self.record.wt > 0 && self.record.wt < self.record.ttl {
            self.lease
        } else {
            self.record.hl
        }
    }

    /// The lease as `status` and grants show it.
    pub(crate) fn lease(&self, expires_at: StoreTime) -> Lease {
        let g = self.record.g.as_ref();
        Lease {
            lease_id: self.id,
            weight: self.record.w,
            seats: g.map(|g| g.s.clone()).unwrap_or_default(),
            fence: self.fence() as u64,
            holder: self.record.h.clone(),
            acquired_at: StoreTime(g.map_or(0, |g| g.a)),
            expires_at,
            tenant: None,
        }
    }
}

/// A semaphore as one range read saw it at `revision`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Snapshot {
    pub(crate) revision: i64,
    /// The stored capacity and the revision it was written at.
    pub(crate) capacity: Option<(u32, i64)>,
    /// Every `q/` key, in arrival order (create revision).
    pub(crate) entries: Vec<Entry>,
    /// Seats held.
    pub(crate) seats: BTreeSet<u32>,
    /// Lease ids whose acquire a cancel stopped (their marker keys).
    pub(crate) cancelled: Vec<LeaseId>,
}

/// What an acquire's transaction read as it wrote the acquire's record into a queue that
/// was not empty (`EtcdBackend::acquire_inner`): no record, only counts, the seats and the
/// tail, so that what it costs does not grow with the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Joined {
    /// The transaction's revision: the record's create revision.
    pub(crate) revision: i64,
    /// The lease id the tail named before this record replaced it: the record that joined
    /// last before it, if the tail was there and readable.
    pub(crate) tail: Option<LeaseId>,
    /// `q/` records, this one included.
    pub(crate) records: u64,
    /// Seats held (the weight of the holders).
    pub(crate) seats: u64,
    /// Leases holding them.
    pub(crate) holders: u64,
}

impl Joined {
    /// The reply of the acquire's transaction, failed at the top (the queue was not empty),
    /// or of the join alone (onto a queue found long, `EtcdBackend::long_queue`): `Ok` if
    /// its nested transaction wrote the record, else `Err` with the snapshot of the whole
    /// semaphore that the nested transaction read instead.
    pub(crate) fn parse(
        keys: &Keys,
        resp: &TxnResponse,
    ) -> Result<std::result::Result<Joined, Snapshot>> {
        let corrupt = || Error::Corrupt("etcd: an acquire's transaction without its reads".into());
        let ops = resp.op_responses();
        let [TxnOpResponse::Get(tail), TxnOpResponse::Txn(nested), TxnOpResponse::Get(records), TxnOpResponse::Get(seats)] =
            ops.as_slice()
        else {
            return Err(corrupt());
        };
        if !nested.succeeded() {
            let Some(TxnOpResponse::Get(all)) = nested.op_responses().into_iter().next() else {
                return Err(corrupt());
            };
            let revision = all.header().map_or(0, |h| h.revision());
            return Ok(Err(Snapshot::parse(keys, revision, all.kvs())?));
        }
        let tail = tail
            .kvs()
            .first()
            .and_then(|kv| std::str::from_utf8(kv.value()).ok())
            .and_then(|v| v.parse::<LeaseId>().ok());
        let holders: BTreeSet<&[u8]> = seats.kvs().iter().map(|kv| kv.value()).collect();
        Ok(Ok(Joined {
            revision: resp.header().map_or(0, |h| h.revision()),
            tail,
            records: records.count().max(0) as u64,
            seats: seats.kvs().len() as u64,
            holders: holders.len() as u64,
        }))
    }
}

/// Where one lease id stands in a [`Snapshot`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Place {
    /// No key for it.
    Absent,
    /// It holds its permits.
    Holder,
    /// It waits.
    Waiting {
        /// Waiters ahead of it (its 0-based queue position).
        position: u64,
        /// Everything ahead of it (holders and waiters) plus its own weight fits the
        /// capacity: it may be granted now.
        fits: bool,
        /// The nearest waiter ahead of it; `None` if everyone ahead holds (it is the head).
        ahead: Option<LeaseId>,
    },
}

impl Snapshot {
    /// Reads the keys of one semaphore (a range over [`Keys::all`]).
    pub(crate) fn parse(keys: &Keys, revision: i64, kvs: &[KeyValue]) -> Result<Snapshot> {
        let mut snap = Snapshot {
            revision,
            ..Snapshot::default()
        };
        let seat_prefix = format!("{}s/", keys.all);
        let marker_prefix = format!("{}x/", keys.all);
        for kv in kvs {
            let key = kv.key();
            if key == keys.cap.as_bytes() {
                let cap = std::str::from_utf8(kv.value())
                    .ok()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|&c| (1..=MAX_CAPACITY).contains(&c))
                    .ok_or_else(|| Error::Corrupt("unreadable etcd capacity".into()))?;
                snap.capacity = Some((cap, kv.mod_revision()));
            } else if let Some(id) = key.strip_prefix(keys.queue.as_bytes()) {
                let id = std::str::from_utf8(id)
                    .ok()
                    .and_then(|s| s.parse::<LeaseId>().ok())
                    .ok_or_else(|| Error::Corrupt("unreadable etcd lease key".into()))?;
                snap.entries.push(Entry {
                    id,
                    record: Record::decode(kv.value())?,
                    create_rev: kv.create_revision(),
                    mod_rev: kv.mod_revision(),
                    lease: kv.lease(),
                });
            } else if let Some(seat) = key.strip_prefix(seat_prefix.as_bytes()) {
                let seat = std::str::from_utf8(seat)
                    .ok()
                    .and_then(|s| s.parse::<u32>().ok())
                    .ok_or_else(|| Error::Corrupt("unreadable etcd seat key".into()))?;
                snap.seats.insert(seat);
            } else if let Some(id) = key.strip_prefix(marker_prefix.as_bytes()) {
                if let Some(id) = std::str::from_utf8(id).ok().and_then(|s| s.parse().ok()) {
                    snap.cancelled.push(id);
                }
            }
        }
        snap.entries.sort_by_key(|e| e.create_rev);
        Ok(snap)
    }

    pub(crate) fn entry(&self, id: LeaseId) -> Option<&Entry> {
        self.entries.iter().find(|e| e.id == id)
    }

    /// The seats `id` holds.
    pub(crate) fn seats_of(&self, id: LeaseId) -> Vec<u32> {
        self.entry(id)
            .map(|e| e.record.seats().to_vec())
            .unwrap_or_default()
    }

    pub(crate) fn capacity(&self) -> Option<u32> {
        self.capacity.map(|(c, _)| c)
    }

    pub(crate) fn used(&self) -> u32 {
        self.entries
            .iter()
            .filter(|e| e.is_holder())
            .map(|e| e.record.w)
            .sum()
    }

    /// The record that would be left alone once `gone` leaves, if there is exactly one and
    /// it is a settled grant (the one [`Keys::attach_capacity_if_only`] puts the capacity
    /// key's lease on).
    pub(crate) fn settled_left_after(&self, gone: LeaseId) -> Option<&Entry> {
        let mut others = self.entries.iter().filter(|e| e.id != gone);
        match (others.next(), others.next()) {
            (Some(e), None) if e.is_holder() && !e.record.is_provisional() => Some(e),
            _ => None,
        }
    }

    pub(crate) fn waiters(&self) -> u64 {
        self.entries.iter().filter(|e| !e.is_holder()).count() as u64
    }

    /// Where `id` stands. Strict FIFO on arrival order: a waiter fits when the weights of
    /// *every* key created before it (holders and waiters alike) plus its own fit the
    /// capacity, so nobody is granted before a waiter ahead of it could be.
    pub(crate) fn place(&self, id: LeaseId) -> Place {
        let cap = u64::from(self.capacity().unwrap_or(0));
        let mut ahead_weight = 0u64;
        let mut position = 0u64;
        let mut ahead = None;
        for e in &self.entries {
            if e.id == id {
                if e.is_holder() {
                    return Place::Holder;
                }
                return Place::Waiting {
                    position,
                    fits: ahead_weight + u64::from(e.record.w) <= cap,
                    ahead,
                };
            }
            ahead_weight += u64::from(e.record.w);
            if !e.is_holder() {
                position += 1;
                ahead = Some(e.id);
            }
        }
        Place::Absent
    }

    /// The hand-off a release of `id` (a holder) makes in its own transaction: the waiters
    /// at the head of the queue that fit once `id` is gone, each with its seats, in order;
    /// it stops at the first that does not fit or names no session to grant on.
    pub(crate) fn hand_off_after(&self, id: LeaseId) -> Vec<(Entry, Vec<u32>)> {
        let mut rest = self.clone();
        let Some(at) = rest.entries.iter().position(|e| e.id == id) else {
            return vec![];
        };
        let gone = rest.entries.remove(at);
        for s in gone.record.seats() {
            rest.seats.remove(s);
        }
        let mut out = Vec::new();
        let waiters: Vec<Entry> = rest
            .entries
            .iter()
            .filter(|e| !e.is_holder())
            .cloned()
            .collect();
        for w in waiters {
            let fits = matches!(rest.place(w.id), Place::Waiting { fits: true, .. });
            let seats = rest.free_seats(w.record.w);
            match (fits, seats) {
                (true, Some(seats)) if w.hand_off_lease() != 0 => {
                    rest.seats.extend(seats.iter().copied());
                    if let Some(e) = rest.entries.iter_mut().find(|e| e.id == w.id) {
                        e.record = e.record.granted(seats.clone(), StoreTime(0));
                    }
                    out.push((w, seats));
                }
                _ => break,
            }
        }
        out
    }

    /// The `n` lowest seats below the capacity that no holder has, or `None` if there are
    /// fewer (only while over capacity after a shrinking resize).
    pub(crate) fn free_seats(&self, n: u32) -> Option<Vec<u32>> {
        let cap = self.capacity()?;
        let seats: Vec<u32> = (0..cap)
            .filter(|s| !self.seats.contains(s))
            .take(n as usize)
            .collect();
        (seats.len() == n as usize).then_some(seats)
    }
}

/// etcd's shortest lease TTL (its default `--min-lease-ttl`... a new lease shorter than
/// this is raised to it silently by the server).
pub(crate) const MIN_LEASE_SECS: i64 = 2;

/// Whole seconds of an etcd lease for `ttl`: rounded up, at least etcd's minimum.
pub(crate) fn lease_secs(ttl: std::time::Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    (secs as i64).max(MIN_LEASE_SECS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u128, w: u32, holder: bool, rev: i64) -> Entry {
        let record = Record {
            w,
            h: "h".into(),
            ttl: 2,
            e: 0,
            hl: 0,
            wt: 0,
            g: holder.then(|| grant(vec![])),
        };
        Entry {
            id: LeaseId::from_u128(n),
            record,
            create_rev: rev,
            mod_rev: rev,
            lease: 1,
        }
    }

    fn grant(s: Vec<u32>) -> Granted {
        Granted {
            s,
            a: 0,
            p: false,
            f: None,
        }
    }

    fn snap(cap: u32, entries: Vec<Entry>, seats: &[u32]) -> Snapshot {
        Snapshot {
            revision: 100,
            capacity: Some((cap, 1)),
            entries,
            seats: seats.iter().copied().collect(),
            cancelled: vec![],
        }
    }

    #[test]
    fn a_waiter_fits_only_with_everyone_ahead_counted() {
        // capacity 3: a holder of 1, a waiter of 2 (fits: 1 + 2), a waiter of 1 (does not:
        // 1 + 2 + 1, although 1 + 1 would).
        let s = snap(
            3,
            vec![
                entry(1, 1, true, 1),
                entry(2, 2, false, 2),
                entry(3, 1, false, 3),
            ],
            &[0],
        );
        let id = LeaseId::from_u128;
        assert_eq!(s.place(id(1)), Place::Holder);
        assert_eq!(
            s.place(id(2)),
            Place::Waiting {
                position: 0,
                fits: true,
                ahead: None
            }
        );
        assert_eq!(
            s.place(id(3)),
            Place::Waiting {
                position: 1,
                fits: false,
                ahead: Some(id(2))
            }
        );
        assert_eq!(s.place(id(9)), Place::Absent);
    }

    #[test]
    fn a_large_head_blocks_smaller_ones_behind_it() {
        let id = LeaseId::from_u128;
        let s = snap(
            4,
            vec![
                entry(1, 3, true, 1),
                entry(2, 4, false, 2),
                entry(3, 1, false, 3),
            ],
            &[0, 1, 2],
        );
        assert!(matches!(
            s.place(id(2)),
            Place::Waiting {
                fits: false,
                ahead: None,
                ..
            }
        ));
        assert!(matches!(s.place(id(3)), Place::Waiting { fits: false, .. }));
    }

    #[test]
    fn a_release_hands_off_to_the_head_in_order_and_stops_at_a_large_one() {
        let id = LeaseId::from_u128;
        let waiter = |n, w| {
            let mut e = entry(n, w, false, n as i64);
            e.record.hl = 9;
            e
        };
        let mut h = entry(1, 2, true, 1);
        h.record.g = Some(grant(vec![0, 1]));
        // capacity 3: holder of 2 (seats 0, 1) and one of 1 (seat 2); waiters 1, 1, 3, 1.
        let mut h2 = entry(2, 1, true, 2);
        h2.record.g = Some(grant(vec![2]));
        let s = snap(
            3,
            vec![
                h,
                h2,
                waiter(3, 1),
                waiter(4, 1),
                waiter(5, 3),
                waiter(6, 1),
            ],
            &[0, 1, 2],
        );
        let out = s.hand_off_after(id(1));
        let got: Vec<(LeaseId, Vec<u32>)> = out.iter().map(|(e, s)| (e.id, s.clone())).collect();
        assert_eq!(got, vec![(id(3), vec![0]), (id(4), vec![1])]);
        assert!(
            s.hand_off_after(id(3)).is_empty(),
            "a waiter is not a holder"
        );
    }

    #[test]
    fn free_seats_are_the_lowest_below_the_capacity() {
        let s = snap(4, vec![], &[0, 2]);
        assert_eq!(s.free_seats(2), Some(vec![1, 3]));
        assert_eq!(s.free_seats(3), None);
        // After a shrink to 2 with seats 2 and 3 held: only 0 and 1.
        let s = snap(2, vec![], &[2, 3]);
        assert_eq!(s.free_seats(2), Some(vec![0, 1]));
    }

    #[test]
    fn lease_seconds_round_up_to_etcds_minimum() {
        use std::time::Duration;
        assert_eq!(lease_secs(Duration::from_millis(100)), 2);
        assert_eq!(lease_secs(Duration::from_secs(2)), 2);
        assert_eq!(lease_secs(Duration::from_millis(2_001)), 3);
        assert_eq!(lease_secs(Duration::from_secs(30)), 30);
    }

    #[test]
    fn names_come_back_from_queue_keys_only() {
        let keys = Keys::new("p/x", &Name::new("a/b").unwrap());
        let q = keys.lease(LeaseId::from_u128(7));
        assert_eq!(Keys::name_of("p/x", q.as_bytes()), Some("a/b".to_string()));
        assert_eq!(Keys::name_of("p/x", keys.cap.as_bytes()), None);
        assert_eq!(Keys::name_of("p/x", keys.seat(3).as_bytes()), None);
        assert_eq!(Keys::name_of("p", q.as_bytes()), None);
    }

    /// A waiter whose queue entry's TTL is below its lease TTL is handed a provisional grant
    /// on the etcd lease its entry is on; its move keeps the fence; a record of a client
    /// before provisional hand-offs (no `wt`) is granted on its session of the lease TTL.
    #[test]
    fn a_hand_off_is_provisional_on_the_waiters_entry_lease_until_settled() {
        let mut w = entry(3, 1, false, 40);
        w.lease = 7;
        w.record.hl = 9;
        w.record.ttl = 30;
        assert_eq!(w.hand_off_lease(), 9, "no waiter TTL recorded: as before");
        w.record.wt = 5;
        assert_eq!(w.hand_off_lease(), 7);
        let handed = w.record.handed_off(vec![0], StoreTime(1));
        assert!(handed.is_provisional());
        assert_eq!(handed.session_ttl(), 5);
        let granted = Entry {
            record: handed,
            mod_rev: 41,
            ..w.clone()
        };
        assert_eq!(granted.fence(), 41);
        let settled = Entry {
            record: granted.record.settled(granted.fence()),
            mod_rev: 57,
            ..granted.clone()
        };
        assert!(!settled.record.is_provisional());
        assert_eq!(settled.record.session_ttl(), 30);
        assert_eq!(settled.fence(), 41, "the move kept the grant's fence");
        assert_eq!(settled.lease(StoreTime(0)).fence, 41);
        let back = Record::decode(settled.record.encode().unwrap().as_bytes()).unwrap();
        assert_eq!(back, settled.record);
        // A waiter TTL not below the lease TTL: a full grant on the lease TTL's session.
        w.record.wt = 30;
        assert_eq!(w.hand_off_lease(), 9);
        assert!(!w.record.handed_off(vec![0], StoreTime(1)).is_provisional());
    }

    /// Records written by clients before provisional hand-offs read as full grants whose
    /// fence is the mod revision, and a full grant is written as before (no new fields).
    #[test]
    fn records_without_the_new_fields_read_as_before() {
        let old = br#"{"w":1,"h":"h","ttl":30,"e":0,"hl":9,"g":{"s":[0],"a":5}}"#;
        let r = Record::decode(old).unwrap();
        assert_eq!(r.wt, 0);
        assert!(!r.is_provisional());
        assert_eq!(r.g.as_ref().unwrap().f, None);
        assert_eq!(std::str::from_utf8(old).unwrap(), r.encode().unwrap());
    }
}
