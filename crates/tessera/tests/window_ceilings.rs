//! Tenants' window ceilings (`docs/fair-shares.md`, "A ceiling on a share of the windows")
//! on every store that keeps them, through the public API, each test private to its store:
//! a tenant is admitted at most its share of each window whatever the others leave; a
//! window-capped tenant's waiters do not hold another tenant's admission back; a give-back
//! returns the tenant's charge and a settled excess counts against it; the ceiling is kept,
//! checked, shown and removed, and a cost above the tenant's share is a typed error that
//! charges nothing. On the memory store, over random steps on a clock the test moves, no
//! tenant is ever admitted more than its share of any window. The SQLite and MariaDB stores
//! run the same scenarios (the shared SQL step, `stores/sql/step.rs`).

use std::sync::Arc;
use std::time::Duration;

use tessera::backend::stores::MemoryBackend;
use tessera::backend::{Clock, ManualClock};
use tessera::{
    Admission, Error, InvalidInput, RateMode, RateOptions, RateSpec, SemaphoreOptions, Store,
    StoreTime, Tenant, TenantLimits,
};

mod tenant_stores;
use tenant_stores::*;

/// Every test below, run on the store `$make` connects (a function of the test's name).
macro_rules! on_store {
    ($store:ident, $make:path) => {
        mod $store {
            use super::*;

            #[tokio::test]
            async fn a_tenant_is_admitted_at_most_its_share_of_each_window() {
                let f = $make("share").await;
                super::a_tenant_is_admitted_at_most_its_share_of_each_window(&f.store).await;
            }

            #[tokio::test]
            async fn a_window_capped_tenant_does_not_hold_another_tenants_admission_back() {
                let f = $make("capped").await;
                super::a_window_capped_tenant_does_not_hold_another_tenants_admission_back(
                    &f.store,
                )
                .await;
            }

            #[tokio::test]
            async fn a_give_back_returns_the_tenants_charge_and_a_settled_excess_counts() {
                let f = $make("back").await;
                super::a_give_back_returns_the_tenants_charge_and_a_settled_excess_counts(&f.store)
                    .await;
            }

            #[tokio::test]
            async fn window_ceilings_are_kept_checked_and_removed() {
                let f = $make("kept").await;
                super::window_ceilings_are_kept_checked_and_removed(&f.store).await;
            }

            #[tokio::test]
            async fn in_smooth_mode_a_tenant_is_admitted_at_most_its_share_of_the_burst() {
                let f = $make("smooth").await;
                super::in_smooth_mode_a_tenant_is_admitted_at_most_its_share_of_the_burst(&f.store)
                    .await;
            }
        }
    };
}

on_store!(memory_store, memory);
#[cfg(feature = "postgres")]
on_store!(postgres_store, postgres);
#[cfg(feature = "sqlite")]
on_store!(sqlite_store, sqlite);
#[cfg(feature = "mysql")]
on_store!(mariadb_store, mariadb);
#[cfg(feature = "redis")]
on_store!(redis_store, redis);
#[cfg(feature = "redis")]
on_store!(redis_cluster_store, redis_cluster);

/// Limits with only a window ceiling of `percent`.
fn window(percent: u8) -> TenantLimits {
    TenantLimits::default()
        .with_window_ceiling(Some(percent))
        .unwrap()
}

/// An admission on `name` as `tenant`: 100 permits, 10 per minute (exact), a margin of 1 s
/// so that no grant comes back past its use-by on a loaded machine.
fn admission(store: &Store, name: &str, tenant: &str) -> Admission {
    store
        .admission(name)
        .permits(100)
        .semaphore_options(SemaphoreOptions::default().tenant(Tenant::new(tenant, 1).unwrap()))
        .rate_options(RateOptions::default().margin(Duration::from_secs(1)))
        .rate(RateSpec::per_minute(10).unwrap())
        .unwrap()
}

/// `bulk` at a window ceiling of 20 % on `name`, and the admissions of `bulk` and `alerts`.
async fn bulk_and_alerts(store: &Store, name: &str) -> (Admission, Admission) {
    store
        .set_tenant_limits(name, "bulk", window(20))
        .await
        .unwrap();
    (
        admission(store, name, "bulk"),
        admission(store, name, "alerts"),
    )
}

/// How many of `n` tries are admitted (the tickets are kept held).
async fn admitted(a: &Admission, n: usize, held: &mut Vec<tessera::Admitted>) -> usize {
    let mut got = 0;
    for _ in 0..n {
        if let Some(t) = a.try_acquire().await.unwrap() {
            held.push(t);
            got += 1;
        }
    }
    got
}

