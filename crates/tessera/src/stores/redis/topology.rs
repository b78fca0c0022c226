//! Where commands go: one server (`redis://`), the master that the sentinels name
//! (`redis+sentinel://`), or the shard of a cluster that holds a semaphore's slot
//! (`redis+cluster://`). The rest of the store sends every command through [`Topology::conn`]
//! and tells the topology about failures ([`Topology::after_error`]), so the calls, scripts
//! and subscribers are the same code for all three.
//!
//! # Following a Sentinel failover
//!
//! redis-rs resolves a master through Sentinel once and never again, so the topology does it
//! itself:
//!
//! - At connect it asks every sentinel for the master's address and the configuration epoch
//!   of that answer (`SENTINEL MASTER`: each failover raises the epoch) and takes the
//!   answer of the highest epoch whose server says it is a master (`ROLE`); a sentinel that
//!   does not answer or names a server that is not a master is skipped. If the first
//!   sentinel that answers says NOAUTH, every sentinel is asked with the URL's user and
//!   password, unless the URL gives the sentinels credentials of their own
//!   (`sentinel_user`, `sentinel_password`), which are then used from the start.
//! - A watcher task subscribes to `+switch-master` on every sentinel and also asks one
//!   sentinel every [`SENTINEL_POLL`] (a switch message is lost while a sentinel connection
//!   is down); when a sentinel names another master at a higher epoch, it resolves again.
//!   It pings the master's connection at the same pace and resolves again when it is lost,
//!   so an idle client's next call finds it made again.
//! - It never follows an answer of an epoch no higher than the master's it uses, unless that
//!   master itself says it is no longer one. A sentinel learns of a failover from the others
//!   up to seconds after it (their hello messages), and meanwhile names the old master; the
//!   old master, restarted, says it is a master until a sentinel turns it into a replica, and
//!   a client that went back to it would find it without the new master's leases and grant
//!   them again (seen as an over-grant 2 s after a failover in the chaos runner's
//!   `f2-sentinel-kill`).
//! - It never connects to a server the sentinels did not just name. The master's connection
//!   is a plain multiplexed connection, not a connection manager: a manager reconnects to
//!   its address by itself, and after the master was killed, replaced by a failover and
//!   restarted empty there, a client whose sentinels were out of reach (or whose watcher had
//!   not yet heard of the failover) sent its calls to the empty server and granted permits
//!   held on the new master. A lost connection is made again only by a resolution: to the
//!   server the newest answer names (the same address after a plain restart only if every
//!   sentinel answers and names it: a majority may still lag behind a failover), never to one
//!   the sentinels are failing over (`o_down` or `failover_in_progress` in their flags: until
//!   the switch they still name the old master in `SENTINEL MASTER`). A new connection of
//!   the `WAIT` pool, and the wake-up subscriber's after a loss, first check that the
//!   master's connection answers, and have the sentinels asked if it does not.
//! - A call that fails with `READONLY` (the old master was demoted while clients still reached
//!   it), `LOADING`, or a connection error resolves again at once, and a call refused with
//!   `READONLY` or `LOADING` (never run) is sent once more to the new master.
//! - Each resolution that changes the master bumps a generation: the wake-up subscriber
//!   watches it and resubscribes on the new master, then wakes every waiter so each asks the
//!   store at once (wake-ups published on the old master are lost). The function library is
//!   replicated with the data; where it is missing, the first `FCALL` reloads it (as after a
//!   restart).
//!
//! What a failover costs (see docs/reliability.md): Redis replicates asynchronously, so a
//! write acknowledged by the old master may not have reached the replica that takes over. A
//! grant can be forgotten that way, and the permit granted again. `?wait=N` closes that
//! window: every state-changing call then runs on a connection of its own followed by
//! `WAIT N` (a blocking command, so never on the shared multiplexed connection), and
//! answers only once N replicas have the write; if they do not within [`WAIT_TIMEOUT`], the
//! call fails with a timeout (the step did run on the master; retries are idempotent).
//! A hand-off grant then reaches its waiter only after the `WAIT` of the call that made it:
//! the step leaves the wake-up to its caller, which publishes it with the grant once its
//! `WAIT` counted the waiter's N replicas, and bare otherwise (a client without `wait`, a
//! `WAIT` that timed out), in which case the waiter asks with a heartbeat of its own, which
//! waits too (see `call.rs`, `call_and_wait` and `Relays`).
//!
//! # Cluster
//!
//! Every key of one semaphore or limiter carries the hash tag `{<prefix>:<name>}`, so each
//! step is one call on one shard; cluster-async routes it by its keys and follows `MOVED`
//! and `ASK`. On a cluster a call names every key of the state, so while its slot migrates
//! Redis runs it whole on one node or not at all: on the source while all its keys are
//! there, on the target (`ASKING`) once all are there, and answers `TRYAGAIN` while they are
//! split; the client sends it again after a short pause (`CLUSTER_RETRY_WAIT` in the
//! module above). Each `MIGRATE` moves its keys atomically, so no step ever sees half a state. `FUNCTION LOAD` goes to every primary; a primary without the library (a
//! replica promoted before it had synced it, a node added later) answers "Function not
//! found", and the library is loaded again on every primary (`REPLACE`: the same code, so
//! harmless where it was present). Wake-ups travel on sharded pub/sub (see `notify.rs`).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{connection_config, CONNECT_TIMEOUT};

