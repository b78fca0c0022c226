//! Placeholder entry point (the real CLI is being written on another branch); for now it
//! only wires `tessera bench`.

mod bench;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "tessera", about = "Distributed semaphores and locks")]
struct Cli {
    /// The store URL.
    #[arg(
        long,
        env = "TESSERA_STORE",
        global = true,
        default_value = "memory://"
    )]
    store: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Runs the benchmark workloads against the store.
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Runtime::new()?;
    let code = match &cli.command {
        Command::Bench(args) => rt.block_on(bench::run(&cli.store, args))?,
    };
    std::process::exit(code);
}
