//! `tessera-rate-worker`: one worker process of the multi-process rate-limit test. Hammers a
//! rate limiter with `try_acquire` and `acquire` for a while and logs every admission (see
//! `tessera_testkit::ratelog`); prints its counts.

use clap::Parser;
use tessera_testkit::ratelog::{run_rate_worker, RateWorkerArgs};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = RateWorkerArgs::parse();
    let summary = run_rate_worker(&args).await?;
    println!("{summary:?}");
    Ok(())
}
