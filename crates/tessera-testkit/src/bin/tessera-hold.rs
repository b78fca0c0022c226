//! Acquires one permit and holds it until killed, printing `HELD <lease id> <fence>`; if the
//! lease is lost, prints `LOST <microseconds since the Unix epoch>` (the host's wall clock,
//! for tests on one machine to order it against other events) and exits with 3.
//! Usage: tessera-hold --store URL --name NAME --permits C --ttl-ms T

use std::time::Duration;

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .unwrap_or_else(|| panic!("missing {flag}"))
            .clone()
    };
    let store = tessera::Store::connect(&arg("--store"))
        .await
        .expect("connect");
    let opts = tessera::SemaphoreOptions::default()
        .ttl(Duration::from_millis(
            arg("--ttl-ms").parse().expect("--ttl-ms"),
        ))
        .holder("tessera-hold");
    let sem = tessera::Semaphore::new(
        &store,
        &arg("--name"),
        arg("--permits").parse().expect("--permits"),
        opts,
    )
    .expect("semaphore");
    let p = sem.acquire().await.expect("acquire");
    println!("HELD {} {}", p.lease_id(), p.fence());
    let reason = p.lost().await;
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    println!("LOST {}", at.as_micros());
    eprintln!("tessera-hold: lost: {reason}");
    std::process::exit(3);
}