/// The shared windows' count (used and reserved) of `name`.
async fn shared_used(store: &Store, name: &str) -> u64 {
    match store.rate_status(name).await.unwrap() {
        Some(s) => s.limits.iter().map(|l| l.used + l.reserved).max().unwrap(),
        None => 0,
    }
}

async fn a_tenant_is_admitted_at_most_its_share_of_each_window(store: &Store) {
    let (bulk, alerts) = bulk_and_alerts(store, "w").await;
    let mut held = Vec::new();
    // 20 % of 10 per minute: 2, although the shared windows have room for 10.
    assert_eq!(admitted(&bulk, 4, &mut held).await, 2);
    assert_eq!(
        shared_used(store, "w").await,
        2,
        "a refusal charges nothing"
    );
    // The others take what is left of the shared windows, and no more.
    assert_eq!(admitted(&alerts, 9, &mut held).await, 8);
    assert_eq!(admitted(&bulk, 1, &mut held).await, 0);
    assert_eq!(shared_used(store, "w").await, 10);
}

async fn a_window_capped_tenant_does_not_hold_another_tenants_admission_back(store: &Store) {
    let (bulk, alerts) = bulk_and_alerts(store, "w").await;
    let mut held = Vec::new();
    // `bulk` first, then `alerts` six times: `bulk`'s next start tag is below `alerts`'s,
    // so by the shares alone `bulk`'s waiter would be the head.
    assert_eq!(admitted(&bulk, 2, &mut held).await, 2);
    assert_eq!(admitted(&alerts, 6, &mut held).await, 6);
    let waiting = tokio::spawn(async move { bulk.acquire_timeout(Duration::from_secs(60)).await });
    for _ in 0..500 {
        let queued = store
            .status("w")
            .await
            .unwrap()
            .map_or(0, |s| s.queue.len());
        if queued == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let status = store.status("w").await.unwrap().unwrap();
    assert_eq!(status.queue.len(), 1, "bulk waits for its own windows");
    // `alerts` is admitted at once, ahead of the capped tenant's waiter (with the waiter
    // as the head it would wait for bulk's minute).
    let t = alerts
        .acquire_timeout(Duration::from_secs(10))
        .await
        .unwrap();
    assert!(
        t.is_some(),
        "a window-capped tenant held another tenant back"
    );
    assert!(!waiting.is_finished(), "bulk is still capped");
    waiting.abort();
    assert_eq!(shared_used(store, "w").await, 9);
}

async fn a_give_back_returns_the_tenants_charge_and_a_settled_excess_counts(store: &Store) {
    store
        .set_tenant_limits("g", "bulk", window(20))
        .await
        .unwrap();
    let bulk = admission(store, "g", "bulk");
    let mut held = Vec::new();
    assert_eq!(admitted(&bulk, 2, &mut held).await, 2);
    // The latest admission given back unused: its charge returns to the tenant's windows.
    assert!(held.pop().unwrap().give_back().await.unwrap());
    assert_eq!(admitted(&bulk, 2, &mut held).await, 1);
    assert_eq!(shared_used(store, "g").await, 2);

    // On another name: one admission of cost 1 that cost 2 fills the tenant's share.
    store
        .set_tenant_limits("s", "bulk", window(20))
        .await
        .unwrap();
    let (bulk, alerts) = (
        admission(store, "s", "bulk"),
        admission(store, "s", "alerts"),
    );
    let t = bulk.try_acquire().await.unwrap().expect("admitted");
    assert!(t.settle(2).await.unwrap());
    assert_eq!(admitted(&bulk, 1, &mut held).await, 0, "the excess counts");
    assert_eq!(admitted(&alerts, 1, &mut held).await, 1);
    assert_eq!(shared_used(store, "s").await, 3);
}

async fn window_ceilings_are_kept_checked_and_removed(store: &Store) {
    // Out of range: a typed error before anything is sent.
    for bad in [0u8, 101] {
        let err = TenantLimits::default()
            .with_window_ceiling(Some(bad))
            .unwrap_err();
        assert!(matches!(err, InvalidInput::Other(_)), "{err:?}");
    }
    let limits = TenantLimits::new(Some(50), 0)
        .unwrap()
        .with_window_ceiling(Some(20))
        .unwrap();
    store.set_tenant_limits("k", "bulk", limits).await.unwrap();
    let kept = store.tenant_limits("k").await.unwrap();
    assert_eq!(kept.get("bulk"), Some(&limits), "{kept:?}");

    // A cost above the tenant's share of the smallest window (2 of 10): a typed error,
    // nothing charged, nothing held.
    let bulk = admission(store, "k", "bulk").cost(3).unwrap();
    let err = bulk.try_acquire().await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::Cost { cost: 3, max: 2 })
        ),
        "{err:?}"
    );
    assert_eq!(shared_used(store, "k").await, 0);
    assert_eq!(store.status("k").await.unwrap().map_or(0, |s| s.used), 0);

    // Removed: the tenant is admitted up to the shared windows again.
    store
        .set_tenant_limits("k", "bulk", TenantLimits::new(Some(50), 0).unwrap())
        .await
        .unwrap();
    let kept = store.tenant_limits("k").await.unwrap();
    assert_eq!(kept.get("bulk").unwrap().window_ceiling, None);
    let bulk = admission(store, "k", "bulk");
    let mut held = Vec::new();
    assert_eq!(admitted(&bulk, 4, &mut held).await, 4);
}

