//! The Redis store (`redis://`, `rediss://` for TLS), also behind Redis Sentinel and as a
//! Redis Cluster.
//!
//! ```text
//! redis://[user[:password]@]host[:port][/db][?prefix=tessera][&eviction=warn|refuse][&wait=N]
//! redis+sentinel://[user[:password]@]host[:port][,host[:port]…]/MASTER[/db][?…same options]
//!     [&sentinel_user=USER][&sentinel_password=PASSWORD]
//! redis+cluster://[user[:password]@]host[:port][,host[:port]…][?prefix=…][&eviction=…]
//! ```
//!
//! (`rediss+sentinel://` and `rediss+cluster://` for TLS, to the sentinels as to the
//! servers.) With Sentinel, the credentials and the database are the master's (and every
//! server's it fails over to); the sentinels (default port 26379) are asked with
//! `sentinel_user` and `sentinel_password` if the URL gives them, else without credentials,
//! and with the master's if they answer NOAUTH. The store follows failovers by itself, and `wait=N` makes every
//! state-changing call wait until N replicas have it (see [`topology`] for how, and
//! docs/reliability.md for what a failover costs with and without it). On a Cluster every
//! key of a semaphore or limiter shares one hash tag, so each operation is one call on one
//! shard, and wake-ups travel on sharded pub/sub; an ACL for a cluster user needs
//! `+spublish +ssubscribe` and the channels `&{<prefix>:*` instead of `+subscribe +publish`
//! and `&<prefix>:wake:*`.
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
//!     +hlen +zscore +persist
//! ```
//!
//! The first line of commands is what the client sends (`config|get` is optional: without
//! it the eviction check is skipped; with `?wait=N` it also sends `WAIT`, after a `PUBLISH`
//! to `<prefix>:wake:wait`, so add `+wait`); the rest are the commands the semaphore and rate
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
//! The uncontended acquire and release touch the meta hash alone: a lease granted at once
//! while no other is kept there (the *inline* lease) lives in three of its fields, written with
//! the counters in one `HSET`, and a semaphore left with nobody holding or waiting stays as an
//! *idle* meta hash (kept at least 10 minutes, it keeps the fence) instead of being deleted and
//! created again. Every other lease lives in the holders and leases keys. `status`, `list` and
//! `delete` take an idle state for none. In a rolling upgrade from a version before the inline
//! lease, clients of that version keep working on the same keys: they count the inline
//! lease's permits as used (so nothing is over-granted), never list it in `status` and cannot
//! `revoke` it; hand-offs never go inline, so their waiters are granted where they look, and
//! this version's steps purge an inline lease at its expiry. Their own steps never purge one:
//! when a holder of this version dies without releasing, clients of the older version alone
//! wait for its permits until any step of this version runs on the semaphore (an acquire,
//! a heartbeat, a `tessera status`), which hands them on at once. Run on a throwaway Redis
//! with both builds by `scripts/redis-mixed-versions.sh OLD_DIR NEW_DIR`: 4 + 4 workers on 2
//! permits never held more than 2 at once (1,913 grants); a killed older holder came back to
//! this version after its TTL; a killed holder of this version came back to an older acquire
//! 14 ms after a `tessera status` of this version, not before.
//!
//! The tenant a request names (fair shares) is kept as a last field of its waiter's record and
//! of its lease's (inline or not), written only when it names one, so a step without a tenant
//! runs the commands it ran before; every lease and waiter the store returns carries it
//! (`prelude.lua`, `ops::decode_lease`, `ops::decode_waiter`).
//!
//! Tenants' ceilings and floors live in `{<prefix>:<name>}:limits`, kept for the name (no
//! expiry) until cleared or deleted; meta's `cap` carries a trailing `L` while the name has
//! some, read by the `HMGET` every step runs, so a name without limits runs the commands it
//! ran before, and meta then never expires, so no step creates such a state without knowing
//! (`prelude.lua`, docs/stores/redis.md). A client of a build before limits cannot read such
//! a capacity: its every step on that name fails as corrupt, so it grants nothing past them.
//! A tenant's window ceiling rides in its limits' field, with the instant until which it is
//! window-capped; its own limiter sits beside the shared one, `{<prefix>:<name>}:rate:tenant:<t>`
//! (and `:rate:tenant-log:<t>`), expiring as any limiter state (`admission.rs`).
//!
//! Each [`RedisBackend`] has a random client id and one subscriber task on a dedicated pub/sub
//! connection, which calls [`tessera_core::wake::notify`] for every lease id it receives, or
//! [`tessera_core::wake::notify_grant`] when the wake-up carries the grant (the scripts push the grant
//! to clients whose id ends with `.g`, as this one's does without `wait`, so a woken waiter
//! needs no round trip to learn it; older clients get the bare lease id, and clients with
//! `wait=N`, whose id ends with `.r<N>`, get the grant from the caller of the step once its
//! `WAIT` counted N replicas, see [`topology`]). The
//! subscription is confirmed before `connect` returns, so no grant to this client is
//! published before anyone listens. When the subscriber's connection drops, it reconnects
//! and resubscribes with backoff, then wakes every waiter of this backend so each asks the
//! store at once (a grant published during the gap is found by that heartbeat instead of the
//! next periodic one). On one server, commands go through a `ConnectionManager`, which
//! reconnects by itself; on Sentinel, through the master's connection, which is made again
//! only through the sentinels (as is the subscriber's, see `topology.rs`). At most 256 calls
//! are in flight at once (64 with `wait`, each on a connection of its own), the rest wait
//! their turn in a line, and keep-alives have a line of their own: the response timeout
//! measures the server, not the length of the line (see `line.rs`).

