//! Fair shares between tenants (`docs/fair-shares.md`) on every store that orders its queue
//! by start tags — the memory store (the reference model), SQLite, MariaDB, PostgreSQL and
//! Redis (one test also on a Redis Cluster), each test private to its store: backlogged tenants are served in proportion to their shares, a light tenant
//! does not wait behind another's backlog (semaphore and admission queues), one tenant
//! stays FIFO, the queue follows the start-tag model step by step, and a store that cannot
//! order by shares refuses a tenant with a typed error.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tessera::backend::stores::MemoryBackend;
use tessera::backend::*;
use tessera::{Error, LeaseId, RateMode, Result, SemaphoreOptions, SemaphoreStatus, Store, Tenant};

/// What a store of a test needs kept alive while it is used: its file's directory, or its
/// throwaway server.
type Keep = Option<Box<dyn std::any::Any + Send>>;

/// A store with fair shares, private to one test.
struct Fixture {
    store: Store,
    _keep: Keep,
}

impl Fixture {
    fn backend(&self) -> &dyn Backend {
        self.store.backend().as_ref()
    }
}

async fn memory(test: &str) -> Fixture {
    let url = format!("memory://fair-{test}-{}", LeaseId::random());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: None,
    }
}

async fn sqlite(test: &str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/{test}.db", dir.path().display());
    Fixture {
        store: Store::connect(&url).await.unwrap(),
        _keep: Some(Box::new(dir)),
    }
}

/// A throwaway MariaDB (it dies with the thread that started it: the test's own).
async fn mariadb(test: &str) -> Fixture {
    let server = tessera_testkit::servers::mysql::MariaDbServer::start();
    Fixture {
        store: Store::connect(&server.url(test)).await.unwrap(),
        _keep: Some(Box::new(server)),
    }
}

/// A throwaway PostgreSQL server (stopped on drop), its schema named after the test.
#[cfg(feature = "postgres")]
async fn postgres(test: &str) -> Fixture {
    let server = tessera_testkit::servers::postgres::PostgresServer::start();
    Fixture {
        store: Store::connect(&server.url_with_schema(test)).await.unwrap(),
        _keep: Some(Box::new(server)),
    }
}

/// Every test below, run on the store `$make` connects (a function of the test's name).
macro_rules! on_store {
    ($store:ident, $make:path) => {
        mod $store {
            use super::*;

            #[tokio::test]
            async fn backlogged_tenants_are_served_in_proportion_to_their_shares() {
                let f = $make("shares").await;
                super::backlogged_tenants_are_served_in_proportion_to_their_shares(f.backend())
                    .await;
            }

            #[tokio::test]
            async fn a_light_tenant_waits_behind_one_grant_of_a_flood_not_the_whole_backlog() {
                let f = $make("flood").await;
                super::a_light_tenant_waits_behind_one_grant_of_a_flood(f.backend()).await;
            }

            #[tokio::test]
            async fn a_light_tenants_admission_waits_behind_one_of_a_flood() {
                let f = $make("admission").await;
                super::a_light_tenants_admission_waits_behind_one_of_a_flood(f.backend()).await;
            }

            #[tokio::test]
            async fn one_tenant_and_no_tenant_are_fifo() {
                let f = $make("fifo").await;
                super::one_tenant_and_no_tenant_are_fifo(f.backend()).await;
            }

            #[tokio::test]
            async fn an_idle_tenant_banks_no_credit() {
                let f = $make("bank").await;
                super::an_idle_tenant_banks_no_credit(f.backend()).await;
            }

            #[tokio::test]
            async fn an_idle_semaphore_forgets_every_tag() {
                let f = $make("idle").await;
                super::an_idle_semaphore_forgets_every_tag(f.backend()).await;
            }

            #[tokio::test]
            async fn status_shows_each_tenants_holders_and_waiters() {
                let f = $make("usage").await;
                super::status_shows_each_tenants_holders_and_waiters(f.backend()).await;
            }

            #[tokio::test]
            async fn a_semaphore_with_tenants_accepts_them_through_the_api() {
                let f = $make("api").await;
                super::a_semaphore_with_tenants_accepts_them_through_the_api(&f.store).await;
            }

            /// Invariants 1 and 2 of `docs/fair-shares.md`: the holders and the queue order
            /// follow the start-tag model step by step, tenants or none.
            #[test]
            fn queue_order_follows_the_start_tag_model() {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                // Connected on this thread, which outlives every case (a throwaway server
                // dies with the thread that started it).
                let f = rt.block_on($make("model"));
                super::queue_order_follows_the_start_tag_model(&rt, f.backend());
            }
        }
    };
}

