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
//!   renewals keep them alive (a keep-alive on the lease's stream is not a Raft write). A
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
//! - **Waking.** Each waiter watches only what can let it in: the head watches deletions of
//!   `q/` records and the capacity; every other waiter the waiter just ahead of it (its grant
//!   makes this one the head; its deletion moves this one up). A release wakes one waiter,
//!   not the queue. A woken waiter's heartbeat re-reads the semaphore, its own record and its
//!   leases before it believes or makes a grant (the mutex recipe's known fault is to trust
//!   a watch event without re-reading). Watches are set again from a fresh read after any
//!   disconnect or compaction (see `watch.rs`); the heartbeat, every
//!   `min(waiter TTL/3, TTL/4)`, is the safety net.
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
//!   member when an exchange fails or times out, and watches follow the backend to its new
//!   member, reopened from the revision they started at (see `watch.rs`).
//!
//! # How each Backend operation maps
//!
//! | operation | etcd |
//! |---|---|
//! | `acquire` | keep-alive of the sessions; one transaction: grant at once if the queue is empty, else write the record and read the semaphore; then a grant transaction if it fits |
//! | `heartbeat` | while its watch is quiet (`watch.rs`), keep-alives and a read of its own record in one round trip; otherwise keep-alives and a read of the semaphore, then a grant transaction if it fits |
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
//! - **Capacity**: the capacity key has no lease (it must outlive any one client); an idle
//!   semaphore (no `q/` record) takes the capacity of the next acquire, as on every store,
//!   in a transaction that compares the queue empty. A release, cancel, revoke or purge that
//!   removes the last record deletes the capacity key in the same transaction (a nested one
//!   that compares the rest of the queue empty, `Keys::drop_capacity_if_last`), so a
//!   semaphore nobody holds or waits on leaves no key. When the last record goes by expiry
//!   instead (its client died), the key (a few bytes) stays until the name's next lease
//!   ends, or `delete`.
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
//! [`HandOff::NextStep`]: crate::seam::HandOff::NextStep

mod error;
mod members;
pub(crate) mod ops;
pub(crate) mod url;
mod watch;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, LeaseKeepAliveStream,
    LeaseKeeper, PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::error::{Error, InvalidInput, Result, StoreErrorKind};
use crate::model::*;
use crate::seam::{Backend, Capabilities, FenceSource, HandOff, Waking};
use crate::wake;

use error::{is_lease_not_found, is_out_of_space, is_unreachable, store_error};
use members::{timed_out, Members, ATTEMPT_TIMEOUT};
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
/// Reads and transactions a release tries to hand its permits off in before it just ends.
const HAND_OFF_ROUNDS: usize = 4;

/// How long one attempt of a renewal of a lease of `ttl` seconds may take on one member:
/// TTL/8, between 250 ms and [`ATTEMPT_TIMEOUT`]. The keeper bounds a renewal by the moment
/// `lost()` is due (about TTL/3 after it starts), so a renewal whose member stopped
/// answering must give up on it early enough to be sent again on the next one in time.
fn renewal_attempt(ttl: i64) -> Duration {
    (Duration::from_secs(ttl.max(1) as u64) / 8).clamp(Duration::from_millis(250), ATTEMPT_TIMEOUT)
}

/// An etcd lease and its TTL in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct EtcdLease {
    pub(super) id: i64,
    pub(super) ttl: i64,
}

/// A keep-alive stream kept open between renewals of one etcd lease, with the member it
/// was opened on.
type KeepAliveSlot = Arc<tokio::sync::Mutex<Option<(usize, LeaseKeeper, LeaseKeepAliveStream)>>>;

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
struct WaitHere {
    /// The holder and waiter TTLs, seconds.
    ttls: (i64, i64),
    /// The mod revision of its waiting record (a grant writes the record again).
    rev: i64,
    keys: Keys,
    /// One waiter TTL after its last heartbeat: past it, the record goes (as above).
    deadline: Instant,
    /// The wake-up stamp ([`Watches::now`]) taken before the read that noted it last (0:
    /// an acquire's read): its watch has been quiet since then, or the heartbeat reads again
    /// (see [`EtcdBackend::heartbeat`]).
    read_at: u64,
}