mod admission;
mod call;
mod error;
mod eviction;
mod heartbeats;
mod line;
mod notify;
pub(crate) mod ops;
pub(crate) mod rate;
mod topology;
pub(crate) mod url;

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use redis::{IntoConnectionInfo, RedisError};
use tokio::task::JoinHandle;

use tessera_core::error::{Error, InvalidInput, Result, StoreErrorKind};
use tessera_core::model::*;
use tessera_core::seam::{Backend, Capabilities};
use tessera_core::stores::batch::Batcher;
use tessera_core::stores::expiries::Expiries;

use call::FUNCTIONS;
pub use call::FUNCTIONS_RETRY;
use error::{mask_in, store_error};
use eviction::check_eviction;
use heartbeats::{HeartbeatMany, Heartbeats};
use line::Line;
use notify::subscribe_loop;
use ops::{micros, Op};
use topology::Topology;
use url::{parse_url, Config, Layout};
#[cfg(doc)]
use {call::epoch_ms, ops::Library};

const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Reconnect attempts of the command connection before a request fails (50 ms, 100 ms, …).
const RECONNECT_ATTEMPTS: usize = 3;
/// The shortest and longest pause of the cluster client before it sends a call again that
/// a node answered `TRYAGAIN` (a slot migrating with the call's keys split between two
/// nodes) or `CLUSTERDOWN`: random up to 10 ms · 2^attempt, within these bounds. redis-rs's
/// own are 1.28 s and 655 s: with them every call that met a moving slot waited at least
/// 1.28 s, renewals with it, and holders of short leases were told they lost them (8 and 9
/// losses in two runs of `a_cluster_slot_moving_under_load_…`, none with these).
const CLUSTER_RETRY_WAIT: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(1000));

