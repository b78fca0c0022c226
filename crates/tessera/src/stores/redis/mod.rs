//! The Redis store (`redis://`, `rediss://` for TLS).
//!
//! ```text
//! redis://[user[:password]@]host[:port][/db][?prefix=tessera][&eviction=warn|refuse]
//! ```
//!
//! - `prefix` (default `tessera`; `A-Z a-z 0-9 . _ -`) isolates tenants: every key of a
//!   semaphore lives under the Cluster hash tag `{<prefix>:<name>}`, so each operation touches
//!   one slot, and wake-ups travel on `<prefix>:wake:<client id>`.
//! - `eviction`: at connect the store reads `maxmemory` and `maxmemory-policy`. A memory limit
//!   with a policy that may evict tessera's keys (`allkeys-*`, `volatile-*`: every tessera key
//!   has a TTL) can silently drop leases and over-grant. By default this is logged as a
//!   warning; `eviction=refuse` makes connect fail instead. A server that refuses `CONFIG`
//!   (ACL) is not checked. With `noeviction` (the safe policy), a full server refuses what
//!   would add state (an acquire, a resize, a rate charge) with Redis's `OOM` error, and
//!   still runs what keeps or frees it: renewals, waiter heartbeats, release, cancel, revoke,
//!   delete and status. Holders keep their leases through the episode and can give them back.
//!
//! # Least-privilege ACL
//!
//! One user per tenant, confined to its prefix (here `tessera`; for `?prefix=acme` write
//! `~{acme:*` and `&acme:wake:*`):
//!
//! ```text
//! ACL SETUSER app on >PASSWORD resetkeys ~{tessera:* resetchannels &tessera:wake:*
//!     -@all +fcall +evalsha +script|load +subscribe +ping +scan +config|get
//!     +time +hmget +hget +hset +hdel +hgetall +exists +del +get +set +pexpire +publish
//!     +zadd +zrem +zrange +zrangebyscore +zrank +zcard +zremrangebyrank +zremrangebyscore
//! ```
//!
//! The first line of commands is what the client sends (`config|get` is optional: without
//! it the eviction check is skipped); the rest are the commands the semaphore and rate
//! scripts call, which ACLs check inside scripts and functions too. Prefixes never contain
//! `:`, so `~{acme:*` never matches another tenant's keys. With these rules a user connecting
//! with another tenant's prefix is refused at connect (the wake channel) and on every
//! operation (the keys), as [`Error::Store`]; `tests/redis_security.rs` proves it. `SCAN` is
//! not filtered by key patterns in Redis, so a tenant's user can see (not read or change) the
//! key names, hence the semaphore names, of other tenants on the same server; use a server
//! or a database per tenant where names are secret.
//!
//! Such a user cannot load tessera's function library (`FUNCTION LOAD` is deliberately not in
//! the list: a user who may load functions may also replace the ones other tenants call), so
//! its client runs the same steps as `EVALSHA` scripts, which costs Redis more per call. To
//! give tenants the faster `FCALL` path, let an administrator load the library once per
//! server and tessera version: any tessera operation on a semaphore by a user allowed
//! `FUNCTION LOAD` does it, e.g. `tessera --store redis://admin:…@host status any-name`.
//! Each version whose scripts differ loads its own library (`tessera_<hash of the code>`,
//! listed by `FUNCTION LIST LIBRARYNAME tessera_`); once no client of an older version runs,
//! `FUNCTION DELETE` removes its library. Functions are kept in RDB and AOF files and
//! replicated like data; when a server lost them, the next call of a client allowed to load
//! them loads them again, and other clients fall back to scripts. A client that fell back
//! tries the library again a minute later ([`FUNCTIONS_RETRY`]), so a refusal that passes
//! (OOM, a read-only replica before a failover, an ACL widened later) does not leave it on
//! the slower path for the rest of its life.
//!
//! # Implementation details
//!
//! Each operation is one `FCALL` of tessera's function library ([`ops::Library`]; one
//! `EVALSHA` of the same code where functions are unavailable) that runs the reference
//! model's step on the server clock (`TIME`), and publishes the lease ids to wake on the
//! *waking client's own* channel, so a grant costs Redis work for one subscriber only. Inside
//! Redis the cost of a call is mostly per `redis.call`, so counters kept in the meta hash
//! (queue length, a lower bound of the earliest expiry, the instant every key expires) let a
//! step skip the calls that would only confirm there is nothing to purge, hand off or
//! re-expire (see `prelude.lua`). A step purges at most 256 expired holders and 4,096 dead
//! waiters (in bulk), so its work stays bounded when thousands of leases expire together; it
//! then wakes the head of the queue, whose heartbeat purges the next batch, and so on.
//!
//! Each [`RedisBackend`] has a random client id and one subscriber task on a dedicated pub/sub
//! connection, which calls [`crate::wake::notify`] for every lease id it receives, or
//! [`crate::wake::notify_grant`] when the wake-up carries the grant (the scripts push the grant
//! to clients whose id ends with `.g`, as this one's does, so a woken waiter needs no round
//! trip to learn it; older clients get the bare lease id). The
//! subscription is confirmed before `connect` returns, so no grant to this client is
//! published before anyone listens. When the subscriber's connection drops, it reconnects
//! and resubscribes with backoff, then wakes every waiter of this backend so each asks the
//! store at once (a grant published during the gap is found by that heartbeat instead of the
//! next periodic one). Commands go through a `ConnectionManager`, which reconnects by itself.

