//! Acquires one permit and holds it until killed, printing `HELD <lease id> <fence>`.
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
    eprintln!("tessera-hold: lost: {reason}");
    std::process::exit(3);
}