/// The Redis backend. Cheap to share behind an `Arc`; dropping it stops its subscriber.
pub struct RedisBackend {
    /// What sends the calls, shared with the task that sends gathered heartbeats.
    caller: Arc<Caller>,
    client_id: String,
    /// Lease ids queued through this backend, woken after a resubscription.
    waiting: Arc<Mutex<HashSet<LeaseId>>>,
    /// On a cluster, the sharded wake channels this client listens on (one per name it
    /// acquired on, kept for the client's life).
    subscribed: Mutex<HashSet<String>>,
    /// Waiters' heartbeats, gathered per semaphore (see `heartbeats.rs`).
    heartbeats: Arc<Heartbeats>,
    subscriber: JoinHandle<()>,
}

/// What every call needs (see `call.rs`): where it goes, how, and the lines it waits in.
pub(super) struct Caller {
    /// Where commands go (one server, the Sentinel master, or a cluster).
    topo: Arc<Topology>,
    /// Replicas every state-changing call waits for (`?wait=N`).
    wait: u32,
    /// The lines calls wait in before they go out (see `line.rs`): one for operations, one
    /// for keep-alives (renewals, waiters' heartbeats).
    operations: Line,
    keep_alives: Line,
    /// Whether operations go to the function library (`FCALL`): [`FUNCTIONS`], or the
    /// instant (ms since [`epoch_ms`]'s origin) after which the library is tried again, once
    /// the server refused it (no functions, an ACL allowing neither `FCALL` nor `FUNCTION
    /// LOAD`, a load refused under OOM or on a read-only replica; see [`Library`]).
    functions_from: AtomicU64,
    /// How long after a refusal the library is tried again, in ms.
    functions_retry_ms: AtomicU64,
    prefix: String,
    /// `<prefix>:wake:`; this client's channel is `wake_base + client_id`.
    wake_base: String,
    url: String,
    secret: Option<String>,
    /// When each semaphore this client waits on may next expire something, as its last
    /// `queued` or `waiting` reply said (see [`Backend::next_expiry`]).
    expiries: Expiries,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.caller.url)
            .field("prefix", &self.caller.prefix)
            .field("client_id", &self.client_id)
            .finish_non_exhaustive()
    }
}

impl Drop for RedisBackend {
    fn drop(&mut self) {
        self.subscriber.abort();
    }
}

/// Everything [`RedisBackend::connect`] reads from the URL before it connects: the parsed
/// URL, the password (to keep out of messages) and the redis-rs client, which parses the URL
/// again and opens nothing yet.
pub(crate) fn open_client(raw: &str) -> Result<(Config, Option<String>, redis::Client)> {
    let config = parse_url(raw)?;
    let secret = ::url::Url::parse(raw)
        .ok()
        .and_then(|u| u.password().map(str::to_string));
    let client = redis::Client::open(config.server_url.as_str()).map_err(|e| {
        Error::from(InvalidInput::StoreUrl {
            url: config.redacted.clone(),
            reason: store_error(e, secret.as_deref()).to_string(),
        })
    })?;
    Ok((config, secret, client))
}

/// The timeouts of a plain connection.
fn connection_config() -> redis::AsyncConnectionConfig {
    redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
}

/// One plain connection to `client`'s server: a wrong password or an unreachable server
/// fails here at once; then the eviction check.
async fn probe(client: &redis::Client, config: &Config, secret: Option<&str>) -> Result<()> {
    let mut probe = client
        .get_multiplexed_async_connection_with_config(&connection_config())
        .await
        .map_err(|e| probe_error(e, config, secret))?;
    check_eviction(&mut probe, config, secret).await
}

