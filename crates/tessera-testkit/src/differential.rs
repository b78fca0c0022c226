//! The differential test every store runs: random operation sequences (acquire with and
//! without waiting, heartbeat, cancel, release, renew, revoke, resize, delete, list, and
//! clock steps) applied to the store's backend and to the reference model
//! ([`MemoryBackend`]), comparing every reply and, after every step, the status of every
//! semaphore. A store's test file drives it:
//!
//! ```text
//! let mut seen = Seen::default();
//! for seed in 1..=6 {
//!     let store = /* a fresh backend, on `clock` if it can take one */;
//!     let mut d = Differential::new(&store, DiffClock::Shared(clock), seed);
//!     for _ in 0..500 {
//!         d.step().await;
//!         // store-specific checks between steps, if any
//!     }
//!     seen.add(&d);
//! }
//! seen.assert_every_answer_reached();
//! ```
//!
//! Two clocks, as the store allows:
//!
//! - [`DiffClock::Shared`]: the store takes an injected [`ManualClock`] (SQLite), which the
//!   model shares. TTLs are short and random, the clock moves in whole tenths of a second (so
//!   expiries often fall exactly on `now`), and replies and statuses must be *equal*.
//! - [`DiffClock::Server`]: the store keeps its own time (Redis). TTLs are one to two hours
//!   and the walk takes seconds, so nothing expires; times and fences are left out of the
//!   comparison.
//!
//! On both, after every step, the store's own status must hold the invariants no model can
//! hide: seats distinct and as many as `used`, fences ascending in grant order, and no fence
//! of one semaphore ever issued to two leases (also across `delete`).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tessera::backend::stores::MemoryBackend;
use tessera::backend::{AcquireReply, AcquireRequest, Backend, Clock, ManualClock, Name};
use tessera::backend::{WaitReply, WaitSpec};
use tessera::{LeaseId, Result, SemaphoreStatus};

use crate::seam::LONG;

/// Every kind of answer the random walk must reach, or it proves little.
const ANSWERS: [&str; 11] = [
    "Granted",
    "Queued",
    "NoPermit",
    "Waiting",
    "Gone",
    "Dequeued",
    "Released",
    "NotFound",
    "Renewed",
    "QueueFull",
    "CapacityMismatch",
];

/// Whose clock the store and the model run on.
#[derive(Debug, Clone)]
pub enum DiffClock {
    /// The store and the model share this clock: compared exactly, with expiries.
    Shared(Arc<ManualClock>),
    /// The store keeps its own time: nothing expires, times and fences are not compared.
    Server,
}

/// One random walk (one seed) over a store and the model.
pub struct Differential<'a> {
    store: &'a dyn Backend,
    model: MemoryBackend,
    clock: DiffClock,
    rng: StdRng,
    seed: u64,
    step: usize,
    names: Vec<Name>,
    declared: Vec<u32>,
    leases: Vec<LeaseId>,
    was_queued: Vec<LeaseId>,
    fences: HashMap<(usize, u64), LeaseId>,
    seen: BTreeMap<&'static str, usize>,
}

impl<'a> Differential<'a> {
    /// A walk with `seed` over `store` (fresh, holding nothing) and a fresh model.
    pub fn new(store: &'a dyn Backend, clock: DiffClock, seed: u64) -> Self {
        let model = match &clock {
            DiffClock::Shared(c) => MemoryBackend::with_clock(Arc::clone(c) as Arc<dyn Clock>),
            DiffClock::Server => {
                MemoryBackend::connect(&format!("memory://diff-{:016x}", rand::random::<u64>()))
                    .expect("memory backend")
            }
        };
        Differential {
            store,
            model,
            clock,
            rng: StdRng::seed_from_u64(seed),
            seed,
            step: 0,
            names: ["a", "b"].map(|n| Name::new(n).unwrap()).to_vec(),
            declared: vec![3, 5],
            leases: (0..10).map(|_| LeaseId::random()).collect(),
            was_queued: Vec::new(),
            fences: HashMap::new(),
            seen: BTreeMap::new(),
        }
    }

    /// The names the walk works on (store-specific checks between steps look at them).
    pub fn names(&self) -> &[Name] {
        &self.names
    }

    /// Runs `steps` random steps.
    pub async fn run(&mut self, steps: usize) {
        for _ in 0..steps {
            self.step().await;
        }
    }

