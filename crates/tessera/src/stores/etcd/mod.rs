//! The etcd store (`etcd://`, `etcds://` for TLS): consensus-backed semaphores.
//!
//! ```text
//! etcd://[user:password@]host[:port][,host[:port]…][/prefix]
//! etcds://[user:password@]host[:port][,…][/prefix][?ca=FILE][&cert=FILE&key=FILE][&domain=NAME]
//! ```
//!
//! - Several endpoints: the client balances over them and goes on through the loss of a
//!   member. The port defaults to 2379.
//! - `user:password` (percent-encoded) authenticates with etcd's auth; the password never
//!   appears in a message.
//! - `prefix` (default `tessera`; `A-Z a-z 0-9 . _ -` and inner `/`) roots every key, so
//!   tenants sharing a cluster are isolated (with etcd roles granting `prefix/` only).
//! - `etcds://`: TLS (rustls). `ca` is the PEM file of the CA that signed the members'
//!   certificates (default: none, so give it), `cert` and `key` a client certificate for
//!   etcd's `--client-cert-auth`, `domain` the name the certificates are checked against.
//!
//! Cargo feature `etcd`; building it needs `protoc` (Debian: `protobuf-compiler`).
//!
//! # Implementation details
//!
//! The semaphore lives in etcd's keyspace (layout in [`ops`]): one key per acquire,
//! `q/<lease id>`, attached to an etcd lease of its own, holding the request and, once
//! granted, its seats; one key per held seat; and the capacity. Every expiry is an etcd
//! lease expiring on the cluster's leader: no clock of a client ever decides anything.
//!
//! - **Order** is the create revision of the `q/` key. A waiter may be granted when the
//!   weights of *all* keys created before it (holders and waiters) plus its own fit the
//!   capacity: strict FIFO, and a large request at the head is never overtaken.
//! - **A grant** is one transaction that compares the waiter's own key (its mod revision:
//!   still there, still waiting, still on its lease), the capacity (its value) and each seat
//!   it claims (absent), and then puts the record with its seats and the seat keys, all on
//!   the holder's etcd lease. A conflict fails the compares; the waiter reads again and
//!   retries. The **fence** is that transaction's revision (the key's mod revision): etcd's
//!   revision never goes back, across leader changes and the loss of members, and a
//!   granted key is never written again.
//! - **Never over-grant.** Take the granted key created last, `G`. When `G` was granted,
//!   the keys created before it, plus `G`, fitted the capacity, which the grant compared.
//!   Every key granted now was created no later than `G` and existed then (a key is never
//!   created again with an old revision), so the holders now weigh no more than then. A
//!   resize changes the capacity value, so a grant decided on the old one fails.
//! - **Two etcd leases per acquire**: a waiter's key is on a lease of the waiter TTL
//!   (renewed by its heartbeat), so a dead waiter leaves the queue within its TTL; the grant
//!   moves the key (a put keeps its create revision) to a lease of the lease TTL, renewed
//!   by the permit's keep-alive. An uncontended acquire is granted in its first
//!   transaction, on the holder lease, without ever waiting (the transaction compares that
//!   no `q/` key exists at all). Release, revoke and expiry end the holder lease, which
//!   deletes the record and its seats in one revision.
//! - **Waking** (the hand-off runs in the *next* step, [`HandOff::NextStep`]): nobody
//!   grants on behalf of a waiter. Each waiter watches only what can let it in: the head
//!   watches deletions of `q/` keys and the capacity; every other waiter watches the
//!   waiter just ahead of it (its grant makes this one the head; its deletion moves this
//!   one up). So a release wakes one waiter, not the queue. A woken waiter's heartbeat
//!   re-reads the semaphore, its own key and its leases before it grants itself (the mutex
//!   recipe's known fault is to trust a watch event without re-reading). Watches are set
//!   again after any disconnect or compaction (see `watch.rs`); the heartbeat, every
//!   `min(waiter TTL/3, TTL/4)`, is the safety net.
//! - **Leases are whole seconds, at least 2 s** ([`Capabilities::min_ttl`],
//!   [`Capabilities::ttl_granularity`]): a semaphore with a shorter or fractional TTL is
//!   refused at [`crate::Semaphore::new`] with [`crate::InvalidInput::Ttl`] (etcd would
//!   silently raise a TTL below its minimum, and a holder must not believe a TTL the store
//!   does not keep). The seam's calls round a TTL up to whole seconds, at least 2.
//! - **Renewal** is a keep-alive on the lease's own keep-alive stream (kept open between
//!   renewals) plus a read of the record: the reply says `expires_at - now` = the lease's
//!   TTL, so the keeper's "certainly valid until send time + TTL − margin" holds, since etcd
//!   restarts the TTL when it receives the keep-alive. A revoked, deleted or expired lease
//!   answers `Gone`.
//!
//! # How each Backend operation maps
//!
//! | operation | etcd |
//! |---|---|
//! | `acquire` | lease grant (holder TTL); one transaction: grant at once if the queue is empty, else put the key and read the semaphore; then a grant transaction if it fits; if it must wait: a lease grant (waiter TTL) and a put moving the key to it |
//! | `heartbeat` | read, keep-alive of the waiter lease; a grant transaction if it fits |
//! | `cancel` | read the key; delete it if waiting (compared on its mod revision), revoke the holder lease if granted |
//! | `release`, `revoke` | revoke the holder lease |
//! | `renew` | keep-alive + read of the key |
//! | `status` | one read, one time-to-live per lease |
//! | `resize` | put the capacity, compared on its mod revision (wakes the head) |
//! | `delete` | revoke every lease of the semaphore, delete its keys |
//!
//! Where the seam's model does not map one to one:
//!
//! - The **queue cap** is checked on the snapshot of the acquire's own transaction (the
//!   waiters created before it), so it is exact for that acquire.
//! - **Capacity**: the capacity key has no lease (it must outlive any one holder); an idle
//!   semaphore (no `q/` key) takes the capacity of the next acquire, as on every store,
//!   in a transaction that compares the queue empty. The key of a semaphore that was used
//!   and went idle stays (a few bytes per name) until `delete`.
//! - **Hand-off**: a frozen head waiter (process stopped) blocks the queue until its waiter
//!   TTL ends; on stores that grant in the release's own step it would be granted and its
//!   lease would run out instead. Either way the permits return within one TTL.
//! - **Leader changes**: a new leader restarts every lease at its full TTL, so a crashed
//!   holder's permit can come back up to one TTL (plus the election) later than its TTL
//!   after the crash. Holders are not affected (their leases only get longer).
//!
//! [`HandOff::NextStep`]: crate::seam::HandOff::NextStep

