//! How commands reach the server: one step is one `FCALL` of tessera's function library, or
//! one `EVALSHA` of the same code where the server refuses the library (see the
//! [store's docs](super)); and `SCAN` for the names of a prefix.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{RedisError, Value};

use super::ops::{keys, Library, Op};
use super::RedisBackend;
use crate::error::Result;
use crate::model::Name;

impl RedisBackend {
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

    /// Runs `op` on the keys of `name` with the shared first argument and `args`.
    pub(super) async fn run(&self, op: Op, name: &Name, args: &[String]) -> Result<Value> {
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
}

/// [`RedisBackend::functions_from`] while the function library is in use.
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
