//! `tessera-worker`: one worker process of the grant-log reliability tests. Acquires,
//! holds and releases permits at random and writes a grant log (see
//! `tessera_testkit::grantlog`); exits non-zero if it could not connect or write its log.

use clap::Parser;
use tessera_testkit::worker::{run_worker, WorkerArgs};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = WorkerArgs::parse();
    let summary = run_worker(&args).await?;
    println!("{summary:?}");
    Ok(())
}