mod error;
pub(crate) mod ops;
pub(crate) mod url;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::error::{Error, InvalidInput, Result, StoreErrorKind};
use crate::model::*;
use crate::seam::{Backend, Capabilities, FenceSource, HandOff, Waking};
use crate::wake;

use error::{is_lease_not_found, store_error};
use ops::{lease_secs, Entry, Keys, Place, Record, Snapshot};
use watch::{Target, Watches};

/// etcd's shortest lease TTL (its default `--min-lease-ttl`... a new lease shorter than
/// this is raised to it silently by the server).
pub(crate) const MIN_LEASE_SECS: i64 = 2;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Read-decide-write rounds of one operation before it reports contention.
const MAX_ROUNDS: usize = 64;
/// Times a request is sent again after its member could not be reached (20 ms, 40 ms, …,
/// about 1.5 s in all).
const CALL_RETRIES: usize = 6;

/// An etcd lease and its TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct EtcdLease {
    id: i64,
    ttl: i64,
}

/// A keep-alive stream kept open between renewals of one etcd lease.
type KeepAliveSlot = Arc<tokio::sync::Mutex<Option<(LeaseKeeper, LeaseKeepAliveStream)>>>;

/// The etcd backend. Cheap to share behind an `Arc`; dropping it stops its watches.
pub struct EtcdBackend {
    client: Client,
    root: String,
    url: String,
    secret: Option<String>,
    /// Holder leases granted through this backend (saves a read on renew and release),
    /// with the expiry the last grant or renewal reported (what `status` shows for them).
    held: Mutex<HashMap<LeaseId, (EtcdLease, StoreTime)>>,
    /// The holder lease of each acquire under way: if the acquire is dropped half-way, its
    /// transaction may still land after the cancel read the key; the cancel ends this
    /// lease, so that a late write fails (no lease) or is undone (its keys go with it).
    pending: Mutex<HashMap<LeaseId, i64>>,
    /// Holder leases granted for waiters of this backend, renewed by their heartbeats and
    /// used at their grant (saves a lease grant on the hand-off path).
    spare: Mutex<HashMap<LeaseId, EtcdLease>>,
    keep_alives: Mutex<HashMap<i64, KeepAliveSlot>>,
    watches: Arc<Watches>,
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("url", &self.url)
            .field("prefix", &self.root)
            .finish_non_exhaustive()
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.watches.stop_all();
    }
}