on_store!(memory_store, memory);
on_store!(sqlite_store, sqlite);
on_store!(mariadb_store, mariadb);
#[cfg(feature = "postgres")]
on_store!(postgres_store, postgres);

/// The tests of a store whose step locks the semaphore, where a process's new requests on
/// one name wait their turn in the process (`Capabilities::arrivals_in_flight`).
macro_rules! on_locked_store {
    ($store:ident, $make:path) => {
        mod $store {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_flood_sent_at_once_does_not_hold_back_another_tenants_request() {
                let f = $make("arrivals").await;
                super::a_flood_sent_at_once_does_not_hold_back_another_tenants_request(&f.store)
                    .await;
            }
        }
    };
}

on_locked_store!(sqlite_arrivals, sqlite);
on_locked_store!(mariadb_arrivals, mariadb);
#[cfg(feature = "postgres")]
on_locked_store!(postgres_arrivals, postgres);

/// Through the public API, where a user meets it: 400 requests of one tenant sent at once
/// (the permit is held, so they all queue) do not go to the store ahead of another tenant's
/// request sent just after them, nor ahead of a status read: when the other tenant's waiter
/// first shows in the queue, most of the flood has not reached the store yet. Without the
/// process's arrival gate the flood's steps all queue for the connections first, and every
/// status read sees all 400 before the light one.
async fn a_flood_sent_at_once_does_not_hold_back_another_tenants_request(store: &Store) {
    const FLOOD: usize = 400;
    assert!(store.backend().capabilities().arrivals_in_flight > 0);
    let name = "arrivals";
    let sem = |tenant: &str| {
        let opts = SemaphoreOptions::default().tenant(Tenant::new(tenant, 1).unwrap());
        tessera::Semaphore::new(store, name, 1, opts).unwrap()
    };
    let held = sem("holder").acquire().await.unwrap();
    let bulk = sem("bulk");
    let mut flood = Vec::new();
    for _ in 0..FLOOD {
        let bulk = bulk.clone();
        flood.push(tokio::spawn(async move { bulk.acquire().await }));
    }
    let count = |s: &SemaphoreStatus, t: &str| {
        s.queue
            .iter()
            .filter(|w| w.tenant.as_deref() == Some(t))
            .count()
    };
    loop {
        let s = store.status(name).await.unwrap().unwrap();
        if count(&s, "bulk") > 0 {
            break;
        }
    }
    let light = sem("light");
    let light = tokio::spawn(async move { light.acquire().await });
    let ahead = loop {
        let s = store.status(name).await.unwrap().unwrap();
        if count(&s, "light") == 1 {
            break count(&s, "bulk");
        }
        assert!(
            count(&s, "bulk") < FLOOD,
            "the whole flood reached the store first"
        );
    };
    assert!(
        ahead < FLOOD / 2,
        "{ahead} of the flood's {FLOOD} requests reached the store before the light one"
    );
    for t in &flood {
        t.abort();
    }
    light.abort();
    drop(held);
}

/// Admissions of mixed tenants and costs are granted on PostgreSQL in the reference model's
/// order (its step runs in PL/pgSQL functions, `tessera_admit`).
#[cfg(feature = "postgres")]
#[tokio::test]
async fn on_postgres_admissions_are_ordered_as_on_the_memory_store() {
    let f = postgres("admit").await;
    assert_eq!(
        admission_order(&f.store).await,
        admission_order(&memory("as-postgres").await.store).await
    );
}

const WAIT: WaitSpec = WaitSpec {
    waiter_ttl: Duration::from_secs(3_600),
    queue_cap: 100_000,
};

fn request(tenant: Option<(&str, u32)>, weight: u32) -> AcquireRequest {
    AcquireRequest {
        lease_id: LeaseId::random(),
        weight,
        ttl: Duration::from_secs(3_600),
        holder: tenant.map_or("-", |t| t.0).to_string(),
        wait: Some(WAIT),
        tenant: tenant.map(|(n, s)| Tenant::new(n, s).unwrap()),
        first_send: false,
    }
}

/// Queues `req`; `true` if it was granted at once.
async fn ask(b: &dyn Backend, name: &Name, capacity: u32, req: &AcquireRequest) -> bool {
    match b.acquire(name, capacity, req).await.unwrap() {
        AcquireReply::Granted(_) => true,
        AcquireReply::Queued { .. } => false,
        other => panic!("{other:?}"),
    }
}

