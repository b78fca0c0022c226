//! The rate limiter's contract as tests, run against every store: the window guarantee under
//! concurrency (checked on the store's own admit times), exact retry times, FIFO
//! reservations, waiting by reservation, cancellation, all-or-nothing charging of several
//! limits, "limited changes nothing", typed errors, configuration mismatch, the margin
//! between admission and use, deletion, and expiry.

use std::time::Duration;

use tessera::backend::{Name, RateConfig, RateReply, RateRequest};
use tessera::{
    RateDecision, RateLimiter, RateMode, RateOptions, RateSpec, Store, DEFAULT_RATE_MARGIN,
};

use super::{eventually, unique};
use crate::harness::Harness;
use crate::window::max_in_window;

fn spec(s: &str) -> RateSpec {
    s.parse().unwrap()
}

fn limiter(store: &Store, name: &str, limits: &[&str]) -> RateLimiter {
    let specs: Vec<RateSpec> = limits.iter().map(|s| spec(s)).collect();
    store.rate_limiter(name, &specs).unwrap()
}

/// One raw rate step through the seam (no sleeping), for tests that look at store times.
async fn step(
    store: &Store,
    name: &str,
    config: &RateConfig,
    cost: u32,
    wait: Option<Duration>,
) -> RateReply {
    let req = RateRequest {
        cost,
        max_wait: wait,
        update: false,
    };
    store
        .backend()
        .rate()
        .expect("rate support")
        .rate_acquire(&Name::new(name).unwrap(), config, &req)
        .await
        .expect("rate step")
}

/// N admitted at once, then limited with the exact retry time: the first admission + L + the
/// margin (the default one, which a limiter built with default options declares too).
pub async fn rate_limits_after_n_with_exact_retry_time(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-n");
    let config = RateConfig::new(&[spec("5/2s")], RateMode::Exact)
        .unwrap()
        .with_margin(DEFAULT_RATE_MARGIN)
        .unwrap();
    let mut first = None;
    for _ in 0..5 {
        match step(&c.store, &name, &config, 1, None).await {
            RateReply::Admitted { at, now, .. } => {
                assert_eq!(at, now);
                first.get_or_insert(at);
            }
            other => panic!("limited too early: {other:?}"),
        }
    }
    match step(&c.store, &name, &config, 1, None).await {
        RateReply::Limited { retry_at, now } => {
            assert_eq!(
                retry_at,
                first
                    .unwrap()
                    .plus(Duration::from_secs(2) + DEFAULT_RATE_MARGIN)
            );
            assert!(retry_at > now);
        }
        other => panic!("the 6th in 2 s was admitted: {other:?}"),
    }
    let rl = limiter(&c.store, &name, &["5/2s"]);
    let d = rl.try_acquire(1).await.unwrap();
    let after = d.retry_after().expect("limited");
    assert!(
        after > Duration::from_millis(1000)
            && after <= Duration::from_secs(2) + DEFAULT_RATE_MARGIN,
        "{after:?}"
    );
}

/// A limited request (try, or acquire whose wait is too long) changes no state.
pub async fn rate_limited_requests_change_nothing(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-nochange");
    let rl = limiter(&c.store, &name, &["3/5s", "4/10s"]);
    for _ in 0..3 {
        assert!(rl.try_acquire(1).await.unwrap().is_admitted());
    }
    let before = c.store.rate_status(&name).await.unwrap().unwrap();
    for _ in 0..5 {
        assert!(!rl.try_acquire(1).await.unwrap().is_admitted());
        let d = rl
            .acquire_within(2, Duration::from_millis(50))
            .await
            .unwrap();
        assert!(!d.is_admitted(), "{d:?}");
    }
    let after = c.store.rate_status(&name).await.unwrap().unwrap();
    // Usage is unchanged (a limit's next free time is "now" while it is free, so only the
    // binding one is compared).
    let usage = |s: &tessera::RateStatus| {
        s.limits
            .iter()
            .map(|l| (l.used, l.reserved, l.next_free.max(s.now) > s.now))
            .collect::<Vec<_>>()
    };
    assert_eq!(usage(&before), usage(&after));
    assert_eq!(before.limits[0].next_free, after.limits[0].next_free);
    assert_eq!(
        (before.last_admit, before.next_free),
        (after.last_admit, after.next_free)
    );
    assert_eq!(after.limits[0].used, 3);
    assert_eq!(after.limits[1].used, 3);
}

