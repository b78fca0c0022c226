//! The SQLite store against the reference model: the test kit's differential test, on a
//! manual clock the store and the model share, so replies and statuses must be equal,
//! expiries included.
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use tessera::backend::stores::SqliteBackend;
use tessera::backend::{Clock, ManualClock};
use tessera::StoreTime;
use tessera_testkit::differential::{DiffClock, Differential, Seen};
use tessera_testkit::seam::name;
use tessera_testkit::status_locks::{self, Blocker};

const T0: StoreTime = StoreTime(1_800_000_000_000_000);

#[tokio::test]
async fn random_operations_match_the_reference_model() {
    let mut seen = Seen::default();
    for seed in 1u64..=6 {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db", dir.path().display());
        let clock = Arc::new(ManualClock::new(T0));
        let sqlite = SqliteBackend::connect_with_clock(&url, Arc::clone(&clock) as Arc<dyn Clock>)
            .await
            .unwrap()
            .with_exact_heartbeats();
        let mut d = Differential::new(&sqlite, DiffClock::Shared(clock), seed);
        d.run(500).await;
        seen.add(&d);
    }
    seen.assert_every_answer_reached();
}

/// A store on a temporary file and a manual clock; the file's path.
async fn on_manual_clock() -> (
    tempfile::TempDir,
    std::path::PathBuf,
    Arc<ManualClock>,
    SqliteBackend,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.db");
    let clock = Arc::new(ManualClock::new(T0));
    let url = format!("sqlite://{}", path.display());
    let sqlite = SqliteBackend::connect_with_clock(&url, Arc::clone(&clock) as Arc<dyn Clock>)
        .await
        .unwrap();
    (dir, path, clock, sqlite)
}

/// A status reads one snapshot without the write lock when the step would change nothing
/// (`stores/sql/snapshot.rs`): while another process holds the write lock in an open
/// transaction, it answers the holders and the queue, with nothing written.
#[tokio::test]
async fn status_answers_while_another_process_holds_the_write_lock() {
    let (_dir, path, _clock, sqlite) = on_manual_clock().await;
    status_locks::semaphore_status_answers_while_locked(&sqlite, &name("busy"), async || {
        Blocker::sqlite(&path).await
    })
    .await;
}

/// A limiter's status reads one snapshot without the write lock
/// (`stores/sql/rate_snapshot.rs`): while another process holds the write lock in an open
/// transaction, it answers. Before, it was a step, which waited for the write lock.
#[tokio::test]
async fn rate_status_answers_while_another_process_holds_the_write_lock() {
    let (_dir, path, _clock, sqlite) = on_manual_clock().await;
    status_locks::rate_status_answers_while_locked(&sqlite, &name("r"), async || {
        Blocker::sqlite(&path).await
    })
    .await;
}

/// A limiter's status when something is due (a prune, an expiry) is the reference model's,
/// and so are the acquires after it.
#[tokio::test]
async fn rate_status_when_something_is_due_is_the_models() {
    let (_dir, _path, clock, sqlite) = on_manual_clock().await;
    status_locks::rate_status_when_something_is_due_is_the_models(&sqlite, &name("r"), async |d| {
        clock.advance(d)
    })
    .await;
}
