//! Wake-ups: one `LISTEN` connection per client process and server.
//!
//! # How it works
//!
//! Every backend of this process connected to the same server and database shares one
//! [`Listener`] (a process-wide registry keyed by the connection target). It has a random
//! client id; its channel is `tessera_w<client id>` (`tessera__channel` in `common.sql`). A
//! function that grants a waiter (the hand-off), revokes or deletes a holder calls
//! `pg_notify` on the channel of that lease's client with the lease id as payload, so every
//! notification reaches exactly one listening backend (before PostgreSQL 19 every commit
//! that notifies signals every listening backend: one channel per process keeps that to
//! one listener per process). The listener calls [`tessera_core::wake::notify`] for each. A release
//! is the exception: it returns the grants to waiters of its own process in its reply
//! (`tessera_release`), which goes through [`Listener::route`] as a notification would, so
//! hand-offs within one process send no NOTIFY at all.
//!
//! # What can go wrong, and what catches it
//!
//! 1. **The listener connection drops.** sqlx's `PgListener` reconnects and `LISTEN`s again
//!    inside `try_recv`, which then returns `Ok(None)`; whatever was notified in between is
//!    lost. So after every reconnect every waiter queued through this process asks the
//!    store at once ([`Listener::wake_all`]), instead of at its next heartbeat.
//! 2. **The connection is half-open** (the server or the path vanished without a FIN or RST;
//!    `PgListener` sets no TCP keepalive, sqlx issue 3062): `try_recv` would wait forever.
//!    Every [`PING_EVERY`] the receiving task asks its own connection for its backend's pid
//!    (`SELECT pg_backend_pid()`, run between notifications; `PgListener` keeps any that
//!    arrive meanwhile); with no answer within [`PING_TIMEOUT`] the connection is dropped, a new one is
//!    connected (with backoff while the server is unreachable), and every waiter is woken as
//!    in 1. A pid that changed means `PgListener` reconnected by itself: every waiter is woken
//!    then too. The ping is a query, not a `NOTIFY` to our own channel: before PostgreSQL 19
//!    every `NOTIFY` signals every listening backend of the database, so a self-`NOTIFY` from
//!    each of N idle processes every 2 s cost the server N²/2 wake-ups a second.
//! 3. **A wake-up is lost anyway** (the server crashed after the commit but before sending
//!    it): the waiter's periodic heartbeat finds the grant. Wake-ups are the mechanism,
//!    heartbeats the safety net.
//!
//! The listener is connected (its `LISTEN` confirmed) before the first backend using it
//! returns from `connect`, so no grant to this client is notified before someone listens.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio_util::task::AbortOnDropHandle;

use tessera_core::error::Result;
use tessera_core::model::{Grant, Lease, LeaseId, StoreTime};
use tessera_core::wake;

/// How often the receiving task pings its connection.
pub(crate) const PING_EVERY: Duration = Duration::from_secs(2);
/// How long a ping may take to be answered before the listener is rebuilt.
pub(crate) const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// Connect timeout of the listener's connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// The shared listener of one server and database (see the module docs).
pub(crate) struct Listener {
    client_id: String,
    channel: String,
    /// Lease ids queued through this process, woken after a reconnect.
    waiting: Mutex<HashSet<LeaseId>>,
    /// Times the listener connection was rebuilt or reconnected (for tests and logs).
    reconnects: AtomicU64,
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// The backend pid of the current listener connection (for fault tests).
    pid: AtomicU64,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("channel", &self.channel)
            .finish_non_exhaustive()
    }
}

type Registry = Mutex<HashMap<String, Weak<Listener>>>;

fn registry() -> &'static Registry {
    static REGISTRY: std::sync::OnceLock<Registry> = std::sync::OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

/// Serializes the creation of listeners, so two backends connecting at once share one.
fn creating() -> &'static tokio::sync::Mutex<()> {
    static CREATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    &CREATING
}

impl Listener {
    /// The listener of this process for `key` (the server and database), started and
    /// listening before this returns.
    pub(crate) async fn shared(key: &str, options: &PgConnectOptions) -> Result<Arc<Listener>> {
        let _serial = creating().lock().await;
        if let Some(l) = registry().lock().unwrap().get(key).and_then(Weak::upgrade) {
            return Ok(l);
        }
        let client_id = format!("{:032x}", rand::random::<u128>());
        let listener = Arc::new(Listener {
            channel: format!("tessera_w{client_id}"),
            client_id,
            waiting: Mutex::default(),
            reconnects: AtomicU64::new(0),
            tasks: Mutex::default(),
            pid: AtomicU64::new(0),
        });
        let options = options.clone().application_name("tessera-listener");
        let first = connect(&listener.channel, &options)
            .await
            .map_err(super::error::map_err)?;
        let weak = Arc::downgrade(&listener);
        let watchdog = tokio::spawn(watchdog(weak, first, options));
        listener.tasks.lock().unwrap().push(watchdog);
        registry()
            .lock()
            .unwrap()
            .insert(key.to_string(), Arc::downgrade(&listener));
        Ok(listener)
    }