/// Releases every holder one at a time, `n` times, and returns the holder labels (tenants)
/// in the order they were granted.
async fn serve(b: &dyn Backend, name: &Name, n: usize) -> Vec<String> {
    let mut order = Vec::new();
    for _ in 0..n {
        let status = b.status(name).await.unwrap().unwrap();
        let h = status.holders.first().expect("a holder").clone();
        assert!(b.release(name, h.lease_id).await.unwrap());
        let status = b.status(name).await.unwrap().unwrap();
        if let Some(next) = status.holders.first() {
            order.push(next.holder.clone());
        }
    }
    order
}

fn count(order: &[String]) -> HashMap<&str, usize> {
    let mut c = HashMap::new();
    for t in order {
        *c.entry(t.as_str()).or_default() += 1;
    }
    c
}

async fn backlogged_tenants_are_served_in_proportion_to_their_shares(b: &dyn Backend) {
    let name = Name::new("shares").unwrap();
    assert!(
        ask(b, &name, 1, &request(None, 1)).await,
        "the first holder"
    );
    for _ in 0..200 {
        for (t, share) in [("a", 1), ("b", 2), ("c", 3)] {
            assert!(!ask(b, &name, 1, &request(Some((t, share)), 1)).await);
        }
    }
    let order = serve(b, &name, 600).await;
    // Over every prefix of 60 grants the shares hold to within one request per tenant.
    for end in (60..=300).step_by(60) {
        let c = count(&order[..end]);
        for (t, share) in [("a", 1), ("b", 2), ("c", 3)] {
            let want = end * share / 6;
            let got = c[t];
            assert!(
                got.abs_diff(want) <= 1,
                "{t} got {got} of the first {end} grants, its share is {want}"
            );
        }
    }
    // Once a and b run out, c takes every grant (work-conserving).
    let c = count(&order);
    assert_eq!((c["a"], c["b"]), (200, 200), "{c:?}");
    assert_eq!(c["c"], 200, "{c:?}");
}

async fn a_light_tenant_waits_behind_one_grant_of_a_flood(b: &dyn Backend) {
    let name = Name::new("flood").unwrap();
    assert!(ask(b, &name, 1, &request(Some(("bulk", 1)), 1)).await);
    for _ in 0..1_000 {
        assert!(!ask(b, &name, 1, &request(Some(("bulk", 1)), 1)).await);
    }
    for round in 0..5 {
        let light = request(Some(("alerts", 1)), 1);
        assert!(!ask(b, &name, 1, &light).await);
        let queue = b.status(&name).await.unwrap().unwrap().queue;
        let place = queue
            .iter()
            .position(|w| w.lease_id == light.lease_id)
            .unwrap();
        assert!(
            place <= 1,
            "round {round}: place {place} of {}",
            queue.len()
        );
        let order = serve(b, &name, 2).await;
        assert!(order.contains(&"alerts".to_string()), "{order:?}");
    }
}

async fn one_tenant_and_no_tenant_are_fifo(b: &dyn Backend) {
    for (i, tenant) in [None, Some(("only", 3))].into_iter().enumerate() {
        let name = Name::new(format!("fifo-{i}")).unwrap();
        assert!(ask(b, &name, 2, &request(tenant, 2)).await);
        let mut ids = Vec::new();
        for i in 0..50 {
            let r = request(tenant, 1 + (i % 2));
            assert!(!ask(b, &name, 2, &r).await);
            ids.push(r.lease_id);
        }
        let queue = b.status(&name).await.unwrap().unwrap().queue;
        let order: Vec<LeaseId> = queue.iter().map(|w| w.lease_id).collect();
        assert_eq!(order, ids, "{tenant:?}: arrival order");
    }
}

/// A tenant idle for a while competes from now: it gets no credit for the time it did not
/// ask, so it does not take a run of grants when it comes back.
async fn an_idle_tenant_banks_no_credit(b: &dyn Backend) {
    let name = Name::new("bank").unwrap();
    assert!(ask(b, &name, 1, &request(Some(("a", 1)), 1)).await);
    for _ in 0..100 {
        assert!(!ask(b, &name, 1, &request(Some(("a", 1)), 1)).await);
    }
    serve(b, &name, 50).await;
    for _ in 0..20 {
        assert!(!ask(b, &name, 1, &request(Some(("b", 1)), 1)).await);
    }
    let order = serve(b, &name, 20).await;
    let c = count(&order);
    assert!(c["b"].abs_diff(10) <= 1, "{c:?}: b alternates with a");
}

