//! Promises the step makes to the dialects, checked on the SQLite dialect.

use std::sync::Arc;
use std::time::Duration;

use sqlx::ConnectOptions;

use crate::clock::{Clock, ManualClock};
use crate::model::*;
use crate::store::Backend;
use crate::stores::sqlite::SqliteBackend;

const T0: StoreTime = StoreTime(1_800_000_000_000_000);

fn try_one(lease: LeaseId) -> AcquireRequest {
    AcquireRequest {
        lease_id: lease,
        weight: 2,
        ttl: Duration::from_secs(10),
        holder: "h/1".into(),
        wait: None,
    }
}

/// A dialect that locks with `SELECT … FOR UPDATE` may insert a placeholder row before an
/// acquire (see `SemRows::load`): with nothing used or queued it must act exactly as no row,
/// whatever capacity it carries, and leave nothing behind once released.
#[tokio::test]
async fn a_placeholder_row_with_nothing_held_acts_as_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let url = format!("sqlite://{}", path.display());
    let clock = Arc::new(ManualClock::new(T0));
    let b = SqliteBackend::connect_with_clock(&url, Arc::clone(&clock) as Arc<dyn Clock>)
        .await
        .unwrap();
    let (fresh, placed) = (Name::new("fresh").unwrap(), Name::new("placed").unwrap());
    // Raise the high-water mark well above the clock, as a deleted semaphore leaves it.
    let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(&path)
        .connect()
        .await
        .unwrap();
    sqlx::query("UPDATE tessera_meta SET value = ?1 WHERE key = 'fence_hwm'")
        .bind((T0.0 + 1_000_000) as i64)
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO tessera_semaphores (name, capacity, used, queued, last_fence, next_seq, \
         seat_high) SELECT 'placed', 7, 0, 0, value, 0, 0 FROM tessera_meta \
         WHERE key = 'fence_hwm'",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let mut grants = Vec::new();
    for s in [&fresh, &placed] {
        let lease = LeaseId::random();
        let AcquireReply::Granted(g) = b.acquire(s, 3, &try_one(lease)).await.unwrap() else {
            panic!("{s}: not granted")
        };
        let status = b.status(s).await.unwrap().unwrap();
        assert_eq!((status.capacity, status.used), (3, 2), "{s}");
        assert!(g.lease.fence > T0.0 + 1_000_000, "{s}: {}", g.lease.fence);
        assert!(b.release(s, lease).await.unwrap(), "{s}");
        grants.push((g.lease.seats, g.lease.fence));
    }
    assert_eq!(grants[0].0, grants[1].0);
    assert!(grants[1].1 > grants[0].1);
    assert!(b.list().await.unwrap().is_empty());
}