mod ops;
mod rate;

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use redis::aio::ConnectionManager;
use redis::{RedisError, Value};
use tokio::task::JoinHandle;

use crate::error::{redact_url, Error, InvalidInput, Result, StoreErrorKind};
use crate::model::*;
use crate::seam::{Backend, Capabilities};
use crate::wake;

use ops::{keys, micros, Library, Op};

/// Default key prefix.
pub const DEFAULT_PREFIX: &str = "tessera";
/// Longest key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect attempts of the command connection before a request fails (50 ms, 100 ms, …).
const RECONNECT_ATTEMPTS: usize = 3;
/// How often the subscriber checks that its connection is alive.
const SUBSCRIBER_PING: Duration = Duration::from_secs(10);

/// What to do when the server may evict tessera's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EvictionPolicy {
    Warn,
    Refuse,
}

/// A parsed `redis://` or `rediss://` URL.
struct Config {
    /// The URL handed to redis-rs (tessera's options removed).
    server_url: String,
    /// The URL for messages, password replaced.
    redacted: String,
    prefix: String,
    eviction: EvictionPolicy,
    tls: bool,
}

fn parse_url(raw: &str) -> Result<Config> {
    let redacted = redact_url(raw);
    let bad = |reason: String| -> Error {
        InvalidInput::StoreUrl {
            url: redacted.clone(),
            reason,
        }
        .into()
    };
    let mut url = url::Url::parse(raw).map_err(|e| bad(format!("not a URL ({e})")))?;
    let tls = match url.scheme() {
        "redis" => false,
        "rediss" => true,
        _ => return Err(bad("expected redis:// or rediss://".into())),
    };
    if url.host_str().is_none_or(str::is_empty) {
        return Err(bad("missing host, e.g. redis://127.0.0.1:6379".into()));
    }
    let path = url.path().trim_start_matches('/');
    if !path.is_empty() && path.parse::<u16>().is_err() {
        return Err(bad(format!(
            "the path must be a database number, e.g. /0, not /{path}"
        )));
    }
    let mut prefix = DEFAULT_PREFIX.to_string();
    let mut eviction = EvictionPolicy::Warn;
    // Options redis-rs itself reads from the URL, handed through.
    let mut passed: Vec<(String, String)> = Vec::new();
    for (k, v) in url.query_pairs() {
        match &*k {
            "prefix" => {
                if v.is_empty()
                    || v.len() > MAX_PREFIX_LEN
                    || !v
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
                {
                    return Err(bad(format!(
                        "prefix {v:?} must be 1-{MAX_PREFIX_LEN} bytes of A-Z a-z 0-9 . _ -"
                    )));
                }
                prefix = v.into_owned();
            }
            "eviction" => {
                eviction = match &*v {
                    "warn" => EvictionPolicy::Warn,
                    "refuse" => EvictionPolicy::Refuse,
                    _ => return Err(bad(format!("eviction={v} must be warn or refuse"))),
                }
            }
            "protocol" => passed.push((k.into_owned(), v.into_owned())),
            _ => {
                return Err(bad(format!(
                    "unknown option {k:?}; known: prefix, eviction, protocol"
                )))
            }
        }
    }
    url.set_query(None);
    if !passed.is_empty() {
        url.query_pairs_mut().extend_pairs(passed);
    }
    Ok(Config {
        server_url: url.to_string(),
        redacted,
        prefix,
        eviction,
        tls,
    })
}