    /// This process's client id (the suffix of its channel).
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }

    /// How many times the listener connection was replaced so far.
    pub(crate) fn reconnects(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The server pid of the listener's connection (0 before it is known).
    pub(crate) fn pid(&self) -> u32 {
        self.pid.load(Ordering::Relaxed) as u32
    }

    pub(crate) fn set_waiting(&self, lease: LeaseId, waiting: bool) {
        let mut set = self.waiting.lock().unwrap();
        if waiting {
            set.insert(lease);
        } else {
            set.remove(&lease);
        }
    }

    /// Wakes every waiter queued through this process: each asks the store itself.
    pub(crate) fn wake_all(&self) {
        let leases: Vec<LeaseId> = self.waiting.lock().unwrap().iter().copied().collect();
        for lease in leases {
            wake::notify(lease);
        }
    }

    /// Routes one notification, or one wake-up payload of a release's reply.
    pub(crate) fn route(&self, payload: &str) {
        if let Some(grant) = parse_grant(payload) {
            self.waiting.lock().unwrap().remove(&grant.lease.lease_id);
            wake::notify_grant(grant);
        } else if let Ok(lease) = payload.split('\t').next().unwrap_or("").parse::<LeaseId>() {
            // A granted waiter stops waiting; a revoked holder's keeper hears it too.
            self.waiting.lock().unwrap().remove(&lease);
            wake::notify(lease);
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().unwrap().drain(..) {
            t.abort();
        }
    }
}

/// A listener connection of its own (a one-connection pool, not the operations' pool), with
/// `LISTEN` on `channel` confirmed. Its connections run [`super::url::KEEP_IDLE`] first: a
/// server's `idle_session_timeout` would otherwise end it between two pings.
async fn connect(channel: &str, options: &PgConnectOptions) -> sqlx::Result<PgListener> {
    let pool = PgPoolOptions::new()
        .after_connect(|conn, _| {
            Box::pin(async move {
                sqlx::raw_sql(super::url::KEEP_IDLE).execute(conn).await?;
                Ok(())
            })
        })
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .acquire_timeout(CONNECT_TIMEOUT)
        .connect_with(options.clone())
        .await?;
    let mut listener = PgListener::connect_with(&pool).await?;
    listener.ignore_pool_close_event(true);
    listener.listen(channel).await?;
    Ok(listener)
}

/// Receives notifications, and pings its own connection every [`PING_EVERY`], until the
/// connection fails in a way `PgListener` does not mend or a ping goes unanswered for
/// [`PING_TIMEOUT`] (a half-open connection): then it returns, dropping the connection, and
/// the watchdog connects a new one. `try_recv` is cancel-safe (sqlx reads a message only
/// once it is whole), so a ping may interrupt it; a notification that arrives during a ping
/// is buffered by `PgListener` and returned by the next `try_recv`.
async fn receive(owner: Weak<Listener>, mut pg: PgListener) {
    let mut pid: Option<i32> = None;
    let mut tick = tokio::time::interval(PING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let msg = tokio::select! {
            msg = pg.try_recv() => Some(msg),
            _ = tick.tick() => None,
        };
        let Some(l) = owner.upgrade() else { return };
        match msg {
            Some(Ok(Some(n))) => l.route(n.payload()),
            Some(Ok(None)) => {
                // Reconnected and listening again (eager reconnect): what was notified in
                // between is lost, so every waiter asks the store now.
                l.reconnects.fetch_add(1, Ordering::Relaxed);
                tracing::info!(channel = %l.channel, "tessera postgres listener reconnected");
                l.wake_all();
                pid = None;
            }
            Some(Err(e)) => {
                tracing::warn!(channel = %l.channel, error = %e, "tessera postgres listener failed");
                return;
            }
            None => {
                // Not held across the ping: a store dropped meanwhile ends this task at once.
                drop(l);
                let ping =
                    sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()").fetch_one(&mut pg);
                let answer = tokio::time::timeout(PING_TIMEOUT, ping).await;
                let Some(l) = owner.upgrade() else { return };
                match answer {
                    Ok(Ok(now)) => {
                        l.pid.store(now as u64, Ordering::Relaxed);
                        if pid.is_some_and(|before| before != now) {
                            // `PgListener` reconnected inside the ping (the connection it
                            // had was lost while `try_recv` was interrupted): as above.
                            l.reconnects.fetch_add(1, Ordering::Relaxed);
                            l.wake_all();
                        }
                        pid = Some(now);
                    }
                    // A failed query (the backend was terminated, the server restarts): the
                    // next `try_recv` meets the lost connection and reconnects, or reports
                    // what it cannot mend.
                    Ok(Err(_)) => {}
                    Err(_) => {
                        tracing::warn!(channel = %l.channel, "tessera postgres listener silent; reconnecting");
                        return;
                    }
                }
            }
        }
    }
}

/// Owns the receiving task, and replaces it (and its connection) whenever it returns.
async fn watchdog(owner: Weak<Listener>, first: PgListener, options: PgConnectOptions) {
    // The receiving task owns the listener's connection: it ends with the watchdog (aborted
    // when the last handle of the store drops the `Listener`), or the connection would stay
    // open, idle in `try_recv`, for the life of the process.
    let mut recv = AbortOnDropHandle::new(tokio::spawn(receive(owner.clone(), first)));
    let mut backoff = Duration::from_millis(20);
    loop {
        let _ = (&mut recv).await;
        let Some(l) = owner.upgrade() else { return };
        let channel = l.channel.clone();
        drop(l);
        match connect(&channel, &options).await {
            Ok(pg) => {
                backoff = Duration::from_millis(20);
                recv = AbortOnDropHandle::new(tokio::spawn(receive(owner.clone(), pg)));
                let Some(l) = owner.upgrade() else { return };
                l.reconnects.fetch_add(1, Ordering::Relaxed);
                l.wake_all();
            }
            Err(e) => {
                tracing::warn!(%channel, error = %e, "tessera postgres listener: reconnect failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                // Loop with a finished task: reconnect again at once.
                recv = AbortOnDropHandle::new(tokio::spawn(async {}));
            }
        }
    }
}

/// A grant pushed with its wake-up (`tessera__hand_off` in `common.sql`):
/// `lease \t now \t fence \t expires_at \t seats \t holder`, the seats field
/// `seats:tenant` for a lease of a tenant (step revision 8). `None` for anything else (a bare
/// lease id, or a payload that does not read: the waiter then asks the store).
fn parse_grant(payload: &str) -> Option<Grant> {
    let mut f = payload.splitn(6, '\t');
    let lease_id: LeaseId = f.next()?.parse().ok()?;
    let now = StoreTime(f.next()?.parse().ok()?);
    let fence: u64 = f.next()?.parse().ok()?;
    let expires_at = StoreTime(f.next()?.parse().ok()?);
    let seats = f.next()?;
    let (seats, tenant) = match seats.split_once(':') {
        Some((_, "")) => return None,
        Some((seats, tenant)) => (seats, Some(tenant.to_string())),
        None => (seats, None),
    };
    let seats: Vec<u32> = seats
        .split(',')
        .map(|s| s.parse().ok())
        .collect::<Option<_>>()?;
    let holder = f.next()?.to_string();
    if seats.is_empty() || seats.windows(2).any(|w| w[0] >= w[1]) || expires_at < now {
        return None;
    }
    Some(Grant {
        lease: Lease {
            lease_id,
            weight: seats.len() as u32,
            seats,
            fence,
            holder,
            acquired_at: now,
            expires_at,
            tenant,
        },
        now,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_grants_are_read_and_anything_else_is_not() {
        let id = "0123456789abcdef0123456789abcdef";
        let g = parse_grant(&format!("{id}\t100\t7\t200\t0,2\thost/1\twith tab")).unwrap();
        assert_eq!(g.lease.lease_id.to_string(), id);
        assert_eq!(
            (g.now.0, g.lease.fence, g.lease.expires_at.0),
            (100, 7, 200)
        );
        assert_eq!((g.lease.seats.clone(), g.lease.weight), (vec![0, 2], 2));
        assert_eq!(g.lease.holder, "host/1\twith tab");
        assert_eq!(g.lease.tenant, None);
        // A tenant's lease: `seats:tenant` (the tenant may hold ':' and ',').
        let g = parse_grant(&format!("{id}\t100\t7\t200\t0,2:a:b,c\th")).unwrap();
        assert_eq!(
            (g.lease.seats.clone(), g.lease.holder.as_str()),
            (vec![0, 2], "h")
        );
        assert_eq!(g.lease.tenant.as_deref(), Some("a:b,c"));
        assert!(parse_grant(&format!("{id}\t100\t7\t200\t0:\th")).is_none());
        assert!(parse_grant(id).is_none());
        assert!(parse_grant(&format!("{id}\t100\t7\t200\t2,0\th")).is_none());
        assert!(parse_grant(&format!("{id}\t100\t7\t50\t0\th")).is_none());
        assert!(parse_grant(&format!("{id}\tx\t7\t200\t0\th")).is_none());
    }
}
