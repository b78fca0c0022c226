//! How good is the expected wait a watched acquire is told? `N` waiters queue behind a
//! semaphore whose holders keep it for a steady time (`hold`), or behind an admission whose
//! rate limit paces them (`rate`); each records the first expected wait it was told and the
//! wait it then had from that moment, and the run prints the median and p90 of
//! |told − had| / had. Not a test: figures go to docs/performance.md.
//!
//! ```sh
//! cargo run --release -p tessera-locks --example expected_wait -- [STORE_URL] [WAITERS]
//! ```

use std::time::Duration;

use tessera::{QueuePlace, SemaphoreOptions, Store};
use tokio::time::Instant;

/// One waiter's record: what it was first told, and the wait it had from then.
struct Told {
    told: Duration,
    had: Duration,
}

#[tokio::main]
async fn main() -> Result<(), tessera::Error> {
    let mut args = std::env::args().skip(1);
    let url = args.next().unwrap_or_else(|| "memory://".to_string());
    let waiters: usize = args.next().map_or(40, |n| n.parse().expect("WAITERS"));
    let store = Store::connect(&url).await?;
    println!("store {url}, {waiters} waiters each case");
    for (capacity, hold) in [(1, 100), (4, 400)] {
        let errors = semaphore_case(&store, waiters, capacity, Duration::from_millis(hold)).await?;
        report(
            &format!("semaphore, capacity {capacity}, hold {hold} ms"),
            &errors,
        );
    }
    match admission_case(&store, waiters).await {
        Ok(errors) => report("admission, 2 permits, hold 10 ms, 10/s", &errors),
        Err(tessera::Error::Unsupported(e)) => println!("admission: {e}"),
        Err(e) => return Err(e),
    }
    store.close().await
}

/// Waiters that each hold the permit for `hold`, all queued at once.
async fn semaphore_case(
    store: &Store,
    waiters: usize,
    capacity: u32,
    hold: Duration,
) -> Result<Vec<Told>, tessera::Error> {
    let name = format!("expected-wait-{capacity}-{}", std::process::id());
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let sem = tessera::Semaphore::new(
            store,
            &name,
            capacity,
            SemaphoreOptions::default().holder(format!("waiter-{i}")),
        )?;
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = tokio::sync::watch::channel(None);
            let first = tokio::spawn(first_told(rx));
            let permit = sem
                .acquire_many_watching(1, None, &tx)
                .await?
                .expect("no deadline");
            let granted = Instant::now();
            tokio::time::sleep(hold).await;
            permit.release().await?;
            drop(tx);
            Ok::<_, tessera::Error>(first.await.expect("the watcher").map(|(at, told)| Told {
                told,
                had: granted - at,
            }))
        }));
        // In arrival order.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    collect(tasks).await
}

/// Admissions of 2 permits at 10/s: the windows pace the queue.
async fn admission_case(store: &Store, waiters: usize) -> Result<Vec<Told>, tessera::Error> {
    let name = format!("expected-wait-rate-{}", std::process::id());
    let mut tasks = Vec::new();
    for i in 0..waiters {
        let adm = store
            .admission(&name)
            .semaphore_options(SemaphoreOptions::default().holder(format!("waiter-{i}")))
            .permits(2)
            .rate("10/s".parse()?)?;
        tasks.push(tokio::spawn(async move {
            let (tx, rx) = tokio::sync::watch::channel(None);
            let first = tokio::spawn(first_told(rx));
            let ticket = adm
                .acquire_watching(Duration::from_secs(600), &tx)
                .await?
                .expect("admitted");
            let granted = Instant::now();
            tokio::time::sleep(Duration::from_millis(10)).await;
            ticket.release().await?;
            drop(tx);
            Ok::<_, tessera::Error>(first.await.expect("the watcher").map(|(at, told)| Told {
                told,
                had: granted - at,
            }))
        }));
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    collect(tasks).await
}

/// The first expected wait published, and when.
async fn first_told(
    mut rx: tokio::sync::watch::Receiver<Option<QueuePlace>>,
) -> Option<(Instant, Duration)> {
    while rx.changed().await.is_ok() {
        if let Some(told) = rx.borrow_and_update().and_then(|p| p.expected_wait) {
            return Some((Instant::now(), told));
        }
    }
    None
}

async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Result<Option<Told>, tessera::Error>>>,
) -> Result<Vec<Told>, tessera::Error> {
    let mut out = Vec::new();
    for t in tasks {
        if let Some(told) = t.await.expect("a waiter")? {
            out.push(told);
        }
    }
    Ok(out)
}

fn report(case: &str, told: &[Told]) {
    let mut errors: Vec<f64> = told
        .iter()
        .filter(|t| !t.had.is_zero())
        .map(|t| (t.told.as_secs_f64() - t.had.as_secs_f64()).abs() / t.had.as_secs_f64())
        .collect();
    errors.sort_by(f64::total_cmp);
    let at = |q: f64| errors[((errors.len() - 1) as f64 * q).round() as usize];
    if errors.is_empty() {
        println!("{case}: no waiter was told an expected wait");
        return;
    }
    let over = told.iter().filter(|t| t.told > t.had).count();
    println!(
        "{case}: {} waiters told an expected wait; |error|/actual median {:.0}%, p90 {:.0}%; \
         {over} told too long, {} too short",
        errors.len(),
        at(0.5) * 100.0,
        at(0.9) * 100.0,
        told.len() - over,
    );
}