async fn in_smooth_mode_a_tenant_is_admitted_at_most_its_share_of_the_burst(store: &Store) {
    store
        .set_tenant_limits("m", "bulk", window(20))
        .await
        .unwrap();
    // 10 per minute after a burst of 10; `bulk`: 2 per minute after a burst of 2.
    let smooth = |tenant: &str, cost: u32| {
        store
            .admission("m")
            .permits(100)
            .semaphore_options(SemaphoreOptions::default().tenant(Tenant::new(tenant, 1).unwrap()))
            .rate_options(
                RateOptions::default()
                    .margin(Duration::from_secs(1))
                    .mode(RateMode::Smooth { burst: 10 }),
            )
            .rate(RateSpec::per_minute(10).unwrap())
            .unwrap()
            .cost(cost)
            .unwrap()
    };
    let err = smooth("bulk", 3).try_acquire().await.expect_err("refused");
    assert!(
        matches!(
            err,
            Error::InvalidInput(InvalidInput::Cost { cost: 3, max: 2 })
        ),
        "{err:?}"
    );
    let mut held = Vec::new();
    assert_eq!(admitted(&smooth("bulk", 1), 4, &mut held).await, 2);
    assert_eq!(admitted(&smooth("alerts", 1), 9, &mut held).await, 8);
    assert_eq!(admitted(&smooth("bulk", 1), 1, &mut held).await, 0);
}

/// On Redis, the tenant's own limiter is kept beside the shared one, saved with the shared
/// configuration scaled (`RateConfig::scaled(..).encode()`), and expires as any limiter
/// state does.
#[cfg(feature = "redis")]
#[tokio::test]
async fn on_redis_the_tenants_limiter_is_saved_with_the_scaled_configuration() {
    let server = tessera_testkit::servers::redis::RedisServer::start();
    let store = Store::connect(&format!("{}?prefix=scaled", server.url()))
        .await
        .unwrap();
    store
        .set_tenant_limits("c", "bulk", window(25))
        .await
        .unwrap();
    let bulk = store
        .admission("c")
        .permits(100)
        .semaphore_options(SemaphoreOptions::default().tenant(Tenant::new("bulk", 1).unwrap()))
        .rate_options(RateOptions::default().margin(Duration::from_millis(500)))
        .rate(RateSpec::per_minute(10).unwrap())
        .unwrap()
        .rate(RateSpec::per_minute(11).unwrap())
        .unwrap()
        .rate(RateSpec::new(1_000, Duration::from_secs(3_600)).unwrap())
        .unwrap();
    let _t = bulk.try_acquire().await.unwrap().expect("admitted");
    let key = "{scaled:c}:rate:tenant:bulk";
    let reply = server.command(&["HGET", key, "cfg"]);
    let cfg = tessera_testkit::servers::redis::bulk_strings(&reply)[0].to_string();
    let expected = bulk.limiter().config().scaled(25).encode();
    assert_eq!(cfg, expected);
    // (10 and 11 per minute both become 2 per minute: one limit.)
    assert_eq!(expected, "exact+500ms|2/min,250/h");
    let ttl: i64 = server
        .command(&["PTTL", key])
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!(ttl > 0, "the tenant's limiter expires: {ttl}");
    // A cap is kept with the tenant's limits, which still read as set.
    assert!(bulk.try_acquire().await.unwrap().is_some());
    assert!(bulk.try_acquire().await.unwrap().is_none());
    let kept = store.tenant_limits("c").await.unwrap();
    assert_eq!(kept.get("bulk"), Some(&window(25)));
    // Deleting the limiter drops the tenant's too.
    assert!(store.delete_rate_limiter("c").await.unwrap());
    assert_eq!(server.command(&["EXISTS", key]).trim(), ":0");
}