/// A first connection's error, saying what the URL may have got wrong: a database the server
/// does not have is an invalid URL (no retry helps); a port where nothing listens and refused
/// credentials name the URL (password masked); TLS against a plain port (the handshake waits
/// for an answer that never comes) or plain text against a TLS port (the server closes the
/// connection) gets a hint.
fn probe_error(e: RedisError, config: &Config, secret: Option<&str>) -> Error {
    if e.to_string().contains("DB index is out of range") {
        return InvalidInput::StoreUrl {
            url: config.redacted.clone(),
            reason: "the server has no database of that number (Redis has 16, 0 to 15, unless \
                     its `databases` setting says otherwise)"
                .to_string(),
        }
        .into();
    }
    // (redis-rs counts a refused connection as a dropped one too: refusal is asked first.)
    let hint = if e.is_connection_refusal() {
        Some(tessera_core::error::refused_hint(&config.redacted))
    } else if error::is_auth(&e) {
        Some(tessera_core::error::auth_hint(&config.redacted))
    } else if config.tls && (e.is_timeout() || e.is_io_error() || e.is_connection_dropped()) {
        Some("rediss:// expects TLS on this port; a server without TLS takes redis://".into())
    } else if !config.tls && e.is_connection_dropped() {
        Some(
            "the server closed the connection; if it serves TLS on this port, use rediss://".into(),
        )
    } else {
        None
    };
    match (store_error(e, secret), hint) {
        (Error::Store { kind, message }, Some(hint)) => {
            Error::store(kind, format!("{message} ({hint})"))
        }
        (other, _) => other,
    }
}

/// Warns at connect about a replication that does not fit `wait=N`:
/// - `wait=N` with fewer than N replicas connected now: until more connect, every change
///   waits for `WAIT`'s timeout and fails as a connection fault (which callers retry, so a
///   replica that is down for a while is ridden out), and what the change did on the master
///   stays until its TTL;
/// - no `wait` on Sentinel, or on a master with replicas: a failover can promote a replica
///   that had not received the last grants, and the new master grants them again
///   (docs/stores/redis.md measured 6 to 17 over-grants in 9 failovers).
async fn warn_about_replication(client: &redis::Client, config: &Config, sentinel: bool) {
    let Ok(mut conn) = client
        .get_multiplexed_async_connection_with_config(&connection_config())
        .await
    else {
        return;
    };
    let mut info = redis::cmd("INFO");
    info.arg("replication");
    let Ok(info) = info.query_async::<String>(&mut conn).await else {
        return;
    };
    if let Some(warning) = replication_warning(&info, config.wait, sentinel) {
        tracing::warn!("{}: {warning}", config.redacted);
    }
}

/// The warning [`warn_about_replication`] gives for the master's `INFO replication`, if any.
fn replication_warning(info: &str, wait: u32, sentinel: bool) -> Option<String> {
    let connected = info
        .lines()
        .find_map(|l| l.strip_prefix("connected_slaves:"))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    if wait > 0 {
        return (connected < wait).then(|| {
            format!(
                "wait={wait} asks for {wait} replicas, but the master has {connected} \
                 connected: every change will wait {:?} and fail until more replicas connect",
                topology::WAIT_TIMEOUT
            )
        });
    }
    (sentinel || connected > 0).then(|| {
        format!(
            "{} and no wait=N: a failover can promote a replica that missed the last \
             grants, and they are granted again (over-grants); add ?wait=1 to the URL so that \
             every grant reaches a replica before it is answered",
            if sentinel {
                "a Sentinel-managed master".to_string()
            } else {
                format!("a master with {connected} replica(s)")
            }
        )
    })
}

