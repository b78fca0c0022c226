//! Statuses that answer while another session holds the lock a store's step takes: the
//! semaphore's and the limiter's, for the SQL stores, which read a status from one snapshot
//! without that lock (`stores/sql/snapshot.rs`, `stores/sql/rate_snapshot.rs`). Written
//! once; each store's test file calls them with its own [`Blocker`]. A status that waited
//! for the lock fails the check after 10 s.
//!
//! Also the limiter's status when a prune or an expiry is due, compared with the reference
//! model: the snapshot computes the step's answer, writes included, without writing.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sqlx::Connection;
use tessera::backend::stores::MemoryBackend;
use tessera::backend::{
    AcquireReply, Backend, Clock, ManualClock, Name, RateConfig, RateReply, RateRequest,
};
use tessera::{LeaseId, RateMode, RateStatus, StoreTime};

use crate::seam::{req, LONG};

/// How long a status may take while the lock is held before the check calls it a wait.
const PATIENCE: Duration = Duration::from_secs(10);

/// Another client's session holding the lock a store's step takes on one object, in an open
/// transaction, until [`Blocker::release`] rolls it back.
pub enum Blocker {
    Postgres(sqlx::PgConnection),
    Mysql(sqlx::MySqlConnection),
    Sqlite(sqlx::SqliteConnection),
}

impl Blocker {
    /// A new PostgreSQL session at `url` that runs `BEGIN` and `lock` (a `SELECT … FOR
    /// UPDATE` of the object's row).
    pub async fn postgres(url: &str, lock: &str) -> Blocker {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {lock}")))
            .execute(&mut conn)
            .await
            .unwrap();
        Blocker::Postgres(conn)
    }

    /// A new MySQL / MariaDB session at `url` that runs `BEGIN` and `lock` (a `SELECT … FOR
    /// UPDATE` of the object's row).
    pub async fn mysql(url: &str, lock: &str) -> Blocker {
        let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("BEGIN; {lock}")))
            .execute(&mut conn)
            .await
            .unwrap();
        Blocker::Mysql(conn)
    }

    /// A new connection to the SQLite file at `path` holding its write lock (`BEGIN
    /// IMMEDIATE`), which every step of the store takes.
    pub async fn sqlite(path: &Path) -> Blocker {
        let opts = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
        let mut conn = sqlx::SqliteConnection::connect_with(&opts).await.unwrap();
        sqlx::raw_sql("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .unwrap();
        Blocker::Sqlite(conn)
    }

    /// Rolls the transaction back, which frees the lock.
    pub async fn release(self) {
        match self {
            Blocker::Postgres(mut c) => drop(sqlx::raw_sql("ROLLBACK").execute(&mut c).await),
            Blocker::Mysql(mut c) => drop(sqlx::raw_sql("ROLLBACK").execute(&mut c).await),
            Blocker::Sqlite(mut c) => drop(sqlx::raw_sql("ROLLBACK").execute(&mut c).await),
        }
    }
}

/// `f` within [`PATIENCE`], or a failure naming `what`.
async fn promptly<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f)
        .await
        .unwrap_or_else(|_| panic!("{what} waited for the lock another session holds"))
}

/// Semaphore `name` (capacity 2: one holder of 2, one waiter of 1) answers its status while
/// `lock` holds the lock of its step: the same holders and queue as just before, nothing
/// changed.
pub async fn semaphore_status_answers_while_locked(
    backend: &dyn Backend,
    name: &Name,
    lock: impl AsyncFnOnce() -> Blocker,
) {
    let (holder, waiter) = (LeaseId::random(), LeaseId::random());
    assert!(matches!(
        backend
            .acquire(name, 2, &req(holder, 2, LONG, None))
            .await
            .unwrap(),
        AcquireReply::Granted(_)
    ));
    assert_eq!(
        backend
            .acquire(name, 2, &req(waiter, 1, LONG, Some((LONG, 10))))
            .await
            .unwrap(),
        AcquireReply::Queued { position: 0 }
    );
    let before = backend.status(name).await.unwrap().unwrap();
    let blocker = lock().await;
    let status = promptly("a semaphore's status", backend.status(name))
        .await
        .unwrap()
        .unwrap();
    blocker.release().await;
    assert_eq!((status.capacity, status.used, status.available), (2, 2, 0));
    let holders: Vec<_> = status
        .holders
        .iter()
        .map(|h| (h.lease_id, h.weight))
        .collect();
    assert_eq!(holders, vec![(holder, 2)]);
    let queue: Vec<_> = status
        .queue
        .iter()
        .map(|w| (w.lease_id, w.weight))
        .collect();
    assert_eq!(queue, vec![(waiter, 1)]);
    assert!(status.holders[0].expires_at > status.now);
    assert!(status.now >= before.now);
    assert_eq!(
        (status.holders, status.queue),
        (before.holders, before.queue)
    );
}