/// Turns a redis-rs error into a tessera error; `secret` (the URL's password) never appears.
fn store_error(e: RedisError, secret: Option<&str>) -> Error {
    if e.code() == Some("TESSERA_CORRUPT") {
        return Error::Corrupt(e.detail().unwrap_or("corrupt semaphore state").to_string());
    }
    if e.code() == Some("WRONGTYPE") {
        // A key of tessera's layout holds something else: written by someone else.
        return Error::Corrupt(format!("a tessera key holds another type: {e}"));
    }
    let kind = if e.is_timeout() {
        StoreErrorKind::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        StoreErrorKind::Connection
    } else if e.code() == Some("BUSY") || e.code() == Some("LOADING") {
        StoreErrorKind::Busy
    } else {
        StoreErrorKind::Other
    };
    let mut message = e.to_string();
    if let Some(s) = secret.filter(|s| !s.is_empty()) {
        message = message.replace(s, "***");
    }
    Error::store(kind, format!("redis: {message}"))
}

/// The Redis backend. Cheap to share behind an `Arc`; dropping it stops its subscriber.
pub struct RedisBackend {
    conn: ConnectionManager,
    /// Whether operations go to the function library (`FCALL`): [`FUNCTIONS`], or the
    /// instant (ms since [`epoch_ms`]'s origin) after which the library is tried again, once
    /// the server refused it (no functions, an ACL allowing neither `FCALL` nor `FUNCTION
    /// LOAD`, a load refused under OOM or on a read-only replica; see [`Library`]).
    functions_from: AtomicU64,
    /// How long after a refusal the library is tried again.
    functions_retry: Duration,
    prefix: String,
    /// `<prefix>:wake:`; this client's channel is `wake_base + client_id`.
    wake_base: String,
    client_id: String,
    url: String,
    secret: Option<String>,
    /// Lease ids queued through this backend, woken after a resubscription.
    waiting: Arc<Mutex<HashSet<LeaseId>>>,
    subscriber: JoinHandle<()>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.url)
            .field("prefix", &self.prefix)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.subscriber.abort();
    }
}