fn read_pem(path: &std::path::Path, what: &str, url: &str) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| {
        InvalidInput::StoreUrl {
            url: url.to_string(),
            reason: format!("cannot read the {what} file {}: {e}", path.display()),
        }
        .into()
    })
}

impl EtcdBackend {
    /// Connects to an `etcd://` or `etcds://` URL (see the module docs) and checks that the
    /// cluster answers (and accepts the user, if any).
    pub async fn connect(raw: &str) -> Result<Self> {
        let config = url::parse_url(raw)?;
        let secret = config.user.as_ref().map(|(_, p)| p.clone());
        let err = |e| store_error(e, secret.as_deref());
        let mut options = ConnectOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if let Some(tls) = &config.tls {
            let mut t = etcd_client::TlsOptions::new();
            if let Some(ca) = &tls.ca {
                let pem = read_pem(ca, "CA", &config.redacted)?;
                t = t.ca_certificate(etcd_client::Certificate::from_pem(pem));
            }
            if let Some((cert, key)) = &tls.identity {
                let cert = read_pem(cert, "client certificate", &config.redacted)?;
                let key = read_pem(key, "client key", &config.redacted)?;
                t = t.identity(etcd_client::Identity::from_pem(cert, key));
            }
            if let Some(domain) = &tls.domain {
                t = t.domain_name(domain.clone());
            }
            options = options.with_tls(t);
        }
        let client = tokio::time::timeout(
            CONNECT_TIMEOUT,
            Client::connect(&config.endpoints, Some(options)),
        )
        .await
        .map_err(|_| {
            Error::store(
                StoreErrorKind::Timeout,
                format!("etcd: no answer from {} in time", config.redacted),
            )
        })?
        .map_err(err)?;
        // One read: an unreachable cluster or a refused user fails here, at once.
        let mut probe = client.clone();
        tokio::time::timeout(
            CONNECT_TIMEOUT,
            probe.get(
                Keys::sems(&config.prefix),
                Some(
                    GetOptions::new()
                        .with_prefix()
                        .with_keys_only()
                        .with_limit(1),
                ),
            ),
        )
        .await
        .map_err(|_| {
            Error::store(
                StoreErrorKind::Timeout,
                format!("etcd: no answer from {} in time", config.redacted),
            )
        })?
        .map_err(err)?;
        Ok(EtcdBackend {
            watches: Watches::new(client.clone()),
            client,
            root: config.prefix,
            url: config.redacted,
            secret,
            held: Mutex::default(),
            pending: Mutex::default(),
            spare: Mutex::default(),
            keep_alives: Mutex::default(),
        })
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.root
    }

