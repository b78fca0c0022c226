//! The arrival gate: how many of a process's new requests on one semaphore are at the store
//! at once, and which one goes next (`docs/fair-shares.md`, "A process's own arrivals").
//!
//! On a store whose step locks the semaphore (the SQL stores), a flood of one tenant's
//! requests sent at once queues in the process, for the pool's connections and then for the
//! semaphore's row lock, in the order it was sent: another tenant's request sent a moment
//! later waits behind all of it, and so does every release that would hand off. The store's
//! fair order (start tags) cannot help a request that has not reached the store yet.
//!
//! So a store that asks for it ([`Capabilities::arrivals_in_flight`]) gets, per semaphore
//! name, at most that many arrivals (the first send of an acquire, try-acquire or admission,
//! with its retries) in flight from this process, and the others wait here, each in its
//! tenant's line (requests without a tenant in the line of `""`). A freed place goes to the
//! next tenant in turn (round robin over the tenants that have requests waiting), and within a
//! tenant in the order of arrival. Releases, heartbeats and cancels never wait here.
//!
//! Invariants (tested below):
//! 1. at most `width` passes of one name are alive at once;
//! 2. a freed place goes to a waiting request at once (a place is never left unused while
//!    someone waits), skipping those that gave up;
//! 3. within one tenant, passes are handed out in the order the requests arrived;
//! 4. while two tenants wait, neither gets a second place before the other got one;
//! 5. a request that gives up while waiting (its future is dropped) leaves nothing behind,
//!    and an idle name keeps no entry.
//!
//! Nothing here changes what a store decides: a request that waited here is the same request,
//! sent a little later.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// The gate of one connection (one opened store).
#[derive(Debug)]
pub(crate) struct Arrivals {
    width: usize,
    names: Arc<Mutex<HashMap<String, Line>>>,
}

/// One name's requests in flight and waiting.
#[derive(Debug, Default)]
struct Line {
    in_flight: usize,
    /// The tenants with requests waiting, in turn order; each with its requests in arrival
    /// order.
    turns: VecDeque<(String, VecDeque<oneshot::Sender<Pass>>)>,
}

/// A place at the store for one request of `name`; dropping it frees the place.
#[derive(Debug)]
pub(crate) struct Pass {
    name: String,
    names: Option<Arc<Mutex<HashMap<String, Line>>>>,
}

impl Arrivals {
    /// A gate letting `width` requests of one name in at once; 0: no gate (every
    /// [`Arrivals::enter`] passes at once and keeps nothing).
    pub(crate) fn new(width: usize) -> Arrivals {
        Arrivals {
            width,
            names: Arc::default(),
        }
    }

    /// Waits for a place for a request of `tenant` (`""`: none) on `name`.
    pub(crate) async fn enter(&self, name: &str, tenant: &str) -> Pass {
        if self.width == 0 {
            return Pass {
                name: String::new(),
                names: None,
            };
        }
        let rx = {
            let mut names = self.names.lock().unwrap();
            let line = names.entry(name.to_string()).or_default();
            if line.in_flight < self.width && line.turns.is_empty() {
                line.in_flight += 1;
                return self.pass(name);
            }
            let (tx, rx) = oneshot::channel();
            match line.turns.iter_mut().find(|(t, _)| t == tenant) {
                Some((_, waiting)) => waiting.push_back(tx),
                None => line
                    .turns
                    .push_back((tenant.to_string(), VecDeque::from([tx]))),
            }
            rx
        };
        // The sender is dropped only with a pass sent, or by a gate that is gone with its
        // connection; then nobody keeps count any more and the request goes at once.
        rx.await.unwrap_or(Pass {
            name: String::new(),
            names: None,
        })
    }

    fn pass(&self, name: &str) -> Pass {
        Pass {
            name: name.to_string(),
            names: Some(Arc::clone(&self.names)),
        }
    }