/// How long a cancel's marker (see [`EtcdBackend::cancel`]) outlives the request it stops.
const MARKER_TTL: i64 = 30;

/// The etcd backend. Cheap to share behind an `Arc`; dropping it stops its watches.
pub struct EtcdBackend {
    members: Arc<Members>,
    root: String,
    url: String,
    secret: Option<String>,
    /// This client's session leases, one per TTL in seconds: every key this backend writes
    /// (waiting records, granted records and their seats, cancel markers) is on one, as
    /// with etcd's own `concurrency` sessions. Kept alive by the heartbeats of waiters and
    /// the renewals of holders; a session that ended (this process stalled past it) is
    /// replaced by a new one at the next write.
    sessions: tokio::sync::Mutex<HashMap<i64, EtcdLease>>,
    /// Leases held through this backend (saves a read on renew and release).
    held: HeldMap,
    /// Acquires under way, by lease id: if one is dropped half-way, its transaction may
    /// still land after a cancel read the key; such a cancel first writes a marker that
    /// every acquire transaction compares absent.
    pending: Mutex<HashMap<LeaseId, ()>>,
    /// The holder and waiter TTLs (seconds) of this backend's waiters, for their heartbeats.
    waiting: Mutex<HashMap<LeaseId, WaitHere>>,
    /// Cancels that did not finish (the store failed, or the caller dropped the call, as the
    /// clean-up does past its bound during an outage), by lease id. Their records are on this
    /// client's sessions, which the other waiters and holders of this process keep alive: left
    /// alone, such a record would sit in the queue (or hold the permits a release handed it)
    /// for as long as the process lives. Every acquire and heartbeat tries them again first.
    unfinished: Mutex<HashMap<LeaseId, Name>>,
    keep_alives: Mutex<HashMap<i64, KeepAliveSlot>>,
    watches: Arc<Watches>,
}

