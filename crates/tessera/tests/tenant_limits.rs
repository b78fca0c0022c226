//! Tenants' ceilings and floors (`docs/fair-shares.md#ceilings-and-floors`) on every store
//! that keeps them, each test private to its store: a tenant never holds more than its
//! ceiling and a capped tenant does not hold the others back; a floor's permits are kept for
//! its tenant, whose requests within it are granted at once, ahead of the queue; the limits
//! outlive an idle semaphore, are checked when set and go with `delete`; over random steps
//! the invariants hold and every answer is the memory store's (the reference model); a store
//! that keeps none refuses them with a typed error.

use std::collections::HashMap;
use std::time::Duration;

use tessera::backend::*;
use tessera::{Error, LeaseId, SemaphoreOptions, Store, Tenant, TenantLimits};

mod tenant_stores;
use tenant_stores::*;

/// The reference model beside the store under test.
async fn reference() -> Store {
    memory("reference").await.store
}

/// Every test below, run on the store `$make` connects (a function of the test's name).
macro_rules! on_store {
    ($store:ident, $make:path) => {
        mod $store {
            use super::*;

            #[tokio::test]
            async fn a_tenant_at_its_ceiling_waits_and_does_not_hold_the_others_back() {
                let f = $make("ceiling").await;
                super::a_tenant_at_its_ceiling_waits_and_does_not_hold_the_others_back(&f.store)
                    .await;
            }

            #[tokio::test]
            async fn a_floor_keeps_permits_for_its_tenant_and_grants_it_ahead_of_the_queue() {
                let f = $make("floor").await;
                super::a_floor_keeps_permits_for_its_tenant_and_grants_it_ahead_of_the_queue(
                    &f.store,
                )
                .await;
            }

            #[tokio::test]
            async fn limits_outlive_an_idle_semaphore_are_checked_when_set_and_go_with_delete() {
                let f = $make("kept").await;
                super::limits_outlive_an_idle_semaphore_are_checked_when_set_and_go_with_delete(
                    &f.store,
                )
                .await;
            }

            #[tokio::test]
            async fn bad_limits_get_typed_errors_and_change_nothing() {
                let f = $make("bad").await;
                super::bad_limits_get_typed_errors_and_change_nothing(&f.store).await;
            }

            #[test]
            fn ceilings_and_floors_hold_over_random_steps_as_on_the_reference_model() {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                // Connected on this thread, which outlives every case (a throwaway server
                // dies with the thread that started it).
                let f = rt.block_on($make("model"));
                super::ceilings_and_floors_hold_over_random_steps(&rt, &f.store);
            }
        }
    };
}

on_store!(memory_store, memory);
#[cfg(feature = "sqlite")]
on_store!(sqlite_store, sqlite);
#[cfg(feature = "mysql")]
on_store!(mariadb_store, mariadb);
#[cfg(feature = "postgres")]
on_store!(postgres_store, postgres);
#[cfg(feature = "redis")]
on_store!(redis_store, redis);

fn request(tenant: Option<&str>, weight: u32) -> AcquireRequest {
    AcquireRequest {
        lease_id: LeaseId::random(),
        weight,
        ttl: Duration::from_secs(3_600),
        holder: tenant.unwrap_or("-").to_string(),
        wait: Some(WaitSpec {
            waiter_ttl: Duration::from_secs(3_600),
            queue_cap: 100_000,
        }),
        tenant: tenant.map(|t| Tenant::new(t, 1).unwrap()),
        first_send: false,
    }
}

/// Asks for `req`; `true` if it was granted at once (else it waits).
async fn ask(store: &Store, name: &Name, capacity: u32, req: &AcquireRequest) -> bool {
    match store.backend().acquire(name, capacity, req).await.unwrap() {
        AcquireReply::Granted(_) => true,
        AcquireReply::Queued { .. } => false,
        other => panic!("{other:?}"),
    }
}

/// Permits held per tenant (`-`: none named), from the status.
async fn held(store: &Store, name: &Name) -> HashMap<String, u32> {
    let mut out = HashMap::new();
    for h in store
        .backend()
        .status(name)
        .await
        .unwrap()
        .map_or(vec![], |s| s.holders)
    {
        *out.entry(h.tenant.unwrap_or_else(|| "-".into()))
            .or_default() += h.weight;
    }
    out
}