/// An idle semaphore (no holders, no waiters) restarts every tag at 0: a tenant that took
/// many grants before it went idle is not behind a newcomer afterwards.
async fn an_idle_semaphore_forgets_every_tag(b: &dyn Backend) {
    let name = Name::new("idle").unwrap();
    let first = request(Some(("b", 1)), 1);
    assert!(ask(b, &name, 1, &first).await);
    for _ in 0..30 {
        assert!(!ask(b, &name, 1, &request(Some(("b", 1)), 1)).await);
    }
    serve(b, &name, 30).await;
    let last = b.status(&name).await.unwrap().unwrap().holders[0].lease_id;
    assert!(b.release(&name, last).await.unwrap());
    assert!(b.status(&name).await.unwrap().is_none(), "idle");
    // From idle, b (31 grants before) and a (none) start level: served in arrival order.
    assert!(ask(b, &name, 1, &request(Some(("c", 1)), 1)).await);
    let (b1, a1) = (request(Some(("b", 1)), 1), request(Some(("a", 1)), 1));
    assert!(!ask(b, &name, 1, &b1).await);
    assert!(!ask(b, &name, 1, &a1).await);
    let queue = b.status(&name).await.unwrap().unwrap().queue;
    let order: Vec<LeaseId> = queue.iter().map(|w| w.lease_id).collect();
    assert_eq!(order, vec![b1.lease_id, a1.lease_id], "arrival order");
}

/// An admission waits in the same queue, by the same tags: a light tenant's admission is
/// placed behind at most one of a flood's, and granted by its own step within two grants.
async fn a_light_tenants_admission_waits_behind_one_of_a_flood(b: &dyn Backend) {
    let a = b
        .admission()
        .expect("a store with fair shares has admission");
    let name = Name::new("admit").unwrap();
    let config = RateConfig::new(&["100000/h".parse().unwrap()], RateMode::Exact).unwrap();
    let admit = |tenant| AdmitRequest {
        acquire: request(Some((tenant, 1)), 1),
        cost: 1,
        update: false,
        at_head: false,
    };
    let first = admit("bulk");
    assert!(matches!(
        a.admit(&name, 1, &config, &first).await.unwrap(),
        AdmitReply::Granted { .. }
    ));
    let mut queued = Vec::new();
    for _ in 0..20 {
        let r = admit("bulk");
        assert!(matches!(
            a.admit(&name, 1, &config, &r).await.unwrap(),
            AdmitReply::Queued { .. }
        ));
        queued.push(r);
    }
    let light = admit("alerts");
    let AdmitReply::Queued { position, .. } = a.admit(&name, 1, &config, &light).await.unwrap()
    else {
        panic!("the light admission is queued")
    };
    let queue = b.status(&name).await.unwrap().unwrap().queue;
    let place = queue
        .iter()
        .position(|w| w.lease_id == light.acquire.lease_id)
        .unwrap();
    assert_eq!(position, place as u64, "the reply's position is its place");
    assert!(place <= 1, "place {place} of {}", queue.len());
    queued.insert(place, light.clone());
    // Served in queue order: each head, woken by the release, is granted by its own step.
    let mut holder = first.acquire.lease_id;
    for (i, next) in queued.iter().take(3).enumerate() {
        assert!(b.release(&name, holder).await.unwrap());
        match a.admit(&name, 1, &config, next).await.unwrap() {
            AdmitReply::Granted { grant, .. } => holder = grant.lease.lease_id,
            other => panic!("grant {i}: {other:?}"),
        }
    }
}

