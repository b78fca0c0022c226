//! Tests of the SQLite store: real processes contending on one file, damaged rows, URLs and
//! the fence high-water mark. The differential test against the reference model is
//! `tests/sqlite_store.rs` (the test kit's `differential`).

use std::sync::Arc;
use std::time::Duration;

use super::*;
use tessera_core::clock::ManualClock;

const T0: StoreTime = StoreTime(1_800_000_000_000_000);

fn temp_db() -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/t.db", dir.path().display());
    (dir, url)
}

fn name(s: &str) -> Name {
    Name::new(s).unwrap()
}

fn req(lease: LeaseId, weight: u32, wait: Option<WaitSpec>) -> AcquireRequest {
    AcquireRequest {
        lease_id: lease,
        weight,
        ttl: Duration::from_secs(10),
        holder: "h/1".into(),
        wait,
        tenant: None,
        first_send: false,
    }
}

fn waiting() -> Option<WaitSpec> {
    Some(WaitSpec {
        waiter_ttl: Duration::from_secs(6),
        queue_cap: 100,
    })
}

async fn sqlite_at(url: &str, clock: &Arc<ManualClock>) -> SqliteBackend {
    SqliteBackend::connect_with_clock(url, Arc::clone(clock) as Arc<dyn Clock>)
        .await
        .unwrap()
}