impl RedisBackend {
    /// Connects to a `redis://` or `rediss://` URL (see the module docs): parses it, opens
    /// the command connection, checks the eviction policy and starts the wake-up subscriber.
    pub async fn connect(raw: &str) -> Result<Self> {
        let config = parse_url(raw)?;
        let secret = url::Url::parse(raw)
            .ok()
            .and_then(|u| u.password().map(str::to_string));
        let err = |e: RedisError| store_error(e, secret.as_deref());
        if config.tls {
            // redis-rs builds its rustls config with the process-wide provider; install ring
            // unless the application already chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let client = redis::Client::open(config.server_url.as_str()).map_err(|e| {
            Error::from(InvalidInput::StoreUrl {
                url: config.redacted.clone(),
                reason: store_error(e, secret.as_deref()).to_string(),
            })
        })?;
        // One plain connection first: a wrong password or an unreachable server fails here at
        // once, where the connection manager would retry with backoff for seconds.
        let probe_config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT));
        let mut probe = client
            .get_multiplexed_async_connection_with_config(&probe_config)
            .await
            .map_err(err)?;
        check_eviction(&mut probe, &config, secret.as_deref()).await?;
        drop(probe);
        // Few reconnect attempts: with redis-rs's default (six, backing off to 3.2 s) every
        // request to a server that refuses connections waited about 6 s before it failed;
        // now it fails within about a second (a black-holed server still costs up to the
        // connect timeout per attempt). The loops that must ride out an outage retry on
        // their own (the lease keeper, a waiting acquire, a waiter's heartbeat).
        let manager_config = redis::aio::ConnectionManagerConfig::new()
            .set_response_timeout(Some(RESPONSE_TIMEOUT))
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_number_of_retries(RECONNECT_ATTEMPTS)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(400));
        let conn = client
            .get_connection_manager_with_config(manager_config)
            .await
            .map_err(err)?;

        // The suffix asks the scripts to push grants with the wake-ups (ops::GRANT_PUSH).
        let client_id = format!("{:032x}{}", rand::random::<u128>(), ops::GRANT_PUSH);
        let wake_base = format!("{}:wake:", config.prefix);
        let channel = format!("{wake_base}{client_id}");
        let waiting: Arc<Mutex<HashSet<LeaseId>>> = Arc::default();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let subscriber = tokio::spawn(subscribe_loop(
            client,
            channel,
            Arc::clone(&waiting),
            config.redacted.clone(),
            ready_tx,
        ));
        let ready = tokio::time::timeout(CONNECT_TIMEOUT, ready_rx).await;
        if !matches!(ready, Ok(Ok(Ok(())))) {
            subscriber.abort();
            // A refusal by the server (an ACL without the wake channel: NOPERM) is a setup
            // mistake that no retry fixes, so it keeps its own kind; anything else (a dropped
            // connection, no answer in time) is a connection fault.
            let (kind, reason) = match ready {
                Ok(Ok(Err(e))) => match store_error(e, secret.as_deref()) {
                    Error::Store { kind, message } => (kind, message),
                    other => (StoreErrorKind::Other, other.to_string()),
                },
                _ => (StoreErrorKind::Timeout, "timed out".to_string()),
            };
            return Err(Error::store(
                kind,
                format!(
                    "could not subscribe to wake-ups on {}: {reason}",
                    config.redacted
                ),
            ));
        }
        Ok(RedisBackend {
            conn,
            functions_from: AtomicU64::new(FUNCTIONS),
            functions_retry: FUNCTIONS_RETRY,
            prefix: config.prefix,
            wake_base,
            client_id,
            url: config.redacted,
            secret,
            waiting,
            subscriber,
        })
    }

    /// This backend's client id (the suffix of its wake-up channel).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The names behind every key matching `pattern` (a `SCAN`, so Redis is never blocked),
    /// sorted and without duplicates; `name_of` maps a key to its name.
    pub(super) async fn scan_names(
        &self,
        pattern: &str,
        name_of: impl Fn(&str) -> Option<Name>,
    ) -> Result<Vec<String>> {
        let mut conn = self.conn.clone();
        let mut cursor: u64 = 0;
        let mut names = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.err(e))?;
            names.extend(
                keys.iter()
                    .filter_map(|k| name_of(k))
                    .map(|n| n.to_string()),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    fn err(&self, e: RedisError) -> Error {
        store_error(e, self.secret.as_deref())
    }

    /// Runs `op` on the keys of `name` with the shared first argument and `args`.
    async fn run(&self, op: Op, name: &Name, args: &[String]) -> Result<Value> {
        let keys = keys(&self.prefix, name);
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(self.wake_base.as_str());
        all.extend(args.iter().map(String::as_str));
        self.call(op, &keys, &all).await
    }

    /// One round trip: `FCALL` of the library's function for `op`, or `EVALSHA` of its
    /// script. A server that lost the library (restart, `FUNCTION FLUSH`) gets it again and
    /// the call is retried once, as redis-rs does for scripts after `NOSCRIPT`.
    pub(super) async fn call(&self, op: Op, keys: &[String], args: &[&str]) -> Result<Value> {
        let library = Library::get();
        let mut conn = self.conn.clone();
        let from = self.functions_from.load(Ordering::Relaxed);
        if from == FUNCTIONS || epoch_ms() >= from {
            // Sized up front: growing the buffer argument by argument cost more than the
            // arguments themselves.
            let function = library.function(op);
            let data = 8
                + function.len()
                + keys.iter().map(String::len).sum::<usize>()
                + args.iter().map(|a| a.len()).sum::<usize>();
            let mut fcall = redis::Cmd::with_capacity(3 + keys.len() + args.len(), data);
            fcall
                .arg("FCALL")
                .arg(function)
                .arg(keys.len())
                .arg(keys)
                .arg(args);
            match fcall.query_async::<Value>(&mut conn).await {
                Ok(v) => {
                    if from != FUNCTIONS {
                        self.use_functions();
                    }
                    return Ok(v);
                }
                Err(e)
                    if e.code() == Some("ERR") && e.to_string().contains("Function not found") =>
                {
                    if self.load_library(&mut conn).await? {
                        let v = fcall
                            .query_async(&mut conn)
                            .await
                            .map_err(|e| self.err(e))?;
                        if from != FUNCTIONS {
                            self.use_functions();
                        }
                        return Ok(v);
                    }
                }
                Err(e) if functions_unavailable(&e) => self.use_scripts(&e),
                Err(e) => return Err(self.err(e)),
            }
        }
        let mut inv = library.script(op).prepare_invoke();
        inv.key(keys);
        for a in args {
            inv.arg(*a);
        }
        inv.invoke_async(&mut conn).await.map_err(|e| self.err(e))
    }

    /// Loads the function library; `false` (and scripts from now on) if the server refuses.
    async fn load_library(&self, conn: &mut ConnectionManager) -> Result<bool> {
        let library = Library::get();
        let loaded: redis::RedisResult<Value> = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg(&library.code)
            .query_async(conn)
            .await;
        match loaded {
            Ok(_) => {
                tracing::debug!(library = %library.name, "loaded the function library");
                Ok(true)
            }
            // Loaded meanwhile by another client.
            Err(e) if e.to_string().contains("already exists") => Ok(true),
            // Any refusal by the server (no functions, an ACL without FUNCTION LOAD, OOM
            // under maxmemory, a read-only replica): the scripts need no library.
            Err(e) if e.code().is_some() => {
                self.use_scripts(&e);
                Ok(false)
            }
            Err(e) => Err(self.err(e)),
        }
    }

    fn use_scripts(&self, why: &RedisError) {
        let retry_at = epoch_ms() + self.functions_retry.as_millis() as u64;
        if self.functions_from.swap(retry_at, Ordering::Relaxed) == FUNCTIONS {
            tracing::info!(
                url = %self.url,
                reason = %self.err(why.clone()),
                retry_in = ?self.functions_retry,
                "the tessera function library is not available; using EVALSHA scripts (load it once with a user allowed FUNCTION LOAD for faster calls)"
            );
        }
    }

    fn use_functions(&self) {
        if self.functions_from.swap(FUNCTIONS, Ordering::Relaxed) != FUNCTIONS {
            tracing::info!(url = %self.url, "the tessera function library is available again; using FCALL");
        }
    }

    /// How long after the server refused the function library it is tried again (default
    /// [`FUNCTIONS_RETRY`]); for tests.
    #[doc(hidden)]
    pub fn with_functions_retry(mut self, after: Duration) -> Self {
        self.functions_retry = after;
        self
    }

    fn set_waiting(&self, lease: LeaseId, waiting: bool) {
        let mut set = self.waiting.lock().unwrap();
        if waiting {
            set.insert(lease);
        } else {
            set.remove(&lease);
        }
    }
}

