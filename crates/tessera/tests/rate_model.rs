//! Property tests of the rate limiter on the memory store, driven by an injected clock: under
//! random arrival patterns, costs, waits and cancellations, the exact mode never admits more
//! than N in any window of length L, a "limited" answer's retry time is exact (not a
//! microsecond earlier would do, and at it the request passes), reservations are served in
//! order, and the smooth mode keeps its documented bound.

use std::sync::Arc;
use std::time::Duration;

use futures::executor::block_on;
use proptest::prelude::*;
use tessera::backend::stores::MemoryBackend;
use tessera::backend::{
    Backend, ManualClock, Name, RateBackend, RateConfig, RateReply, RateRequest,
};
use tessera::{RateMode, RateSpec, StoreTime};
use tessera_testkit::window::max_in_window;

const START: u64 = 1_700_000_000_000_000;

struct Rig {
    clock: Arc<ManualClock>,
    backend: MemoryBackend,
    name: Name,
    config: RateConfig,
}

impl Rig {
    fn new(limits: &[(u32, u64)], mode: RateMode) -> Rig {
        let clock = Arc::new(ManualClock::new(StoreTime(START)));
        let backend = MemoryBackend::with_clock(clock.clone());
        let specs: Vec<RateSpec> = limits
            .iter()
            .map(|&(n, ms)| RateSpec::new(n, Duration::from_millis(ms)).unwrap())
            .collect();
        Rig {
            clock,
            backend,
            name: Name::new("prop").unwrap(),
            config: RateConfig::new(&specs, mode).unwrap(),
        }
    }
    fn rate(&self) -> &dyn RateBackend {
        self.backend.rate().unwrap()
    }
    fn now(&self) -> u64 {
        use tessera::backend::Clock;
        self.clock.now().0
    }
    fn ask(&self, cost: u32, max_wait: Option<Duration>) -> RateReply {
        let req = RateRequest {
            cost,
            max_wait,
            update: false,
        };
        block_on(self.rate().rate_acquire(&self.name, &self.config, &req)).unwrap()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn exact_mode_never_exceeds_n_in_any_window(
        limits in prop::collection::vec((1u32..8, 1u64..50), 1..4),
        ops in prop::collection::vec((0u64..40_000, 1u32..8, 0u8..5, 0u64..120), 1..150),
    ) {
        let rig = Rig::new(&limits, RateMode::Exact);
        let max_cost = rig.config.max_cost();
        // (at, cost, reservation) of every admission still charged, in issue order.
        let mut admitted: Vec<(u64, u32, u64)> = Vec::new();
        // Whether the latest admission was returned (nothing older can be returned then).
        let mut undone = false;
        for (advance, cost, kind, wait_ms) in ops {
            rig.clock.advance(Duration::from_micros(advance));
            let cost = 1 + (cost - 1) % max_cost;
            let now = rig.now();
            match kind {
                // try_acquire; a limited answer's retry time is checked to be exact.
                0 | 1 => match rig.ask(cost, None) {
                    RateReply::Admitted { at, now: n, reservation } => {
                        prop_assert_eq!((at.0, n.0), (now, now));
                        admitted.push((at.0, cost, reservation));
                        undone = false;
                    }
                    RateReply::Limited { retry_at, .. } => {
                        prop_assert!(retry_at.0 > now);
                        if kind == 1 {
                            rig.clock.set(StoreTime(retry_at.0 - 1));
                            let again = rig.ask(cost, None);
                            prop_assert!(
                                matches!(again, RateReply::Limited { retry_at: r, .. } if r == retry_at),
                                "{again:?} one µs before {retry_at:?}"
                            );
                            rig.clock.set(retry_at);
                            match rig.ask(cost, None) {
                                RateReply::Admitted { at, reservation, .. } => {
                                    prop_assert_eq!(at, retry_at);
                                    admitted.push((at.0, cost, reservation));
                                    undone = false;
                                }
                                other => prop_assert!(false, "not admitted at retry_at: {other:?}"),
                            }
                        }
                    }
                },
                // acquire: reserve if the wait is within the maximum.
                2 | 3 => {
                    let max_wait = Duration::from_millis(wait_ms);
                    match rig.ask(cost, Some(max_wait)) {
                        RateReply::Admitted { at, reservation, .. } => {
                            prop_assert!(at.0 >= now && at.0 - now <= max_wait.as_micros() as u64);
                            // FIFO: never before an earlier admission.
                            if let Some(&(prev, _, _)) = admitted.last() {
                                prop_assert!(at.0 >= prev);
                            }
                            admitted.push((at.0, cost, reservation));
                            undone = false;
                        }
                        RateReply::Limited { retry_at, .. } => {
                            prop_assert!(retry_at.0 - now > max_wait.as_micros() as u64);
                        }
                    }
                }
                // cancel the latest reservation.
                _ => {
                    if let Some(&(at, _, id)) = admitted.last() {
                        let returned =
                            block_on(rig.rate().rate_cancel(&rig.name, id, StoreTime(at))).unwrap();
                        // Only the latest admission, not yet due, and not after an undo (the
                        // one before it can no longer be restored).
                        prop_assert_eq!(returned, !undone && at > now);
                        if returned {
                            undone = true;
                            admitted.pop();
                            // A second cancel of the same reservation does nothing.
                            prop_assert!(!block_on(rig.rate().rate_cancel(&rig.name, id, StoreTime(at))).unwrap());
                        }
                    }
                }
            }
        }
        let flat: Vec<(u64, u32)> = admitted.iter().map(|&(t, c, _)| (t, c)).collect();
        for spec in rig.config.limits() {
            let worst = max_in_window(&flat, spec.period().as_micros() as u64);
            prop_assert!(worst <= spec.count() as u64, "{} admitted {} in one window", spec, worst);
        }
    }

    #[test]
    fn smooth_mode_admits_at_most_n_plus_burst_minus_one_per_window(
        limits in prop::collection::vec((2u32..10, 1u64..50), 1..3),
        burst in 1u32..3,
        ops in prop::collection::vec((0u64..20_000, 0u8..2, 0u64..60), 1..150),
    ) {
        let min_n = limits.iter().map(|l| l.0).min().unwrap();
        let burst = burst.min(min_n);
        let rig = Rig::new(&limits, RateMode::Smooth { burst });
        let mut admitted: Vec<(u64, u32)> = Vec::new();
        for (advance, kind, wait_ms) in ops {
            rig.clock.advance(Duration::from_micros(advance));
            let wait = (kind == 1).then(|| Duration::from_millis(wait_ms));
            if let RateReply::Admitted { at, .. } = rig.ask(1, wait) {
                admitted.push((at.0, 1));
            }
        }
        for spec in rig.config.limits() {
            let worst = max_in_window(&admitted, spec.period().as_micros() as u64);
            prop_assert!(worst < (spec.count() + burst) as u64, "{} admitted {} in one window", spec, worst);
        }
    }
}

#[test]
fn demand_above_the_limit_is_admitted_at_exactly_the_limit() {
    // 50/s AND 1000/min, a request every millisecond for two minutes of store time.
    let rig = Rig::new(&[(50, 1000), (1000, 60_000)], RateMode::Exact);
    let mut admitted = Vec::new();
    for _ in 0..120_000 {
        if let RateReply::Admitted { at, .. } = rig.ask(1, None) {
            admitted.push((at.0, 1));
        }
        rig.clock.advance(Duration::from_millis(1));
    }
    // 1000 in each minute: the limit itself, nothing lost, nothing extra.
    assert_eq!(admitted.len(), 2000);
    assert_eq!(max_in_window(&admitted, 1_000_000), 50);
    assert_eq!(max_in_window(&admitted, 60_000_000), 1000);
}

#[test]
fn reservations_queue_in_order_and_fill_every_window() {
    let rig = Rig::new(&[(3, 100)], RateMode::Exact);
    let ats: Vec<u64> = (0..9)
        .map(|_| match rig.ask(1, Some(Duration::from_secs(1))) {
            RateReply::Admitted { at, .. } => at.0 - START,
            other => panic!("{other:?}"),
        })
        .collect();
    // Three per 100 ms: now, then each slot exactly when the third one before it leaves.
    assert_eq!(
        ats,
        [0, 0, 0, 100_000, 100_000, 100_000, 200_000, 200_000, 200_000]
    );
    // A try does not jump ahead of the reservations.
    assert!(
        matches!(rig.ask(1, None), RateReply::Limited { retry_at, .. } if retry_at.0 - START == 300_000)
    );
}