fn limits(ceiling: Option<u32>, floor: u32) -> TenantLimits {
    TenantLimits::new(ceiling, floor).unwrap()
}

async fn a_tenant_at_its_ceiling_waits_and_does_not_hold_the_others_back(store: &Store) {
    let name = Name::new("provider").unwrap();
    store
        .set_tenant_limits("provider", "bulk", limits(Some(2), 0))
        .await
        .unwrap();
    let bulk: Vec<_> = (0..4).map(|_| request(Some("bulk"), 1)).collect();
    assert!(ask(store, &name, 4, &bulk[0]).await);
    assert!(ask(store, &name, 4, &bulk[1]).await);
    // Two permits are free, but bulk is at its ceiling: it waits, at the head.
    assert!(!ask(store, &name, 4, &bulk[2]).await);
    assert!(!ask(store, &name, 4, &bulk[3]).await);
    // Another tenant, and a request without one, pass the capped head.
    assert!(ask(store, &name, 4, &request(Some("alerts"), 1)).await);
    assert!(ask(store, &name, 4, &request(None, 1)).await);
    assert_eq!(held(store, &name).await["bulk"], 2);
    // A release of bulk's lets its next one in, and no more.
    assert!(store
        .backend()
        .release(&name, bulk[0].lease_id)
        .await
        .unwrap());
    assert_eq!(held(store, &name).await["bulk"], 2);
    let status = store.backend().status(&name).await.unwrap().unwrap();
    assert_eq!(status.queue.len(), 1, "{status:?}");
    // A raised ceiling lets the last one in at once.
    assert!(store
        .backend()
        .release(&name, bulk[1].lease_id)
        .await
        .unwrap());
    store
        .set_tenant_limits("provider", "bulk", limits(Some(3), 0))
        .await
        .unwrap();
    assert_eq!(held(store, &name).await["bulk"], 2);
    assert!(store
        .backend()
        .status(&name)
        .await
        .unwrap()
        .unwrap()
        .queue
        .is_empty());
}

async fn a_floor_keeps_permits_for_its_tenant_and_grants_it_ahead_of_the_queue(store: &Store) {
    let name = Name::new("provider").unwrap();
    store
        .set_tenant_limits("provider", "alerts", limits(None, 1))
        .await
        .unwrap();
    // A flood takes 3 of the 4 permits: the fourth is kept for alerts.
    let flood: Vec<_> = (0..6).map(|_| request(Some("bulk"), 1)).collect();
    let mut granted = Vec::new();
    for r in &flood {
        if ask(store, &name, 4, r).await {
            granted.push(r.lease_id);
        }
    }
    assert_eq!(granted.len(), 3);
    // alerts, below its floor, is granted at once behind the backlog.
    let a1 = request(Some("alerts"), 1);
    assert!(ask(store, &name, 4, &a1).await);
    // At its floor, its next request waits its turn among the others.
    let a2 = request(Some("alerts"), 1);
    assert!(!ask(store, &name, 4, &a2).await);
    // alerts gives its permit back: the permit is kept for alerts, whose waiter gets it
    // ahead of bulk's queued requests.
    assert!(store.backend().release(&name, a1.lease_id).await.unwrap());
    let status = store.backend().status(&name).await.unwrap().unwrap();
    assert!(
        status.holders.iter().any(|h| h.lease_id == a2.lease_id),
        "{status:?}"
    );
    assert_eq!(held(store, &name).await["bulk"], 3);
    // A release of bulk's goes to bulk's queue (alerts is at its floor).
    assert!(store.backend().release(&name, granted[0]).await.unwrap());
    assert_eq!(held(store, &name).await["bulk"], 3);
}