/// Several limits are charged together or not at all; a cost counts fully on each.
pub async fn rate_limits_are_charged_all_or_nothing(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-multi");
    let rl = limiter(&c.store, &name, &["4/5s", "6/10s"]);
    assert!(rl.try_acquire(3).await.unwrap().is_admitted());
    // 3 + 2 > 4 on the first limit: refused, and the second limit is not charged either.
    assert!(!rl.try_acquire(2).await.unwrap().is_admitted());
    assert!(rl.try_acquire(1).await.unwrap().is_admitted());
    let s = rl.status().await.unwrap();
    assert_eq!(
        s.limits.iter().map(|l| l.used).collect::<Vec<_>>(),
        vec![4, 4]
    );
    assert!(s.next_free > s.now);
}

/// Reservations are served in the order the store received them, each window full.
pub async fn rate_reservations_are_served_in_order(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-fifo");
    let config = RateConfig::new(&[spec("2/300ms")], RateMode::Exact).unwrap();
    let mut ats = Vec::new();
    for _ in 0..8 {
        match step(&c.store, &name, &config, 1, Some(Duration::from_secs(5))).await {
            RateReply::Admitted { at, .. } => ats.push(at.0),
            other => panic!("{other:?}"),
        }
    }
    assert!(ats.windows(2).all(|w| w[0] <= w[1]), "{ats:?}");
    for pair in ats.chunks(2).collect::<Vec<_>>().windows(2) {
        // Each pair starts exactly when the pair before it leaves the window.
        assert_eq!(pair[1][0], pair[0][0] + 300_000, "{ats:?}");
    }
    let admitted: Vec<(u64, u32)> = ats.iter().map(|&t| (t, 1)).collect();
    assert_eq!(max_in_window(&admitted, 300_000), 2);
    // A try after them does not jump the queue.
    match step(&c.store, &name, &config, 1, None).await {
        RateReply::Limited { retry_at, .. } => assert!(retry_at.0 >= *ats.last().unwrap()),
        other => panic!("{other:?}"),
    }
}

/// `acquire` sleeps until its reservation and returns its admission time; `acquire_until`
/// with a deadline before the admissible time reserves nothing.
pub async fn rate_acquire_waits_for_its_reservation(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-wait");
    let rl = limiter(&c.store, &name, &["1/400ms"]);
    let first = rl.acquire(1).await.unwrap();
    let start = std::time::Instant::now();
    let second = rl.acquire(1).await.unwrap();
    let waited = start.elapsed();
    assert_eq!(
        second,
        first.plus(Duration::from_millis(400) + DEFAULT_RATE_MARGIN)
    );
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    let before = rl.status().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_millis(100);
    let d = rl.acquire_until(1, deadline).await.unwrap();
    assert!(
        matches!(d, RateDecision::Limited { retry_after, .. } if retry_after > Duration::from_millis(100)),
        "{d:?}"
    );
    let d = rl
        .acquire_within(1, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(!d.is_admitted(), "{d:?}");
    let after = rl.status().await.unwrap();
    assert_eq!(
        (before.last_admit, before.next_free),
        (after.last_admit, after.next_free)
    );
    // A deadline past the admissible time reserves it and waits.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    match rl.acquire_until(1, deadline).await.unwrap() {
        RateDecision::Admitted { at } => {
            assert_eq!(at, second.plus(Duration::from_millis(420)))
        }
        other => panic!("{other:?}"),
    }
}

