//! Whether the store answers, as this server sees it, so that a store that stopped answering
//! (a cut network path, a frozen server) costs a client about the store timeout before it
//! gets 503 `store_unavailable` with `Retry-After`, and a load balancer reading `/healthz`
//! routes around this instance.
//!
//! A probe is [`Store::ping`]: one round trip that writes nothing and takes no lock a step
//! waits for (Redis `PING`, `SELECT 1`, a keys-only etcd read). Probes run one after another,
//! [`INTERVAL`] apart. Each may take half the store timeout (`--store-timeout`, default 2 s),
//! and the store is taken as down after [`MISSES`] probes in a row went unanswered: so it
//! has left the server without an answer for the whole store timeout, and one slow answer (a
//! blip) marks nothing. A probe failing with a connection error (refused, reset: the path is
//! known to be broken, not merely slow) marks it down at once. The first probe answered
//! marks it up again. A store that answers with another error (a missing permission, data
//! it cannot read) still answers.
//!
//! While it is down, `/healthz` answers 503 with the reason, every request that needs the
//! store answers 503 at once, and every request waiting on the store (a waiting acquire, a
//! rate wait) ends with 503 as it goes down. The store's own retries go on underneath: what a
//! request had done before stays as the store says (a lease granted and not answered expires
//! by its TTL, as after any lost answer).
//!
//! The embedded stores (memory, SQLite) are not probed: nothing lies between this process
//! and them that could be cut or black-holed (the SQLite file is on this host, and a second
//! instance on the same file would find it in the same state), so `/healthz` answers 200 for
//! as long as the server runs, and a store call that fails answers its own error.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tessera::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The pause between two probes (none after a probe that went unanswered: the next one
/// follows at once, so two misses in a row take the store timeout).
pub const INTERVAL: Duration = Duration::from_millis(500);

/// How many probes in a row must go unanswered before the store is taken as down.
pub const MISSES: u32 = 2;

/// The store's state: `None` while it answers, else why it is taken as down.
#[derive(Debug)]
pub struct Health {
    down: watch::Receiver<Option<String>>,
}

/// What one probe found.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// The store answered (perhaps with an error that is not about reaching it).
    Answered,
    /// No answer within the probe's time, or a transient error that says no more: down once
    /// [`MISSES`] come in a row.
    Missed(String),
    /// The connection failed outright: down at once.
    Broken(String),
}

/// Whether the store at `url` is embedded in this process or host (see the module docs).
fn embedded(url: &str) -> bool {
    url.starts_with("memory:") || url.starts_with("sqlite:")
}

/// The store's state after a probe found `probe`, with `misses` the unanswered probes in a
/// row before it; returns the new state and the new count.
fn judge(probe: Probe, misses: u32) -> (Option<String>, u32) {
    match probe {
        Probe::Answered => (None, 0),
        Probe::Broken(why) => (Some(why), misses + 1),
        Probe::Missed(why) if misses + 1 >= MISSES => (Some(why), misses + 1),
        // One miss: not yet (the caller keeps the state it had).
        Probe::Missed(_) => (None, misses + 1),
    }
}

impl Health {
    /// Starts probing `store` until `stop` (not at all on an embedded store).
    pub fn start(store: Store, timeout: Duration, stop: CancellationToken) -> Arc<Health> {
        let (tx, rx) = watch::channel(None);
        if embedded(store.url()) {
            // Never down; with the sender gone, `gone_down` never resolves.
            drop(tx);
            return Arc::new(Health { down: rx });
        }
        let ping = move || {
            let store = store.clone();
            async move { store.ping().await }
        };
        Health::probing(ping, timeout, stop)
    }

    /// Probes with `ping` until `stop` (see the module docs).
    fn probing<F, Fut>(mut ping: F, timeout: Duration, stop: CancellationToken) -> Arc<Health>
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = tessera::Result<()>> + Send,
    {
        let (tx, rx) = watch::channel(None);
        let each = timeout / MISSES;
        tokio::spawn(async move {
            let mut misses = 0;
            loop {
                let probe = tokio::select! {
                    r = tokio::time::timeout(each, ping()) => match r {
                        Ok(Ok(())) => Probe::Answered,
                        Ok(Err(e)) if e.is_connection() => {
                            Probe::Broken(format!("the store's connection failed: {e}"))
                        }
                        Ok(Err(e)) if e.is_transient() => Probe::Missed(format!("the store failed: {e}")),
                        Ok(Err(_)) => Probe::Answered,
                        Err(_) => Probe::Missed(format!(
                            "the store did not answer within {} (--store-timeout)",
                            humantime::format_duration(timeout)
                        )),
                    },
                    _ = stop.cancelled() => return,
                };
                let answered = probe == Probe::Answered;
                let (state, now_misses) = judge(probe, misses);
                misses = now_misses;
                // A single miss changes nothing: a store taken as down stays down, one taken
                // as up stays up, until the next probe decides.
                if answered || state.is_some() {
                    tx.send_if_modified(|now| {
                        let changed = now.is_some() != state.is_some();
                        if changed {
                            match &state {
                                Some(why) => tracing::warn!("store down: {why}"),
                                None => tracing::info!("store answers again"),
                            }
                        }
                        *now = state;
                        changed
                    });
                }
                if misses > 0 {
                    // The next probe at once: the store timeout runs from the first miss.
                    continue;
                }
                tokio::select! {
                    _ = tokio::time::sleep(INTERVAL) => {}
                    _ = stop.cancelled() => return,
                }
            }
        });
        Arc::new(Health { down: rx })
    }