async fn limits_outlive_an_idle_semaphore_are_checked_when_set_and_go_with_delete(store: &Store) {
    store
        .set_tenant_limits("jobs", "batch", limits(Some(1), 0))
        .await
        .unwrap();
    store
        .set_tenant_limits("jobs", "web", limits(None, 2))
        .await
        .unwrap();
    let kept = store.tenant_limits("jobs").await.unwrap();
    assert_eq!(kept.len(), 2);
    assert_eq!(kept["batch"], limits(Some(1), 0));
    // Through the public API, twice, with the semaphore idle in between.
    let opts = SemaphoreOptions::default().tenant(Tenant::new("batch", 1).unwrap());
    let batch = tessera::Semaphore::new(store, "jobs", 3, opts).unwrap();
    for _ in 0..2 {
        let p = batch.acquire().await.unwrap();
        assert!(
            batch.try_acquire().await.unwrap().is_none(),
            "at its ceiling"
        );
        p.release().await.unwrap();
        assert!(store.status("jobs").await.unwrap().is_none(), "idle");
    }
    // Floors above the capacity of the live semaphore: refused, nothing changed.
    let _p = batch.acquire().await.unwrap();
    let err = store
        .set_tenant_limits("jobs", "ops", limits(None, 2))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err}");
    assert_eq!(store.tenant_limits("jobs").await.unwrap().len(), 2);
    // Default limits remove a tenant's; delete removes the rest.
    store
        .set_tenant_limits("jobs", "web", TenantLimits::default())
        .await
        .unwrap();
    assert_eq!(store.tenant_limits("jobs").await.unwrap().len(), 1);
    assert!(store.delete("jobs").await.unwrap());
    assert!(store.tenant_limits("jobs").await.unwrap().is_empty());
}

async fn bad_limits_get_typed_errors_and_change_nothing(store: &Store) {
    for (ceiling, floor) in [(Some(0), 0), (Some(2), 3), (Some(2_000_000), 0)] {
        assert!(
            TenantLimits::new(ceiling, floor).is_err(),
            "{ceiling:?} {floor}"
        );
    }
    store
        .set_tenant_limits("jobs", "web", limits(Some(2), 1))
        .await
        .unwrap();
    let long = "t".repeat(65);
    for (name, tenant) in [
        ("jobs", ""),
        ("jobs", long.as_str()),
        ("jobs", "a\nb"),
        ("", "web"),
    ] {
        let err = store
            .set_tenant_limits(name, tenant, limits(None, 1))
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidInput(_)),
            "{name:?} {tenant:?}: {err}"
        );
    }
    let kept = store.tenant_limits("jobs").await.unwrap();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(kept["web"], limits(Some(2), 1));
}

/// A store that keeps no limits (etcd) refuses them with a typed error, and lists none.
#[cfg(feature = "etcd")]
#[tokio::test]
async fn a_store_without_limits_refuses_them_with_a_typed_error() {
    let cluster = tessera_testkit::servers::etcd::EtcdCluster::start(1);
    let store = Store::connect(&cluster.url()).await.unwrap();
    assert!(!store.backend().capabilities().tenant_limits);
    let err = store
        .set_tenant_limits("jobs", "web", limits(None, 1))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    assert!(store.tenant_limits("jobs").await.unwrap().is_empty());
    // Nor does it order by shares (`docs/fair-shares.md#etcd-measured-why-not`): a request
    // that names a tenant is refused before anything is sent.
    assert!(!store.backend().capabilities().fair_shares);
    let opts = SemaphoreOptions::default().tenant(Tenant::new("web", 2).unwrap());
    let err = tessera::Semaphore::new(&store, "jobs", 2, opts).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    assert!(
        store.status("jobs").await.unwrap().is_none(),
        "nothing changed"
    );
}