/// Limiter `name` (3 per minute, charged 3 in two admissions) answers its status while
/// `lock` holds the lock of its step: the same answer as just before but for `now`.
pub async fn rate_status_answers_while_locked(
    backend: &dyn Backend,
    name: &Name,
    lock: impl AsyncFnOnce() -> Blocker,
) {
    let rate = backend.rate().expect("the store has rate limiters");
    let config = RateConfig::new(&["3/min".parse().unwrap()], RateMode::Exact).unwrap();
    for cost in [1, 2] {
        let req = RateRequest {
            cost,
            max_wait: None,
            update: false,
        };
        let reply = rate.rate_acquire(name, &config, &req).await.unwrap();
        assert!(matches!(reply, RateReply::Admitted { .. }), "{reply:?}");
    }
    let before = rate.rate_status(name).await.unwrap().unwrap();
    assert_eq!((before.limits[0].used, before.limits[0].reserved), (3, 0));
    let blocker = lock().await;
    let status = promptly("a limiter's status", rate.rate_status(name))
        .await
        .unwrap()
        .unwrap();
    blocker.release().await;
    assert!(status.now >= before.now);
    let later = status.now;
    assert_eq!(
        RateStatus {
            now: before.now,
            ..status
        },
        before,
        "at {later:?}"
    );
}

/// Limiter `name`'s status, when a prune is due and when its state has expired, is the
/// reference model's, and so are the acquires after each (the writes a status leaves
/// undone change no later answer). `pause` lets the store's clock run on by at least the
/// given time (a sleep on a server's clock, an advance of a manual one). Limits `1/50ms`
/// and `3/1s`: admissions at `t0` and `t0 + 600 ms`; at `t0 + 1.1 s` the first is due to
/// be pruned while the state lives on (a third admission then); 1.1 s later the state has
/// expired.
pub async fn rate_status_when_something_is_due_is_the_models(
    backend: &dyn Backend,
    name: &Name,
    pause: impl AsyncFn(Duration),
) {
    let rate = backend.rate().expect("the store has rate limiters");
    let clock = Arc::new(ManualClock::new(StoreTime(0)));
    let memory = MemoryBackend::with_clock(Arc::clone(&clock) as Arc<dyn Clock>);
    let model = memory.rate().unwrap();
    let limits = ["1/50ms".parse().unwrap(), "3/1s".parse().unwrap()];
    let config = RateConfig::new(&limits, RateMode::Exact).unwrap();
    let one = RateRequest {
        cost: 1,
        max_wait: None,
        update: false,
    };
    // An acquire on both, the model at the store's time of it.
    let both = async |config: &RateConfig| {
        let got = rate.rate_acquire(name, config, &one).await.unwrap();
        let (RateReply::Admitted { now, .. } | RateReply::Limited { now, .. }) = got;
        clock.set(now);
        let want = model.rate_acquire(name, config, &one).await.unwrap();
        assert_eq!(got, want, "acquire at {now:?}");
        got
    };
    let RateReply::Admitted { at: t0, .. } = both(&config).await else {
        panic!("the first request is admitted");
    };
    pause(Duration::from_millis(600)).await;
    assert!(matches!(both(&config).await, RateReply::Admitted { .. }));
    pause(Duration::from_millis(500)).await;
    // The first admission is due to be pruned; the state has not expired.
    let got = rate.rate_status(name).await.unwrap().expect("state");
    assert!(got.now.0 >= t0.0 + 1_000_000, "{got:?}");
    clock.set(got.now);
    assert_eq!(Some(got), model.rate_status(name).await.unwrap());
    both(&config).await;
    // Past the state's expiry: no status, and other limits are taken as a fresh state's.
    // The model's time is the acquire's after it, when the state has expired too.
    pause(Duration::from_millis(1_100)).await;
    let got = rate.rate_status(name).await.unwrap();
    assert_eq!(got, None);
    let other = RateConfig::new(&["5/1s".parse().unwrap()], RateMode::Exact).unwrap();
    let admitted = rate.rate_acquire(name, &other, &one).await.unwrap();
    let RateReply::Admitted { now, .. } = admitted else {
        panic!("limits other than the expired state's: {admitted:?}");
    };
    clock.set(now);
    assert_eq!(model.rate_status(name).await.unwrap(), None);
    assert_eq!(
        model.rate_acquire(name, &other, &one).await.unwrap(),
        admitted
    );
}