    /// The etcd client (for tests and the bench's comparison recipe).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn err(&self, e: etcd_client::Error) -> Error {
        store_error(e, self.secret.as_deref())
    }

    fn keys(&self, name: &Name) -> Keys {
        Keys::new(&self.root, name)
    }

    /// One request, sent again on another member when the connection to the one picked
    /// failed (a member killed or restarting: the client's balancer keeps picking it for a
    /// while). Every request of this store may be repeated: writes are transactions whose
    /// compares fail on a second run, and callers read again after a failed compare.
    async fn call<T, F, Fut>(&self, mut f: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 0;
        loop {
            match f(self.client.clone()).await {
                Err(e) if attempt < CALL_RETRIES && error::is_unreachable(&e) => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, "etcd request failed; sending it again");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(400));
                }
                r => return r,
            }
        }
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| self.err(e))
    }

    async fn get(
        &self,
        key: String,
        options: Option<GetOptions>,
    ) -> Result<etcd_client::GetResponse> {
        self.call(|mut c| {
            let (key, options) = (key.clone(), options.clone());
            async move { c.get(key, options).await }
        })
        .await
        .map_err(|e| self.err(e))
    }

    /// Every key of one semaphore, as one snapshot.
    async fn read(&self, keys: &Keys) -> Result<Snapshot> {
        let resp = self
            .get(keys.all.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        Snapshot::parse(keys, revision(resp.header()), resp.kvs())
    }

    /// The `q/` key of one lease, if any.
    async fn read_one(&self, keys: &Keys, id: LeaseId) -> Result<Option<Entry>> {
        let resp = self.get(keys.lease(id), None).await?;
        let snap = Snapshot::parse(keys, revision(resp.header()), resp.kvs())?;
        Ok(snap.entries.into_iter().next())
    }

    async fn grant_lease(&self, ttl: i64) -> Result<EtcdLease> {
        let resp = self
            .call(|mut c| async move { c.lease_grant(ttl, None).await })
            .await
            .map_err(|e| self.err(e))?;
        Ok(EtcdLease {
            id: resp.id(),
            ttl: resp.ttl().max(ttl),
        })
    }

    /// Revokes an etcd lease: `true` if it existed.
    async fn revoke_lease(&self, lease: i64) -> Result<bool> {
        self.forget_keep_alive(lease);
        match self
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_lease_not_found(&e) => Ok(false),
            Err(e) => Err(self.err(e)),
        }
    }

    /// Revokes a lease nobody waits for (a spare, a waiter lease after its grant); if that
    /// fails, the lease expires by its TTL.
    fn revoke_later(&self, lease: i64) {
        self.forget_keep_alive(lease);
        let mut client = self.client.clone();
        tokio::spawn(async move {
            let _ = client.lease_revoke(lease).await;
        });
    }

    /// One keep-alive of an etcd lease, on its keep-alive stream (opened on first use and
    /// kept): `true` if the lease lives (etcd restarted its TTL when it received the
    /// request), `false` if it is gone.
    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        let slot = Arc::clone(self.keep_alives.lock().unwrap().entry(lease).or_default());
        let mut guard = slot.lock().await;
        // Taken out while in use: if this call is dropped half-way, the stream goes with
        // it, so a later call never reads a reply meant for an earlier request.
        if let Some((mut keeper, mut stream)) = guard.take() {
            let exchange = async {
                keeper.keep_alive().await?;
                stream.message().await
            };
            match exchange.await {
                Ok(Some(resp)) if resp.ttl() > 0 => {
                    *guard = Some((keeper, stream));
                    return Ok(true);
                }
                Ok(Some(_)) => {
                    drop(guard);
                    self.forget_keep_alive(lease);
                    return Ok(false);
                }
                // The stream broke: open a new one below.
                Ok(None) | Err(_) => {}
            }
        }
        match self
            .call(|mut c| async move { c.lease_keep_alive(lease).await })
            .await
        {
            Ok(pair) => {
                *guard = Some(pair);
                Ok(true)
            }
            Err(e) if is_lease_not_found(&e) => {
                drop(guard);
                self.forget_keep_alive(lease);
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    fn forget_keep_alive(&self, lease: i64) {
        self.keep_alives.lock().unwrap().remove(&lease);
    }

    /// The grant transaction: `entry` (waiting, seen in `snap`) takes the lowest free seats,
    /// on `holder` (an etcd lease whose TTL restarted after the caller's request was sent).
    /// `None` if the compares failed (someone changed the semaphore since `snap`): read
    /// again.
    async fn claim(
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
        let txn = Txn::new()
            .when(when)
            .and_then(keys.grant_ops(entry.id, &record, holder.id)?);
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(Some(self.granted(
            entry.id,
            &record,
            revision(resp.header()),
            holder,
            now,
        )))
    }

    /// A grant made now: noted as held through this backend, its waiting ended.
    fn granted(
        &self,
        id: LeaseId,
        record: &Record,
        fence: i64,
        holder: EtcdLease,
        now: StoreTime,
    ) -> Grant {
        let expires_at = now.plus(Duration::from_secs(holder.ttl as u64));
        self.held.lock().unwrap().insert(id, (holder, expires_at));
        self.watches.stop(id);
        let entry = Entry {
            id,
            record: record.clone(),
            create_rev: 0,
            mod_rev: fence,
            lease: holder.id,
        };
        Grant {
            lease: entry.lease(expires_at),
            now,
        }
    }

    /// The grant of a key that already holds (a retried acquire or a heartbeat after a
    /// grant whose reply was lost): its lease is kept alive first, so the reply's TTL runs
    /// from after the caller's request was sent. `None` if the lease just ended.
    async fn existing_grant(&self, entry: &Entry) -> Result<Option<Grant>> {
        if !self.keep_alive(entry.lease).await? {
            return Ok(None);
        }
        let holder = EtcdLease {
            id: entry.lease,
            ttl: entry.record.ttl,
        };
        let now = StoreTime::host_now();
        let expires_at = now.plus(Duration::from_secs(holder.ttl as u64));
        self.held
            .lock()
            .unwrap()
            .insert(entry.id, (holder, expires_at));
        self.watches.stop(entry.id);
        Ok(Some(Grant {
            lease: entry.lease(expires_at),
            now,
        }))
    }

    /// Watches what can let `id` in (see the module docs), from after `snap`.
    fn watch(&self, keys: &Keys, snap: &Snapshot, ahead: Option<LeaseId>, id: LeaseId) {
        let target = match ahead {
            None => Target::Head {
                queue: keys.queue.clone(),
                cap: keys.cap.clone(),
            },
            Some(a) => Target::Behind(keys.lease(a)),
        };
        self.watches.set(id, target, snap.revision + 1);
    }

    fn take_spare(&self, id: LeaseId) -> Option<EtcdLease> {
        self.spare.lock().unwrap().remove(&id)
    }

    /// `id` waits no more (gone, cancelled): its watch and spare lease go.
    fn end_wait(&self, id: LeaseId) {
        self.watches.stop(id);
        if let Some(spare) = self.take_spare(id) {
            self.revoke_later(spare.id);
        }
    }

    /// The rest of an acquire whose key was written (or found) at `snap`: grant it if it
    /// fits, refuse a try that does not, or queue it on a waiter lease.
    async fn place_new(
        &self,
        req_name: &Name,
        keys: &Keys,
        snap: &Snapshot,
        req: &AcquireRequest,
        holder: EtcdLease,
    ) -> Result<Option<AcquireReply>> {
        let id = req.lease_id;
        let Some(entry) = snap.entry(id) else {
            return Ok(None);
        };
        let Place::Waiting {
            position,
            fits,
            ahead,
        } = snap.place(id)
        else {
            return Ok(None);
        };
        if fits {
            return Ok(self
                .claim(keys, snap, entry, holder)
                .await?
                .map(AcquireReply::Granted));
        }
        let Some(wait) = req.wait else {
            // A try that does not fit: its key goes with its lease.
            self.revoke_lease(entry.lease).await?;
            if entry.lease != holder.id {
                self.revoke_later(holder.id);
            }
            let cap = snap.capacity().unwrap_or(0);
            return Ok(Some(AcquireReply::NoPermit {
                available: cap.saturating_sub(snap.used()),
                queued: snap.waiters().saturating_sub(1),
            }));
        };
        if position >= u64::from(wait.queue_cap) {
            self.revoke_lease(entry.lease).await?;
            return Err(Error::QueueFull {
                name: req_name.to_string(),
                cap: wait.queue_cap,
            });
        }
        // It waits: its key moves to a lease of the waiter TTL, so that a waiter that dies
        // leaves the queue within that TTL; the holder lease stays as this waiter's spare.
        let waiter = self.grant_lease(lease_secs(wait.waiter_ttl)).await?;
        let txn = Txn::new()
            .when([Compare::mod_revision(
                keys.lease(id),
                CompareOp::Equal,
                entry.mod_rev,
            )])
            .and_then([TxnOp::put(
                keys.lease(id),
                entry.record.encode()?,
                Some(PutOptions::new().with_lease(waiter.id)),
            )]);
        let resp = self.txn(txn).await?;
        if !resp.succeeded() {
            // Deleted meanwhile (an admin delete): read again.
            self.revoke_later(waiter.id);
            return Ok(None);
        }
        self.spare.lock().unwrap().insert(id, holder);
        self.watch(keys, snap, ahead, id);
        Ok(Some(AcquireReply::Queued { position }))
    }
}

/// The revision of a response header (0 without one).
fn revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}