/// [`RedisBackend::functions_from`] while the function library is in use.
const FUNCTIONS: u64 = 0;
/// After the server refused the function library, operations run as scripts for this long,
/// then the library is tried again: a refusal may pass (memory freed after OOM, a failover
/// from a read-only replica, an administrator who loaded the library or widened the ACL).
/// Where functions never work (Redis 6) this costs one refused `FCALL` per minute.
pub const FUNCTIONS_RETRY: Duration = Duration::from_secs(60);

/// Milliseconds on a monotonic clock, never [`FUNCTIONS`].
fn epoch_ms() -> u64 {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
        + 1
}

/// Whether an error says functions cannot be used here: a server without them (Redis 6:
/// unknown command) or a user whose ACL allows neither `FCALL` nor `FUNCTION LOAD`.
fn functions_unavailable(e: &RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("unknown command")
}

/// Reads the memory limit and eviction policy; warns or refuses if tessera's keys may be
/// evicted. A refused `CONFIG` (ACL, managed services) is logged and tolerated.
async fn check_eviction(
    conn: &mut redis::aio::MultiplexedConnection,
    config: &Config,
    secret: Option<&str>,
) -> Result<()> {
    async fn get(
        conn: &mut redis::aio::MultiplexedConnection,
        param: &str,
    ) -> redis::RedisResult<Option<String>> {
        let v: Vec<String> = redis::cmd("CONFIG")
            .arg("GET")
            .arg(param)
            .query_async(conn)
            .await?;
        Ok(v.get(1).cloned())
    }
    let (maxmemory, policy) = match (
        get(conn, "maxmemory").await,
        get(conn, "maxmemory-policy").await,
    ) {
        (Ok(m), Ok(p)) => (m.unwrap_or_default(), p.unwrap_or_default()),
        (Err(e), _) | (_, Err(e)) => {
            if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
                return Err(store_error(e, secret));
            }
            tracing::info!(url = %config.redacted, error = %store_error(e, secret),
                "cannot read the eviction policy (CONFIG refused); make sure maxmemory-policy is noeviction");
            return Ok(());
        }
    };
    let limited = maxmemory
        .trim()
        .parse::<u64>()
        .map(|m| m > 0)
        .unwrap_or(false);
    let evicts = policy.starts_with("allkeys-") || policy.starts_with("volatile-");
    if limited && evicts {
        let message = format!(
            "{} has maxmemory {maxmemory} with maxmemory-policy {policy}: Redis may evict tessera's \
             lease keys under memory pressure and over-grant permits; set maxmemory-policy noeviction",
            config.redacted
        );
        if config.eviction == EvictionPolicy::Refuse {
            return Err(Error::store(
                StoreErrorKind::Other,
                format!("refused (eviction=refuse): {message}"),
            ));
        }
        tracing::warn!("{message}");
    }
    Ok(())
}