/// Unfinished cancels tried again per acquire or heartbeat (see [`EtcdBackend::finish_cancels`]).
const UNFINISHED_PER_CALL: usize = 16;

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
        let mut options = ConnectOptions::new()
            .with_timeout(REQUEST_TIMEOUT)
            .with_connect_timeout(CONNECT_TIMEOUT)
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(2))
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = &config.user {
            // etcd's auth tokens expire (a simple token `--auth-token-ttl` after its last
            // use, 300 s by default; a JWT at a fixed time): a request refused for an
            // expired token authenticates again and is sent once more.
            options = options
                .with_user(user.clone(), password.clone())
                .with_auto_token_refresh(true);
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
        // Connected member by member, on first use (see `members.rs`).
        let members = Arc::new(Members::new(config.endpoints.clone(), options));
        let held = HeldMap::default();
        let backend = EtcdBackend {
            watches: Watches::new(Arc::clone(&members), Arc::clone(&held)),
            members,
            root: config.prefix,
            url: config.redacted,
            secret,
            sessions: tokio::sync::Mutex::default(),
            held,
            pending: Mutex::default(),
            waiting: Mutex::default(),
            unfinished: Mutex::default(),
            keep_alives: Mutex::default(),
        };
        // One read: an unreachable cluster or a refused user fails here (after the
        // retries every request gets, so an election under way is ridden out).
        let probe = backend.get(
            Keys::sems(&backend.root),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(1),
            ),
        );
        // Each member named may take one attempt to fail before the next one is tried.
        let n = backend.members.len() as u32;
        tokio::time::timeout(CONNECT_TIMEOUT.max(ATTEMPT_TIMEOUT * (n + 1)), probe)
            .await
            .map_err(|_| {
                Error::store(
                    StoreErrorKind::Timeout,
                    format!("etcd: no answer from {} in time", backend.url),
                )
            })??;
        Ok(backend)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.root
    }

    fn err(&self, e: etcd_client::Error) -> Error {
        store_error(e, self.secret.as_deref())
    }

    fn keys(&self, name: &Name) -> Keys {
        Keys::new(&self.root, name)
    }

    /// One request, sent to the member this backend talks to, and sent again on the next
    /// member when that one could not be reached or gave no answer within
    /// [`ATTEMPT_TIMEOUT`] (a member killed, restarting or black-holed; see `members.rs`).
    /// Every request of this store may be repeated: writes are transactions whose compares
    /// fail on a second run, and callers read again after a failed compare (a request that
    /// timed out may have landed).
    async fn call<T, F, Fut>(&self, f: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_at(ATTEMPT_TIMEOUT, f).await.map(|(_, t)| t)
    }

    /// [`EtcdBackend::call`] with attempts of at most `attempt`, also saying which member
    /// answered.
    async fn call_at<T, F, Fut>(
        &self,
        attempt_timeout: Duration,
        mut f: F,
    ) -> std::result::Result<(usize, T), etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let n = self.members.len();
        // Every member gets two tries, and one member at least CALL_RETRIES.
        let retries = CALL_RETRIES.max(2 * n);
        let mut backoff = Duration::from_millis(20);
        let mut attempt = 0;
        loop {
            let member = self.members.current();
            let outcome = match self.members.client(member).await {
                Ok(c) => tokio::time::timeout(attempt_timeout, f(c))
                    .await
                    .unwrap_or_else(|_| Err(timed_out("request"))),
                Err(e) => Err(e),
            };
            match outcome {
                Err(e) if attempt < retries && is_unreachable(&e) => {
                    attempt += 1;
                    tracing::debug!(error = %e, attempt, member, "etcd request failed; sending it again");
                    self.members.failed(member);
                    // A pause once every member has been tried (an election under way).
                    if attempt % n == 0 {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(400));
                    }
                }
                r => return r.map(|t| (member, t)),
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
        self.read_one_within(keys, id, ATTEMPT_TIMEOUT).await
    }

    /// [`EtcdBackend::read_one`] with attempts of at most `attempt`.
    async fn read_one_within(
        &self,
        keys: &Keys,
        id: LeaseId,
        attempt: Duration,
    ) -> Result<Option<Entry>> {
        let key = keys.lease(id);
        let (_, resp) = self
            .call_at(attempt, |mut c| {
                let key = key.clone();
                async move { c.get(key, None).await }
            })
            .await
            .map_err(|e| self.err(e))?;
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

    /// One keep-alive of an etcd lease, on its keep-alive stream (opened on first use and
    /// kept): `true` if the lease lives (etcd restarted its TTL when it received the
    /// request), `false` if it is gone.
    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        self.keep_alive_within(lease, ATTEMPT_TIMEOUT).await
    }

    /// [`EtcdBackend::keep_alive`] with attempts of at most `attempt` (a renewal's are
    /// shorter, see [`renewal_attempt`]).
    async fn keep_alive_within(&self, lease: i64, attempt: Duration) -> Result<bool> {
        let slot = Arc::clone(self.keep_alives.lock().unwrap().entry(lease).or_default());
        let mut guard = slot.lock().await;
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
                    return Ok(true);
                }
                Ok(Ok(Some(_))) => {
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

    /// This backend's session lease of `ttl` seconds, kept alive by this call: its TTL
    /// restarted after the call began, so a key written on it lives at least until then
    /// plus `ttl`. A session that ended is replaced.
    async fn session(&self, ttl: i64) -> Result<EtcdLease> {
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
    async fn drop_session(&self, lease: EtcdLease) {
        let mut sessions = self.sessions.lock().await;
        if sessions.get(&lease.ttl) == Some(&lease) {
            sessions.remove(&lease.ttl);
        }
        self.forget_keep_alive(lease.id);
    }

    /// A transaction that may name a session lease that just ended: on "lease not found"
    /// the session is forgotten and `None` returned (the caller writes again on a new one).
    async fn txn_on(&self, txn: Txn, sessions: &[EtcdLease]) -> Result<Option<TxnResponse>> {
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

    /// Ends a grant and hands its permits to the head of the queue in the same transaction
    /// (see the module docs): `true` if the record of `id` was still the grant of `fence`.
    /// Each waiter granted here gets its grant on its own client's session
    /// ([`Entry::hand_off_lease`]: provisionally the one of its queue entry); if that lease
    /// ended meanwhile, the grant is ended alone, and the waiter grants itself when its
    /// watch fires.
    async fn end_grant(&self, keys: &Keys, id: LeaseId, fence: i64) -> Result<bool> {
        let mut seen = None;
        for _ in 0..HAND_OFF_ROUNDS {
            let snap = self.read(keys).await?;
            let rev = match snap.entry(id) {
                Some(e) if e.fence() == fence && e.is_holder() => e.mod_rev,
                _ => return Ok(false),
            };
            seen = Some((rev, snap.seats_of(id)));
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
    /// `fence`. `seen`: its mod revision and seats as just read, if it was.
    async fn end_grant_alone(
        &self,
        keys: &Keys,
        id: LeaseId,
        fence: i64,
        mut seen: Option<(i64, Vec<u32>)>,
    ) -> Result<bool> {
        for _ in 0..HAND_OFF_ROUNDS {
            let (rev, seats) = match seen.take() {
                Some(s) => s,
                None => match self.read_one(keys, id).await? {
                    Some(e) if e.fence() == fence && e.is_holder() => {
                        (e.mod_rev, e.record.seats().to_vec())
                    }
                    _ => return Ok(false),
                },
            };
            let mut ops = vec![TxnOp::delete(keys.lease(id), None)];
            ops.extend(seats.iter().map(|&s| TxnOp::delete(keys.seat(s), None)));
            ops.push(keys.drop_capacity_if_last(id));
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

    /// A renewal of a grant on `session` (not provisional): the keep-alive restarts the
    /// session's TTL, and the read in the same round trip proves the grant is still there,
    /// the same (a revoke or a delete removes it; the session may live on).
    async fn renew_on(
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
    async fn settle(&self, keys: &Keys, id: LeaseId, fence: i64) -> Result<RenewReply> {
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
            let txn = Txn::new()
                .when([Compare::mod_revision(
                    keys.lease(id),
                    CompareOp::Equal,
                    entry.mod_rev,
                )])
                .and_then(keys.grant_ops(id, &record, holder.id)?);
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

    /// The grant transaction: `entry` (waiting, seen in `snap`) takes the lowest free seats,
    /// on `holder` (a session kept alive after the caller's request was sent). `None` if
    /// the compares failed (someone changed the semaphore since `snap`): read again.
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

    /// A grant made or found now, its session kept alive after the caller's request was
    /// sent: noted as held through this backend, its waiting ended.
    fn granted(&self, keys: &Keys, entry: &Entry, now: StoreTime) -> Grant {
        let (held, grant) = HeldHere::new(keys, entry, now);
        self.held.lock().unwrap().insert(entry.id, held);
        self.end_wait(entry.id);
        grant
    }

    /// The grant of a key that already holds (a retried acquire or a heartbeat after a
    /// grant whose reply was lost): its lease is kept alive first, so the reply's TTL runs
    /// from after the caller's request was sent. `None` if the lease just ended.
    async fn existing_grant(&self, keys: &Keys, entry: &Entry) -> Result<Option<Grant>> {
        self.existing_grant_after(keys, entry, &[]).await
    }

    /// [`EtcdBackend::existing_grant`], sparing the keep-alive when one of `renewed` (the
    /// sessions this call already kept alive) is the lease the record is on.
    async fn existing_grant_after(
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
    fn watch(&self, keys: &Keys, snap: &Snapshot, ahead: Option<LeaseId>, id: LeaseId) {
        let target = match ahead {
            None => Target::Head {
                queue: keys.queue.clone(),
                cap: keys.cap.clone(),
            },
            Some(a) => Target::Behind(keys.lease(a)),
        };
        self.watches.set(id, target, keys, snap.revision + 1);
    }

    /// Notes (or renews) a waiter of this backend, `entry` as its heartbeat or acquire read
    /// it.
    fn note_waiting(&self, entry: &Entry, keys: &Keys, ttls: (i64, i64), read_at: u64) {
        let deadline = Instant::now() + Duration::from_secs(ttls.1 as u64);
        self.waiting.lock().unwrap().insert(
            entry.id,
            WaitHere {
                ttls,
                rev: entry.mod_rev,
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
    async fn sweep(&self) -> Result<()> {
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
        let waits: Vec<(LeaseId, WaitHere)> = {
            let mut map = self.waiting.lock().unwrap();
            let overdue: Vec<LeaseId> = map
                .iter()
                .filter(|(_, w)| w.deadline < now)
                .map(|(id, _)| *id)
                .collect();
            overdue
                .into_iter()
                .filter_map(|id| map.remove(&id).map(|w| (id, w)))
                .collect()
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
    fn end_wait(&self, id: LeaseId) {
        self.watches.stop(id);
        self.waiting.lock().unwrap().remove(&id);
    }

    /// Deletes a waiting record if it is still as read; `true` if it was.
    async fn dequeue(&self, keys: &Keys, entry: &Entry) -> Result<bool> {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                keys.lease(entry.id),
                CompareOp::Equal,
                entry.mod_rev,
            )])
            .and_then([
                TxnOp::delete(keys.lease(entry.id), None),
                keys.drop_capacity_if_last(entry.id),
            ]);
        Ok(self.txn(txn).await?.succeeded())
    }

    /// The rest of an acquire whose waiting record was written in this call, seen in
    /// `snap`: grant it if it fits, refuse a try that does not, or leave it queued.
    async fn place_new(
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
        if !self.dequeue(keys, entry).await? {
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
            } else if self.dequeue(&keys, &entry).await? {
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
                    get_all(),
                ])
                .or_else([get_all()]);
            let txn = Txn::new()
                .when(when)
                .and_then(keys.grant_ops(id, &granted, holder.id)?)
                .or_else([TxnOp::txn(nested)]);
            let Some(resp) = self.txn_on(txn, &[holder, waiter]).await? else {
                continue;
            };
            if resp.succeeded() {
                let fence = revision(resp.header());
                return Ok(AcquireReply::Granted(self.granted(
                    &keys,
                    &Entry::written(id, granted.clone(), fence, holder.id),
                    now,
                )));
            }
            let (written, read) = txn_read(&resp)
                .ok_or_else(|| Error::Corrupt("etcd transaction without its read".into()))?;
            wrote |= written;
            let snap = Snapshot::parse(&keys, revision(read.header()), read.kvs())?;
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
                    let mut ops = vec![TxnOp::put(keys.cap.clone(), capacity.to_string(), None)];
                    ops.extend(keys.grant_ops(id, &granted, holder.id)?);
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
        self.finish_cancels().await;
        let id = req.lease_id;
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
                .map(|w| w.rev);
            (w.map(|w| w.ttls), quiet)
        };
        if let (Some((hs, ws)), Some(rev)) = (known, quiet) {
            // Nothing that can let it in happened since the last read (its watch is quiet):
            // the sessions kept alive and its own record read, in one round trip. A record
            // still waiting, unchanged and on the waiter session just kept alive waits on;
            // anything else takes the full read below.
            let (entry, h, w) = tokio::join!(
                self.read_one(&keys, lease),
                self.session(hs),
                self.session(ws)
            );
            let (entry, w) = (entry?, (h?, w?).1);
            if entry.is_some_and(|e| !e.is_holder() && e.mod_rev == rev && e.lease == w.id) {
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

/// etcd's default `--max-txn-ops`: it refuses a transaction with more compares, or more
/// operations in either branch ("too many operations in txn request").
const MAX_TXN_OPS: usize = 128;

/// The most permits one lease takes on etcd. An acquire's first transaction compares the
/// capacity, the queue, the cancel marker and each of the W seats it would take (W + 3
/// compares), and carries in its other branch a transaction of 3 compares that writes the
/// waiting record, which etcd counts against what the outer one leaves: W + 6 <= 128.
/// A heavier request is refused before it reaches the store.
pub const MAX_WEIGHT: u32 = MAX_TXN_OPS as u32 - 6;

/// What the etcd store declares: watch wake-ups, whole-second leases of at least 2 s,
/// revision fences, the hand-off in the waiter's next step, at most [`MAX_WEIGHT`] permits
/// per lease.
pub const CAPABILITIES: Capabilities = Capabilities {
    waking: Waking::Push,
    min_ttl: Duration::from_secs(MIN_LEASE_SECS as u64),
    ttl_granularity: Duration::from_secs(1),
    fence: FenceSource::Revision,
    hand_off: HandOff::NextStep,
    max_weight: MAX_WEIGHT,
};

fn not_found(name: &Name) -> Error {
    Error::NotFound(format!(
        "semaphore \"{name}\" has no holders or waiters (its capacity is set by the clients that use it)"
    ))
}