    /// One random operation on both, then the status of every name on both; panics on the
    /// first difference. Returns what the step did (for messages of checks the caller adds).
    pub async fn step(&mut self) -> String {
        let rng = &mut self.rng;
        let shared = matches!(self.clock, DiffClock::Shared(_));
        let ttl = |rng: &mut StdRng, lo: u64, hi: u64| {
            if shared {
                Duration::from_millis(100 * rng.random_range(lo..hi))
            } else {
                // Past the hour by a few minutes to one: nothing expires during the walk, yet
                // a later grant or enqueue may expire before an earlier one, as in use.
                LONG + Duration::from_secs(60 * rng.random_range(lo..hi))
            }
        };
        let n = rng.random_range(0..self.names.len());
        let nm = self.names[n].clone();
        // Mostly one of a few leases, so operations meet; now and then one never seen.
        let lease = if rng.random_ratio(1, 20) {
            LeaseId::random()
        } else {
            self.leases[rng.random_range(0..self.leases.len())]
        };
        let op = rng.random_range(0..100);
        let cap = if rng.random_ratio(1, 20) {
            self.declared[n] % 6 + 1
        } else {
            self.declared[n]
        };
        let what = format!(
            "seed {} step {} op {op} on {nm} lease {lease}",
            self.seed, self.step
        );
        self.step += 1;
        let (store, model) = (self.store, &self.model);
        let (s, m) = match op {
            0..=29 => {
                let weight = rng.random_range(1..=cap);
                let wait = rng.random_bool(0.6).then(|| WaitSpec {
                    waiter_ttl: ttl(rng, 5, 40),
                    queue_cap: rng.random_range(1..6),
                });
                let r = AcquireRequest {
                    lease_id: lease,
                    weight,
                    ttl: ttl(rng, 2, 60),
                    holder: format!("host/{}", rng.random_range(1..5)),
                    wait,
                    tenant: None,
                    first_send: false,
                };
                let s = store.acquire(&nm, cap, &r).await;
                if let Ok(AcquireReply::Granted(g)) = &s {
                    record_fence(&mut self.fences, n, g.lease.fence, g.lease.lease_id);
                }
                (self.show(&s), self.show(&model.acquire(&nm, cap, &r).await))
            }
            30..=41 => {
                let t = ttl(rng, 5, 40);
                let s = store.heartbeat(&nm, lease, t).await;
                if let Ok(WaitReply::Granted(g)) = &s {
                    record_fence(&mut self.fences, n, g.lease.fence, g.lease.lease_id);
                }
                (
                    self.show(&s),
                    self.show(&model.heartbeat(&nm, lease, t).await),
                )
            }
            42..=49 => (
                self.show(&store.cancel(&nm, lease).await),
                self.show(&model.cancel(&nm, lease).await),
            ),
            50..=61 => (
                self.show(&store.release(&nm, lease).await),
                self.show(&model.release(&nm, lease).await),
            ),
            62..=69 => {
                let t = ttl(rng, 2, 60);
                (
                    self.show(&store.renew(&nm, lease, t).await),
                    self.show(&model.renew(&nm, lease, t).await),
                )
            }
            70..=73 => (
                self.show(&store.revoke(&nm, lease).await),
                self.show(&model.revoke(&nm, lease).await),
            ),
            74..=78 => {
                let c = rng.random_range(1..=6);
                self.declared[n] = c;
                (
                    self.show(&store.resize(&nm, c).await),
                    self.show(&model.resize(&nm, c).await),
                )
            }
            79..=80 => (
                self.show(&store.delete(&nm).await),
                self.show(&model.delete(&nm).await),
            ),
            81..=83 => (
                self.show(&store.list().await),
                self.show(&model.list().await),
            ),
            _ => {
                if let DiffClock::Shared(clock) = &self.clock {
                    clock.advance(Duration::from_millis(100 * rng.random_range(0..15)));
                }
                (String::new(), String::new())
            }
        };
        assert_eq!(s, m, "{what}: the store and the model answer differently");
        for kind in ANSWERS {
            if m.contains(kind) {
                *self.seen.entry(kind).or_default() += 1;
            }
        }
        self.compare_status(&what).await;
        what
    }