/// Dropping an acquire while it sleeps returns its reservation (it was the latest).
pub async fn rate_cancelled_reservation_is_returned(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-cancel");
    let rl = limiter(&c.store, &name, &["1/2s"]);
    assert!(rl.try_acquire(1).await.unwrap().is_admitted());
    let before = rl.status().await.unwrap();
    let r = tokio::time::timeout(Duration::from_millis(200), rl.acquire(1)).await;
    assert!(r.is_err(), "the acquire should still be sleeping");
    let want = before.next_free;
    eventually(
        "the cancelled reservation is returned",
        Duration::from_secs(3),
        || {
            let rl = rl.clone();
            async move {
                let s = rl.status().await.unwrap();
                s.limits[0].reserved == 0 && s.next_free == want
            }
        },
    )
    .await;
}

/// Costs, limits and modes out of range are typed errors, nothing sent.
pub async fn rate_bad_inputs_get_typed_errors(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-bad");
    let rl = limiter(&c.store, &name, &["5/s", "100/min"]);
    for cost in [0, 6, 1000] {
        let e = rl.try_acquire(cost).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        let e = rl.acquire(cost).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }
    assert!(c.store.rate_status(&name).await.unwrap().is_none());
    for bad in [
        "",
        "5",
        "0/s",
        "5/0s",
        "5/m",
        "5/fortnight",
        "-1/s",
        "5/8d",
        "x/s",
    ] {
        assert!(bad.parse::<RateSpec>().is_err(), "{bad:?}");
    }
    assert!(c
        .store
        .rate_limiter(&name, &[])
        .unwrap_err()
        .is_invalid_input());
    assert!(c
        .store
        .rate_limiter("bad name", &[spec("1/s")])
        .unwrap_err()
        .is_invalid_input());
    let smooth = RateOptions::default().mode(RateMode::Smooth { burst: 6 });
    assert!(RateLimiter::new(&c.store, &name, &[spec("5/s")], smooth)
        .unwrap_err()
        .is_invalid_input());
    let smooth = RateOptions::default().mode(RateMode::Smooth { burst: 2 });
    let rl =
        RateLimiter::new(&c.store, &unique("rate-smooth-bad"), &[spec("5/s")], smooth).unwrap();
    assert!(rl.try_acquire(3).await.unwrap_err().is_invalid_input());
}

/// A name reopened with other limits is refused unless the caller asks to update.
pub async fn rate_mismatched_limits_are_refused_unless_updated(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-mismatch");
    let a = limiter(&c.store, &name, &["5/s", "100/min"]);
    assert!(a.try_acquire(2).await.unwrap().is_admitted());
    // The same limits in another order are the same limiter.
    let same = limiter(&c.store, &name, &["100/min", "5/s"]);
    assert!(same.try_acquire(1).await.unwrap().is_admitted());
    let b = limiter(&c.store, &name, &["10/s"]);
    let e = b.try_acquire(1).await.unwrap_err();
    assert!(e.is_rate_mismatch(), "{e}");
    assert!(e.to_string().contains("5/s"), "{e}");
    let updated = RateLimiter::new(
        &c.store,
        &name,
        &[spec("4/s")],
        RateOptions::default().update(true),
    )
    .unwrap();
    // History is kept: 3 already admitted within the second, so 1 more fits, not 2.
    assert!(updated.try_acquire(1).await.unwrap().is_admitted());
    assert!(!updated.try_acquire(1).await.unwrap().is_admitted());
    assert!(a.try_acquire(1).await.unwrap_err().is_rate_mismatch());
}

/// Smooth mode paces: one unit every L/N after the burst, with an exact retry time.
pub async fn rate_smooth_mode_paces_evenly(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-smooth");
    let opts = RateOptions::default().mode(RateMode::Smooth { burst: 1 });
    let rl = RateLimiter::new(&c.store, &name, &[spec("10/s")], opts).unwrap();
    let first = match rl.try_acquire(1).await.unwrap() {
        RateDecision::Admitted { at } => at,
        other => panic!("{other:?}"),
    };
    match rl.try_acquire(1).await.unwrap() {
        RateDecision::Limited { retry_at, .. } => {
            assert_eq!(retry_at, first.plus(Duration::from_millis(100)))
        }
        other => panic!("{other:?}"),
    }
    let mut ats = vec![first];
    for _ in 0..3 {
        ats.push(rl.acquire(1).await.unwrap());
    }
    for w in ats.windows(2) {
        assert!(w[1].0 - w[0].0 >= 100_000, "{ats:?}");
    }
    let s = rl.status().await.unwrap();
    assert_eq!(s.mode, RateMode::Smooth { burst: 1 });
}