/// How often the Sentinel watcher asks a sentinel which server is the master, besides
/// listening for `+switch-master`.
pub(super) const SENTINEL_POLL: Duration = Duration::from_millis(500);
/// How long a resolution waits for the other sentinels once a majority has answered.
const ANSWER_GRACE: Duration = Duration::from_millis(200);
/// How long a state-changing call waits for `?wait=N` replicas before it fails.
pub(super) const WAIT_TIMEOUT: Duration = Duration::from_secs(2);

/// A connection of the topology: the shared one (a connection manager to one server, the
/// Sentinel master's connection, or the cluster's), or one of a pool of connections of its
/// own for calls followed by `WAIT`.
#[derive(Clone)]
pub(super) enum Conn {
    Shared(ConnectionManager),
    /// The Sentinel master's: never made again by itself (see the module docs).
    Master(MultiplexedConnection),
    Cluster(ClusterConnection),
    Own(MultiplexedConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Master(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
            Conn::Own(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Shared(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Master(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Own(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Shared(c) => c.get_db(),
            Conn::Master(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
            Conn::Own(c) => c.get_db(),
        }
    }
}

/// The server in use now (for Sentinel: the master as last resolved).
struct Current {
    /// Bumped each time the master changes.
    generation: u64,
    addr: (String, u16),
    /// The configuration epoch of the sentinels' answer that named it (0 for one server).
    epoch: u64,
    client: redis::Client,
    /// [`Conn::Shared`] to one server, [`Conn::Master`] on Sentinel.
    conn: Conn,
    /// Idle connections of their own, for calls followed by `WAIT`.
    own: Arc<Mutex<Vec<MultiplexedConnection>>>,
}

/// Where commands go; see the module docs.
pub(super) struct Topology {
    kind: Kind,
    /// The generation of the server in use; the wake-up subscriber watches it.
    generation: watch::Sender<u64>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

// One per backend: the size difference between the variants does not matter.
#[allow(clippy::large_enum_variant)]
enum Kind {
    Single(RwLock<Current>),
    Sentinel {
        current: RwLock<Current>,
        sentinels: Vec<redis::Client>,
        master: String,
        /// The master's URL with `{addr}` in place of `host:port`.
        template: String,
        /// One resolution at a time.
        resolving: tokio::sync::Mutex<()>,
    },
    Cluster(ClusterConnection),
}

impl Drop for Topology {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// Whether the server behind `client` says it is a master (`ROLE`).
async fn is_master(client: &redis::Client) -> RedisResult<bool> {
    let mut c = client
        .get_multiplexed_async_connection_with_config(&connection_config())
        .await?;
    let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut c).await?;
    Ok(
        matches!(role.first(), Some(Value::BulkString(b)) if b == b"master")
            || matches!(role.first(), Some(Value::SimpleString(s)) if s == "master"),
    )
}

/// A master as one sentinel names it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Named {
    addr: (String, u16),
    /// The sentinel's configuration epoch for the master: raised by every failover, so of
    /// two answers the one of the higher epoch is the newer.
    epoch: u64,
    /// The sentinel calls it down (`o_down`) or is failing it over: no server to go to,
    /// whatever it says of itself.
    replacing: bool,
}

/// What the sentinel behind `client` says of `master` (`SENTINEL MASTER`); `None` if it does
/// not know the name.
async fn ask_sentinel(client: &redis::Client, master: &str) -> RedisResult<Option<Named>> {
    let mut c = client
        .get_multiplexed_async_connection_with_config(&connection_config())
        .await?;
    let fields: std::collections::HashMap<String, String> = match redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(master)
        .query_async(&mut c)
        .await
    {
        Ok(f) => f,
        Err(e) if e.to_string().contains("No such master") => return Ok(None),
        Err(e) => return Err(e),
    };
    named(&fields).map(Some).ok_or_else(|| {
        RedisError::from((
            redis::ErrorKind::UnexpectedReturnType,
            "a sentinel's SENTINEL MASTER reply lacks ip, port or config-epoch",
        ))
    })
}

/// The address and epoch in a `SENTINEL MASTER` reply.
fn named(fields: &std::collections::HashMap<String, String>) -> Option<Named> {
    Some(Named {
        addr: (fields.get("ip")?.clone(), fields.get("port")?.parse().ok()?),
        epoch: fields.get("config-epoch")?.parse().ok()?,
        replacing: fields.get("flags").is_some_and(|f| {
            f.split(',')
                .any(|flag| flag == "o_down" || flag == "failover_in_progress")
        }),
    })
}

/// Whether the first sentinel that answers refuses to without a password (NOAUTH); `false`
/// when none answers (the sentinels are then asked as they are, and fail as they will).
pub(super) async fn sentinels_need_auth(sentinels: &[redis::Client], master: &str) -> bool {
    for s in sentinels {
        match ask_sentinel(s, master).await {
            Ok(_) => return false,
            Err(e) if e.code() == Some("NOAUTH") => return true,
            Err(_) => continue,
        }
    }
    false
}

/// Whether an error says the server is no (longer the) master or not reachable: the signs
/// that a Sentinel master may have changed.
pub(super) fn failover_sign(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("READONLY") | Some("LOADING") | Some("MASTERDOWN")
    ) || e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
}

/// Whether the server refused the call without running it because it is not a master (or
/// not ready): it may be sent again to the new master.
pub(super) fn refused_by_replica(e: &RedisError) -> bool {
    matches!(
        e.code(),
        Some("READONLY") | Some("LOADING") | Some("MASTERDOWN")
    )
}

impl Topology {
    /// One server behind `client`.
    pub(super) async fn single(
        client: redis::Client,
        addr: (String, u16),
        manager: ConnectionManagerConfig,
    ) -> RedisResult<Arc<Topology>> {
        let conn = Conn::Shared(client.get_connection_manager_with_config(manager).await?);
        let current = Current {
            generation: 0,
            addr,
            epoch: 0,
            client,
            conn,
            own: Arc::default(),
        };
        Ok(Arc::new(Topology {
            kind: Kind::Single(RwLock::new(current)),
            generation: watch::channel(0).0,
            tasks: Mutex::default(),
        }))
    }

    /// The master that `sentinels` name `master`; `template` is the master's URL with
    /// `{addr}` for its `host:port`. Starts the watcher task.
    pub(super) async fn sentinel(
        sentinels: Vec<redis::Client>,
        master: String,
        template: String,
    ) -> RedisResult<Arc<Topology>> {
        let (named, client) = match resolve(&sentinels, &master, &template, None).await? {
            Resolved::Other(named, client) => (named, client),
            Resolved::Same(_) => unreachable!("no master in use to be the same"),
        };
        let conn = Conn::Master(
            client
                .get_multiplexed_async_connection_with_config(&connection_config())
                .await?,
        );
        let current = Current {
            generation: 0,
            addr: named.addr,
            epoch: named.epoch,
            client,
            conn,
            own: Arc::default(),
        };
        let topo = Arc::new(Topology {
            kind: Kind::Sentinel {
                current: RwLock::new(current),
                sentinels,
                master,
                template,
                resolving: tokio::sync::Mutex::new(()),
            },
            generation: watch::channel(0).0,
            tasks: Mutex::default(),
        });
        let watcher = tokio::spawn(watch_sentinels(Arc::downgrade(&topo)));
        topo.tasks.lock().unwrap().push(watcher);
        Ok(topo)
    }

    /// A cluster through `conn`.
    pub(super) fn cluster(conn: ClusterConnection) -> Arc<Topology> {
        Arc::new(Topology {
            kind: Kind::Cluster(conn),
            generation: watch::channel(0).0,
            tasks: Mutex::default(),
        })
    }

    /// Whether this follows a Sentinel master.
    pub(super) fn is_sentinel(&self) -> bool {
        matches!(self.kind, Kind::Sentinel { .. })
    }

    /// Whether this is a cluster.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self.kind, Kind::Cluster(_))
    }

    fn current(&self) -> Option<&RwLock<Current>> {
        match &self.kind {
            Kind::Single(c) | Kind::Sentinel { current: c, .. } => Some(c),
            Kind::Cluster(_) => None,
        }
    }

    /// The shared connection to the server in use now.
    pub(super) fn conn(&self) -> Conn {
        match &self.kind {
            Kind::Cluster(c) => Conn::Cluster(c.clone()),
            _ => self.current().unwrap().read().unwrap().conn.clone(),
        }
    }

    /// The cluster connection (`None` unless this is a cluster).
    pub(super) fn cluster_conn(&self) -> Option<ClusterConnection> {
        match &self.kind {
            Kind::Cluster(c) => Some(c.clone()),
            _ => None,
        }
    }

    /// The generation of the server in use now.
    pub(super) fn generation(&self) -> u64 {
        *self.generation.borrow()
    }

    /// A receiver that sees each change of the server in use.
    pub(super) fn watch(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A client of the server in use now (for a pub/sub connection); `None` on a cluster.
    pub(super) fn client(&self) -> Option<redis::Client> {
        Some(self.current()?.read().unwrap().client.clone())
    }

    /// A connection of its own to the server in use (from the pool, or new), for a call
    /// followed by `WAIT`; give it back with [`Topology::give_back`].
    pub(super) async fn own(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if self
            .current()
            .is_some_and(|c| c.read().unwrap().own.lock().unwrap().is_empty())
        {
            self.ensure_master().await;
        }
        let (generation, client, pool) = {
            let c = self
                .current()
                .expect("WAIT is refused on a cluster")
                .read()
                .unwrap();
            (c.generation, c.client.clone(), Arc::clone(&c.own))
        };
        let idle = pool.lock().unwrap().pop();
        let conn = match idle {
            Some(c) => c,
            None => {
                client
                    .get_multiplexed_async_connection_with_config(&connection_config())
                    .await?
            }
        };
        Ok((generation, conn))
    }

    /// On Sentinel, before a new connection to the master: if the master's connection no
    /// longer answers, the sentinels are asked first (see the module docs: a server restarted
    /// at the master's address is no master until they name it).
    pub(super) async fn ensure_master(&self) {
        if let Kind::Sentinel { current, .. } = &self.kind {
            let (seen, conn) = {
                let c = current.read().unwrap();
                (c.generation, c.conn.clone())
            };
            if !answers(conn).await {
                self.resolve_again(seen).await;
            }
        }
    }

    /// Returns a connection of its own to the pool (unless the server changed meanwhile).
    pub(super) fn give_back(&self, generation: u64, conn: MultiplexedConnection) {
        if let Some(c) = self.current() {
            let c = c.read().unwrap();
            if c.generation == generation {
                let mut pool = c.own.lock().unwrap();
                if pool.len() < 64 {
                    pool.push(conn);
                }
            }
        }
    }

    /// Called after a call failed with `e` while `generation` was in use: on Sentinel, a
    /// sign of a failover resolves the master again. `true` if the master changed since
    /// `generation` (the caller may send a refused call again).
    pub(super) async fn after_error(&self, generation: u64, e: &RedisError) -> bool {
        if !matches!(self.kind, Kind::Sentinel { .. }) || !failover_sign(e) {
            return false;
        }
        self.resolve_again(generation).await;
        self.generation() != generation
    }

    /// Asks the sentinels again (unless someone did since `seen`) and switches to the master
    /// they name if it is another server and says it is a master. If they still name the
    /// server in use, its connection is made again only if it no longer answers (the server
    /// restarted there) and the server says it is a master.
    async fn resolve_again(&self, seen: u64) {
        let Kind::Sentinel {
            current,
            sentinels,
            master,
            template,
            resolving,
        } = &self.kind
        else {
            return;
        };
        let _one = resolving.lock().await;
        let (now, conn) = {
            let c = current.read().unwrap();
            if c.generation != seen {
                return;
            }
            let now = Named {
                addr: c.addr.clone(),
                epoch: c.epoch,
                replacing: false,
            };
            (now, c.conn.clone())
        };
        let (named, client) = match resolve(sentinels, master, template, Some(&now)).await {
            Ok(Resolved::Other(named, client)) => (named, client),
            Ok(Resolved::Same(epoch)) => {
                if answers(conn).await {
                    return;
                }
                let client = match client_of(template, &now.addr) {
                    Ok(c) => c,
                    Err(_) => return,
                };
                if !matches!(is_master(&client).await, Ok(true)) {
                    tracing::debug!("sentinel: the master's connection is lost; no master yet");
                    return;
                }
                let named = Named {
                    epoch: epoch.max(now.epoch),
                    ..now.clone()
                };
                (named, client)
            }
            Err(e) => {
                tracing::debug!(error = %e, "sentinel: no other master yet");
                return;
            }
        };
        let conn = match client
            .get_multiplexed_async_connection_with_config(&connection_config())
            .await
        {
            Ok(c) => Conn::Master(c),
            Err(e) => {
                tracing::warn!(error = %e, "sentinel: could not connect to the master");
                return;
            }
        };
        let generation = {
            let mut c = current.write().unwrap();
            c.generation += 1;
            c.addr = named.addr.clone();
            c.epoch = named.epoch;
            c.client = client;
            c.conn = conn;
            c.own = Arc::default();
            c.generation
        };
        if named.addr == now.addr {
            tracing::info!(
                master = %master,
                at = %format!("{}:{}", now.addr.0, now.addr.1),
                "sentinel: connected again to the master the sentinels name"
            );
        } else {
            tracing::info!(
                master = %master,
                from = %format!("{}:{}", now.addr.0, now.addr.1),
                to = %format!("{}:{}", named.addr.0, named.addr.1),
                epoch = named.epoch,
                "sentinel: following the failover to the new master"
            );
        }
        self.generation.send_replace(generation);
    }
}

/// Whether the master's connection still answers (`PING`); a timeout counts as an answer
/// (a slow server is no restarted one).
async fn answers(mut conn: Conn) -> bool {
    match redis::cmd("PING").query_async::<Value>(&mut conn).await {
        Ok(_) => true,
        Err(e) => e.is_timeout() || !(e.is_io_error() || e.is_connection_dropped()),
    }
}

/// A client of the server at `addr`, from the master's URL `template`.
fn client_of(template: &str, addr: &(String, u16)) -> RedisResult<redis::Client> {
    // Sentinels name an IPv6 master without brackets; a URL needs them.
    let url = if addr.0.contains(':') && !addr.0.starts_with('[') {
        template.replace("{addr}", &format!("[{}]:{}", addr.0, addr.1))
    } else {
        template.replace("{addr}", &format!("{}:{}", addr.0, addr.1))
    };
    redis::Client::open(url.as_str())
}

/// What a resolution found (one per resolution: the size difference does not matter).
#[allow(clippy::large_enum_variant)]
enum Resolved {
    /// Another server, which says it is a master.
    Other(Named, redis::Client),
    /// Every sentinel answered and names the server in use, at this epoch. A lagging
    /// sentinel names the old master for up to seconds after a failover, and so may a
    /// majority: a lost connection to the old address is made again only when none says
    /// otherwise (a restarted old master says it is one until the sentinels demote it).
    Same(u64),
}

/// Asks every sentinel about `master` and takes the answer of the highest epoch whose server
/// says it is a master, skipping a master the sentinels are failing over. With `now` (the
/// master in use), answers that all name it give [`Resolved::Same`] unless another is
/// followed; an answer of an epoch no higher than `now`'s is skipped, unless the server of
/// `now` says it is no longer a master (see the module docs: a lagging sentinel names the old
/// master).
async fn resolve(
    sentinels: &[redis::Client],
    master: &str,
    template: &str,
    now: Option<&Named>,
) -> RedisResult<Resolved> {
    let mut last: Option<RedisError> = None;
    let mut answers: Vec<Named> = Vec::new();
    // All at once; once a majority has answered, the rest get [`ANSWER_GRACE`] more, so a
    // sentinel that does not answer (its host cut off) delays a resolution by no more.
    let mut asks: futures::stream::FuturesUnordered<_> =
        sentinels.iter().map(|s| ask_sentinel(s, master)).collect();
    let (mut answered, majority) = (0, sentinels.len() / 2 + 1);
    let grace = tokio::time::sleep(Duration::MAX);
    tokio::pin!(grace);
    loop {
        let reply = tokio::select! {
            r = asks.next() => r,
            _ = &mut grace => None,
        };
        let Some(reply) = reply else { break };
        match reply {
            Ok(named) => {
                answered += 1;
                if answered == majority {
                    grace
                        .as_mut()
                        .reset(tokio::time::Instant::now() + ANSWER_GRACE);
                }
                match named {
                    Some(n) if !answers.contains(&n) => answers.push(n),
                    _ => {}
                }
            }
            Err(e) => last = Some(e),
        }
    }
    // Every sentinel answered, all alike, and none is failing the master over: only then is
    // the master in use, whose connection was lost, connected to again (see `Resolved::Same`).
    let unanimous = answered == sentinels.len() && answers.len() == 1 && !answers[0].replacing;
    answers.sort_by_key(|a| std::cmp::Reverse(a.epoch));
    // Asked only if an older answer is left to try: whether the master in use was demoted.
    let mut demoted: Option<bool> = None;
    let mut same: Option<u64> = None;
    for n in answers {
        if n.replacing {
            continue;
        }
        if let Some(now) = now {
            if n.addr == now.addr {
                same = same.max(Some(n.epoch));
                continue;
            }
            if n.epoch <= now.epoch {
                if demoted.is_none() {
                    demoted = Some(matches!(
                        is_master(&client_of(template, &now.addr)?).await,
                        Ok(false)
                    ));
                }
                if demoted == Some(false) {
                    continue;
                }
            }
        }
        let client = client_of(template, &n.addr)?;
        match is_master(&client).await {
            Ok(true) => return Ok(Resolved::Other(n, client)),
            Ok(false) => continue,
            Err(e) => last = Some(e),
        }
    }
    match same {
        Some(epoch) if unanimous => return Ok(Resolved::Same(epoch)),
        Some(_) => {
            last = Some(RedisError::from((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the sentinels do not all name the master in use yet",
                format!("master {master:?}"),
            )))
        }
        None => {}
    }
    Err(last.unwrap_or_else(|| {
        RedisError::from((
            redis::ErrorKind::MasterNameNotFoundBySentinel,
            "no sentinel names a reachable master",
            format!("master {master:?}"),
        ))
    }))
}

/// The Sentinel watcher: listens for `+switch-master` on every sentinel, and every
/// [`SENTINEL_POLL`] asks one sentinel and pings the master's connection; resolves again when
/// the master seems to have changed or its connection was lost.
/// Ends when the topology is dropped.
async fn watch_sentinels(topo: std::sync::Weak<Topology>) {
    let (switch_tx, mut switch_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut listeners = Vec::new();
    if let Some(t) = topo.upgrade() {
        if let Kind::Sentinel { sentinels, .. } = &t.kind {
            for s in sentinels.clone() {
                let tx = switch_tx.clone();
                listeners.push(tokio::spawn(listen_switch(s, tx)));
            }
        }
    }
    let _stop = AbortOnDrop(listeners);
    let mut poll = tokio::time::interval(SENTINEL_POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next = 0usize;
    loop {
        let switched = tokio::select! {
            _ = switch_rx.recv() => true,
            _ = poll.tick() => false,
        };
        let Some(t) = topo.upgrade() else { return };
        let Kind::Sentinel {
            current,
            sentinels,
            master,
            ..
        } = &t.kind
        else {
            return;
        };
        let (seen, addr, epoch, conn) = {
            let c = current.read().unwrap();
            (c.generation, c.addr.clone(), c.epoch, c.conn.clone())
        };
        let changed = if switched {
            true
        } else {
            next = (next + 1) % sentinels.len();
            let moved = matches!(ask_sentinel(&sentinels[next], master).await,
                Ok(Some(n)) if n.addr != addr && n.epoch > epoch);
            // A lost master connection is made again here, through the sentinels, so the
            // next call of an idle client finds it made (the poll bounds the wait: a slow
            // answer counts as one).
            moved
                || !tokio::time::timeout(SENTINEL_POLL, answers(conn))
                    .await
                    .unwrap_or(true)
        };
        if changed {
            t.resolve_again(seen).await;
        }
    }
}

/// Subscribes to `+switch-master` on one sentinel (again after each disconnect) and sends a
/// unit for each message.
async fn listen_switch(sentinel: redis::Client, tx: tokio::sync::mpsc::UnboundedSender<()>) {
    loop {
        if let Ok(Ok(mut pubsub)) =
            tokio::time::timeout(CONNECT_TIMEOUT, sentinel.get_async_pubsub()).await
        {
            if pubsub.subscribe("+switch-master").await.is_ok() {
                let mut stream = pubsub.on_message();
                while stream.next().await.is_some() {
                    if tx.send(()).is_err() {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

struct AbortOnDrop(Vec<JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}