/// The invariants of `docs/fair-shares.md` over random steps: after every step each tenant
/// holds at most its ceiling and the free permits cover what the floors still keep; a
/// request within its tenant's floor is granted at once; and every answer (granted at once
/// or queued), the holders and the queue's order are the reference model's, given the same
/// steps.
fn ceilings_and_floors_hold_over_random_steps(rt: &tokio::runtime::Runtime, store: &Store) {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    use std::sync::atomic::{AtomicU32, Ordering};
    const TENANTS: [Option<&str>; 4] = [None, Some("a"), Some("b"), Some("c")];
    // a: ceiling 2; b: floor 2; c: ceiling 2 and floor 1. Capacity 6: the floors alone
    // would let a hold 3 and c 4.
    let ceiling = |t: Option<&str>| match t {
        Some("a") => Some(2),
        Some("c") => Some(2),
        _ => None,
    };
    let floor = |t: Option<&str>| match t {
        Some("b") => 2,
        Some("c") => 1,
        _ => 0,
    };
    let step = prop_oneof![
        3 => (0..4usize, 1..=2u32).prop_map(|(t, w)| (0u8, t, w as usize)),
        2 => any::<usize>().prop_map(|i| (1u8, 0, i)),
        1 => any::<usize>().prop_map(|i| (2u8, 0, i)),
    ];
    // Each case on a name of its own (a server's store outlives the cases).
    let case = AtomicU32::new(0);
    let mut runner = TestRunner::new(Config::with_cases(48));
    runner
        .run(&proptest::collection::vec(step, 1..50), |steps| {
            rt.block_on(async {
                let model = reference().await;
                let n = format!("p{}", case.fetch_add(1, Ordering::Relaxed));
                let name = Name::new(&n).unwrap();
                for s in [store, &model] {
                    for t in ["a", "b", "c"] {
                        let l = limits(ceiling(Some(t)), floor(Some(t)));
                        s.set_tenant_limits(&n, t, l).await.unwrap();
                    }
                }
                let (b, m) = (store.backend(), model.backend());
                let mut tenant_of = HashMap::new();
                for (kind, t, i) in steps {
                    let status = b.status(&name).await.unwrap();
                    let holders = status.as_ref().map_or(vec![], |s| s.holders.clone());
                    let queue = status.as_ref().map_or(vec![], |s| s.queue.clone());
                    match kind {
                        0 => {
                            let (t, w) = (TENANTS[t], i as u32);
                            let r = request(t, w);
                            tenant_of.insert(r.lease_id, t);
                            let held: u32 = holders
                                .iter()
                                .filter(|h| h.tenant.as_deref() == t && t.is_some())
                                .map(|h| h.weight)
                                .sum();
                            let within_floor = held + w <= floor(t);
                            let granted = ask(store, &name, 6, &r).await;
                            assert!(!within_floor || granted, "{t:?} within its floor");
                            assert_eq!(granted, ask(&model, &name, 6, &r).await, "{t:?} {w}");
                        }
                        1 if !holders.is_empty() => {
                            let h = &holders[i % holders.len()];
                            assert!(b.release(&name, h.lease_id).await.unwrap());
                            assert!(m.release(&name, h.lease_id).await.unwrap());
                        }
                        2 if !queue.is_empty() => {
                            let w = queue[i % queue.len()].lease_id;
                            b.cancel(&name, w).await.unwrap();
                            m.cancel(&name, w).await.unwrap();
                        }
                        _ => {}
                    }
                    let (got, want) = (
                        b.status(&name).await.unwrap(),
                        m.status(&name).await.unwrap(),
                    );
                    let order = |s: &Option<tessera::SemaphoreStatus>| {
                        let mut holders: Vec<_> = s
                            .as_ref()
                            .map_or(vec![], |s| s.holders.iter().map(|h| h.lease_id).collect());
                        holders.sort();
                        let queue: Vec<_> = s
                            .as_ref()
                            .map_or(vec![], |s| s.queue.iter().map(|w| w.lease_id).collect());
                        (holders, queue)
                    };
                    assert_eq!(order(&got), order(&want), "holders and queue");
                    let holders = got.map_or(vec![], |s| s.holders);
                    let mut by: HashMap<Option<&str>, u32> = HashMap::new();
                    for h in &holders {
                        *by.entry(tenant_of[&h.lease_id]).or_default() += h.weight;
                    }
                    let used: u32 = by.values().sum();
                    let mut kept = 0;
                    for t in TENANTS {
                        let held = by.get(&t).copied().unwrap_or(0);
                        assert!(ceiling(t).is_none_or(|c| held <= c), "{t:?} holds {held}");
                        kept += floor(t).saturating_sub(held);
                    }
                    assert!(used + kept <= 6, "used {used}, floors keep {kept}");
                }
                store.delete(&n).await.unwrap();
            });
            Ok(())
        })
        .unwrap();
}

