//! `tessera-chaos`: runs the reliability scenarios against a store and checks the grant logs.
//!
//! ```text
//! tessera-chaos --store sqlite|redis|postgres|mariadb|etcd|redis+sentinel|redis+cluster \
//!               --profile short|long [--scenario NAME[,NAME…]] [--seed N] [--json] [--tenants]
//! ```
//!
//! Prints one line per scenario (or, with `--json`, one JSON object per line) and exits with
//! 1 if any scenario broke a property, 2 if the runner itself failed.

use clap::Parser;
use tessera_testkit::chaos::{self, Profile, RunConfig, StoreSpec};

#[derive(Debug, Parser)]
#[command(
    name = "tessera-chaos",
    about = "Runs tessera's reliability scenarios (faults + grant-log checks) against a store"
)]
struct Args {
    /// `sqlite`, `redis`, `postgres`, `mariadb` (or `mysql`), `etcd`, `redis+sentinel`,
    /// `redis+sentinel?wait=1` or `redis+cluster` (throwaway stores and topologies the runner
    /// owns), or a `sqlite:///path.db` base path, or a loopback `redis://127.0.0.1:PORT` or
    /// `etcd://127.0.0.1:PORT` (scenarios that restart or reconfigure the server are then
    /// reported as n/a, with why).
    #[arg(long)]
    store: String,
    /// `short` (seconds per scenario) or `long` (longer, several seeds).
    #[arg(long, default_value = "short")]
    profile: Profile,
    /// Run only this scenario (repeat, or separate with commas, for several).
    #[arg(long, value_delimiter = ',')]
    scenario: Vec<String>,
    /// Run only this seed.
    #[arg(long)]
    seed: Option<u64>,
    /// One JSON object per scenario on stdout.
    #[arg(long)]
    json: bool,
    /// Workers as three tenants with shares 1, 2 and 3, the first at a ceiling of one
    /// permit fewer than the capacity (docs/fair-shares.md); not on etcd.
    #[arg(long)]
    tenants: bool,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let store = match StoreSpec::parse(&args.store) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("tessera-chaos: {e:#}");
            std::process::exit(2);
        }
    };
    let cfg = RunConfig {
        store,
        profile: args.profile,
        scenarios: args.scenario,
        seed: args.seed,
        tenants: args.tenants,
    };
    let json = args.json;
    let print = |r: &chaos::ScenarioReport| {
        if json {
            println!("{}", serde_json::to_string(r).expect("a report serializes"));
        } else {
            println!("{}", r.summary());
        }
    };
    let reports = match chaos::run_with(&cfg, print).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tessera-chaos: {e:#}");
            std::process::exit(2);
        }
    };
    let mut failed = false;
    for r in &reports {
        failed |= !r.violations.is_empty();
    }
    std::process::exit(if failed { 1 } else { 0 });
}
