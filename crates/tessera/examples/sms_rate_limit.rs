//! Many processes share one messaging API that allows 50 calls per second and 1,000 per
//! minute. Each process runs this program; together they never exceed either limit, counted
//! at the moment each call is made.
//!
//! ```sh
//! # four senders on one host, sharing the embedded store
//! for i in 1 2 3 4; do
//!   cargo run -p tessera-locks --example sms_rate_limit -- sqlite:///tmp/tessera-sms.db 25 &
//! done; wait
//! # the same across hosts: a Redis store
//! cargo run -p tessera-locks --features redis --example sms_rate_limit -- redis://127.0.0.1:6379 25
//! ```
//!
//! Arguments: STORE_URL [CALLS] [LIMIT...] (default limits: 50/s 1000/min). Prints one line
//! per call: `sent <n> at <unix µs> admitted <store µs>`: the moment the call is made, and
//! the store's time of its admission.

use std::time::{SystemTime, UNIX_EPOCH};

use tessera::{RateSpec, Store, StoreTime};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: sms_rate_limit STORE_URL [CALLS] [LIMIT...]")?;
    let calls: u32 = args.next().map_or(Ok(25), |n| n.parse())?;
    let mut limits: Vec<RateSpec> = args.map(|l| l.parse()).collect::<Result<_, _>>()?;
    if limits.is_empty() {
        limits = vec!["50/s".parse()?, "1000/min".parse()?];
    }

    let store = Store::connect(&url).await?;
    // Every process declares the same limits; the store checks them at the first request.
    let sms = store.rate_limiter("sms-api", &limits)?;
    for n in 1..=calls {
        // Reserves the earliest time every limit allows (in arrival order across every
        // process: no polling, no herd) and sleeps until it.
        let admitted = sms.acquire(1).await?;
        send(n, admitted);
    }
    store.close().await?;
    Ok(())
}

/// Stands in for the API call.
fn send(n: u32, admitted: StoreTime) {
    let at = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    println!("sent {n} at {} admitted {}", at.as_micros(), admitted.0);
}
