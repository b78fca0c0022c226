//! A pool of 8 GPUs shared by training jobs in many processes. A job takes one or two GPUs as
//! one lease, learns *which* ones from its seats, hands its fence to whatever it writes, and
//! stops when the lease is lost (a crashed or frozen holder's GPUs come back within the TTL;
//! an admin's `tessera revoke` stops a job).
//!
//! ```sh
//! # six jobs wanting 1 or 2 GPUs each, on one host
//! for w in 1 2 1 2 1 2; do
//!   cargo run -p tessera-locks --example gpu_slots -- sqlite:///tmp/tessera-gpus.db $w 500ms &
//! done; wait
//! ```
//!
//! Arguments: STORE_URL [GPUS_WANTED] [WORK_TIME]. Prints `start <unix µs> seats <s,..>
//! fence <f>` when the job starts and `end <unix µs>` when it is done (or `lost: <reason>`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera::{Semaphore, SemaphoreOptions, Store};

const GPUS: u32 = 8;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: gpu_slots STORE_URL [GPUS_WANTED] [WORK_TIME]")?;
    let wanted: u32 = args.next().map_or(Ok(1), |w| w.parse())?;
    let work = args
        .next()
        .map_or(Ok(Duration::from_millis(500)), |d| humantime_ms(&d))?;

    let store = Store::connect(&url).await?;
    // A job that dies keeps its GPUs for at most 10 s.
    let opts = SemaphoreOptions::default().ttl(Duration::from_secs(10));
    let gpus = Semaphore::new(&store, "gpus", GPUS, opts)?;

    // Waits in FIFO order; a job wanting two GPUs is not starved by jobs wanting one.
    let permit = gpus.acquire_many(wanted).await?;
    let seats: Vec<String> = permit.seats().iter().map(u32::to_string).collect();
    println!(
        "start {} seats {} fence {}",
        now_us(),
        seats.join(","),
        permit.fence()
    );
    tokio::select! {
        // The work: train on GPUs `permit.seats()`, tagging checkpoints with `permit.fence()`.
        _ = tokio::time::sleep(work) => println!("end {}", now_us()),
        reason = permit.lost() => println!("lost: {reason}"),
    }
    permit.release().await?;
    store.close().await?;
    Ok(())
}

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros()
}

/// `500ms`, `2s`: the work time.
fn humantime_ms(s: &str) -> Result<Duration, String> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "s" | "" => Ok(Duration::from_secs(n)),
        _ => Err(format!("bad duration {s:?}: use ms or s")),
    }
}
