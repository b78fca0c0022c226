//! Whether the store answers, as this server sees it, so that a store that stopped answering
//! (a cut network path, a frozen server) costs a client at most the store timeout and one
//! round trip before it gets 503 `store_unavailable` with `Retry-After`, and a load balancer
//! reading `/healthz` routes around this instance.
//!
//! A probe reads the status of a name nobody uses ([`PROBE_NAME`]; a read that writes nothing
//! on every store) one after another, [`INTERVAL`] apart. A probe not answered within the
//! store timeout (`--store-timeout`, default 2 s) marks the store down, and so does an error
//! of the store's connection; the first probe answered marks it up again. While it is down,
//! `/healthz` answers 503 with the reason, every request that needs the store answers 503 at
//! once, and every request waiting on the store (a waiting acquire, a rate wait) ends with
//! 503 as it goes down. The store's own retries go on underneath: what a request had done
//! before stays as the store says (a lease granted and not answered expires by its TTL, as
//! after any lost answer).

use std::sync::Arc;
use std::time::Duration;

use tessera::Store;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// The name the probe reads (never written).
pub const PROBE_NAME: &str = "tessera-serve-health-probe";

/// The pause between two probes.
pub const INTERVAL: Duration = Duration::from_millis(500);

/// The store's state: `None` while it answers, else why it is taken as down.
#[derive(Debug)]
pub struct Health {
    down: watch::Receiver<Option<String>>,
}

impl Health {
    /// Starts probing `store` until `stop`.
    pub fn start(store: Store, timeout: Duration, stop: CancellationToken) -> Arc<Health> {
        let (tx, rx) = watch::channel(None);
        tokio::spawn(async move {
            loop {
                let probe = store.status(PROBE_NAME);
                let state = tokio::select! {
                    r = tokio::time::timeout(timeout, probe) => match r {
                        Ok(Ok(_)) => None,
                        // A store that answers with an error (a missing permission, data it
                        // cannot read) still answers; only its connection failing is down.
                        Ok(Err(e)) if e.is_transient() => Some(format!("the store failed: {e}")),
                        Ok(Err(_)) => None,
                        Err(_) => Some(format!(
                            "the store did not answer within {} (--store-timeout)",
                            humantime::format_duration(timeout)
                        )),
                    },
                    _ = stop.cancelled() => return,
                };
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