/// Admissions (a permit and a rate turn in one step) with a ceiling and a floor, scripted:
/// a capped tenant's admission waits, another tenant's waits ahead of it by its tag (the
/// permit left is kept for a floor), the floor's tenant is admitted at once, and a release
/// wakes the head (the first waiter not at its ceiling), whose own step is admitted while
/// the capped one's is not. Every answer, the holders and the queue's order are the
/// reference model's; returns the answers.
async fn admissions_with_limits(store: &Store) -> Vec<String> {
    use tessera::backend::{AdmitReply, AdmitRequest, RateConfig};
    let model = reference().await;
    let config = RateConfig::new(&["100000/s".parse().unwrap()], tessera::RateMode::Exact).unwrap();
    let name = Name::new("admit").unwrap();
    for s in [store, &model] {
        s.set_tenant_limits("admit", "bulk", limits(Some(1), 0))
            .await
            .unwrap();
        s.set_tenant_limits("admit", "ops", limits(None, 1))
            .await
            .unwrap();
    }
    let admit = |r: &AcquireRequest| AdmitRequest {
        acquire: r.clone(),
        cost: 1,
        update: false,
        at_head: false,
    };
    let (a, b, c, d) = (
        request(Some("bulk"), 1),
        request(Some("bulk"), 1),
        request(Some("web"), 1),
        request(Some("ops"), 1),
    );
    let mut answers = Vec::new();
    let steps: [(&str, &AcquireRequest); 7] = [
        ("admit", &a),
        ("admit", &b),
        ("admit", &c),
        ("admit", &d),
        ("release", &a),
        ("admit", &b),
        ("admit", &c),
    ];
    for (op, r) in steps {
        let mut got = Vec::new();
        for s in [store, &model] {
            let answer = match op {
                "admit" => {
                    let adm = s.backend().admission().expect("the store admits");
                    match adm.admit(&name, 2, &config, &admit(r)).await.unwrap() {
                        AdmitReply::Granted { .. } => "granted".to_string(),
                        AdmitReply::Queued { position, .. } => format!("queued {position}"),
                        other => format!("{other:?}"),
                    }
                }
                _ => {
                    assert!(s.backend().release(&name, r.lease_id).await.unwrap());
                    "released".to_string()
                }
            };
            let status = s.backend().status(&name).await.unwrap().unwrap();
            let mut holders: Vec<_> = status.holders.iter().map(|h| h.lease_id).collect();
            holders.sort();
            let queue: Vec<_> = status.queue.iter().map(|w| w.lease_id).collect();
            got.push((answer, holders, queue));
        }
        assert_eq!(
            got[0], got[1],
            "{op} {}: the store, then the model",
            r.holder
        );
        answers.push(got.swap_remove(0).0);
    }
    answers
}

#[cfg(feature = "sqlite")]
#[tokio::test]
async fn sqlite_admissions_with_limits_answer_as_the_reference_model() {
    let f = sqlite("admit").await;
    let answers = admissions_with_limits(&f.store).await;
    assert_eq!(
        answers,
        ["granted", "queued 0", "queued 0", "granted", "released", "queued 1", "granted"]
    );
}

#[cfg(feature = "mysql")]
#[tokio::test]
async fn mariadb_admissions_with_limits_answer_as_the_reference_model() {
    let f = mariadb("admit").await;
    let answers = admissions_with_limits(&f.store).await;
    assert_eq!(
        answers,
        ["granted", "queued 0", "queued 0", "granted", "released", "queued 1", "granted"]
    );
}

/// What only Redis can get wrong: where the limits live (a hash of their own, kept without an
/// expiry with the meta that says the name has them, gone with `delete`), a Redis Cluster
/// (every key in KEYS), a second client, and the commands of a name without limits.
#[cfg(feature = "redis")]
mod on_redis {
    use super::*;
    use tessera_testkit::servers::redis::RedisServer;
    use tessera_testkit::servers::redis_cluster::RedisCluster;

    async fn connect(url: &str, prefix: &str) -> Store {
        Store::connect(&format!("{url}?prefix={prefix}"))
            .await
            .unwrap()
    }