/// The wake-up subscriber: subscribes to this client's channel and calls
/// [`wake::notify`] for each lease id published on it; on a connection loss it reconnects
/// with backoff, resubscribes, and wakes every waiter of this backend (a wake-up published
/// during the gap is lost, so they ask the store themselves).
async fn subscribe_loop(
    client: redis::Client,
    channel: String,
    waiting: Arc<Mutex<HashSet<LeaseId>>>,
    url: String,
    ready: tokio::sync::oneshot::Sender<redis::RedisResult<()>>,
) {
    let mut ready = Some(ready);
    let mut backoff = Duration::from_millis(20);
    loop {
        let subscribed = async {
            let pubsub = tokio::time::timeout(CONNECT_TIMEOUT, client.get_async_pubsub())
                .await
                .map_err(|_| {
                    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
                })??;
            let (mut sink, stream) = pubsub.split();
            sink.subscribe(&channel).await?;
            Ok::<_, RedisError>((sink, stream))
        }
        .await;
        let (mut sink, mut stream) = match subscribed {
            Ok(s) => s,
            Err(e) => {
                if let Some(tx) = ready.take() {
                    let _ = tx.send(Err(e));
                    return;
                }
                tracing::warn!(%url, error = %e, "wake-up subscriber: reconnect failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        match ready.take() {
            Some(tx) => {
                let _ = tx.send(Ok(()));
            }
            None => {
                tracing::info!(%url, "wake-up subscriber: resubscribed");
                let leases: Vec<LeaseId> = waiting.lock().unwrap().iter().copied().collect();
                for lease in leases {
                    wake::notify(lease);
                }
            }
        }
        let mut ping = tokio::time::interval(SUBSCRIBER_PING);
        ping.tick().await;
        loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        let payload = std::str::from_utf8(msg.get_payload_bytes()).unwrap_or("");
                        match ops::parse_wake(payload) {
                            Some((_, Some(grant))) => {
                                waiting.lock().unwrap().remove(&grant.lease.lease_id);
                                wake::notify_grant(grant);
                            }
                            Some((lease, None)) => wake::notify(lease),
                            None => {}
                        }
                    }
                    None => break,
                },
                _ = ping.tick() => {
                    let alive = tokio::time::timeout(RESPONSE_TIMEOUT, sink.ping::<Value>()).await;
                    if !matches!(alive, Ok(Ok(_))) {
                        break;
                    }
                }
            }
        }
        tracing::warn!(%url, "wake-up subscriber: connection lost; reconnecting");
    }
}