/// `status` shows each holder's and waiter's tenant, and per tenant what it holds and asks
/// for (`SemaphoreStatus::tenants`), also for leases granted by a hand-off.
async fn status_shows_each_tenants_holders_and_waiters(b: &dyn Backend) {
    use tessera::TenantUsage;
    let name = Name::new("usage").unwrap();
    let usage = |tenant: &str, holders, used, waiters, waiting| TenantUsage {
        tenant: tenant.to_string(),
        holders,
        used,
        waiters,
        waiting,
        ..TenantUsage::default()
    };
    let a = request(Some(("a", 1)), 2);
    let b1 = request(Some(("b", 1)), 1);
    assert!(ask(b, &name, 3, &a).await);
    assert!(ask(b, &name, 3, &b1).await);
    // Queued in tag order: no tenant (0), b (1000), a (2000).
    for r in [
        request(None, 1),
        request(Some(("a", 1)), 1),
        request(Some(("b", 1)), 2),
    ] {
        assert!(!ask(b, &name, 3, &r).await);
    }
    let status = b.status(&name).await.unwrap().unwrap();
    let tenants = |s: &SemaphoreStatus| {
        (
            s.holders
                .iter()
                .map(|h| h.tenant.clone())
                .collect::<Vec<_>>(),
            s.queue.iter().map(|w| w.tenant.clone()).collect::<Vec<_>>(),
        )
    };
    let (mut held, queued) = tenants(&status);
    held.sort();
    let some = |t: &str| Some(t.to_string());
    assert_eq!(held, vec![some("a"), some("b")]);
    assert_eq!(queued, vec![None, some("b"), some("a")]);
    assert_eq!(
        status.tenants(),
        vec![
            usage("", 0, 0, 1, 1),
            usage("a", 1, 2, 1, 1),
            usage("b", 1, 1, 1, 2)
        ]
    );
    // b's release hands its permit to the request without a tenant; a's hands two to b.
    assert!(b.release(&name, b1.lease_id).await.unwrap());
    assert!(b.release(&name, a.lease_id).await.unwrap());
    let status = b.status(&name).await.unwrap().unwrap();
    assert_eq!(
        status.tenants(),
        vec![
            usage("", 1, 1, 0, 0),
            usage("a", 0, 0, 1, 1),
            usage("b", 1, 2, 0, 0)
        ]
    );
    for h in status.holders.clone() {
        assert!(b.release(&name, h.lease_id).await.unwrap());
    }
    for h in b.status(&name).await.unwrap().map_or(vec![], |s| s.holders) {
        assert!(b.release(&name, h.lease_id).await.unwrap());
    }
    assert!(b.status(&name).await.unwrap().is_none(), "nothing left");
}

/// Through the public API: a semaphore whose options name a tenant is accepted and granted.
async fn a_semaphore_with_tenants_accepts_them_through_the_api(store: &Store) {
    let opts = SemaphoreOptions::default().tenant(Tenant::new("sms", 2).unwrap());
    let sem = tessera::Semaphore::new(store, "t", 2, opts).unwrap();
    let permit = sem.acquire().await.unwrap();
    assert_eq!(store.status("t").await.unwrap().unwrap().used, 1);
    permit.release().await.unwrap();
}

#[test]
fn a_tenant_is_checked() {
    for (name, share) in [("", 1), ("x", 0), ("x", 1_001)] {
        let err = Tenant::new(name, share).unwrap_err();
        assert!(err.to_string().contains("tenant") || err.to_string().contains("share"));
    }
}

/// The memory store declaring no fair shares: a store that cannot order by shares.
#[derive(Debug)]
struct NoShares(MemoryBackend);

#[async_trait]
impl Backend for NoShares {
    async fn acquire(&self, n: &Name, c: u32, r: &AcquireRequest) -> Result<AcquireReply> {
        self.0.acquire(n, c, r).await
    }
    async fn heartbeat(&self, n: &Name, l: LeaseId, ttl: Duration) -> Result<WaitReply> {
        self.0.heartbeat(n, l, ttl).await
    }
    async fn cancel(&self, n: &Name, l: LeaseId) -> Result<CancelReply> {
        self.0.cancel(n, l).await
    }
    async fn release(&self, n: &Name, l: LeaseId) -> Result<bool> {
        self.0.release(n, l).await
    }
    async fn renew(&self, n: &Name, l: LeaseId, ttl: Duration) -> Result<RenewReply> {
        self.0.renew(n, l, ttl).await
    }
    async fn status(&self, n: &Name) -> Result<Option<SemaphoreStatus>> {
        self.0.status(n).await
    }
    async fn list(&self) -> Result<Vec<String>> {
        self.0.list().await
    }
    async fn resize(&self, n: &Name, c: u32) -> Result<u32> {
        self.0.resize(n, c).await
    }
    async fn revoke(&self, n: &Name, l: LeaseId) -> Result<bool> {
        self.0.revoke(n, l).await
    }
    async fn delete(&self, n: &Name) -> Result<bool> {
        self.0.delete(n).await
    }
    fn capabilities(&self) -> Capabilities {
        let mut caps = self.0.capabilities();
        caps.fair_shares = false;
        caps
    }
}