    /// Compares the status of every name and checks the store's invariants.
    async fn compare_status(&mut self, what: &str) {
        for (n, nm) in self.names.iter().enumerate() {
            let what = format!("{what}: status of {nm}");
            let m = self.model.status(nm).await.unwrap();
            let s = self
                .store
                .status(nm)
                .await
                .unwrap_or_else(|e| panic!("{what}: {e:?}"));
            if let Some(m) = &m {
                if m.holders
                    .iter()
                    .any(|l| self.was_queued.contains(&l.lease_id))
                {
                    *self.seen.entry("handed off").or_default() += 1;
                }
                self.was_queued
                    .retain(|id| m.queue.iter().any(|w| w.lease_id == *id));
                self.was_queued.extend(m.queue.iter().map(|w| w.lease_id));
            }
            match self.clock {
                DiffClock::Shared(_) => assert_eq!(s, m, "{what}"),
                DiffClock::Server => assert_eq!(
                    clock_free(&format!("{s:?}")),
                    clock_free(&format!("{m:?}")),
                    "{what}"
                ),
            }
            if let Some(s) = &s {
                check_invariants(&what, s);
                for l in &s.holders {
                    record_fence(&mut self.fences, n, l.fence, l.lease_id);
                }
            }
        }
    }

    /// A reply as compared: all of it on a shared clock, without times and fences otherwise.
    fn show<T: Debug>(&self, r: &Result<T>) -> String {
        let s = format!("{r:?}");
        match self.clock {
            DiffClock::Shared(_) => s,
            DiffClock::Server => clock_free(&s),
        }
    }
}

/// The kinds of answer reached, over several walks.
#[derive(Debug, Default)]
pub struct Seen(BTreeMap<&'static str, usize>);

impl Seen {
    /// Adds what walk `d` reached.
    pub fn add(&mut self, d: &Differential<'_>) {
        for (k, v) in &d.seen {
            *self.0.entry(k).or_default() += v;
        }
    }

    /// Panics unless the walks reached every kind of answer and a hand-off to a waiter.
    pub fn assert_every_answer_reached(&self) {
        for kind in ANSWERS.iter().chain(&["handed off"]) {
            assert!(
                self.0.get(kind).copied().unwrap_or(0) > 0,
                "never saw {kind}: {:?}",
                self.0
            );
        }
    }
}

/// Seats are distinct and as many as `used`; fences ascend in grant order.
fn check_invariants(what: &str, s: &SemaphoreStatus) {
    let mut seats: Vec<u32> = s.holders.iter().flat_map(|l| l.seats.clone()).collect();
    assert_eq!(seats.len() as u32, s.used, "{what}: seats vs used: {s:?}");
    seats.sort_unstable();
    seats.dedup();
    assert_eq!(
        seats.len() as u32,
        s.used,
        "{what}: a seat held twice: {s:?}"
    );
    let f: Vec<u64> = s.holders.iter().map(|l| l.fence).collect();
    assert!(
        f.windows(2).all(|w| w[0] < w[1]),
        "{what}: fences out of grant order: {f:?}"
    );
}

/// A fence of semaphore `n` belongs to one lease: never issued to two lease ids.
fn record_fence(fences: &mut HashMap<(usize, u64), LeaseId>, n: usize, fence: u64, id: LeaseId) {
    let owner = *fences.entry((n, fence)).or_insert(id);
    assert_eq!(owner, id, "fence {fence} issued to {owner} and to {id}");
}

/// `s` without store times (`StoreTime(…)` → `T`) and fence values (`fence: 12` → `fence: F`).
fn clock_free(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("StoreTime(") {
        out.push_str(&rest[..i]);
        rest = &rest[i..];
        let end = rest.find(')').map(|e| e + 1).unwrap_or(rest.len());
        out.push('T');
        rest = &rest[end..];
    }
    out.push_str(rest);
    let mut cleaned = String::new();
    let mut rest = out.as_str();
    while let Some(i) = rest.find("fence: ") {
        cleaned.push_str(&rest[..i + 7]);
        rest = &rest[i + 7..];
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        cleaned.push('F');
        rest = &rest[end..];
    }
    cleaned.push_str(rest);
    cleaned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_free_drops_times_and_fences_only() {
        assert_eq!(
            clock_free("Lease { fence: 1234, expires_at: StoreTime(99), seats: [1] }"),
            "Lease { fence: F, expires_at: T, seats: [1] }"
        );
    }

    #[tokio::test]
    async fn the_model_agrees_with_itself_on_a_shared_clock() {
        let mut seen = Seen::default();
        for seed in 1..=3 {
            let clock = Arc::new(ManualClock::new(tessera::StoreTime(1_800_000_000_000_000)));
            let store = MemoryBackend::with_clock(Arc::clone(&clock) as Arc<dyn Clock>);
            let mut d = Differential::new(&store, DiffClock::Shared(clock), seed);
            d.run(500).await;
            seen.add(&d);
        }
        seen.assert_every_answer_reached();
    }
}