/// A private memory store on a clock the test moves.
fn manual_store() -> (Store, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::new(StoreTime(1_000_000_000_000)));
    let backend = MemoryBackend::with_clock(clock.clone());
    (Store::from_backend(Arc::new(backend), "memory://"), clock)
}

/// Checks the admission just logged (the last entry of `log`: tenant, instant, cost
/// counted): within the enforced window that ends at it (each limit's period plus the 100 ms
/// margin), its tenant's count is at most its share and the count of all at most the limit.
/// A settled excess may take a window above its limit (the windows never count less than
/// was used); an admission never does.
fn check(log: &[(usize, u64, i64)], seed: u64) {
    let &(i, t, _) = log.last().unwrap();
    let shares = [20u64, 50, 100];
    for (n, period) in [(10u64, 1_000_000u64), (30, 10_000_000)] {
        let window = period + 100_000;
        let within = |e: &&(usize, u64, i64)| e.1 + window > t && e.1 <= t;
        let all: i64 = log.iter().filter(within).map(|e| e.2).sum();
        let own: i64 = log
            .iter()
            .filter(within)
            .filter(|e| e.0 == i)
            .map(|e| e.2)
            .sum();
        let share = (n * shares[i] / 100).max(1) as i64;
        assert!(
            own <= share,
            "seed {seed}: tenant {i} at {t}: {own} > {share} of {n}"
        );
        assert!(all <= n as i64, "seed {seed}: at {t}: {all} > {n}");
    }
}

/// Over random admissions of three tenants (ceilings of 20 %, 50 % and none) on 10 per
/// second and 30 per 10 s (exact windows), with give-backs, settlements and clock steps: within every
/// window of every limit, each tenant's admitted cost (less what it gave back, plus what
/// it settled above its charge) is at most its share, and all of them at most the limit.
#[tokio::test]
async fn no_tenant_is_admitted_more_than_its_share_of_any_window_over_random_steps() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = std::env::var("TESSERA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (store, clock) = manual_store();
    store.set_tenant_limits("r", "a", window(20)).await.unwrap();
    store.set_tenant_limits("r", "b", window(50)).await.unwrap();
    let make = |tenant: &str| {
        let opts = RateOptions::default().margin(Duration::from_millis(100));
        store
            .admission("r")
            .permits(1_000)
            .semaphore_options(SemaphoreOptions::default().tenant(Tenant::new(tenant, 1).unwrap()))
            .rate_options(opts)
            .rate(RateSpec::per_second(10).unwrap())
            .unwrap()
            .rate(RateSpec::new(30, Duration::from_secs(10)).unwrap())
            .unwrap()
    };
    let tenants = ["a", "b", "c"];
    let adm: Vec<Admission> = tenants.iter().map(|t| make(t)).collect();
    // (tenant, admitted at, cost counted)
    let mut log: Vec<(usize, u64, i64)> = Vec::new();
    let mut held: Vec<(usize, tessera::Admitted)> = Vec::new();
    for _ in 0..400 {
        match rng.random_range(0..10) {
            0..=5 => {
                let i = rng.random_range(0..3);
                if let Some(t) = adm[i].try_acquire().await.unwrap() {
                    log.push((i, t.admitted_at().0, 1));
                    check(&log, seed);
                    held.push((i, t));
                }
            }
            6 if !held.is_empty() => {
                let (i, t) = held.swap_remove(rng.random_range(0..held.len()));
                let at = t.admitted_at().0;
                t.give_back().await.unwrap();
                // Counted back whether or not the store could return it (only its latest
                // charge): the check below stays a lower bound of the store's count.
                if let Some(e) = log
                    .iter_mut()
                    .rev()
                    .find(|e| e.0 == i && e.1 == at && e.2 > 0)
                {
                    e.2 -= 1;
                }
            }
            7 if !held.is_empty() => {
                let (i, t) = held.swap_remove(rng.random_range(0..held.len()));
                // An excess is charged at the settle's instant, to the tenant's windows only
                // if the lease was still held; a smaller cost is not counted back here (the
                // check stays a lower bound of the store's count).
                if t.settle(2).await.unwrap() {
                    log.push((i, clock.now().0, 1));
                }
            }
            _ => clock.advance(Duration::from_millis(rng.random_range(1..400))),
        }
    }
    assert!(
        log.iter().any(|e| e.0 == 0),
        "seed {seed}: tenant a admitted"
    );
}