#[tokio::test]
async fn a_tenant_is_refused_where_the_store_cannot_order_by_shares() {
    let backend = NoShares(MemoryBackend::connect("memory://fair-refused").unwrap());
    let store = Store::from_backend(Arc::new(backend), "memory://fair-refused");
    let opts = SemaphoreOptions::default().tenant(Tenant::new("sms", 2).unwrap());
    let err = tessera::Semaphore::new(&store, "t", 2, opts).unwrap_err();
    assert!(matches!(err, Error::Unsupported(_)), "{err}");
    assert!(
        store.status("t").await.unwrap().is_none(),
        "nothing changed"
    );
}

/// Admissions of mixed tenants and costs (the window cost is what the tags count): a holder,
/// then a backlog of three tenants and requests without one. Each release wakes the head,
/// whose own step is granted (`crate::admission`); returns the holders' labels in grant
/// order. The order is the reference model's on every store.
async fn admission_order(store: &Store) -> Vec<String> {
    use tessera::backend::{AdmitReply, AdmitRequest, RateConfig};
    use tessera::RateMode;
    let b = store.backend().as_ref();
    let adm = b.admission().expect("the store admits");
    let name = Name::new("admit").unwrap();
    let config = RateConfig::new(&["100000/s".parse().unwrap()], RateMode::Exact).unwrap();
    let admit = |r: AcquireRequest, cost: u32| AdmitRequest {
        acquire: r,
        cost,
        update: false,
        at_head: false,
    };
    let first = admit(request(None, 1), 1);
    assert!(matches!(
        adm.admit(&name, 1, &config, &first).await.unwrap(),
        AdmitReply::Granted { .. }
    ));
    let mut holder = first.acquire.lease_id;
    let mut order = Vec::new();
    let mut queued = HashMap::new();
    // d comes late, when its start tag is the virtual time.
    let kind = |i: u32| match i % 4 {
        _ if i >= 37 => (Some(("d", 1)), 1),
        0 => (Some(("a", 1)), 1),
        1 => (Some(("b", 2)), 3),
        2 => (None, 2),
        _ => (Some(("c", 5)), 1 + i % 3),
    };
    for i in 0..40u32 {
        let (tenant, cost) = kind(i);
        let a = admit(request(tenant, 1), cost);
        match adm.admit(&name, 1, &config, &a).await.unwrap() {
            AdmitReply::Queued { .. } => {}
            other => panic!("{other:?}"),
        }
        queued.insert(a.acquire.lease_id, a);
        if i < 20 {
            continue;
        }
        // Later arrivals meet a virtual time that the grants moved.
        assert!(b.release(&name, holder).await.unwrap());
        let head = b.status(&name).await.unwrap().unwrap().queue[0].lease_id;
        let a = queued.remove(&head).unwrap();
        match adm.admit(&name, 1, &config, &a).await.unwrap() {
            AdmitReply::Granted { grant, .. } => {
                let asked = a.acquire.tenant.as_ref().map(|t| t.name().to_string());
                assert_eq!(grant.lease.tenant, asked, "an admission's tenant");
                order.push(grant.lease.holder)
            }
            other => panic!("the head was not granted: {other:?}"),
        }
        holder = head;
    }
    while !queued.is_empty() {
        assert!(b.release(&name, holder).await.unwrap());
        let head = b.status(&name).await.unwrap().unwrap().queue[0].lease_id;
        let a = queued.remove(&head).unwrap();
        match adm.admit(&name, 1, &config, &a).await.unwrap() {
            AdmitReply::Granted { grant, .. } => {
                let asked = a.acquire.tenant.as_ref().map(|t| t.name().to_string());
                assert_eq!(grant.lease.tenant, asked, "an admission's tenant");
                order.push(grant.lease.holder)
            }
            other => panic!("the head was not granted: {other:?}"),
        }
        holder = head;
    }
    order
}

#[tokio::test]
async fn admissions_are_ordered_by_their_window_cost_and_share() {
    let order = admission_order(&memory("mixed").await.store).await;
    // c (share 5, small costs) goes first; b (share 2, cost 3) and "-" (share 1, cost 2)
    // fall behind.
    let c = count(&order[..10]);
    assert!(c["c"] > c.get("-").copied().unwrap_or(0), "{order:?}");
}