#[tokio::test]
async fn large_head_is_not_overtaken_and_seats_stay_below_capacity_after_shrink() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let b = sqlite_at(&url, &clock).await;
    let s = name("shrink");
    let ids: Vec<LeaseId> = (0..4).map(|_| LeaseId::random()).collect();
    for id in &ids {
        assert!(matches!(
            b.acquire(&s, 4, &req(*id, 1, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
    assert_eq!(b.resize(&s, 2).await.unwrap(), 4);
    // Seats 0 and 1 go; 2 and 3 stay held above the new capacity.
    assert!(b.release(&s, ids[0]).await.unwrap());
    assert!(b.release(&s, ids[1]).await.unwrap());
    let big = LeaseId::random();
    let small = LeaseId::random();
    assert_eq!(
        b.acquire(&s, 2, &req(big, 2, waiting())).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert_eq!(
        b.acquire(&s, 2, &req(small, 1, waiting())).await.unwrap(),
        AcquireReply::Queued { position: 1 }
    );
    assert!(b.release(&s, ids[2]).await.unwrap());
    // used 1 of 2: the head (2) does not fit and the small one behind it must not pass.
    assert_eq!(
        b.heartbeat(&s, small, Duration::from_secs(6))
            .await
            .unwrap(),
        WaitReply::Waiting
    );
    assert!(b.release(&s, ids[3]).await.unwrap());
    let WaitReply::Granted(g) = b.heartbeat(&s, big, Duration::from_secs(6)).await.unwrap() else {
        panic!("head not granted")
    };
    assert_eq!(g.lease.seats, vec![0, 1]);
}

/// Real processes on one file: no "database is locked", never more than C holders at once.
#[test]
fn processes_contending_on_one_file_never_over_grant() {
    const CHILDREN: usize = 4;
    const CAPACITY: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("procs.db");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|i| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "stores::sqlite::tests::child_process_worker",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("TESSERA_SQLITE_CHILD_DB", &db)
                .env(
                    "TESSERA_SQLITE_CHILD_LOG",
                    dir.path().join(format!("log{i}")),
                )
                .env("TESSERA_SQLITE_CHILD_CAPACITY", CAPACITY.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "child failed: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Each line: enter_us exit_us seat fence. Entry is stamped after the grant committed and
    // exit before the release started, so overlapping intervals were held at the same time.
    let mut events = Vec::new();
    let mut intervals = 0;
    for i in 0..CHILDREN {
        let log = std::fs::read_to_string(dir.path().join(format!("log{i}"))).unwrap();
        for line in log.lines() {
            let v: Vec<u64> = line.split(' ').map(|x| x.parse().unwrap()).collect();
            events.push((v[0], 1i64, v[2]));
            events.push((v[1], -1i64, v[2]));
            intervals += 1;
        }
    }
    assert_eq!(intervals, CHILDREN * CHILD_ROUNDS);
    // At equal stamps, exits first: touching intervals do not overlap.
    events.sort_by_key(|&(t, d, _)| (t, d));
    let (mut held, mut max) = (0i64, 0i64);
    let mut seats = std::collections::HashSet::new();
    for (_, d, seat) in events {
        held += d;
        if d > 0 {
            assert!(seats.insert(seat), "seat {seat} granted twice at once");
        } else {
            seats.remove(&seat);
        }
        max = max.max(held);
    }
    assert!(
        max <= CAPACITY as i64,
        "{max} holders at once on capacity {CAPACITY}"
    );
}

const CHILD_ROUNDS: usize = 40;

/// The body of one child process of the test above; does nothing in a normal test run.
#[test]
fn child_process_worker() {
    let Ok(db) = std::env::var("TESSERA_SQLITE_CHILD_DB") else {
        return;
    };
    let log = std::env::var("TESSERA_SQLITE_CHILD_LOG").unwrap();
    let capacity: u32 = std::env::var("TESSERA_SQLITE_CHILD_CAPACITY")
        .unwrap()
        .parse()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let store = crate::Store::connect(&format!("sqlite://{db}"))
            .await
            .unwrap();
        let sem = store.semaphore("procs", capacity).unwrap();
        let mut lines = String::new();
        let mut last_fence = 0;
        for _ in 0..CHILD_ROUNDS {
            let permit = sem.acquire().await.unwrap();
            let enter = StoreTime::host_now().0;
            assert!(permit.fence() > last_fence);
            last_fence = permit.fence();
            let st = sem.status().await.unwrap();
            assert!(st.used <= capacity && st.holders.len() as u64 <= u64::from(capacity));
            std::thread::sleep(Duration::from_micros(500));
            let exit = StoreTime::host_now().0;
            lines.push_str(&format!(
                "{enter} {exit} {} {}\n",
                permit.seats()[0],
                permit.fence()
            ));
            assert!(permit.release().await.unwrap());
        }
        std::fs::write(log, lines).unwrap();
    });
}

/// Turns the semaphore rows of the file (kept) back into those of schema version 5, one row
/// per semaphore with `queued`, `next_seq` and `finish` and no tail rows (`schema_6.sql`
/// undone); the version is left for the caller to set.
const TO_ONE_ROW: &str = "ALTER TABLE tessera_semaphores ADD COLUMN queued INTEGER NOT NULL DEFAULT 0; \
     ALTER TABLE tessera_semaphores ADD COLUMN next_seq INTEGER NOT NULL DEFAULT 0; \
     ALTER TABLE tessera_semaphores ADD COLUMN finish INTEGER NOT NULL DEFAULT 0; \
     UPDATE tessera_semaphores SET \
       queued = (SELECT t.enqueued FROM tessera_tails t WHERE t.name = tessera_semaphores.name) - dequeued, \
       next_seq = (SELECT t.next_seq FROM tessera_tails t WHERE t.name = tessera_semaphores.name), \
       finish = (SELECT t.finish FROM tessera_tails t WHERE t.name = tessera_semaphores.name); \
     ALTER TABLE tessera_semaphores DROP COLUMN dequeued; DROP TABLE tessera_tails;";

async fn raw(url: &str, sql: &'static str) {
    let b = SqliteBackend::connect(url).await.unwrap();
    sqlx::query(sql).execute(&b.pool).await.unwrap();
}

/// Turns the file at `url` (its rows kept) into one of schema version 2, from before the
/// holder and waiter rows kept their tenant: no tenant columns; then runs `more`.
async fn to_version_2(url: &str, more: &str) {
    let b = SqliteBackend::connect(url).await.unwrap();
    let sql = format!(
        "{TO_ONE_ROW} DROP TABLE tessera_tenant_limits; \
         ALTER TABLE tessera_holders DROP COLUMN tenant; \
         ALTER TABLE tessera_waiters DROP COLUMN tenant; \
         UPDATE tessera_meta SET value = 2 WHERE key = 'schema_version'; {more}"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&b.pool)
        .await
        .unwrap();
}

/// A file of schema version 2 (before holder and waiter rows kept their tenant) is migrated
/// at connect: its holder and its waiter stay, naming no tenant; the waiter is handed the
/// permit as before, and a tenant named from then on is kept on its waiter row and on the
/// holder row it becomes.
#[tokio::test]
async fn a_file_of_version_2_is_migrated_and_keeps_its_holder_and_waiter() {
    let (_dir, url) = temp_db();
    let s = name("v2");
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    {
        let b = SqliteBackend::connect(&url).await.unwrap();
        assert!(matches!(
            b.acquire(&s, 1, &req(holder, 1, waiting())).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        assert!(matches!(
            b.acquire(&s, 1, &req(waiter, 1, waiting())).await.unwrap(),
            AcquireReply::Queued { position: 0 }
        ));
    }
    to_version_2(&url, "").await;
    let b = SqliteBackend::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(version, 6);
    let rows = |st: SemaphoreStatus| {
        let holders: Vec<_> = st
            .holders
            .iter()
            .map(|h| (h.lease_id, h.tenant.clone()))
            .collect();
        let queue: Vec<_> = st
            .queue
            .iter()
            .map(|w| (w.lease_id, w.tenant.clone()))
            .collect();
        (holders, queue)
    };
    let st = b.status(&s).await.unwrap().unwrap();
    assert_eq!(rows(st), (vec![(holder, None)], vec![(waiter, None)]));
    let mut named = req(LeaseId::random(), 1, waiting());
    named.tenant = Some(tessera_core::model::Tenant::new("t", 1).unwrap());
    let t = Some("t".to_string());
    assert_eq!(
        b.acquire(&s, 1, &named).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    assert!(b.release(&s, holder).await.unwrap());
    let st = b.status(&s).await.unwrap().unwrap();
    assert_eq!(rows(st), (vec![(named.lease_id, t)], vec![(waiter, None)]));
    assert!(b.release(&s, named.lease_id).await.unwrap());
    let st = b.status(&s).await.unwrap().unwrap();
    assert_eq!(rows(st), (vec![(waiter, None)], vec![]));
    // Connecting again changes nothing.
    drop(b);
    let b = SqliteBackend::connect(&url).await.unwrap();
    assert_eq!(b.status(&s).await.unwrap().unwrap().holders.len(), 1);
}

/// Turns the file at `url` (its rows kept) into one of schema version 3, from before tenants'
/// limits: no limits table.
async fn to_version_3(url: &str) {
    let b = SqliteBackend::connect(url).await.unwrap();
    let sql = format!(
        "{TO_ONE_ROW} DROP TABLE tessera_tenant_limits; \
         UPDATE tessera_meta SET value = 3 WHERE key = 'schema_version'"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&b.pool)
        .await
        .unwrap();
}

/// A file of schema version 3 (before tenants' limits) holding a holder and a waiter is
/// migrated at connect to version 4: both stay, and limits set from then on apply to them
/// (a floor keeps the permit the holder frees from the waiter of another tenant, and
/// clearing it hands the permit on).
#[tokio::test]
async fn a_file_of_version_3_is_migrated_keeps_its_holder_and_waiter_and_takes_limits() {
    let (_dir, url) = temp_db();
    let s = name("v3");
    let tenant = |t: &str| Some(tessera_core::model::Tenant::new(t, 1).unwrap());
    let (mut holder, mut waiter) = (
        req(LeaseId::random(), 1, waiting()),
        req(LeaseId::random(), 1, waiting()),
    );
    (holder.tenant, waiter.tenant) = (tenant("a"), tenant("a"));
    {
        let b = SqliteBackend::connect(&url).await.unwrap();
        assert!(matches!(
            b.acquire(&s, 1, &holder).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        assert!(matches!(
            b.acquire(&s, 1, &waiter).await.unwrap(),
            AcquireReply::Queued { position: 0 }
        ));
    }
    to_version_3(&url).await;
    let b = SqliteBackend::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(version, 6);
    assert!(b.capabilities().tenant_limits);
    let ids = |st: Option<SemaphoreStatus>| {
        let st = st.unwrap();
        let holders: Vec<_> = st.holders.iter().map(|h| h.lease_id).collect();
        let queue: Vec<_> = st.queue.iter().map(|w| w.lease_id).collect();
        (holders, queue)
    };
    let (h, w) = (holder.lease_id, waiter.lease_id);
    assert_eq!(ids(b.status(&s).await.unwrap()), (vec![h], vec![w]));
    let floor = tessera_core::model::TenantLimits::new(None, 1).unwrap();
    b.set_tenant_limits(&s, "b", floor).await.unwrap();
    assert_eq!(b.tenant_limits(&s).await.unwrap()["b"], floor);
    // The permit a frees is kept for b, whose request is granted at once ahead of a's.
    assert!(b.release(&s, h).await.unwrap());
    assert_eq!(ids(b.status(&s).await.unwrap()), (vec![], vec![w]));
    let mut other = req(LeaseId::random(), 1, None);
    other.tenant = tenant("b");
    assert!(matches!(
        b.acquire(&s, 1, &other).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(b.release(&s, other.lease_id).await.unwrap());
    assert_eq!(ids(b.status(&s).await.unwrap()), (vec![], vec![w]));
    // Cleared, the floor keeps nothing: the step that clears it hands the permit on.
    b.set_tenant_limits(&s, "b", Default::default())
        .await
        .unwrap();
    assert_eq!(ids(b.status(&s).await.unwrap()), (vec![w], vec![]));
    assert!(b.tenant_limits(&s).await.unwrap().is_empty());
}

/// A file of schema version 4 (before window ceilings) holding a tenant's limits, a holder
/// and a waiter is migrated at connect to version 5: all of them stay (the limits without a
/// window ceiling), and a window ceiling set from then on is kept and holds the tenant to its
/// share of the windows (2 of 10 a minute at 20 %).
#[tokio::test]
async fn a_file_of_version_4_is_migrated_keeps_its_rows_and_takes_window_ceilings() {
    use tessera_core::model::TenantLimits;
    let (_dir, url) = temp_db();
    let s = name("v4");
    let limits = TenantLimits::new(Some(5), 0).unwrap();
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    {
        let b = SqliteBackend::connect(&url).await.unwrap();
        b.set_tenant_limits(&s, "bulk", limits).await.unwrap();
        assert!(matches!(
            b.acquire(&s, 1, &req(holder, 1, waiting())).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        assert!(matches!(
            b.acquire(&s, 1, &req(waiter, 1, waiting())).await.unwrap(),
            AcquireReply::Queued { position: 0 }
        ));
    }
    // What a build of version 4 leaves: the limits table without the window columns.
    let b = SqliteBackend::connect(&url).await.unwrap();
    let sql = format!(
        "{TO_ONE_ROW} ALTER TABLE tessera_tenant_limits DROP COLUMN window_ceiling; \
         ALTER TABLE tessera_tenant_limits DROP COLUMN window_capped_until; \
         UPDATE tessera_meta SET value = 4 WHERE key = 'schema_version'"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&b.pool)
        .await
        .unwrap();
    drop(b);
    let b = SqliteBackend::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(version, 6);
    assert!(b.capabilities().window_ceilings);
    assert_eq!(b.tenant_limits(&s).await.unwrap()["bulk"], limits);
    let st = b.status(&s).await.unwrap().unwrap();
    assert_eq!(st.holders[0].lease_id, holder);
    assert_eq!(st.queue[0].lease_id, waiter);

    let windowed = limits.with_window_ceiling(Some(20)).unwrap();
    b.set_tenant_limits(&s, "bulk", windowed).await.unwrap();
    drop(b);
    let store = crate::Store::connect(&url).await.unwrap();
    assert_eq!(store.tenant_limits("v4").await.unwrap()["bulk"], windowed);
    store
        .set_tenant_limits("w", "bulk", windowed)
        .await
        .unwrap();
    let bulk = store
        .admission("w")
        .permits(10)
        .semaphore_options(
            crate::SemaphoreOptions::default().tenant(crate::Tenant::new("bulk", 1).unwrap()),
        )
        .rate_options(crate::RateOptions::default().margin(Duration::from_secs(1)))
        .rate(crate::RateSpec::per_minute(10).unwrap())
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..4 {
        if let Some(t) = bulk.try_acquire().await.unwrap() {
            held.push(t);
        }
    }
    assert_eq!(held.len(), 2);
    // Connecting again changes nothing.
    drop(store);
    let b = SqliteBackend::connect(&url).await.unwrap();
    assert_eq!(b.tenant_limits(&s).await.unwrap()["bulk"], windowed);
}

/// A file of schema version 5 (one row per semaphore, its queue's tail in it) holding a
/// holder and three waiters is migrated at connect to version 6 in the connect's one
/// transaction: the tail moves to `tessera_tails` (the queue's length as `enqueued`), the old
/// columns are gone, the holder and the waiters stay, the waiters are granted in their order,
/// and a newcomer queues behind them.
#[tokio::test]
async fn a_file_of_version_5_is_migrated_and_keeps_its_holder_waiters_and_order() {
    let (_dir, url) = temp_db();
    let s = name("v5");
    let holder = LeaseId::random();
    let waiters: Vec<LeaseId> = (0..3).map(|_| LeaseId::random()).collect();
    {
        let b = SqliteBackend::connect(&url).await.unwrap();
        assert!(matches!(
            b.acquire(&s, 1, &req(holder, 1, waiting())).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        for (i, w) in waiters.iter().enumerate() {
            assert_eq!(
                b.acquire(&s, 1, &req(*w, 1, waiting())).await.unwrap(),
                AcquireReply::Queued { position: i as u64 }
            );
        }
    }
    let b = SqliteBackend::connect(&url).await.unwrap();
    let sql =
        format!("{TO_ONE_ROW} UPDATE tessera_meta SET value = 5 WHERE key = 'schema_version'");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&b.pool)
        .await
        .unwrap();
    let one_row: (i64, i64) =
        sqlx::query_as("SELECT queued, next_seq FROM tessera_semaphores WHERE name = 'v5'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(one_row, (3, 3), "the version-5 row");
    drop(b);
    let b = SqliteBackend::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(version, 6);
    let tail: (i64, i64, i64) = sqlx::query_as(
        "SELECT t.next_seq, t.enqueued, s.dequeued FROM tessera_tails t \
         JOIN tessera_semaphores s ON s.name = t.name WHERE t.name = 'v5'",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap();
    assert_eq!(tail, (3, 3, 0));
    let old: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pragma_table_info('tessera_semaphores') \
         WHERE name IN ('queued', 'next_seq', 'finish')",
    )
    .fetch_one(&b.pool)
    .await
    .unwrap();
    assert_eq!(old, 0, "the old columns are dropped");
    let st = b.status(&s).await.unwrap().unwrap();
    assert_eq!(st.holders[0].lease_id, holder);
    let queue: Vec<LeaseId> = st.queue.iter().map(|w| w.lease_id).collect();
    assert_eq!(queue, waiters);
    let late = LeaseId::random();
    assert_eq!(
        b.acquire(&s, 1, &req(late, 1, waiting())).await.unwrap(),
        AcquireReply::Queued { position: 3 }
    );
    let mut held = holder;
    for next in waiters.iter().chain([&late]) {
        assert!(b.release(&s, held).await.unwrap());
        let st = b.status(&s).await.unwrap().unwrap();
        assert_eq!(st.holders[0].lease_id, *next);
        held = *next;
    }
    assert!(b.release(&s, held).await.unwrap());
    assert!(b.status(&s).await.unwrap().is_none());
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM tessera_tails")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the tail row goes with the semaphore row");
}

/// Two stores on one file (as two processes): limits one sets are seen and obeyed by the
/// other at its next step, a raised ceiling hands the other's waiter its permit, and a
/// delete through one removes them for both.
#[tokio::test]
async fn a_second_store_on_the_file_sees_the_limits_the_first_sets_and_obeys_them() {
    let (_dir, url) = temp_db();
    let s = name("jobs");
    let (first, second) = (
        SqliteBackend::connect(&url).await.unwrap(),
        SqliteBackend::connect(&url).await.unwrap(),
    );
    let ceiling = |c| tessera_core::model::TenantLimits::new(Some(c), 0).unwrap();
    first
        .set_tenant_limits(&s, "bulk", ceiling(1))
        .await
        .unwrap();
    assert_eq!(second.tenant_limits(&s).await.unwrap()["bulk"], ceiling(1));
    let bulk = || {
        let mut r = req(LeaseId::random(), 1, waiting());
        r.tenant = Some(tessera_core::model::Tenant::new("bulk", 1).unwrap());
        r
    };
    let (one, two) = (bulk(), bulk());
    assert!(matches!(
        second.acquire(&s, 3, &one).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    // Two permits free, but bulk is at its ceiling.
    assert!(matches!(
        second.acquire(&s, 3, &two).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    ));
    first
        .set_tenant_limits(&s, "bulk", ceiling(2))
        .await
        .unwrap();
    let held: Vec<_> = second
        .status(&s)
        .await
        .unwrap()
        .unwrap()
        .holders
        .iter()
        .map(|h| h.lease_id)
        .collect();
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(held.contains(&two.lease_id));
    assert!(first.delete(&s).await.unwrap());
    assert!(second.tenant_limits(&s).await.unwrap().is_empty());
    // Without limits again: bulk takes every free permit.
    for _ in 0..3 {
        assert!(matches!(
            second.acquire(&s, 3, &bulk()).await.unwrap(),
            AcquireReply::Granted(_)
        ));
    }
}

/// Turns the file at `url` (its rows kept) into one of schema version 1, from before fair
/// shares: no tag, vtime, finish or tenants columns, no tenants table, no tenant on the rows;
/// then runs `more`.
async fn to_version_1(url: &str, more: &str) {
    let b = SqliteBackend::connect(url).await.unwrap();
    let sql = format!(
        "{TO_ONE_ROW} DROP INDEX tessera_waiters_by_tag; DROP TABLE tessera_tenants; \
         DROP TABLE tessera_tenant_limits; \
         ALTER TABLE tessera_holders DROP COLUMN tenant; \
         ALTER TABLE tessera_waiters DROP COLUMN tenant; \
         ALTER TABLE tessera_waiters DROP COLUMN tag; \
         ALTER TABLE tessera_semaphores DROP COLUMN vtime; \
         ALTER TABLE tessera_semaphores DROP COLUMN finish; \
         ALTER TABLE tessera_semaphores DROP COLUMN tenants; \
         UPDATE tessera_meta SET value = 1 WHERE key = 'schema_version'; {more}"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&b.pool)
        .await
        .unwrap();
}

/// A file of schema version 1 (before fair shares) is migrated at connect: its queue keeps
/// its order, later arrivals queue behind it, tenants are ordered by their tags from then
/// on, and the file is refused by a build that reads only version 1.
#[tokio::test]
async fn a_file_of_version_1_is_migrated_and_its_queue_keeps_its_order() {
    let (_dir, url) = temp_db();
    let s = name("v1");
    let holder = LeaseId::random();
    let old: Vec<LeaseId> = (0..3).map(|_| LeaseId::random()).collect();
    {
        let b = SqliteBackend::connect(&url).await.unwrap();
        assert!(matches!(
            b.acquire(&s, 1, &req(holder, 1, waiting())).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        for &l in &old {
            b.acquire(&s, 1, &req(l, 1, waiting())).await.unwrap();
        }
    }
    to_version_1(&url, "").await;
    let b = SqliteBackend::connect(&url).await.unwrap();
    let version: i64 =
        sqlx::query_scalar("SELECT value FROM tessera_meta WHERE key = 'schema_version'")
            .fetch_one(&b.pool)
            .await
            .unwrap();
    assert_eq!(version, 6);
    let mut tenant = req(LeaseId::random(), 1, waiting());
    tenant.tenant = Some(tessera_core::model::Tenant::new("t", 1).unwrap());
    let plain = LeaseId::random();
    b.acquire(&s, 1, &tenant).await.unwrap();
    b.acquire(&s, 1, &req(plain, 1, waiting())).await.unwrap();
    let queue: Vec<LeaseId> = b
        .status(&s)
        .await
        .unwrap()
        .unwrap()
        .queue
        .iter()
        .map(|w| w.lease_id)
        .collect();
    // Every tag starts at 0 after the migration: all level, in arrival order.
    let mut want = old.clone();
    want.extend([tenant.lease_id, plain]);
    assert_eq!(queue, want);
    let mut held = holder;
    for want in queue {
        assert!(b.release(&s, held).await.unwrap());
        let h = b.status(&s).await.unwrap().unwrap().holders;
        assert_eq!(h[0].lease_id, want);
        held = want;
    }
    // Connecting again changes nothing; a newer version is refused (below, and in
    // `garbage_in_a_row_is_a_typed_error_not_a_panic`).
    drop(SqliteBackend::connect(&url).await.unwrap());
}

#[tokio::test]
async fn garbage_in_a_row_is_a_typed_error_not_a_panic() {
    let clock = Arc::new(ManualClock::new(T0));
    let s = name("c");
    for (sql, op_is_status) in [
        ("UPDATE tessera_holders SET seats = 'garbage'", true),
        ("UPDATE tessera_holders SET lease_id = 'not-hex'", true),
        ("UPDATE tessera_holders SET weight = 2", true),
        ("UPDATE tessera_semaphores SET used = -1", true),
        ("UPDATE tessera_semaphores SET capacity = 0", false),
        ("UPDATE tessera_holders SET acquired_at = -5", true),
        (
            "UPDATE tessera_meta SET value = -1 WHERE key = 'fence_hwm'",
            false,
        ),
    ] {
        let (_dir, url) = temp_db();
        let b = sqlite_at(&url, &clock).await;
        let id = LeaseId::random();
        assert!(matches!(
            b.acquire(&s, 3, &req(id, 1, None)).await.unwrap(),
            AcquireReply::Granted(_)
        ));
        raw(&url, sql).await;
        let err = if op_is_status {
            b.status(&s).await.unwrap_err()
        } else {
            b.acquire(&s, 3, &req(LeaseId::random(), 1, None))
                .await
                .unwrap_err()
        };
        assert!(err.is_corrupt(), "{sql}: {err:?}");
        // An admin can still clear it.
        assert!(b.delete(&s).await.unwrap(), "{sql}");
    }
    // A newer schema version is refused at connect.
    let (_dir, url) = temp_db();
    raw(
        &url,
        "UPDATE tessera_meta SET value = 99 WHERE key = 'schema_version'",
    )
    .await;
    let err = SqliteBackend::connect(&url).await.unwrap_err();
    assert!(err.is_corrupt(), "{err:?}");
    // STRICT tables refuse a value of the wrong type outright.
    let (_dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    assert!(
        sqlx::query("INSERT INTO tessera_semaphores VALUES ('x', 'many', 0, 0, 0, 0, 0, 0)")
            .execute(&b.pool)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn fences_stay_monotonic_across_delete_reconnect_and_clock_jumps() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let s = name("f");
    let mut last = 0;
    for round in 0..3 {
        let b = sqlite_at(&url, &clock).await;
        for _ in 0..3 {
            let AcquireReply::Granted(g) = b
                .acquire(&s, 5, &req(LeaseId::random(), 1, None))
                .await
                .unwrap()
            else {
                panic!()
            };
            assert!(g.lease.fence > last, "round {round}");
            last = g.lease.fence;
        }
        assert!(b.delete(&s).await.unwrap());
        assert!(!b.delete(&s).await.unwrap());
        assert_eq!(b.status(&s).await.unwrap(), None);
        // The clock jumps back an hour: the high-water mark still wins.
        clock.set(StoreTime(T0.0 - 3_600_000_000));
    }
}

/// `ping` is a read: it answers while another process holds the write lock. So is a status
/// of a semaphore that has no row.
#[tokio::test]
async fn ping_answers_while_another_process_holds_the_write_lock() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let b = sqlite_at(&url, &clock).await;
    let other = sqlite_at(&url, &clock).await;
    let mut writer = other.pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *writer)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(1), b.ping())
        .await
        .expect("a ping does not wait for the writer")
        .unwrap();
    let status = tokio::time::timeout(Duration::from_secs(10), b.status(&name("p")))
        .await
        .expect("a status of a semaphore without a row does not wait for the writer");
    assert_eq!(status.unwrap(), None);
    sqlx::query("ROLLBACK").execute(&mut *writer).await.unwrap();
    assert_eq!(b.status(&name("p")).await.unwrap(), None);
}

/// When the step has something to do at the status's instant, the status is the step's: a
/// holder that expired is purged and its permits handed to the waiter, which the status then
/// shows as the holder (and the waiter's heartbeat finds granted).
#[tokio::test]
async fn status_of_an_expired_holder_and_a_waiter_is_the_steps_hand_off() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let b = sqlite_at(&url, &clock).await;
    let s = name("due");
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        b.acquire(&s, 1, &req(holder, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let long_wait = Some(WaitSpec {
        waiter_ttl: Duration::from_secs(60),
        queue_cap: 100,
    });
    assert_eq!(
        b.acquire(&s, 1, &req(waiter, 1, long_wait)).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    // The holder's 10 s lease expires exactly now: the step purges it.
    clock.advance(Duration::from_secs(10));
    let status = b.status(&s).await.unwrap().unwrap();
    let holders: Vec<_> = status
        .holders
        .iter()
        .map(|h| (h.lease_id, h.weight))
        .collect();
    assert_eq!(holders, vec![(waiter, 1)], "{status:?}");
    assert!(status.queue.is_empty(), "{status:?}");
    assert_eq!(
        (status.used, status.available, status.now),
        (1, 0, clock.now())
    );
    assert_eq!(status.holders[0].acquired_at, clock.now());
    assert!(matches!(
        b.heartbeat(&s, waiter, Duration::from_secs(60))
            .await
            .unwrap(),
        WaitReply::Granted(_)
    ));
}

#[tokio::test]
async fn heartbeat_probe_answers_without_a_write_and_defers_to_the_full_step() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let b = sqlite_at(&url, &clock).await;
    let s = name("p");
    let holder = LeaseId::random();
    let waiter = LeaseId::random();
    let ttl = Duration::from_secs(8);
    assert!(matches!(
        b.acquire(&s, 1, &req(holder, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        b.acquire(&s, 1, &req(waiter, 1, waiting())).await.unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    let expiry = |st: SemaphoreStatus| st.queue[0].expires_at;
    let first = expiry(b.status(&s).await.unwrap().unwrap());
    // Fresh: the probe answers and leaves the expiry alone.
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        b.probe_heartbeat(&s, waiter, ttl).await.unwrap(),
        Some(WaitReply::Waiting)
    );
    assert_eq!(
        b.heartbeat(&s, waiter, ttl).await.unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(expiry(b.status(&s).await.unwrap().unwrap()), first);
    // Past half its TTL: the full step refreshes it.
    clock.advance(Duration::from_secs(3));
    assert_eq!(b.probe_heartbeat(&s, waiter, ttl).await.unwrap(), None);
    assert_eq!(
        b.heartbeat(&s, waiter, ttl).await.unwrap(),
        WaitReply::Waiting
    );
    assert_eq!(
        expiry(b.status(&s).await.unwrap().unwrap()),
        clock.now().plus(ttl)
    );
    // The holder expires: the probe sees it and the full step grants the waiter.
    clock.advance(Duration::from_secs(7));
    assert_eq!(b.probe_heartbeat(&s, waiter, ttl).await.unwrap(), None);
    assert!(matches!(
        b.heartbeat(&s, waiter, ttl).await.unwrap(),
        WaitReply::Granted(_)
    ));
    // An unknown lease is not answered by the probe.
    assert_eq!(
        b.probe_heartbeat(&s, LeaseId::random(), ttl).await.unwrap(),
        None
    );
    assert_eq!(
        b.heartbeat(&s, LeaseId::random(), ttl).await.unwrap(),
        WaitReply::Gone
    );
}

#[tokio::test]
async fn urls_are_checked_and_files_created() {
    let dir = tempfile::tempdir().unwrap();
    for bad in [
        "sqlite://".to_string(),
        "sqlite:///".to_string(),
        format!("sqlite://{}", dir.path().display()),
        format!("sqlite://{}/", dir.path().display()),
        format!("sqlite://{}/a.db?mode=rwc", dir.path().display()),
        format!("sqlite://{}/a.db#x", dir.path().display()),
        "sqlite://:memory:".to_string(),
        "sqlite:/a.db".to_string(),
    ] {
        let err = SqliteBackend::connect(&bad).await.unwrap_err();
        assert!(
            matches!(&err, Error::InvalidInput(InvalidInput::StoreUrl { url, .. }) if *url == redact_url(&bad)),
            "{bad}: {err:?}"
        );
    }
    assert!(!dir.path().join("a.db").exists());
    let nested = dir.path().join("x/y/t.db");
    let store = crate::Store::connect(&format!("sqlite://{}", nested.display()))
        .await
        .unwrap();
    assert!(nested.exists());
    let sem = store.semaphore("u", 1).unwrap();
    let p = sem.try_acquire().await.unwrap().unwrap();
    assert!(sem.try_acquire().await.unwrap().is_none());
    assert_eq!(store.list().await.unwrap(), vec!["u".to_string()]);
    drop(p);
    // WAL was set when the file was created.
    let b = SqliteBackend::connect(&format!("sqlite://{}", nested.display()))
        .await
        .unwrap();
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(&b.pool)
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

/// `sqlite://file.db` would be a different file in every working directory: refused, with
/// the absolute URL that means the same file here, and nothing created.
#[tokio::test]
async fn a_relative_path_is_refused_with_the_absolute_url_to_write() {
    let cwd = std::env::current_dir().unwrap();
    for (rel, meant) in [
        ("tessera-rel-test.db", cwd.join("tessera-rel-test.db")),
        ("./tessera-rel-test.db", cwd.join("tessera-rel-test.db")),
        (
            "rel-dir/tessera-rel-test.db",
            cwd.join("rel-dir/tessera-rel-test.db"),
        ),
    ] {
        let url = format!("sqlite://{rel}");
        for err in [
            crate::Store::connect(&url).await.unwrap_err(),
            crate::Store::connect_existing(&url).await.unwrap_err(),
        ] {
            let Error::InvalidInput(InvalidInput::StoreUrl { reason, .. }) = &err else {
                panic!("{url}: {err:?}");
            };
            assert!(reason.contains("relative"), "{reason}");
            let hint = format!("sqlite://{}", meant.display());
            assert!(
                reason.ends_with(&hint),
                "{url}: {reason} (expected the hint {hint})"
            );
        }
    }
    assert!(!cwd.join("tessera-rel-test.db").exists());
    assert!(!cwd.join("rel-dir").exists());
    if let Some(home) = std::env::var_os("HOME") {
        let err = crate::Store::connect("sqlite://~/t.db").await.unwrap_err();
        let hint = format!("sqlite://{}", Path::new(&home).join("t.db").display());
        assert!(err.to_string().ends_with(&hint), "{err}");
    }
}

/// `sqlite://user:password@host/…` is no path to echo: the message shows neither the
/// password nor an absolute URL built from it (a leak the `store_url` fuzz target found).
#[tokio::test]
async fn a_url_with_a_password_is_refused_without_echoing_it() {
    for url in [
        "sqlite://u:hunter2@host/t.db",
        "sqlite://2:hunter2@",
        "sqlite://u:hunter2@/t.db",
        "sqlite://u:hunter2\0@h",
    ] {
        for err in [
            crate::Store::connect(url).await.unwrap_err(),
            crate::Store::connect_existing(url).await.unwrap_err(),
        ] {
            assert!(err.is_invalid_input(), "{url}: {err:?}");
            assert!(!err.to_string().contains("hunter2"), "{url}: {err}");
            assert!(!format!("{err:?}").contains("hunter2"), "{url}: {err:?}");
        }
    }
}

/// Opening an existing store only: a missing file is `NoStore` and neither the file nor its
/// folder nor the wake-up folder appears; once created, the same URL opens and shows state.
#[tokio::test]
async fn connect_existing_creates_nothing_and_opens_what_exists() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("sub/t.db");
    let url = format!("sqlite://{}", db.display());
    let err = crate::Store::connect_existing(&url).await.unwrap_err();
    assert!(err.is_no_store(), "{err:?}");
    assert!(!err.is_not_found() && !err.is_transient(), "{err:?}");
    assert!(err.to_string().contains(db.to_str().unwrap()), "{err}");
    assert!(!dir.path().join("sub").exists(), "the folder was created");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    assert!(crate::Store::connect_existing(&url)
        .await
        .unwrap_err()
        .is_no_store());
    assert_eq!(
        std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
        0,
        "something was created beside the missing file"
    );

    let store = crate::Store::connect(&url).await.unwrap();
    let sem = store.semaphore("x", 2).unwrap();
    let permit = sem.acquire().await.unwrap();
    let existing = crate::Store::connect_existing(&url).await.unwrap();
    let status = existing.status("x").await.unwrap().unwrap();
    assert_eq!(status.holders[0].lease_id, permit.lease_id());
    assert!(existing
        .revoke("x", &permit.lease_id().to_string())
        .await
        .unwrap());
}

#[tokio::test]
async fn in_process_waiters_are_pushed_and_handed_off_in_order() {
    let (_dir, url) = temp_db();
    let store = crate::Store::connect(&url).await.unwrap();
    let sem = store.semaphore("push", 1).unwrap();
    let first = sem.acquire().await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let p = sem.acquire().await.unwrap();
            let f = p.fence();
            p.release().await.unwrap();
            (i, f)
        }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.release().await.unwrap();
    let mut fences = Vec::new();
    for t in tasks {
        fences.push(t.await.unwrap());
    }
    // Served in arrival order: fences increase with the arrival index.
    assert!(fences.windows(2).all(|w| w[0].1 < w[1].1), "{fences:?}");
}

#[test]
fn seats_encode_compactly_and_garbage_is_refused() {
    use super::ops::{decode_seats, encode_seats};
    for seats in [
        vec![],
        vec![0],
        vec![0, 1, 2, 3, 7],
        vec![2, 4, 5, 9, 10, 11],
    ] {
        let text = encode_seats(&seats);
        assert_eq!(
            decode_seats(&text, seats.len() as u32).unwrap(),
            seats,
            "{text}"
        );
    }
    assert_eq!(encode_seats(&[0, 1, 2, 3, 7]), "0-3,7");
    for (text, weight) in [
        ("x", 1),
        ("1-0", 2),
        ("3,1", 2),
        ("1,1", 2),
        ("0-3", 3),
        ("0-1", 3),
        ("-1", 1),
        ("0-4294967295", 4_000_000),
        ("0-4294967295", u32::MAX),
        ("0,", 1),
        ("", 1),
    ] {
        assert!(
            decode_seats(text, weight).unwrap_err().is_corrupt(),
            "{text}"
        );
    }
}

#[tokio::test]
async fn a_zero_weight_is_refused_and_changes_nothing() {
    let (_dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("z");
    let err = b
        .acquire(&s, 2, &req(LeaseId::random(), 0, None))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_eq!(b.status(&s).await.unwrap(), None);
    assert!(b.list().await.unwrap().is_empty());
}

/// Regression (found by the differential test, seed 4): after a shrinking resize
/// `seat_high` stays above the capacity while a holder sits there; a grant served entirely
/// from returned seats below the capacity must not be refused.
#[tokio::test]
async fn a_grant_from_returned_seats_works_while_seats_above_capacity_are_held() {
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let b = sqlite_at(&url, &clock).await;
    let s = name("high");
    let ids: Vec<LeaseId> = (0..4).map(|_| LeaseId::random()).collect();
    for id in &ids {
        b.acquire(&s, 4, &req(*id, 1, None)).await.unwrap();
    }
    assert_eq!(b.resize(&s, 2).await.unwrap(), 4);
    for i in [0, 1, 3] {
        assert!(b.release(&s, ids[i]).await.unwrap());
    }
    // Seat 2 is held above the new capacity 2; seats 0 and 1 are free.
    let AcquireReply::Granted(g) = b
        .acquire(&s, 2, &req(LeaseId::random(), 1, None))
        .await
        .unwrap()
    else {
        panic!("not granted")
    };
    assert_eq!(g.lease.seats, vec![0]);
}

#[tokio::test]
async fn state_written_under_another_boot_is_dropped_and_fences_keep_rising() {
    use tessera_core::rate::spec::{RateConfig, RateMode};
    use tessera_core::seam::{RateBackend, RateReply, RateRequest};
    let clock = Arc::new(ManualClock::new(T0));
    let (_dir, url) = temp_db();
    let (s, r) = (name("boot"), name("boot-rate"));
    let old = SqliteBackend::connect_with_boot(&url, clock.clone(), 1)
        .await
        .unwrap();
    let AcquireReply::Granted(g) = old
        .acquire(&s, 1, &req(LeaseId::random(), 1, None))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(matches!(
        old.acquire(&s, 1, &req(LeaseId::random(), 1, waiting()))
            .await
            .unwrap(),
        AcquireReply::Queued { .. }
    ));
    let config = RateConfig::new(&["1/h".parse().unwrap()], RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    assert!(matches!(
        old.rate_acquire(&r, &config, &one).await.unwrap(),
        RateReply::Admitted { .. }
    ));
    // Another process of the same boot sees it all.
    let same = SqliteBackend::connect_with_boot(&url, clock.clone(), 1)
        .await
        .unwrap();
    assert_eq!(same.status(&s).await.unwrap().unwrap().queue.len(), 1);
    drop((old, same));
    // The first connect of another boot drops holders, waiters and rate state; the clock
    // (a new boot's clock starts low) went back, yet the next fence is higher.
    clock.set(StoreTime(1_000_000));
    let new = SqliteBackend::connect_with_boot(&url, clock.clone(), 2)
        .await
        .unwrap();
    assert_eq!(new.status(&s).await.unwrap(), None);
    assert!(new.list().await.unwrap().is_empty());
    assert!(new.rate_status(&r).await.unwrap().is_none());
    assert!(matches!(
        new.rate_acquire(&r, &config, &one).await.unwrap(),
        RateReply::Admitted { .. }
    ));
    let AcquireReply::Granted(g2) = new
        .acquire(&s, 1, &req(LeaseId::random(), 1, None))
        .await
        .unwrap()
    else {
        panic!()
    };
    assert!(g2.lease.fence > g.lease.fence);
    // Reconnecting on the same boot drops nothing.
    let again = SqliteBackend::connect_with_boot(&url, clock.clone(), 2)
        .await
        .unwrap();
    assert_eq!(again.status(&s).await.unwrap().unwrap().holders.len(), 1);
}

#[tokio::test]
async fn the_boot_clock_store_replies_in_wall_time() {
    let (_dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("wall");
    let before = StoreTime::host_now();
    let AcquireReply::Granted(g) = b
        .acquire(&s, 2, &req(LeaseId::random(), 1, None))
        .await
        .unwrap()
    else {
        panic!()
    };
    let after = StoreTime::host_now();
    let near = |t: StoreTime| t.0 + 1_000_000 >= before.0 && t.0 <= after.0 + 1_000_000;
    assert!(near(g.now) && near(g.lease.acquired_at), "{g:?}");
    assert_eq!(g.lease.expires_at.since(g.now), Duration::from_secs(10));
    // The fence keeps its wall-clock floor.
    assert!(g.lease.fence >= before.0);
    let st = b.status(&s).await.unwrap().unwrap();
    assert!(near(st.now) && near(StoreTime(st.holders[0].expires_at.0 - 10_000_000)));
}

/// A file made before waiters recorded their wake-up socket gets the column at connect; a
/// waiter queued then names this backend's socket, and is granted as before.
#[tokio::test]
async fn a_file_without_the_wake_column_gets_it_and_waiters_record_their_socket() {
    let (_dir, url) = temp_db();
    // Only a file of version 1 can lack it.
    to_version_1(&url, "ALTER TABLE tessera_waiters DROP COLUMN wake").await;
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("w");
    let (first, second) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        b.acquire(&s, 1, &req(first, 1, waiting())).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    assert!(matches!(
        b.acquire(&s, 1, &req(second, 1, waiting())).await.unwrap(),
        AcquireReply::Queued { .. }
    ));
    let wake: Option<String> =
        sqlx::query_scalar("SELECT wake FROM tessera_waiters WHERE lease_id = ?1")
            .bind(second.to_string())
            .fetch_one(&b.pool)
            .await
            .unwrap();
    let socket = b.notifier.as_ref().map(|n| n.name().to_string());
    assert!(socket.is_some());
    assert_eq!(wake, socket);
    assert!(b.release(&s, first).await.unwrap());
    let holders = b.status(&s).await.unwrap().unwrap().holders;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].lease_id, second);
}

/// A step waits for another process's write lock on a blocking thread; cancelled there, it
/// leaves nothing behind once it gets the lock (its connection closes, rolling back), and
/// the next step runs on a new connection.
#[tokio::test]
async fn a_step_cancelled_while_waiting_for_the_write_lock_changes_nothing() {
    let (dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("c");
    // Another process holding SQLite's write lock.
    let other = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let cancelled = tokio::time::timeout(
        Duration::from_millis(200),
        b.acquire(&s, 2, &req(LeaseId::random(), 1, None)),
    )
    .await;
    assert!(cancelled.is_err(), "the acquire did not wait for the lock");
    other.execute_batch("COMMIT").unwrap();
    assert_eq!(b.status(&s).await.unwrap(), None);
    let lease = LeaseId::random();
    assert!(matches!(
        b.acquire(&s, 2, &req(lease, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    let holders = b.status(&s).await.unwrap().unwrap().holders;
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].lease_id, lease);
}

/// The steps' own connection leaves checkpoints to the background (see `wal_hook`): the WAL
/// still stays bounded under a stream of steps, instead of growing by every step's pages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_stays_bounded_under_a_stream_of_steps() {
    let (dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("wal");
    // About 7 pages per step: far past the checkpoint threshold without checkpoints.
    acquire_release(&b, &s, 1500).await;
    let wal = wal_len(&dir);
    assert!(wal < 12 << 20, "the WAL grew to {wal} bytes");
}

/// `n` acquire + release pairs of one permit of `s` (2 steps each).
async fn acquire_release(b: &SqliteBackend, s: &Name, n: usize) {
    for _ in 0..n {
        let lease = LeaseId::random();
        b.acquire(s, 2, &req(lease, 1, None)).await.unwrap();
        assert!(b.release(s, lease).await.unwrap());
    }
}

/// The length of the WAL file of [`temp_db`]'s database, in bytes.
fn wal_len(dir: &tempfile::TempDir) -> u64 {
    std::fs::metadata(dir.path().join("t.db-wal"))
        .unwrap()
        .len()
}

/// A backend checkpoints once per [`CHECKPOINT_PAGES`] of WAL growth, not after every commit
/// while the WAL is long (two fsyncs each), and again as soon as the WAL has started over.
#[test]
fn a_long_wal_is_checkpointed_once_per_threshold_of_growth() {
    let last = AtomicI32::new(0);
    let due: Vec<i32> = (0..400)
        .map(|i| 7 * i)
        .filter(|&pages| checkpoint_due(&last, pages))
        .collect();
    // 1001 is the first length past the threshold; then one per 1,000 pages more.
    assert_eq!(due, [1001, 2002]);
    // The WAL started over: due again once it is past the threshold.
    assert!(!checkpoint_due(&last, 700));
    assert!(checkpoint_due(&last, 1_003));
    assert!(!checkpoint_due(&last, 1_010));
}

/// While another connection keeps a read transaction open on an old snapshot, a PASSIVE
/// checkpoint cannot copy back the frames after it and the WAL cannot start over, so it
/// grows; once the reader ends, the next checkpoints (which `checkpoint_due` spaces out) let
/// it start over, and it stops growing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wal_starts_over_once_a_long_reader_ends() {
    let (dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("wal-reader");
    acquire_release(&b, &s, 10).await;
    let reader = rusqlite::Connection::open(dir.path().join("t.db")).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let _: i64 = reader
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap();
    acquire_release(&b, &s, 600).await;
    let pinned = wal_len(&dir);
    assert!(
        pinned > 4 << 20,
        "the reader pinned only {pinned} bytes of WAL"
    );
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    // The WAL file keeps its length when it starts over; what shows the restart is that
    // another long run of steps (about 40 MB of frames) writes over it instead of growing
    // it by more than the threshold's worth (4 MB) a backend may let it grow before its next
    // checkpoint.
    acquire_release(&b, &s, 1500).await;
    let after = wal_len(&dir);
    assert!(
        after < pinned + (8 << 20),
        "the WAL grew from {pinned} to {after} bytes"
    );
}

/// Another process holding the write gate (stopped in the middle of a step, say) holds up
/// this process's steps no longer than the busy timeout: the step fails as busy (a transient
/// error, which callers retry) and changes nothing, and later steps do not wait for the gate
/// again while that wait is still blocked; once the gate is free, steps take it again.
#[tokio::test]
async fn a_write_gate_held_past_the_busy_timeout_fails_the_step_as_busy_and_changes_nothing() {
    let (dir, url) = temp_db();
    let b = SqliteBackend::connect(&url).await.unwrap();
    let s = name("gated");
    let other = gate::Gate::open(&dir.path().join("t.db")).unwrap();
    let held = other.try_take().expect("the gate is free between steps");
    let err = b
        .acquire(&s, 2, &req(LeaseId::random(), 1, None))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store {
                kind: StoreErrorKind::Busy,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.is_transient(), "{err:?}");
    // The step's thread stays blocked on the gate; the next steps go without it (into the
    // busy handler, which finds SQLite's own lock free here) rather than wait again.
    assert_eq!(b.status(&s).await.unwrap(), None);
    drop(held);
    assert_eq!(b.status(&s).await.unwrap(), None);
    let lease = LeaseId::random();
    assert!(matches!(
        b.acquire(&s, 2, &req(lease, 1, None)).await.unwrap(),
        AcquireReply::Granted(_)
    ));
    // Between steps the gate is free again: the steps release it with their commit (the
    // blocked wait's thread, which got it first, with its rollback, moments later).
    let free = (0..200).any(|_| {
        let taken = other.try_take().is_some();
        if !taken {
            std::thread::sleep(Duration::from_millis(10));
        }
        taken
    });
    assert!(free, "a step kept the gate");
}

mod offset {
    use super::*;
    use std::sync::Mutex;

    /// A boot clock that reads the scripted times in turn, then stays at the last.
    #[derive(Debug)]
    struct Scripted(Mutex<Vec<u64>>);

    impl Clock for Scripted {
        fn now(&self) -> StoreTime {
            let mut v = self.0.lock().unwrap();
            StoreTime(if v.len() > 1 { v.remove(0) } else { v[0] })
        }
    }

    fn boot(reads: &[u64]) -> Scripted {
        Scripted(Mutex::new(reads.to_vec()))
    }

    #[test]
    fn a_thread_held_up_between_the_reads_leaves_no_delay_in_the_offset() {
        let wall = ManualClock::new(StoreTime(1_000_000_000));
        // First try: held up 7 ms after the first boot read. Second: 10 µs apart.
        let b = boot(&[1_000, 8_000, 9_000, 9_010]);
        let (offset, error) = measure_offset(&b, &wall);
        assert_eq!(error, 10);
        assert_eq!(offset, 1_000_000_000 - 9_005);
    }

    #[test]
    fn a_poor_first_measurement_is_replaced_by_a_good_one_and_a_good_one_stays() {
        let poor = Some((5_000, 6_000));
        assert_eq!(adopt_offset(poor, (100, 8)), (100, 8));
        assert_eq!(adopt_offset(Some((100, 8)), (3_000, 6_000)), (100, 8));
        assert_eq!(adopt_offset(Some((100, 8)), (2_000, 5)), (100, 8));
    }

    #[test]
    fn a_wall_clock_step_is_taken_only_from_a_measurement_that_cannot_be_that_far_off() {
        assert_eq!(adopt_offset(Some((100, 8)), (50_100, 9)), (50_100, 9));
        assert_eq!(adopt_offset(Some((100, 8)), (50_100, 40_000)), (100, 8));
        assert_eq!(adopt_offset(None, (7, 40_000)), (7, 40_000));
    }
}