/// Many clients hammering one limiter never exceed any limit in any window, on the store's
/// own admit times; with demand above the limit the windows fill up.
pub async fn rate_window_holds_under_concurrency(h: &Harness) {
    let name = unique("rate-conc");
    let config = RateConfig::new(&[spec("20/s"), spec("30/2s")], RateMode::Exact).unwrap();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let c = h.client().await;
        let (name, config) = (name.clone(), config.clone());
        tasks.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            let end = tokio::time::Instant::now() + Duration::from_millis(2500);
            let mut n = 0u32;
            while tokio::time::Instant::now() < end {
                n += 1;
                let cost = 1 + (n + i) % 3;
                let wait = n.is_multiple_of(2).then_some(Duration::from_millis(300));
                match step(&c.store, &name, &config, cost, wait).await {
                    RateReply::Admitted { at, now, .. } => {
                        admitted.push((at.0, cost));
                        tokio::time::sleep(at.since(now)).await;
                    }
                    RateReply::Limited { .. } => {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
            }
            admitted
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    assert!(max_in_window(&all, 1_000_000) <= 20);
    assert!(max_in_window(&all, 2_000_000) <= 30);
    let total: u64 = all.iter().map(|&(_, c)| c as u64).sum();
    assert!(total >= 30, "demand above the limit admitted only {total}");
}

/// A limiter's state goes away once its longest period has passed without admissions.
pub async fn rate_state_expires_when_unused(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-expire");
    let rl = limiter(&c.store, &name, &["2/300ms"]);
    assert!(rl.try_acquire(2).await.unwrap().is_admitted());
    assert!(c.store.rate_list().await.unwrap().contains(&name));
    let s = c.store.rate_status(&name).await.unwrap().unwrap();
    assert_eq!(s.limits[0].used, 2);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(c.store.rate_status(&name).await.unwrap().is_none());
    let n = name.clone();
    let store = c.store.clone();
    eventually(
        "the limiter leaves the list",
        Duration::from_secs(4),
        || {
            let (n, store) = (n.clone(), store.clone());
            async move { !store.rate_list().await.unwrap().contains(&n) }
        },
    )
    .await;
    // Unused long enough, other limits may be declared without update.
    assert!(limiter(&c.store, &name, &["1/s"])
        .try_acquire(1)
        .await
        .unwrap()
        .is_admitted());
}

/// The margin widens every window the store enforces (`L + m`), is part of the stored
/// configuration (another margin is a mismatch, unless updated), and status still shows the
/// declared limit.
pub async fn rate_margin_widens_every_window_and_must_match(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-margin");
    let with = |m: u64| {
        RateLimiter::new(
            &c.store,
            &name,
            &[spec("2/300ms")],
            RateOptions::default().margin(Duration::from_millis(m)),
        )
        .unwrap()
    };
    let rl = with(50);
    assert_eq!(
        rl.config().encode(),
        "exact+50ms|2/300ms",
        "{:?}",
        rl.config()
    );
    let first = match rl.try_acquire(2).await.unwrap() {
        RateDecision::Admitted { at } => at,
        other => panic!("{other:?}"),
    };
    match rl.try_acquire(1).await.unwrap() {
        RateDecision::Limited { retry_at, .. } => {
            assert_eq!(retry_at, first.plus(Duration::from_millis(350)))
        }
        other => panic!("{other:?}"),
    }
    let s = rl.status().await.unwrap();
    assert_eq!(s.limits[0].limit.to_string(), "2/300ms");
    assert_eq!(s.margin, Duration::from_millis(50));
    assert_eq!(s.limits[0].used, 2);
    let e = with(0).try_acquire(1).await.unwrap_err();
    assert!(e.is_rate_mismatch(), "{e}");
    // The default margin is another margin too.
    let e = limiter(&c.store, &name, &["2/300ms"])
        .try_acquire(1)
        .await
        .unwrap_err();
    assert!(e.is_rate_mismatch(), "{e}");
    let updated = RateLimiter::new(
        &c.store,
        &name,
        &[spec("2/300ms")],
        RateOptions::default()
            .margin(Duration::from_millis(10))
            .update(true),
    )
    .unwrap();
    match updated.try_acquire(1).await.unwrap() {
        RateDecision::Limited { retry_at, .. } => {
            assert_eq!(retry_at, first.plus(Duration::from_millis(310)))
        }
        other => panic!("{other:?}"),
    }
    assert!(rl.try_acquire(1).await.unwrap_err().is_rate_mismatch());
    // Out of range: typed errors, nothing sent.
    for bad in [
        Duration::from_millis(301),
        Duration::from_millis(1001),
        Duration::from_nanos(1500),
    ] {
        let e = RateLimiter::new(
            &c.store,
            &name,
            &[spec("2/300ms")],
            RateOptions::default().margin(bad),
        )
        .unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e}");
    }
}

/// After delete the store holds nothing for the limiter and a full limit admits again at
/// once; deleting an unknown name answers false and changes nothing.
pub async fn rate_delete_forgets_the_limiter_and_a_full_limit_admits_again(h: &Harness) {
    let c = h.client().await;
    let name = unique("rate-delete");
    let rl = limiter(&c.store, &name, &["3/10s", "5/min"]);
    let other = limiter(&c.store, &unique("rate-delete-other"), &["3/10s"]);
    assert!(rl.try_acquire(3).await.unwrap().is_admitted());
    assert!(other.try_acquire(2).await.unwrap().is_admitted());
    assert!(!rl.try_acquire(1).await.unwrap().is_admitted());
    // A reservation not yet due goes with it.
    let config = rl.config().clone();
    assert!(matches!(
        step(&c.store, &name, &config, 1, Some(Duration::from_secs(30))).await,
        RateReply::Admitted { at, now, .. } if at > now
    ));
    let other_before = other.status().await.unwrap();

    assert!(rl.delete().await.unwrap());
    assert!(c.store.rate_status(&name).await.unwrap().is_none());
    assert!(!c.store.rate_list().await.unwrap().contains(&name));
    assert!(rl.try_acquire(3).await.unwrap().is_admitted());
    // Other limits may be declared at once, without update.
    assert!(c.store.delete_rate_limiter(&name).await.unwrap());
    assert!(limiter(&c.store, &name, &["1/s"])
        .try_acquire(1)
        .await
        .unwrap()
        .is_admitted());

    let unknown = unique("rate-delete-unknown");
    assert!(!c.store.delete_rate_limiter(&unknown).await.unwrap());
    assert!(c.store.rate_status(&unknown).await.unwrap().is_none());
    let other_after = other.status().await.unwrap();
    assert_eq!(
        (other_before.last_admit, other_before.limits[0].used),
        (other_after.last_admit, other_after.limits[0].used)
    );
    assert!(c
        .store
        .delete_rate_limiter("bad name")
        .await
        .unwrap_err()
        .is_invalid_input());
}

/// Expands to one test per rate conformance test, each with a fresh harness.
#[macro_export]
macro_rules! rate_conformance_tests {
    ($harness:expr) => {
        $crate::conformance_tests!(@each $harness;
            rate_limits_after_n_with_exact_retry_time,
            rate_limited_requests_change_nothing,
            rate_limits_are_charged_all_or_nothing,
            rate_reservations_are_served_in_order,
            rate_acquire_waits_for_its_reservation,
            rate_cancelled_reservation_is_returned,
            rate_bad_inputs_get_typed_errors,
            rate_mismatched_limits_are_refused_unless_updated,
            rate_smooth_mode_paces_evenly,
            rate_window_holds_under_concurrency,
            rate_state_expires_when_unused,
            rate_margin_widens_every_window_and_must_match,
            rate_delete_forgets_the_limiter_and_a_full_limit_admits_again
        );
    };
}