/// One step of [`queue_order_follows_the_start_tag_model`].
#[derive(Debug, Clone)]
enum Step {
    /// A waiting acquire of tenant `t` (0 is "no tenant") with this weight.
    Arrive { t: usize, weight: u32 },
    /// Release the holder at this index (modulo how many hold).
    Release(usize),
    /// Cancel the waiter at this index (modulo how many wait).
    Cancel(usize),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..4usize, 1..=2u32).prop_map(|(t, weight)| Step::Arrive { t, weight }),
        3 => any::<usize>().prop_map(Step::Release),
        1 => any::<usize>().prop_map(Step::Cancel),
    ]
}

/// The tenants of the property test: no tenant, then three with shares 1, 2 and 5.
const TENANTS: [Option<(&str, u32)>; 4] = [None, Some(("a", 1)), Some(("b", 2)), Some(("c", 5))];

/// `docs/fair-shares.md` written out plainly: tags, the queue sorted by `(S, arrival)`, strict
/// hand-off from the head, a newcomer granted at once only if it would lead and fits, and
/// everything forgotten when the semaphore is idle.
#[derive(Debug, Default)]
struct SfqModel {
    vtime: u64,
    finish: HashMap<&'static str, u64>,
    /// (start tag, arrival, lease, weight)
    queue: Vec<(u64, u64, LeaseId, u32)>,
    holders: Vec<(LeaseId, u32)>,
    arrivals: u64,
}

impl SfqModel {
    const CAPACITY: u32 = 3;

    fn used(&self) -> u32 {
        self.holders.iter().map(|h| h.1).sum()
    }

    fn arrive(&mut self, t: usize, weight: u32, lease: LeaseId) {
        if self.queue.is_empty() && self.holders.is_empty() {
            self.vtime = 0;
            self.finish.clear();
        }
        let (name, share) = TENANTS[t].unwrap_or(("", 1));
        let start = self.finish.get(name).copied().unwrap_or(0).max(self.vtime);
        self.finish
            .insert(name, start + weight as u64 * 1_000 / share as u64);
        self.arrivals += 1;
        let key = (start, self.arrivals);
        let leads = self.queue.first().is_none_or(|h| key < (h.0, h.1));
        if leads && self.used() + weight <= Self::CAPACITY {
            self.vtime = self.vtime.max(start);
            self.holders.push((lease, weight));
        } else {
            self.queue.push((start, self.arrivals, lease, weight));
            self.queue.sort();
        }
    }

    fn hand_off(&mut self) {
        while let Some(&(start, _, lease, weight)) = self.queue.first() {
            if self.used() + weight > Self::CAPACITY {
                break;
            }
            self.queue.remove(0);
            self.vtime = self.vtime.max(start);
            self.holders.push((lease, weight));
        }
    }
}

fn queue_order_follows_the_start_tag_model(rt: &tokio::runtime::Runtime, b: &dyn Backend) {
    use proptest::test_runner::{Config, TestRunner};
    let mut runner = TestRunner::new(Config::with_cases(64));
    let steps = proptest::collection::vec(step(), 1..80);
    runner
        .run(&steps, |steps| {
            rt.block_on(follow_the_model(b, steps));
            Ok(())
        })
        .unwrap();
}

