//! `tessera-worker`: one worker process of the grant-log reliability tests. Acquires,
//! holds and releases permits at random and writes a grant log (see
//! `tessera_testkit::grantlog`); exits non-zero if it could not connect or write its log.

use clap::Parser;
use tessera_testkit::worker::{run_worker, WorkerArgs};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A panic anywhere (also in a background task of the library, which would otherwise
    // die silently) ends the process with 101, which the chaos runner reports.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::exit(101);
    }));
    let args = WorkerArgs::parse();
    let summary = run_worker(&args).await?;
    println!("{summary:?}");
    Ok(())
}