    /// Why the store is taken as down, or `None` while it answers.
    pub fn down(&self) -> Option<String> {
        self.down.borrow().clone()
    }

    /// Resolves once the store is taken as down (at once if it is), with the reason.
    pub async fn gone_down(&self) -> String {
        let mut rx = self.down.clone();
        let gone = rx
            .wait_for(Option::is_some)
            .await
            .map(|why| why.clone().unwrap_or_default());
        match gone {
            Ok(why) => why,
            // The prober stopped (the server is stopping): never resolves.
            Err(_) => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_unanswered_probe_marks_nothing_two_in_a_row_mark_the_store_down() {
        let miss = || Probe::Missed("slow".into());
        let (state, misses) = judge(miss(), 0);
        assert_eq!((state, misses), (None, 1));
        let (state, misses) = judge(miss(), misses);
        assert_eq!((state.as_deref(), misses), (Some("slow"), 2));
        // Still down while the misses go on; up at the first answer.
        assert!(judge(miss(), misses).0.is_some());
        assert_eq!(judge(Probe::Answered, misses), (None, 0));
        // A miss, an answer, a miss: never down.
        let (_, m) = judge(miss(), 0);
        let (_, m) = judge(Probe::Answered, m);
        assert_eq!(judge(miss(), m), (None, 1));
    }

    #[test]
    fn a_broken_connection_marks_the_store_down_at_once() {
        let (state, _) = judge(Probe::Broken("refused".into()), 0);
        assert_eq!(state.as_deref(), Some("refused"));
    }

    /// What a scripted probe does.
    #[derive(Clone, Copy, Debug)]
    enum Step {
        Answer,
        Hang,
        Refused,
    }

    /// Health probing a store that answers as `script` says, one step per probe (then
    /// answers), with a store timeout of 1 s, on tokio's paused clock.
    fn scripted(script: &[Step]) -> (Arc<Health>, CancellationToken) {
        let steps = Arc::new(std::sync::Mutex::new(
            script
                .iter()
                .copied()
                .collect::<std::collections::VecDeque<_>>(),
        ));
        let ping = move || {
            let step = steps.lock().unwrap().pop_front().unwrap_or(Step::Answer);
            async move {
                match step {
                    Step::Answer => Ok(()),
                    Step::Hang => std::future::pending().await,
                    Step::Refused => Err(tessera::Error::Store {
                        kind: tessera::StoreErrorKind::Connection,
                        message: "connection refused".into(),
                    }),
                }
            }
        };
        let stop = CancellationToken::new();
        let health = Health::probing(ping, Duration::from_secs(1), stop.clone());
        (health, stop)
    }

    /// Every state the health passes through within `span`, sampled each millisecond.
    async fn states(health: &Health, span: Duration) -> Vec<(Duration, bool)> {
        let start = tokio::time::Instant::now();
        let mut seen: Vec<(Duration, bool)> = Vec::new();
        while start.elapsed() < span {
            let down = health.down().is_some();
            if seen.last().map(|s| s.1) != Some(down) {
                seen.push((start.elapsed(), down));
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn a_probe_that_goes_unanswered_once_leaves_the_store_up() {
        let (health, stop) = scripted(&[Step::Answer, Step::Hang, Step::Answer, Step::Hang]);
        let seen = states(&health, Duration::from_secs(5)).await;
        assert_eq!(seen, [(Duration::ZERO, false)]);
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn two_unanswered_probes_in_a_row_take_the_store_timeout_and_mark_it_down() {
        // Answered at 0; the next probe at 0.5 s hangs, and so do the ones sent at once
        // when it gives up at 1.0 s and then at 1.5 s: down at 1.5 s, up again at 2.0 s with
        // the answer of the probe sent then.
        let (health, stop) = scripted(&[Step::Answer, Step::Hang, Step::Hang, Step::Hang]);
        let seen = states(&health, Duration::from_secs(3)).await;
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0], (Duration::ZERO, false));
        let (down_at, down) = seen[1];
        assert!(down);
        let from_first_miss = down_at - INTERVAL;
        assert!(
            from_first_miss >= Duration::from_secs(1)
                && from_first_miss <= Duration::from_millis(1002),
            "{seen:?}"
        );
        assert_eq!(
            seen[2],
            (down_at + INTERVAL, false),
            "up at the next answer"
        );
        stop.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_connection_marks_the_store_down_at_the_first_probe() {
        let (health, stop) = scripted(&[Step::Answer, Step::Refused, Step::Hang, Step::Hang]);
        let gone = tokio::time::timeout(Duration::from_secs(2), health.gone_down()).await;
        let why = gone.expect("down at the refused probe");
        assert!(why.contains("connection refused"), "{why}");
        stop.cancel();
    }

    #[test]
    fn only_the_embedded_stores_go_unprobed() {
        assert!(embedded("memory://"));
        assert!(embedded("sqlite:///var/lib/tessera/t.db"));
        for url in [
            "redis://127.0.0.1:6379",
            "rediss://h",
            "redis+sentinel://h/m",
            "postgres://h/db",
            "mysql://h/db",
            "etcd://h:2379",
        ] {
            assert!(!embedded(url), "{url}");
        }
    }
}