/// One case of [`queue_order_follows_the_start_tag_model`], on a semaphore of its own.
async fn follow_the_model(b: &dyn Backend, steps: Vec<Step>) {
    let name = Name::new(format!("model-{}", LeaseId::random())).unwrap();
    let mut model = SfqModel::default();
    let mut tenant_of: HashMap<LeaseId, Option<String>> = HashMap::new();
    for s in steps {
        match s {
            Step::Arrive { t, weight } => {
                let r = request(TENANTS[t], weight);
                tenant_of.insert(r.lease_id, TENANTS[t].map(|t| t.0.to_string()));
                if let AcquireReply::Granted(g) =
                    b.acquire(&name, SfqModel::CAPACITY, &r).await.unwrap()
                {
                    assert_eq!(g.lease.tenant, tenant_of[&r.lease_id], "the grant's tenant");
                }
                model.arrive(t, weight, r.lease_id);
            }
            Step::Release(i) if !model.holders.is_empty() => {
                let (lease, _) = model.holders.remove(i % model.holders.len());
                assert!(b.release(&name, lease).await.unwrap());
                model.hand_off();
            }
            Step::Cancel(i) if !model.queue.is_empty() => {
                let (_, _, lease, _) = model.queue.remove(i % model.queue.len());
                b.cancel(&name, lease).await.unwrap();
                model.hand_off();
            }
            Step::Release(_) | Step::Cancel(_) => {}
        }
        let status = b.status(&name).await.unwrap();
        // Every holder and waiter shows the tenant it asked as, also after a hand-off.
        if let Some(s) = &status {
            for h in &s.holders {
                assert_eq!(h.tenant, tenant_of[&h.lease_id], "a holder's tenant: {s:?}");
            }
            for w in &s.queue {
                assert_eq!(w.tenant, tenant_of[&w.lease_id], "a waiter's tenant: {s:?}");
            }
        }
        let queue: Vec<LeaseId> = status
            .as_ref()
            .map_or(vec![], |s| s.queue.iter().map(|w| w.lease_id).collect());
        let want: Vec<LeaseId> = model.queue.iter().map(|q| q.2).collect();
        assert_eq!(queue, want, "queue order: {model:?}");
        let mut held: Vec<LeaseId> = status
            .as_ref()
            .map_or(vec![], |s| s.holders.iter().map(|h| h.lease_id).collect());
        let mut want: Vec<LeaseId> = model.holders.iter().map(|h| h.0).collect();
        held.sort();
        want.sort();
        assert_eq!(held, want, "holders: {model:?}");
    }
    // Leave nothing behind (waiters first, so no release hands them a permit).
    for (_, _, lease, _) in model.queue {
        b.cancel(&name, lease).await.unwrap();
    }
    for (lease, _) in model.holders {
        b.release(&name, lease).await.unwrap();
    }
}

/// The scenarios above on Redis: a throwaway `redis-server` per test (the model's cases
/// share one, a semaphore each), and a Redis Cluster for one.
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

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn backlogged_tenants_are_served_in_proportion_to_their_shares() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "shares").await;
        super::backlogged_tenants_are_served_in_proportion_to_their_shares(
            store.backend().as_ref(),
        )
        .await;
        assert_eq!(server.immortal_keys("shares"), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_light_tenant_waits_behind_one_grant_of_a_flood_not_the_whole_backlog() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "flood").await;
        super::a_light_tenant_waits_behind_one_grant_of_a_flood(store.backend().as_ref()).await;
        // The tenants' tags live in a hash beside the queue, and expire with it.
        let tags = server.command(&["HLEN", "{flood:flood}:tags"]);
        assert!(tags.contains(":2"), "bulk and alerts have tags: {tags:?}");
        assert_eq!(server.immortal_keys("flood"), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn status_shows_each_tenants_holders_and_waiters() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "usage").await;
        super::status_shows_each_tenants_holders_and_waiters(store.backend().as_ref()).await;
        assert_eq!(server.immortal_keys("usage"), Vec::<String>::new());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_tenant_and_no_tenant_are_fifo() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "fifo").await;
        super::one_tenant_and_no_tenant_are_fifo(store.backend().as_ref()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_idle_tenant_banks_no_credit() {
        let server = RedisServer::start();
        let store = connect(&server.url(), "bank").await;
        super::an_idle_tenant_banks_no_credit(store.backend().as_ref()).await;
    }

    /// Every key a step touches is named in the call on a cluster (one hash tag, one slot),
    /// so the tenants' tags hash moves with the rest of the state.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_a_cluster_a_light_tenant_waits_behind_one_grant_and_shares_hold() {
        let cluster = RedisCluster::start(false);
        let store = connect(&cluster.url(), "fair").await;
        super::a_light_tenant_waits_behind_one_grant_of_a_flood(store.backend().as_ref()).await;
        super::backlogged_tenants_are_served_in_proportion_to_their_shares(
            store.backend().as_ref(),
        )
        .await;
    }

    /// Admissions with tenants take the order the reference model gives them.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn admissions_are_ordered_as_on_the_memory_store() {
        let server = RedisServer::start();
        let redis = admission_order(&connect(&server.url(), "admit").await).await;
        assert_eq!(
            redis,
            admission_order(&memory("as-redis").await.store).await
        );
    }

    /// Invariants 1 and 2 on Redis: the holders and queue order follow the start-tag model
    /// step by step, tenants or none (a semaphore per case on one server).
    #[test]
    fn queue_order_follows_the_start_tag_model() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let server = RedisServer::start();
        let store = rt.block_on(connect(&server.url(), "model"));
        super::queue_order_follows_the_start_tag_model(&rt, store.backend().as_ref());
        rt.block_on(store.close()).unwrap();
    }
}
