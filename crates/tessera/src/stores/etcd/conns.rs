//! Connecting (URL, TLS, auth) and sending requests: each request goes to one member at a
//! time and is sent again on the next one when its member cannot be reached (`members.rs`);
//! the reads every operation starts from.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{Client, ConnectOptions, GetOptions, Txn, TxnResponse};

use tessera_core::error::{Error, InvalidInput, Result, StoreErrorKind};
use tessera_core::model::*;

use super::error::{is_unreachable, store_error};
use super::held::{HeldMap, WaitHere};
use super::members::{timed_out, Members, ATTEMPT_TIMEOUT};
use super::notify::Watches;
use super::ops::{Entry, Keys, Snapshot};
use super::session::{EtcdLease, KeepAliveSlot};

pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Acquires of one backend under way in etcd at once; more wait in the client, in the order
/// they came (a fair semaphore), so that a burst of them does not stand in etcd's queue
/// before every other request of every client.
pub(super) const JOINS_IN_FLIGHT: usize = 32;

/// Records in a queue from which on an acquire does not try the uncontended grant first
/// (see [`EtcdBackend::long_queue`]).
pub(super) const LONG_QUEUE: u64 = 256;

/// How long a long queue a join of this backend found is believed long.
pub(super) const LONG_QUEUE_FOR: Duration = Duration::from_secs(1);

/// Times a request is sent again after its member could not be reached (20 ms, 40 ms, …,
/// about 1.5 s in all).
pub(super) const CALL_RETRIES: usize = 6;