#[async_trait]
impl Backend for RedisBackend {
    async fn acquire(
        &self,
        name: &Name,
        capacity: u32,
        req: &AcquireRequest,
    ) -> Result<AcquireReply> {
        let (waiter_ttl, queue_cap) = match req.wait {
            Some(w) => (micros(w.waiter_ttl).max(1), w.queue_cap),
            None => (0, 0),
        };
        let lease = req.lease_id.to_string();
        let v = self
            .run(
                Op::Acquire,
                name,
                &[
                    capacity.to_string(),
                    lease,
                    req.weight.to_string(),
                    micros(req.ttl).to_string(),
                    req.holder.clone(),
                    self.client_id.clone(),
                    waiter_ttl.to_string(),
                    queue_cap.to_string(),
                ],
            )
            .await?;
        let reply = ops::parse_acquire(v, name, capacity, req)?;
        self.set_waiting(req.lease_id, matches!(reply, AcquireReply::Queued { .. }));
        Ok(reply)
    }

    async fn heartbeat(
        &self,
        name: &Name,
        lease: LeaseId,
        waiter_ttl: Duration,
    ) -> Result<WaitReply> {
        let id = lease.to_string();
        let v = self
            .run(
                Op::Heartbeat,
                name,
                &[id, micros(waiter_ttl).max(1).to_string()],
            )
            .await?;
        let reply = ops::parse_heartbeat(v, lease)?;
        self.set_waiting(lease, reply == WaitReply::Waiting);
        Ok(reply)
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        let id = lease.to_string();
        let v = self.run(Op::Cancel, name, &[id]).await?;
        self.set_waiting(lease, false);
        ops::parse_cancel(v)
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let id = lease.to_string();
        let v = self.run(Op::Release, name, &[id]).await?;
        ops::parse_bool(v, "release")
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let id = lease.to_string();
        let v = self
            .run(Op::Renew, name, &[id, micros(ttl).to_string()])
            .await?;
        ops::parse_renew(v)
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let v = self.run(Op::Status, name, &[]).await?;
        ops::parse_status(v, name)
    }

    async fn list(&self) -> Result<Vec<String>> {
        let pattern = ops::meta_pattern(&self.prefix);
        self.scan_names(&pattern, |k| ops::name_of_meta_key(&self.prefix, k))
            .await
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        let v = self.run(Op::Resize, name, &[capacity.to_string()]).await?;
        ops::parse_resize(v, name)
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let id = lease.to_string();
        let v = self.run(Op::Revoke, name, &[id]).await?;
        ops::parse_bool(v, "revoke")
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        let v = self.run(Op::Delete, name, &[]).await?;
        ops::parse_bool(v, "delete")
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::push()
    }

    fn rate(&self) -> Option<&dyn crate::seam::RateBackend> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed_and_checked() {
        let c =
            parse_url("redis://u:hunter2@127.0.0.1:6380/2?prefix=team-a&eviction=refuse").unwrap();
        assert_eq!(c.prefix, "team-a");
        assert_eq!(c.eviction, EvictionPolicy::Refuse);
        assert_eq!(c.server_url, "redis://u:hunter2@127.0.0.1:6380/2");
        assert!(!c.redacted.contains("hunter2"));
        assert!(parse_url("rediss://h").unwrap().tls);
        let c = parse_url("redis://h:1?protocol=resp3&prefix=p").unwrap();
        assert_eq!(
            (c.server_url.as_str(), c.prefix.as_str()),
            ("redis://h:1?protocol=resp3", "p")
        );
        for bad in [
            "redis://",
            "redis://h/x",
            "redis://h?prefix=a:b",
            "redis://h?prefix={x}",
            "redis://h?prefix=",
            "redis://h?eviction=maybe",
            "redis://u:hunter2@h?typo=1",
            "http://h",
        ] {
            let e = parse_url(bad)
                .err()
                .unwrap_or_else(|| panic!("{bad} accepted"));
            assert!(e.is_invalid_input(), "{bad}: {e}");
            assert!(!e.to_string().contains("hunter2"), "{e}");
        }
    }
}