    /// Requests of `name` in flight and waiting (for tests).
    #[cfg(test)]
    fn counts(&self, name: &str) -> Option<(usize, usize)> {
        let names = self.names.lock().unwrap();
        names.get(name).map(|l| {
            (
                l.in_flight,
                l.turns.iter().map(|(_, w)| w.len()).sum::<usize>(),
            )
        })
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        let Some(names) = self.names.take() else {
            return;
        };
        let mut map = names.lock().unwrap();
        let Some(line) = map.get_mut(&self.name) else {
            return;
        };
        // The place goes to the first tenant in turn whose first request still waits; the
        // tenant goes to the back of the turns if it has more.
        while let Some((tenant, mut waiting)) = line.turns.pop_front() {
            let mut handed = false;
            while let Some(tx) = waiting.pop_front() {
                let next = Pass {
                    name: std::mem::take(&mut self.name),
                    names: Some(Arc::clone(&names)),
                };
                match tx.send(next) {
                    Ok(()) => {
                        handed = true;
                        break;
                    }
                    // It gave up: take the pass back without dropping it (its drop would
                    // lock the map again), and try the next one.
                    Err(mut back) => {
                        self.name = std::mem::take(&mut back.name);
                        back.names = None;
                    }
                }
            }
            if !waiting.is_empty() {
                line.turns.push_back((tenant, waiting));
            }
            if handed {
                return;
            }
        }
        line.in_flight -= 1;
        if line.in_flight == 0 {
            map.remove(&self.name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Order = Arc<Mutex<Vec<&'static str>>>;

    /// Starts a request of `tenant` that records its turn in `order` and leaves at once, and
    /// waits until it waits at the gate.
    async fn waiter(
        g: &Arc<Arrivals>,
        tenant: &'static str,
        order: &Order,
    ) -> tokio::task::JoinHandle<()> {
        let (g2, order) = (Arc::clone(g), Arc::clone(order));
        let before = g.counts("n").map_or(0, |c| c.1);
        let task = tokio::spawn(async move {
            let _pass = g2.enter("n", tenant).await;
            order.lock().unwrap().push(tenant);
        });
        while g.counts("n").map_or(0, |c| c.1) == before {
            tokio::task::yield_now().await;
        }
        task
    }

    #[tokio::test]
    async fn at_most_width_in_flight_and_a_freed_place_is_handed_on() {
        let g = Arc::new(Arrivals::new(2));
        let a = g.enter("n", "").await;
        let b = g.enter("n", "").await;
        assert_eq!(g.counts("n"), Some((2, 0)));
        let order = Order::default();
        let w = waiter(&g, "x", &order).await;
        tokio::task::yield_now().await;
        assert_eq!(g.counts("n"), Some((2, 1)));
        assert!(
            order.lock().unwrap().is_empty(),
            "a third passed with two in flight"
        );
        drop(a);
        w.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["x"]);
        assert_eq!(g.counts("n"), Some((1, 0)));
        drop(b);
        assert_eq!(g.counts("n"), None, "an idle name keeps no entry");
        // Other names have gates of their own.
        let _c = g.enter("n", "").await;
        let _d = g.enter("m", "").await;
        let _e = g.enter("n", "").await;
        assert_eq!(g.counts("m"), Some((1, 0)));
    }

    #[tokio::test]
    async fn a_flood_of_one_tenant_does_not_hold_back_another() {
        let g = Arc::new(Arrivals::new(1));
        let first = g.enter("n", "bulk").await;
        let order = Order::default();
        let mut tasks = Vec::new();
        for _ in 0..4 {
            tasks.push(waiter(&g, "bulk", &order).await);
        }
        tasks.push(waiter(&g, "light", &order).await);
        tasks.push(waiter(&g, "other", &order).await);
        tasks.push(waiter(&g, "light", &order).await);
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        // One place: the tenants take turns, each in its own order of arrival.
        assert_eq!(
            *order.lock().unwrap(),
            ["bulk", "light", "other", "bulk", "light", "bulk", "bulk"]
        );
        assert_eq!(g.counts("n"), None);
    }

    #[tokio::test]
    async fn a_request_that_gave_up_is_skipped_and_leaves_nothing() {
        let g = Arc::new(Arrivals::new(1));
        let first = g.enter("n", "").await;
        let g2 = Arc::clone(&g);
        let gave_up = tokio::spawn(async move {
            let _pass = g2.enter("n", "a").await;
            unreachable!("it was aborted while waiting");
        });
        while g.counts("n") != Some((1, 1)) {
            tokio::task::yield_now().await;
        }
        gave_up.abort();
        assert!(gave_up.await.unwrap_err().is_cancelled());
        let order = Order::default();
        let w = waiter(&g, "b", &order).await;
        drop(first);
        w.await.unwrap();
        assert_eq!(*order.lock().unwrap(), ["b"]);
        assert_eq!(g.counts("n"), None);
        // Everyone gave up: the place is simply freed.
        let first = g.enter("n", "").await;
        let g2 = Arc::clone(&g);
        let gave_up = tokio::spawn(async move { g2.enter("n", "a").await });
        while g.counts("n") != Some((1, 1)) {
            tokio::task::yield_now().await;
        }
        gave_up.abort();
        let _ = gave_up.await;
        drop(first);
        assert_eq!(g.counts("n"), None);
    }

    #[tokio::test]
    async fn width_zero_is_no_gate() {
        let g = Arc::new(Arrivals::new(0));
        let mut passes = Vec::new();
        for _ in 0..100 {
            passes.push(g.enter("n", "").await);
        }
        assert_eq!(g.counts("n"), None);
    }
}
