//! How commands reach the server: one step is one `FCALL` of tessera's function library, or
//! one `EVALSHA` of the same code where the server refuses the library (see the
//! [store's docs](super)); and `SCAN` for the names of a prefix.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::{RedisError, RedisResult, Value};

use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::ops::{self, keys, Library, Op};
use super::topology::{self, Conn};
use super::{Caller, RedisBackend};
use tessera_core::error::Result;
use tessera_core::model::Name;

/// The channel (under the wake-up channels' prefix, which a restricted user may publish to)
/// that [`Caller::call_and_wait`] publishes to; no client id ends so.
const WAIT_MARK: &str = "wait";

impl Caller {
    /// Whether the connection sends a request again by itself after a dropped connection
    /// (redis-rs's cluster client does; the connection manager fails the request instead),
    /// so that a step may run twice for one call.
    pub(super) fn resends(&self) -> bool {
        self.topo.is_cluster()
    }

    /// The names behind every key matching `pattern` (a `SCAN`, so Redis is never blocked),
    /// sorted and without duplicates; `name_of` maps a key to its name.
    pub(super) async fn scan_names(
        &self,
        pattern: &str,
        name_of: impl Fn(&str) -> Option<Name>,
    ) -> Result<Vec<String>> {
        let mut names = Vec::new();
        match self.topo.cluster_conn() {
            None => {
                let conn = self.topo.conn();
                self.scan_into(&mut names, pattern, &name_of, |cmd| {
                    let mut conn = conn.clone();
                    async move { cmd.query_async(&mut conn).await }
                })
                .await?;
            }
            Some(cluster) => {
                // A SCAN cursor belongs to one node: scan every primary in turn.
                for (host, port) in self.cluster_primaries(&cluster).await? {
                    self.scan_into(&mut names, pattern, &name_of, |cmd| {
                        let mut conn = cluster.clone();
                        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                            host: host.clone(),
                            port,
                        });
                        async move {
                            let v = conn.route_command(cmd, routing).await?;
                            Ok(redis::from_redis_value(v)?)
                        }
                    })
                    .await?;
                }
            }
        }
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// One node's `SCAN` loop, sending each `SCAN` through `send`.
    async fn scan_into<F, Fut>(
        &self,
        names: &mut Vec<String>,
        pattern: &str,
        name_of: &impl Fn(&str) -> Option<Name>,
        send: F,
    ) -> Result<()>
    where
        F: Fn(redis::Cmd) -> Fut,
        Fut: std::future::Future<Output = RedisResult<(u64, Vec<String>)>>,
    {
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000);
            let (next, keys) = send(cmd).await.map_err(|e| self.err(e))?;
            names.extend(
                keys.iter()
                    .filter_map(|k| name_of(k))
                    .map(|n| n.to_string()),
            );
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The addresses of the cluster's primaries (`CLUSTER SLOTS`).
    async fn cluster_primaries(
        &self,
        cluster: &redis::cluster_async::ClusterConnection,
    ) -> Result<Vec<(String, u16)>> {
        let mut conn = cluster.clone();
        let slots = conn
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .map_err(|e| self.err(e))?;
        let ranges: Vec<Vec<Value>> =
            redis::from_redis_value(slots).map_err(|e| self.err(e.into()))?;
        let mut primaries = Vec::new();
        for range in ranges {
            if let Some(node) = range.get(2) {
                let node: Vec<Value> =
                    redis::from_redis_value(node.clone()).map_err(|e| self.err(e.into()))?;
                if let (Some(h), Some(p)) = (node.first(), node.get(1)) {
                    let host: String =
                        redis::from_redis_value(h.clone()).map_err(|e| self.err(e.into()))?;
                    let port: u16 =
                        redis::from_redis_value(p.clone()).map_err(|e| self.err(e.into()))?;
                    if !primaries.contains(&(host.clone(), port)) {
                        primaries.push((host, port));
                    }
                }
            }
        }
        Ok(primaries)
    }

    /// `PING` on the connection the steps use (the shared one, the Sentinel master's, or the
    /// cluster's), outside the lines: it asks whether the server answers, not whether a step
    /// would get its turn. On Sentinel a sign of a failover makes the topology resolve the
    /// master again, as after a step.
    pub(super) async fn ping(&self) -> Result<()> {
        let generation = self.topo.generation();
        let mut conn = self.topo.conn();
        match redis::cmd("PING").query_async::<Value>(&mut conn).await {
            Ok(_) => Ok(()),
            Err(e) => {
                self.topo.after_error(generation, &e).await;
                Err(self.err(e))
            }
        }
    }

    /// Runs `op` on the keys of `name` (the meta key alone, every key on a cluster: see
    /// [`keys`]) with the shared first argument and `args`.
    pub(super) async fn run(&self, op: Op, name: &Name, args: &[String]) -> Result<Value> {
        let keys = keys(&self.prefix, name, self.topo.is_cluster());
        self.run_on(op, name, &keys, args).await
    }

    /// [`Caller::run`] for an admission step: the semaphore's keys, then the limiter's (see
    /// `scripts/admission.lua`).
    pub(super) async fn run_admission(
        &self,
        op: Op,
        name: &Name,
        args: &[String],
    ) -> Result<Value> {
        let mut keys = keys(&self.prefix, name, self.topo.is_cluster());
        keys.extend(super::rate::keys(&self.prefix, name));
        self.run_on(op, name, &keys, args).await
    }

    async fn run_on(&self, op: Op, name: &Name, keys: &[String], args: &[String]) -> Result<Value> {
        let mut all = Vec::with_capacity(args.len() + 1);
        // On a cluster, wake-ups go out on sharded pub/sub in the semaphore's own slot.
        let cluster_base;
        let wake_base = if self.topo.is_cluster() {
            cluster_base = ops::cluster_wake_base(&self.prefix, name);
            cluster_base.as_str()
        } else {
            self.wake_base.as_str()
        };
        all.push(wake_base);
        all.extend(args.iter().map(String::as_str));
        self.call(op, keys, &all).await
    }

    /// One step: [`Caller::call_on`] on the shared connection, or, with `?wait=N` and
    /// an operation that may write, on a connection of its own followed by `WAIT N`. On
    /// Sentinel, a sign of a failover makes the topology resolve the master again, and a call
    /// the old master refused without running it (`READONLY`, `LOADING`) is sent once more.
    /// Each call first takes its place in a line (see `line.rs`): keep-alives in their own.
    pub(super) async fn call(&self, op: Op, keys: &[String], args: &[&str]) -> Result<Value> {
        let line = match op {
            Op::Renew | Op::Heartbeat => &self.keep_alives,
            _ => &self.operations,
        };
        let place = line.enter().await?;
        let result = self.call_in_place(op, keys, args).await;
        let answered = match &result {
            Ok(_) => true,
            Err(e) => {
                !(e.is_timeout()
                    || e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal())
            }
        };
        if answered {
            place.answered();
        }
        result.map_err(|e| self.err(e))
    }

    /// [`Caller::call`] once it has its place in the line.
    async fn call_in_place(&self, op: Op, keys: &[String], args: &[&str]) -> RedisResult<Value> {
        let mut retried = false;
        loop {
            let generation = self.topo.generation();
            let result = if self.wait > 0 && op.may_write() {
                self.call_and_wait(op, keys, args).await
            } else {
                let mut conn = self.topo.conn();
                match self.call_on(&mut conn, op, keys, args).await {
                    // Grants to a client with `wait`, made by a call that waited for no
                    // replica: it gets the bare wake-up and asks.
                    Ok(v) => {
                        let (v, relays) = Relays::split(v);
                        if let Some(relays) = relays {
                            relays.publish(&mut conn, 0).await;
                        }
                        Ok(v)
                    }
                    Err(e) => Err(e),
                }
            };
            match result {
                Ok(v) => return Ok(v),
                Err(e) => {
                    let moved = self.topo.after_error(generation, &e).await;
                    if moved && !retried && topology::refused_by_replica(&e) {
                        retried = true;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// [`Caller::call_on`] on a connection of its own, then `WAIT` for the replicas
    /// the URL asks for: the answer comes only once they have the write, and everything the
    /// master did before it. `WAIT` counts up to the last write *this connection* sent, and a
    /// call that only read (a heartbeat that finds the hand-off another client's release
    /// made) sent none, so a `PUBLISH` to a channel nobody listens on goes first: it is
    /// replicated, and moves that mark to the master's present. Grants the step made to
    /// waiters with `wait` are published after the `WAIT`, with the grant to those who need
    /// no more replicas than it counted (see [`Relays`]).
    async fn call_and_wait(&self, op: Op, keys: &[String], args: &[&str]) -> RedisResult<Value> {
        let (generation, own) = self.topo.own().await?;
        let mut conn = Conn::Own(own);
        let (v, relays) = Relays::split(self.call_on(&mut conn, op, keys, args).await?);
        let (acked,): (i64,) = redis::pipe()
            .cmd("PUBLISH")
            .arg(format!("{}{}", self.wake_base, WAIT_MARK))
            .arg("")
            .ignore()
            .cmd("WAIT")
            .arg(self.wait)
            .arg(topology::WAIT_TIMEOUT.as_millis() as u64)
            .query_async(&mut conn)
            .await?;
        if let Some(relays) = relays {
            relays.publish(&mut conn, acked).await;
        }
        if let Conn::Own(own) = conn {
            self.topo.give_back(generation, own);
        }
        if acked < i64::from(self.wait) {
            return Err(RedisError::from((
                redis::ErrorKind::Io,
                "replicas did not acknowledge the write in time",
                format!(
                    "{acked} of {} replicas within {:?} (WAIT); the step ran on the master and may be retried",
                    self.wait,
                    topology::WAIT_TIMEOUT
                ),
            )));
        }
        Ok(v)
    }

    /// One round trip: `FCALL` of the library's function for `op`, or `EVALSHA` of its
    /// script. A server that lost the library (restart, `FUNCTION FLUSH`, a promoted cluster
    /// replica) gets it again and the call is retried once, as redis-rs does for scripts
    /// after `NOSCRIPT`.
    pub(super) async fn call_on(
        &self,
        conn: &mut Conn,
        op: Op,
        keys: &[String],
        args: &[&str],
    ) -> RedisResult<Value> {
        let library = Library::get();
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
            match fcall.query_async::<Value>(conn).await {
                Ok(v) => {
                    if from != FUNCTIONS {
                        self.use_functions();
                    }
                    return Ok(v);
                }
                Err(e) if e.to_string().contains("Function not found") => {
                    if self.load_library(conn).await? {
                        let v = fcall.query_async(conn).await?;
                        if from != FUNCTIONS {
                            self.use_functions();
                        }
                        return Ok(v);
                    }
                }
                Err(e) if functions_unavailable(&e) => self.use_scripts(&e),
                Err(e) => return Err(e),
            }
        }
        let mut inv = library.script(op).prepare_invoke();
        inv.key(keys);
        for a in args {
            inv.arg(*a);
        }
        inv.invoke_async(conn).await
    }

    /// Loads the function library (on a cluster: on every primary, replacing the same code
    /// where it is present); `false` (and scripts from now on) if the server refuses.
    async fn load_library(&self, conn: &mut Conn) -> RedisResult<bool> {
        let library = Library::get();
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD");
        if self.topo.is_cluster() {
            load.arg("REPLACE");
        }
        let loaded: redis::RedisResult<Value> = load.arg(&library.code).query_async(conn).await;
        match loaded {
            Ok(_) => {
                tracing::debug!(library = %library.name, "loaded the function library");
                Ok(true)
            }
            // Loaded meanwhile by another client.
            Err(e) if e.to_string().contains("already exists") => Ok(true),
            // Any refusal by the server (no functions, an ACL without FUNCTION LOAD, OOM
            // under maxmemory, a read-only replica): the scripts need no library.
            Err(e)
                if e.code().is_some()
                    && !(self.topo.is_sentinel() && topology::refused_by_replica(&e)) =>
            {
                self.use_scripts(&e);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    fn use_scripts(&self, why: &RedisError) {
        let retry_ms = self.functions_retry_ms.load(Ordering::Relaxed);
        let retry_at = epoch_ms() + retry_ms;
        if self.functions_from.swap(retry_at, Ordering::Relaxed) == FUNCTIONS {
            tracing::info!(
                url = %self.url,
                reason = %self.err(why.clone()),
                retry_in = ?Duration::from_millis(retry_ms),
                "the tessera function library is not available; using EVALSHA scripts (load it once with a user allowed FUNCTION LOAD for faster calls)"
            );
        }
    }

    fn use_functions(&self) {
        if self.functions_from.swap(FUNCTIONS, Ordering::Relaxed) != FUNCTIONS {
            tracing::info!(url = %self.url, "the tessera function library is available again; using FCALL");
        }
    }
}

impl RedisBackend {
    /// How long after the server refused the function library it is tried again (default
    /// [`FUNCTIONS_RETRY`]); for tests, right after connect.
    #[doc(hidden)]
    pub fn with_functions_retry(self, after: Duration) -> Self {
        self.caller
            .functions_retry_ms
            .store(after.as_millis() as u64, Ordering::Relaxed);
        self
    }
}

/// [`Caller::functions_from`] while the function library is in use.
pub(super) const FUNCTIONS: u64 = 0;
/// After the server refused the function library, operations run as scripts for this long,
/// then the library is tried again: a refusal may pass (memory freed after OOM, a failover
/// from a read-only replica, an administrator who loaded the library or widened the ACL).
/// Where functions never work (Redis 6) this costs one refused `FCALL` per minute.
pub const FUNCTIONS_RETRY: Duration = Duration::from_secs(60);

/// Milliseconds on a monotonic clock, never [`FUNCTIONS`].
pub(super) fn epoch_ms() -> u64 {
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

/// Wake-ups a step left to its caller (`out()` in `prelude.lua`): hand-off grants to clients
/// with `wait` (id ending `.r<N>`), who trust a grant only once N replicas have the step that
/// made it. The step's reply comes wrapped: `['relay', reply, (channel, bare payload, payload
/// with the grant, N)...]`.
struct Relays(Vec<Value>);

impl Relays {
    /// The step's own reply, and the wake-ups it left, if any.
    fn split(v: Value) -> (Value, Option<Relays>) {
        match v {
            Value::Array(mut items)
                if items.len() >= 2
                    && matches!(&items[0], Value::BulkString(b) if b == b"relay") =>
            {
                let rest = items.split_off(2);
                let reply = items.pop().unwrap_or(Value::Nil);
                (reply, Some(Relays(rest)))
            }
            v => (v, None),
        }
    }

    /// Publishes each wake-up on `conn`: with the grant where `acked` replicas (what this
    /// call's `WAIT` counted) are as many as its client needs, bare otherwise. A wake-up
    /// that cannot be sent is left to the waiter's heartbeat, as one lost in transit: the
    /// step itself succeeded.
    async fn publish(self, conn: &mut Conn, acked: i64) {
        fn text(v: &Value) -> Option<&str> {
            match v {
                Value::BulkString(b) => std::str::from_utf8(b).ok(),
                Value::SimpleString(s) => Some(s.as_str()),
                _ => None,
            }
        }
        let mut pipe = redis::pipe();
        let mut any = false;
        for relay in self.0.chunks_exact(4) {
            let (Some(channel), Some(bare), Some(granted), Some(need)) = (
                text(&relay[0]),
                text(&relay[1]),
                text(&relay[2]),
                text(&relay[3]).and_then(|n| n.parse::<i64>().ok()),
            ) else {
                continue;
            };
            let payload = if acked >= need { granted } else { bare };
            pipe.cmd("PUBLISH").arg(channel).arg(payload).ignore();
            any = true;
        }
        if !any {
            return;
        }
        if let Err(e) = pipe.query_async::<()>(conn).await {
            tracing::debug!(error = %e, "hand-off wake-ups not sent; the waiters' heartbeats find the grants");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_wrapped_reply_gives_the_step_reply_and_its_wake_ups() {
        let wrapped = Value::Array(vec![
            bulk("relay"),
            Value::Int(1),
            bulk("t:wake:c.r1"),
            bulk("7"),
            bulk("7\t1\trecord"),
            bulk("1"),
        ]);
        let (reply, relays) = Relays::split(wrapped);
        assert_eq!(reply, Value::Int(1));
        assert_eq!(relays.unwrap().0.len(), 4);
        let plain = Value::Array(vec![bulk("granted"), Value::Int(5), bulk("record")]);
        let (reply, relays) = Relays::split(plain.clone());
        assert_eq!(reply, plain);
        assert!(relays.is_none());
        assert!(Relays::split(Value::Int(0)).1.is_none());
    }
}