/// The etcd backend. Cheap to share behind an `Arc`; dropping it stops its watches.
pub struct EtcdBackend {
    pub(super) members: Arc<Members>,
    pub(super) root: String,
    pub(super) url: String,
    pub(super) secret: Option<String>,
    /// This client's session leases, one per TTL in seconds: every key this backend writes
    /// (waiting records, granted records and their seats, cancel markers) is on one, as
    /// with etcd's own `concurrency` sessions. Kept alive by the heartbeats of waiters and
    /// the renewals of holders; a session that ended (this process stalled past it) is
    /// replaced by a new one at the next write.
    pub(super) sessions: tokio::sync::Mutex<HashMap<i64, EtcdLease>>,
    /// Leases held through this backend (saves a read on renew and release).
    pub(super) held: HeldMap,
    /// Acquires under way, by lease id: if one is dropped half-way, its transaction may
    /// still land after a cancel read the key; such a cancel first writes a marker that
    /// every acquire transaction compares absent.
    pub(super) pending: Mutex<HashMap<LeaseId, ()>>,
    /// The holder and waiter TTLs (seconds) of this backend's waiters, for their heartbeats.
    pub(super) waiting: Mutex<HashMap<LeaseId, WaitHere>>,
    /// No waiter's deadline in `waiting` is before this (`None`: no waiter): the sweep
    /// looks through the waiters only once it has passed. Deadlines only move later
    /// between sweeps, except a new waiter's, which lowers it; both are written under
    /// `waiting`'s lock.
    pub(super) waits_due: Mutex<Option<Instant>>,
    /// Cancels that did not finish (the store failed, or the caller dropped the call, as the
    /// clean-up does past its bound during an outage), by lease id. Their records are on this
    /// client's sessions, which the other waiters and holders of this process keep alive: left
    /// alone, such a record would sit in the queue (or hold the permits a release handed it)
    /// for as long as the process lives. Every acquire and heartbeat tries them again first.
    pub(super) unfinished: Mutex<HashMap<LeaseId, Name>>,
    pub(super) keep_alives: Mutex<HashMap<i64, Arc<KeepAliveSlot>>>,
    /// Acquires under way in etcd at once ([`JOINS_IN_FLIGHT`]).
    pub(super) joins: tokio::sync::Semaphore,
    /// Cancels under way in etcd at once ([`JOINS_IN_FLIGHT`]): thousands of acquires
    /// dropped together (a timeout shared by every waiter) wait here, not in etcd.
    pub(super) leaving: tokio::sync::Semaphore,
    /// Semaphores (their [`Keys::all`]) whose queue a join of this backend found long, and
    /// when ([`EtcdBackend::long_queue`]).
    pub(super) long_queues: Mutex<HashMap<String, Instant>>,
    pub(super) watches: Arc<Watches>,
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

pub(super) fn read_pem(path: &std::path::Path, what: &str, url: &str) -> Result<Vec<u8>> {
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
        let config = super::url::parse_url(raw)?;
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
            waits_due: Mutex::default(),
            unfinished: Mutex::default(),
            keep_alives: Mutex::default(),
            joins: tokio::sync::Semaphore::new(JOINS_IN_FLIGHT),
            leaving: tokio::sync::Semaphore::new(JOINS_IN_FLIGHT),
            long_queues: Mutex::default(),
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

    pub(super) fn err(&self, e: etcd_client::Error) -> Error {
        store_error(e, &self.url, self.secret.as_deref())
    }

    pub(super) fn keys(&self, name: &Name) -> Keys {
        Keys::new(&self.root, name)
    }

    /// Whether a join of this backend found at least [`LONG_QUEUE`] records in the queue of
    /// `keys` within the last [`LONG_QUEUE_FOR`]. An acquire then does not try the
    /// uncontended grant first: that branch's compare ("no `q/` key at all") makes etcd 3.4
    /// read every record of the queue, values and all (10.8 ms of etcd's CPU per
    /// transaction with 10,000 records, against 0.8 ms for a put), which bounded how fast
    /// one process could queue 10,000 waiters. A queue that emptied meanwhile costs that
    /// acquire a read of the semaphore before its grant, never a wrong step: the join's
    /// transaction is valid on any queue.
    pub(super) fn long_queue(&self, keys: &Keys) -> bool {
        let map = self.long_queues.lock().unwrap();
        map.get(&keys.all)
            .is_some_and(|&at| at.elapsed() < LONG_QUEUE_FOR)
    }

    /// A join of this backend found `records` records in the queue of `keys`.
    pub(super) fn note_queue(&self, keys: &Keys, records: u64) {
        let mut map = self.long_queues.lock().unwrap();
        if records >= LONG_QUEUE {
            // Bounded: entries past their time go whenever the map grows large.
            if map.len() >= 1024 {
                map.retain(|_, at| at.elapsed() < LONG_QUEUE_FOR);
            }
            map.insert(keys.all.clone(), Instant::now());
        } else {
            map.remove(&keys.all);
        }
    }

    /// One request, sent to the member this backend talks to, and sent again on the next
    /// member when that one could not be reached or gave no answer within
    /// [`ATTEMPT_TIMEOUT`] (a member killed, restarting or black-holed; see `members.rs`).
    /// Every request of this store may be repeated: writes are transactions whose compares
    /// fail on a second run, and callers read again after a failed compare (a request that
    /// timed out may have landed).
    pub(super) async fn call<T, F, Fut>(&self, f: F) -> std::result::Result<T, etcd_client::Error>
    where
        F: FnMut(Client) -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        self.call_at(ATTEMPT_TIMEOUT, f).await.map(|(_, t)| t)
    }

    /// [`EtcdBackend::call`] with attempts of at most `attempt`, also saying which member
    /// answered.
    pub(super) async fn call_at<T, F, Fut>(
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

    pub(super) async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        self.call(|mut c| {
            let txn = txn.clone();
            async move { c.txn(txn).await }
        })
        .await
        .map_err(|e| self.err(e))
    }

    pub(super) async fn get(
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
    pub(super) async fn read(&self, keys: &Keys) -> Result<Snapshot> {
        let resp = self
            .get(keys.all.clone(), Some(GetOptions::new().with_prefix()))
            .await?;
        Snapshot::parse(keys, revision(resp.header()), resp.kvs())
    }

    /// The `q/` key of one lease, if any.
    pub(super) async fn read_one(&self, keys: &Keys, id: LeaseId) -> Result<Option<Entry>> {
        self.read_one_within(keys, id, ATTEMPT_TIMEOUT).await
    }

    /// [`EtcdBackend::read_one`] with attempts of at most `attempt`.
    pub(super) async fn read_one_within(
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
}

/// The revision of a response header (0 without one).
pub(super) fn revision(header: Option<&etcd_client::ResponseHeader>) -> i64 {
    header.map_or(0, |h| h.revision())
}