/// [`probe`] of a cluster's seed nodes, in the URL's order, until one answers: a seed that is
/// down (a node that failed, the usual case during a failover) must not stop a client from
/// starting while the others serve the cluster. A refusal that is not a connection fault (a
/// wrong password, an eviction policy) ends it at once; if no seed answers, the first seed's
/// error is returned.
async fn probe_any_seed(urls: &[String], config: &Config, secret: Option<&str>) -> Result<()> {
    let mut first = None;
    for url in urls {
        let client = redis::Client::open(url.as_str()).map_err(|e| store_error(e, secret))?;
        match probe(&client, config, secret).await {
            Ok(()) => return Ok(()),
            Err(e) if e.is_transient() => {
                tracing::debug!(url = %config.redacted, error = %e, "a cluster seed did not answer; trying the next");
                first.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    Err(first.unwrap_or_else(|| Error::store(StoreErrorKind::Connection, "no seed node")))
}

/// `url` with `{addr}` in place of its `host:port` (credentials, database and options kept).
fn addr_template(url: &str) -> String {
    const PLACEHOLDER: &str = "tessera-addr-placeholder";
    match ::url::Url::parse(url) {
        Ok(mut u) => {
            let _ = u.set_host(Some(PLACEHOLDER));
            let _ = u.set_port(Some(1));
            u.to_string()
                .replacen(&format!("{PLACEHOLDER}:1"), "{addr}", 1)
        }
        Err(_) => url.to_string(),
    }
}

impl Caller {
    fn err(&self, e: RedisError) -> Error {
        store_error(e, self.secret.as_deref())
    }

    /// Notes the expiry a `queued` or `waiting` reply for `name` announces, if it has one
    /// (see [`ops::expiry_in`]); measured from now, when the reply has arrived.
    fn note_expiry(&self, name: &Name, reply: &redis::Value) {
        if let Some(after) = ops::expiry_in(reply) {
            self.expiries.note(name, after);
        }
    }
}

impl RedisBackend {
    /// Connects to a `redis://` or `rediss://` URL (see the module docs): parses it, opens
    /// the command connection, checks the eviction policy and starts the wake-up subscriber.
    pub async fn connect(raw: &str) -> Result<Self> {
        let (config, secret, client) = open_client(raw)?;
        // Refused credentials name the URL (a sentinel's or a cluster node's refusal as well
        // as the probe's: see `probe_error`).
        let err = |e: RedisError| {
            tessera_core::error::with_auth_hint(store_error(e, secret.as_deref()), &config.redacted)
        };
        if config.tls {
            // redis-rs builds its rustls config with the process-wide provider; install ring
            // unless the application already chose one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
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
        let waiting: Arc<Mutex<HashSet<LeaseId>>> = Arc::default();
        let (topo, pushes) = match &config.layout {
            Layout::Single => {
                // One plain connection first: a wrong password or an unreachable server fails
                // here at once, where the connection manager would retry with backoff for
                // seconds.
                probe(&client, &config, secret.as_deref()).await?;
                warn_about_replication(&client, &config, false).await;
                let url = ::url::Url::parse(&config.server_url).ok();
                let addr = url
                    .as_ref()
                    .map(|u| {
                        (
                            u.host_str().unwrap_or_default().to_string(),
                            u.port().unwrap_or(6379),
                        )
                    })
                    .unwrap_or_default();
                let topo = Topology::single(client, addr, manager_config)
                    .await
                    .map_err(err)?;
                (topo, None)
            }
            Layout::Sentinel { sentinels, master } => {
                let template = addr_template(&config.server_url);
                let scheme = if config.tls { "rediss" } else { "redis" };
                // A sentinel's refusal may quote what it was sent: its password is masked in
                // messages as well as the master's.
                let sentinel_secret = config.sentinel_auth.as_ref().map(|a| a.password.as_str());
                let err = |e: RedisError| mask_in(err(e), sentinel_secret);
                // One client per sentinel, logging in as `auth` (user, password) if given.
                let open = |auth: Option<(Option<&str>, &str)>| {
                    sentinels
                        .iter()
                        .map(|(h, p)| {
                            let info = format!("{scheme}://{h}:{p}").into_connection_info()?;
                            let info = match auth {
                                Some((user, password)) => {
                                    let mut settings =
                                        info.redis_settings().clone().set_password(password);
                                    if let Some(user) = user {
                                        settings = settings.set_username(user);
                                    }
                                    info.set_redis_settings(settings)
                                }
                                None => info,
                            };
                            redis::Client::open(info)
                        })
                        .collect::<redis::RedisResult<Vec<_>>>()
                        .map_err(err)
                };
                let clients = match &config.sentinel_auth {
                    // The sentinels' own credentials (`sentinel_user`, `sentinel_password`).
                    Some(auth) => open(Some((auth.user.as_deref(), &auth.password)))?,
                    None => {
                        let clients = open(None)?;
                        // Sentinels protected by a password (`requirepass` in sentinel.conf)
                        // answer NOAUTH: without credentials of their own in the URL they are
                        // asked with the master's (the URL's user and password, as redis-rs
                        // read them), as deployments often give both the same.
                        let master_auth = client.get_connection_info().redis_settings();
                        match master_auth.password() {
                            Some(password)
                                if topology::sentinels_need_auth(&clients, master).await =>
                            {
                                open(Some((master_auth.username(), password)))?
                            }
                            _ => clients,
                        }
                    }
                };
                let sentinels = clients;
                let topo = Topology::sentinel(sentinels, master.clone(), template)
                    .await
                    .map_err(err)?;
                let master = topo.client().unwrap();
                probe(&master, &config, secret.as_deref()).await?;
                warn_about_replication(&master, &config, true).await;
                (topo, None)
            }
            Layout::Cluster { nodes } => {
                let template = addr_template(&config.server_url);
                let urls: Vec<String> = nodes
                    .iter()
                    .map(|(h, p)| template.replace("{addr}", &format!("{h}:{p}")))
                    .collect();
                probe_any_seed(&urls, &config, secret.as_deref()).await?;
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                let cluster = redis::cluster::ClusterClientBuilder::new(urls)
                    .use_protocol(redis::ProtocolVersion::RESP3)
                    .push_sender(tx)
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(RESPONSE_TIMEOUT)
                    .min_retry_wait(CLUSTER_RETRY_WAIT.0.as_millis() as u64)
                    .max_retry_wait(CLUSTER_RETRY_WAIT.1.as_millis() as u64)
                    .build()
                    .map_err(err)?;
                let conn = cluster.get_async_connection().await.map_err(err)?;
                (Topology::cluster(conn), Some(rx))
            }
        };

        // The suffix asks the scripts to push grants with the wake-ups (ops::GRANT_PUSH);
        // with `wait`, a grant must come from a call that waited for the replicas, so the
        // scripts leave the wake-up to the caller, which publishes the grant once its own
        // WAIT counted as many replicas (ops::GRANT_RELAY).
        let push = if config.wait == 0 {
            ops::GRANT_PUSH.to_string()
        } else {
            format!("{}{}", ops::GRANT_RELAY, config.wait)
        };
        let client_id = format!("{:032x}{push}", rand::random::<u128>());
        let wake_base = format!("{}:wake:", config.prefix);
        let subscriber = match pushes {
            Some(pushes) => tokio::spawn(notify::cluster_loop(pushes, Arc::clone(&waiting))),
            None => {
                let channel = format!("{wake_base}{client_id}");
                let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
                let subscriber = tokio::spawn(subscribe_loop(
                    Arc::clone(&topo),
                    channel,
                    Arc::clone(&waiting),
                    config.redacted.clone(),
                    ready_tx,
                ));
                let ready = tokio::time::timeout(CONNECT_TIMEOUT, ready_rx).await;
                if !matches!(ready, Ok(Ok(Ok(())))) {
                    subscriber.abort();
                    // A refusal by the server (an ACL without the wake channel: NOPERM) is a
                    // setup mistake that no retry fixes, so it keeps its own kind; anything
                    // else (a dropped connection, no answer in time) is a connection fault.
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
                subscriber
            }
        };
        let in_flight = if config.wait == 0 {
            line::SHARED_IN_FLIGHT
        } else {
            line::OWN_IN_FLIGHT
        };
        let caller = Arc::new(Caller {
            topo,
            wait: config.wait,
            operations: Line::new(in_flight, RESPONSE_TIMEOUT),
            keep_alives: Line::new(in_flight, RESPONSE_TIMEOUT),
            functions_from: AtomicU64::new(FUNCTIONS),
            functions_retry_ms: AtomicU64::new(FUNCTIONS_RETRY.as_millis() as u64),
            prefix: config.prefix,
            wake_base,
            url: config.redacted,
            secret,
            expiries: Expiries::default(),
        });
        Ok(RedisBackend {
            heartbeats: Batcher::new(HeartbeatMany(Arc::clone(&caller))),
            caller,
            client_id,
            waiting,
            subscribed: Mutex::default(),
            subscriber,
        })
    }

    /// This backend's client id (the suffix of its wake-up channel).
    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.caller.prefix
    }

    /// On a cluster, subscribes (`SSUBSCRIBE`) to this client's wake channel in `name`'s
    /// slot, once per name, before the first acquire on it: no grant to this client is
    /// published there before it listens.
    async fn listen_on(&self, name: &Name) -> Result<()> {
        let Some(mut conn) = self.caller.topo.cluster_conn() else {
            return Ok(());
        };
        let channel = format!(
            "{}{}",
            ops::cluster_wake_base(&self.caller.prefix, name),
            self.client_id
        );
        if self.subscribed.lock().unwrap().contains(&channel) {
            return Ok(());
        }
        conn.ssubscribe(&channel)
            .await
            .map_err(|e| self.caller.err(e))?;
        self.subscribed.lock().unwrap().insert(channel);
        Ok(())
    }

    /// How many gathered heartbeat calls this backend sent (for tests).
    #[doc(hidden)]
    pub fn heartbeat_calls(&self) -> u64 {
        self.heartbeats.calls()
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
        self.listen_on(name).await?;
        let lease = req.lease_id.to_string();
        let args = [
            capacity.to_string(),
            lease,
            req.weight.to_string(),
            micros(req.ttl).to_string(),
            req.holder.clone(),
            self.client_id.clone(),
            waiter_ttl.to_string(),
            queue_cap.to_string(),
        ];
        // A tenant and its share follow; without one the call is as before tenants. Then
        // the first send's mark (see `acquire.lua`), except on a cluster, whose client sends
        // a request again by itself after a dropped connection.
        let first_send = req.first_send && !self.caller.resends();
        let extended;
        let args: &[String] = match (&req.tenant, first_send) {
            (None, false) => &args,
            (tenant, _) => {
                extended = ops::with_tenant_and_mark(&args, tenant.as_ref(), first_send);
                &extended
            }
        };
        let v = self.caller.run(Op::Acquire, name, args).await?;
        self.caller.note_expiry(name, &v);
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
        let reply = self
            .heartbeats
            .send(name.as_str(), (lease, micros(waiter_ttl).max(1)))
            .await?;
        self.set_waiting(lease, reply == WaitReply::Waiting);
        Ok(reply)
    }

    async fn cancel(&self, name: &Name, lease: LeaseId) -> Result<CancelReply> {
        let id = lease.to_string();
        let v = self.caller.run(Op::Cancel, name, &[id]).await?;
        self.set_waiting(lease, false);
        ops::parse_cancel(v)
    }

    async fn release(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let id = lease.to_string();
        let v = self.caller.run(Op::Release, name, &[id]).await?;
        ops::parse_bool(v, "release")
    }

    async fn renew(&self, name: &Name, lease: LeaseId, ttl: Duration) -> Result<RenewReply> {
        let id = lease.to_string();
        let v = self
            .caller
            .run(Op::Renew, name, &[id, micros(ttl).to_string()])
            .await?;
        ops::parse_renew(v)
    }

    async fn status(&self, name: &Name) -> Result<Option<SemaphoreStatus>> {
        let v = self.caller.run(Op::Status, name, &[]).await?;
        ops::parse_status(v, name)
    }

    /// `PING` (see `Caller::ping`), not a status: that is a script call, and purges.
    async fn ping(&self) -> Result<()> {
        self.caller.ping().await
    }

    /// The names whose meta key holds a semaphore in use: an idle state (kept for its fence,
    /// see `prelude.lua`) is no state, as for `status`.
    async fn list(&self) -> Result<Vec<String>> {
        use futures::{StreamExt, TryStreamExt};
        let pattern = ops::meta_pattern(&self.caller.prefix);
        let names = self
            .caller
            .scan_names(&pattern, |k| ops::name_of_meta_key(&self.caller.prefix, k))
            .await?;
        let in_use: Vec<Option<String>> = futures::stream::iter(names)
            .map(|n| async move {
                let name = Name::new(&n)?;
                Ok::<_, Error>(self.status(&name).await?.map(|_| n))
            })
            .buffered(16)
            .try_collect()
            .await?;
        Ok(in_use.into_iter().flatten().collect())
    }

    async fn resize(&self, name: &Name, capacity: u32) -> Result<u32> {
        let v = self
            .caller
            .run(Op::Resize, name, &[capacity.to_string()])
            .await?;
        ops::parse_resize(v, name)
    }

    async fn revoke(&self, name: &Name, lease: LeaseId) -> Result<bool> {
        let id = lease.to_string();
        let v = self.caller.run(Op::Revoke, name, &[id]).await?;
        ops::parse_bool(v, "revoke")
    }

    async fn delete(&self, name: &Name) -> Result<bool> {
        let v = self.caller.run(Op::Delete, name, &[]).await?;
        ops::parse_bool(v, "delete")
    }

    /// Fair shares: the queue's scores are start tags (`scripts/prelude.lua`); tenants'
    /// ceilings, floors and window ceilings in a hash of their own (`scripts/set_limits.lua`,
    /// `scripts/admission.lua`).
    fn capabilities(&self) -> Capabilities {
        Capabilities::push()
            .with_fair_shares()
            .with_tenant_limits()
            .with_window_ceilings()
    }

    async fn set_tenant_limits(
        &self,
        name: &Name,
        tenant: &str,
        limits: TenantLimits,
    ) -> Result<()> {
        let args = ops::limits_args(tenant, limits);
        let v = self.caller.run(Op::SetLimits, name, &args).await?;
        ops::parse_set_limits(v, name)
    }

    async fn tenant_limits(&self, name: &Name) -> Result<BTreeMap<String, TenantLimits>> {
        let v = self.caller.run(Op::Limits, name, &[]).await?;
        ops::parse_limits(v)
    }

    /// As the last `queued` or `waiting` reply for `name` announced it.
    fn next_expiry(&self, name: &Name) -> Option<tokio::time::Instant> {
        self.caller.expiries.get(name)
    }
    fn rate(&self) -> Option<&dyn tessera_core::seam::RateBackend> {
        Some(self)
    }
    fn admission(&self) -> Option<&dyn tessera_core::seam::AdmissionBackend> {
        Some(self)
    }
}

#[cfg(test)]
mod tests {
    use super::replication_warning;

    #[test]
    fn a_replication_that_does_not_fit_wait_is_found_in_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:1\r\nslave0:ip=127.0.0.1\r\n";
        let alone = "role:master\r\nconnected_slaves:0\r\n";
        let short = replication_warning(info, 2, false).unwrap();
        assert!(short.contains("has 1 connected"), "{short}");
        assert_eq!(replication_warning(info, 1, false), None);
        assert_eq!(replication_warning(info, 1, true), None);
        // No wait: a failover can over-grant on Sentinel, or wherever replicas exist.
        let sentinel = replication_warning(alone, 0, true).unwrap();
        assert!(
            sentinel.contains("Sentinel") && sentinel.contains("?wait=1"),
            "{sentinel}"
        );
        let replicated = replication_warning(info, 0, false).unwrap();
        assert!(replicated.contains("1 replica"), "{replicated}");
        assert_eq!(replication_warning(alone, 0, false), None);
        assert_eq!(replication_warning("role:master\r\n", 0, false), None);
    }
}