    /// The ceiling and floor scenarios on a Redis Cluster, where every key a step touches,
    /// the limits' hash included, is named in the call.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn limits_hold_on_a_redis_cluster() {
        let cluster = RedisCluster::start(false);
        let capped = connect(&cluster.url(), "cl1").await;
        super::a_tenant_at_its_ceiling_waits_and_does_not_hold_the_others_back(&capped).await;
        let store = connect(&cluster.url(), "cl").await;
        super::a_floor_keeps_permits_for_its_tenant_and_grants_it_ahead_of_the_queue(&store).await;
        let node = cluster.primary_for("{cl:provider}:limits");
        let kept = node.command(&["HGETALL", "{cl:provider}:limits"]);
        assert!(kept.contains("alerts"), "{kept}");
        assert!(store.delete("provider").await.unwrap());
        assert!(store.tenant_limits("provider").await.unwrap().is_empty());
    }

    /// Limits set through one client bind every other client of the same Redis at once,
    /// and survive the first client's going away and the semaphore's going idle.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_store_sees_and_keeps_the_limits_set_by_the_first() {
        let server = RedisServer::start();
        let first = connect(&server.url(), "two").await;
        first
            .set_tenant_limits("jobs", "batch", limits(Some(1), 0))
            .await
            .unwrap();
        first.close().await.unwrap();
        let second = connect(&server.url(), "two").await;
        assert_eq!(
            second.tenant_limits("jobs").await.unwrap()["batch"],
            limits(Some(1), 0)
        );
        let name = Name::new("jobs").unwrap();
        let (a, b) = (request(Some("batch"), 1), request(Some("batch"), 1));
        assert!(ask(&second, &name, 3, &a).await);
        assert!(!ask(&second, &name, 3, &b).await, "at its ceiling");
        // The limits and the meta that says the name has them carry no expiry; every other
        // key of the state does.
        // What says so is meta's capacity with a trailing L, which a build before limits
        // cannot read (every step of such a client on this name fails as corrupt).
        assert!(server
            .command(&["HGET", "{two:jobs}:meta", "cap"])
            .contains("3L"));
        let mut immortal = server.immortal_keys("two");
        immortal.sort();
        assert_eq!(immortal, ["{two:jobs}:limits", "{two:jobs}:meta"]);
        // Cleared, the meta expires again, and no key is left without an expiry.
        second
            .set_tenant_limits("jobs", "batch", TenantLimits::default())
            .await
            .unwrap();
        assert!(
            second
                .status("jobs")
                .await
                .unwrap()
                .unwrap()
                .queue
                .is_empty(),
            "the cleared ceiling lets the waiter in"
        );
        assert_eq!(server.immortal_keys("two"), Vec::<String>::new());
        let cap = server.command(&["HGET", "{two:jobs}:meta", "cap"]);
        assert!(cap.contains('3') && !cap.contains('L'), "{cap:?}");
        // Limits on a name nobody uses: an idle state keeps them; delete takes them, and
        // leaves nothing without an expiry.
        second
            .set_tenant_limits("unused", "web", limits(None, 1))
            .await
            .unwrap();
        assert!(second.status("unused").await.unwrap().is_none());
        assert!(second.delete("unused").await.unwrap(), "it had limits");
        assert!(second.tenant_limits("unused").await.unwrap().is_empty());
        assert!(!second.delete("unused").await.unwrap());
        assert_eq!(server.immortal_keys("two"), Vec::<String>::new());
    }

    /// Admissions under ceilings and floors get the reference model's answers (granted,
    /// queued at the same position) and leave the same holders and queue, step by step:
    /// arrivals, releases, and queued admissions asking again as woken waiters do.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admissions_under_limits_follow_the_reference_model() {
        use tessera::backend::{AdmitReply, AdmitRequest, RateConfig};
        use tessera::RateMode;
        let server = RedisServer::start();
        let store = connect(&server.url(), "adm").await;
        let model = reference().await;
        let name = Name::new("admit").unwrap();
        let config = RateConfig::new(&["100000/s".parse().unwrap()], RateMode::Exact).unwrap();
        for s in [&store, &model] {
            s.set_tenant_limits("admit", "a", limits(Some(2), 0))
                .await
                .unwrap();
            s.set_tenant_limits("admit", "b", limits(None, 1))
                .await
                .unwrap();
            s.set_tenant_limits("admit", "c", limits(Some(2), 1))
                .await
                .unwrap();
        }
        let answer = |r: AdmitReply| match r {
            AdmitReply::Granted { .. } => "granted".to_string(),
            AdmitReply::Queued { position, .. } => format!("queued {position}"),
            other => format!("{other:?}"),
        };
        let snapshot = |s: Option<tessera::SemaphoreStatus>| {
            let s = s.map_or((vec![], vec![]), |s| (s.holders, s.queue));
            let mut holders: Vec<_> = s.0.iter().map(|h| h.lease_id).collect();
            holders.sort();
            (holders, s.1.iter().map(|w| w.lease_id).collect::<Vec<_>>())
        };
        let mut queued: HashMap<LeaseId, AdmitRequest> = HashMap::new();
        let mut seed = 0x2545_f491_u64;
        let mut next = |n: u64| {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            (seed >> 33) % n
        };
        const TENANTS: [Option<&str>; 4] = [None, Some("a"), Some("b"), Some("c")];
        for step in 0..160 {
            let (got, _) = snapshot(store.backend().status(&name).await.unwrap());
            match next(10) {
                0..=4 => {
                    let t = TENANTS[next(4) as usize];
                    let a = AdmitRequest {
                        acquire: request(t, 1 + next(2) as u32),
                        cost: 1,
                        update: false,
                        at_head: false,
                    };
                    let mut answers = Vec::new();
                    for s in [&store, &model] {
                        let adm = s.backend().admission().unwrap();
                        answers.push(answer(adm.admit(&name, 4, &config, &a).await.unwrap()));
                    }
                    assert_eq!(answers[0], answers[1], "step {step}: {t:?}");
                    if answers[0].starts_with("queued") {
                        queued.insert(a.acquire.lease_id, a);
                    }
                }
                5..=7 if !got.is_empty() => {
                    let h = got[next(got.len() as u64) as usize];
                    for s in [&store, &model] {
                        assert!(s.backend().release(&name, h).await.unwrap());
                    }
                }
                _ => {
                    let (_, order) = snapshot(store.backend().status(&name).await.unwrap());
                    for id in order {
                        let a = &queued[&id];
                        let mut answers = Vec::new();
                        for s in [&store, &model] {
                            let adm = s.backend().admission().unwrap();
                            answers.push(answer(adm.admit(&name, 4, &config, a).await.unwrap()));
                        }
                        assert_eq!(answers[0], answers[1], "step {step}: queued {id}");
                    }
                }
            }
            assert_eq!(
                snapshot(store.backend().status(&name).await.unwrap()),
                snapshot(model.backend().status(&name).await.unwrap()),
                "step {step}: holders and queue"
            );
        }
    }

    /// A name without limits runs the commands it ran before limits existed: an
    /// uncontended acquire and release touch the meta hash alone (TIME, HMGET, HSET), and a
    /// name with limits beside it on the same server changes nothing there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_name_without_limits_runs_the_same_commands() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "cmds").await;
        store
            .set_tenant_limits("other", "bulk", limits(Some(1), 1))
            .await
            .unwrap();
        let name = Name::new("plain").unwrap();
        let b = store.backend();
        // Warm: the state exists, the library is loaded.
        let r = request(None, 1);
        assert!(ask(&store, &name, 2, &r).await);
        assert!(b.release(&name, r.lease_id).await.unwrap());
        let before = server.command_calls();
        for _ in 0..10 {
            let r = request(None, 1);
            assert!(ask(&store, &name, 2, &r).await);
            assert!(b.release(&name, r.lease_id).await.unwrap());
        }
        let after = server.command_calls();
        let delta =
            |c: &str| after.get(c).copied().unwrap_or(0) - before.get(c).copied().unwrap_or(0);
        for (cmd, n) in [("time", 20), ("hmget", 20), ("hset", 20)] {
            assert_eq!(delta(cmd), n, "{cmd}: {after:?}");
        }
        // (Less the INFO that read `before`.)
        let all: u64 = after.values().sum::<u64>() - before.values().sum::<u64>() - 1;
        assert_eq!(
            all,
            20 + 60,
            "10 pairs: 20 calls, 60 commands inside: {after:?}"
        );
    }
}
