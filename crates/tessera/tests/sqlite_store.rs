//! The SQLite store against the reference model: the test kit's differential test, on a
//! manual clock the store and the model share, so replies and statuses must be equal,
//! expiries included.
#![cfg(feature = "sqlite")]

use std::sync::Arc;

use tessera::backend::stores::SqliteBackend;
use tessera::backend::{Clock, ManualClock};
use tessera::StoreTime;
use tessera_testkit::differential::{DiffClock, Differential, Seen};

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