/// The range read inside a transaction's responses (the last `Get`, searching nested
/// transactions), with whether the nested transaction succeeded.
fn txn_read(resp: &TxnResponse) -> Option<(bool, etcd_client::GetResponse)> {
    let mut nested_ok = true;
    let mut found = None;
    for op in resp.op_responses() {
        match op {
            TxnOpResponse::Get(g) => found = Some(g),
            TxnOpResponse::Txn(t) => {
                nested_ok = t.succeeded();
                if let Some((_, g)) = txn_read(&t) {
                    found = Some(g);
                }
            }
            _ => {}
        }
    }
    found.map(|g| (nested_ok, g))
}

#[async_trait]
impl Backend for EtcdBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        let keys = self.keys(name);
        let id = req.lease_id;
        let now = StoreTime::host_now();
        let record = Record {
            w: req.weight,
            h: req.holder.clone(),
            ttl: lease_secs(req.ttl),
            e: now.0,
            g: None,
        };
        // Granted after the caller sent this request, so its TTL runs from later than that.
        let holder = self.grant_lease(record.ttl).await?;
        self.pending.lock().unwrap().insert(id, holder.id);
        let first_seats: Vec<u32> = (0..req.weight).collect();
        let get_all = || TxnOp::get(keys.all.clone(), Some(GetOptions::new().with_prefix()));
        let put_waiting = || -> Result<TxnOp> {
            Ok(TxnOp::put(
                keys.lease(id),
                record.encode()?,
                Some(PutOptions::new().with_lease(holder.id)),
            ))
        };
        let outcome: Result<AcquireReply> = async {
            for _ in 0..MAX_ROUNDS {
                // Granted at once if nobody holds or waits; otherwise (same capacity, key
                // not written yet) the key is written and the semaphore read, in one step.
                let mut when = vec![keys.capacity_is(capacity), keys.queue_is_empty()];
                when.extend(keys.seats_free(&first_seats));
                let granted = record.granted(first_seats.clone(), now);
                let nested = Txn::new()
                    .when([
                        keys.capacity_is(capacity),
                        Compare::create_revision(keys.lease(id), CompareOp::Equal, 0),
                    ])
                    .and_then([put_waiting()?, get_all()])
                    .or_else([get_all()]);
                let txn = Txn::new()
                    .when(when)
                    .and_then(keys.grant_ops(id, &granted, holder.id)?)
                    .or_else([TxnOp::txn(nested)]);
                let resp = self.txn(txn).await?;
                if resp.succeeded() {
                    let fence = revision(resp.header());
                    return Ok(AcquireReply::Granted(
                        self.granted(id, &granted, fence, holder, now),
                    ));
                }
                let (written, read) = txn_read(&resp)
                    .ok_or_else(|| Error::Corrupt("etcd transaction without its read".into()))?;
                let snap = Snapshot::parse(&keys, revision(read.header()), read.kvs())?;
                // Waiting, written in this call (this round, or an earlier one whose grant
                // conflicted), or a try's key that some earlier call left: decide it now.
                let decide = snap.entry(id).is_some_and(|e| {
                    !e.is_holder() && (written || e.lease == holder.id || req.wait.is_none())
                });
                if decide {
                    match self.place_new(name, &keys, &snap, req, holder).await? {
                        Some(reply) => return Ok(reply),
                        None => continue,
                    }
                }
                if let Some(entry) = snap.entry(id) {
                    // A retry of an acquire whose reply was lost (by the caller, or by this
                    // call when a request was sent again): what it already has.
                    if entry.lease != holder.id {
                        self.revoke_later(holder.id);
                    }
                    match snap.place(id) {
                        Place::Holder => match self.existing_grant(entry).await? {
                            Some(grant) => return Ok(AcquireReply::Granted(grant)),
                            None => continue,
                        },
                        Place::Waiting {
                            position, ahead, ..
                        } => {
                            self.watch(&keys, &snap, ahead, id);
                            return Ok(AcquireReply::Queued { position });
                        }
                        Place::Absent => unreachable!("the entry exists"),
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
                    // Capacity as declared: the key went in meanwhile? Read again.
                    Some(stored) if stored == capacity => continue,
                    // No capacity yet, or an idle semaphore: this client's capacity, and
                    // the grant, in one step, if the queue is still empty.
                    _ => {
                        let seen = snap.capacity.map_or(0, |(_, rev)| rev);
                        let mut when = vec![
                            Compare::mod_revision(keys.cap.clone(), CompareOp::Equal, seen),
                            keys.queue_is_empty(),
                        ];
                        when.extend(keys.seats_free(&first_seats));
                        let mut ops =
                            vec![TxnOp::put(keys.cap.clone(), capacity.to_string(), None)];
                        ops.extend(keys.grant_ops(id, &granted, holder.id)?);
                        let resp = self.txn(Txn::new().when(when).and_then(ops)).await?;
                        if resp.succeeded() {
                            let fence = revision(resp.header());
                            return Ok(AcquireReply::Granted(
                                self.granted(id, &granted, fence, holder, now),
                            ));
                        }
                    }
                }
            }
            Err(Error::store(
                StoreErrorKind::Busy,
                format!("etcd: acquire on {name} kept conflicting with other clients"),
            ))
        }
        .await;
        self.pending.lock().unwrap().remove(&id);
        // On error the holder lease may have the key on it: ending it removes the key.
        if outcome.is_err() && !self.held.lock().unwrap().contains_key(&id) {
            self.revoke_later(holder.id);
        }
        outcome
    }

    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        let _ = waiter_ttl; // the waiter lease's TTL was fixed when it was granted
        let keys = self.keys(name);
        for _ in 0..MAX_ROUNDS {
            let snap = self.read(&keys).await?;
            let Some(entry) = snap.entry(lease) else {
                self.end_wait(lease);
                return Ok(WaitReply::Gone);
            };
            match snap.place(lease) {
                Place::Absent => unreachable!("the entry exists"),
                Place::Holder => {
                    self.end_wait(lease);
                    return Ok(match self.existing_grant(entry).await? {
                        Some(grant) => WaitReply::Granted(grant),
                        None => WaitReply::Gone,
                    });
                }
                Place::Waiting { fits: true, .. } => {
                    // Re-read above: its key is there and waiting, so its waiter lease
                    // lives; the grant compares that the key is unchanged since.
                    let holder = match self.take_spare(lease) {
                        Some(spare) if self.keep_alive(spare.id).await? => spare,
                        _ => self.grant_lease(entry.record.ttl).await?,
                    };
                    match self.claim(&keys, &snap, entry, holder).await? {
                        Some(grant) => {
                            self.revoke_later(entry.lease);
                            return Ok(WaitReply::Granted(grant));
                        }
                        None => {
                            self.spare.lock().unwrap().insert(lease, holder);
                            continue;
                        }
                    }
                }
                Place::Waiting { ahead, .. } => {
                    if !self.keep_alive(entry.lease).await? {
                        self.end_wait(lease);
                        return Ok(WaitReply::Gone);
                    }
                    let spare = self.spare.lock().unwrap().get(&lease).copied();
                    if let Some(spare) = spare {
                        // Keeps the spare from running out during a long wait; if it did,
                        // the grant takes a new one.
                        let _ = self.keep_alive(spare.id).await;
                    }
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

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        let keys = self.keys(name);
        // An acquire dropped half-way through this backend: end its holder lease first, so
        // that a transaction of it still in flight cannot leave a key behind.
        let dropped = self.pending.lock().unwrap().remove(&lease);
        let mut reply = CancelReply::NotFound;
        if let Some(holder) = dropped {
            let on_it = self
                .read_one(&keys, lease)
                .await?
                .filter(|e| e.lease == holder);
            if self.revoke_lease(holder).await? {
                reply = match on_it {
                    Some(e) if e.is_holder() => CancelReply::Released,
                    Some(_) => CancelReply::Dequeued,
                    None => CancelReply::NotFound,
                };
            }
        }
        for _ in 0..MAX_ROUNDS {
            let Some(entry) = self.read_one(&keys, lease).await? else {
                self.end_wait(lease);
                return Ok(reply);
            };
            if entry.is_holder() {
                self.end_wait(lease);
                self.held.lock().unwrap().remove(&lease);
                return Ok(if self.revoke_lease(entry.lease).await? {
                    CancelReply::Released
                } else {
                    CancelReply::NotFound
                });
            }
            // Still waiting: delete it unless it was granted meanwhile.
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.lease(lease),
                    CompareOp::Equal,
                    entry.mod_rev,
                )])
                .and_then([TxnOp::delete(keys.lease(lease), None)]);
            if self.txn(txn).await?.succeeded() {
                self.end_wait(lease);
                self.revoke_later(entry.lease);
                return Ok(CancelReply::Dequeued);
            }
        }
        Err(Error::store(
            StoreErrorKind::Busy,
            format!("etcd: cancel on {name} kept conflicting with other clients"),
        ))
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let known = self.held.lock().unwrap().remove(&lease);
        let etcd_lease = match known {
            Some((l, _)) => l.id,
            None => match self.read_one(&self.keys(name), lease).await? {
                Some(e) if e.is_holder() => e.lease,
                _ => return Ok(false),
            },
        };
        self.revoke_lease(etcd_lease).await
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let _ = ttl; // an etcd lease keeps the TTL it was granted with
        let keys = self.keys(name);
        let known = self.held.lock().unwrap().get(&lease).copied();
        let holder = match known {
            Some((l, _)) => l,
            None => match self.read_one(&keys, lease).await? {
                Some(e) if e.is_holder() => EtcdLease {
                    id: e.lease,
                    ttl: e.record.ttl,
                },
                _ => return Ok(RenewReply::Gone),
            },
        };
        // The keep-alive restarts the TTL; the read proves the record is still there on
        // that lease (a delete by hand would otherwise go unnoticed).
        let (alive, entry) = tokio::join!(self.keep_alive(holder.id), self.read_one(&keys, lease));
        let now = StoreTime::host_now();
        let entry = entry?;
        if !alive? || entry.is_none_or(|e| e.lease != holder.id || !e.is_holder()) {
            self.held.lock().unwrap().remove(&lease);
            self.forget_keep_alive(holder.id);
            return Ok(RenewReply::Gone);
        }
        let expires_at = now.plus(Duration::from_secs(holder.ttl as u64));
        if let Some(h) = self.held.lock().unwrap().get_mut(&lease) {
            h.1 = expires_at;
        }
        Ok(RenewReply::Renewed { expires_at, now })
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let keys = self.keys(name);
        let snap = self.read(&keys).await?;
        if snap.entries.is_empty() {
            return Ok(None);
        }
        let ttls = futures::future::join_all(snap.entries.iter().map(|e| {
            let mut client = self.client.clone();
            async move {
                client
                    .lease_time_to_live(e.lease, None)
                    .await
                    .map(|r| r.ttl().max(0))
                    .unwrap_or(0)
            }
        }))
        .await;
        let now = StoreTime::host_now();
        let mut holders = Vec::new();
        let mut queue = Vec::new();
        let known = self.held.lock().unwrap().clone();
        for (e, ttl) in snap.entries.iter().zip(ttls) {
            // Exact for the leases this backend renews; otherwise etcd's whole seconds left.
            let expires_at = match known.get(&e.id) {
                Some((l, at)) if l.id == e.lease => *at,
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
                });
            }
        }
        holders.sort_by_key(|l| l.fence);
        let capacity = snap.capacity().unwrap_or(0);
        let used = snap.used();
        Ok(Some(SemaphoreStatus {
            name: name.to_string(),
            capacity,
            used,
            available: capacity.saturating_sub(used),
            now,
            holders,
            queue,
        }))
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
                .and_then([TxnOp::put(keys.cap.clone(), capacity.to_string(), None)]);
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
        let Some(entry) = self.read_one(&self.keys(name), lease).await? else {
            return Ok(false);
        };
        if !entry.is_holder() {
            return Ok(false);
        }
        let revoked = self.revoke_lease(entry.lease).await?;
        // A holder in this process hears of it at once; others at their next renewal.
        wake::notify(lease);
        Ok(revoked)
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        let keys = self.keys(name);
        let snap = self.read(&keys).await?;
        let revoked =
            futures::future::join_all(snap.entries.iter().map(|e| self.revoke_lease(e.lease)))
                .await;
        for r in revoked {
            r?;
        }
        self.call(|mut c| {
            let all = keys.all.clone();
            async move {
                c.delete(all, Some(DeleteOptions::new().with_prefix()))
                    .await
            }
        })
        .await
        .map_err(|e| self.err(e))?;
        for e in &snap.entries {
            wake::notify(e.id);
        }
        Ok(!snap.entries.is_empty() || snap.capacity.is_some())
    }

    fn capabilities(&self) -> Capabilities {
        CAPABILITIES
    }
}

/// What the etcd store declares: watch wake-ups, whole-second leases of at least 2 s,
/// revision fences, the hand-off in the waiter's next step.
pub const CAPABILITIES: Capabilities = Capabilities {
    waking: Waking::Push,
    min_ttl: Duration::from_secs(MIN_LEASE_SECS as u64),
    ttl_granularity: Duration::from_secs(1),
    fence: FenceSource::Revision,
    hand_off: HandOff::NextStep,
};

fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore {name:?} has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}
