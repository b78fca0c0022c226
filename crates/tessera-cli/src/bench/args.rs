//! The options of `tessera bench`.

use std::time::Duration;

use super::rate::RateBenchMode;

/// Which workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// 1 client, capacity 10, acquire + release loop.
    W1,
    /// 8 clients on a lock, hold ≈ 0.
    W2,
    /// 32 clients, capacity 4.
    W3,
    /// W1, W2 and W3 in turn (not `rate`).
    All,
    /// Many semaphores at once (`--names`, default 64, each a lock with `--clients` per
    /// name, default 4): how throughput spreads over the shards of a Redis Cluster.
    Many,
    /// Clients on one rate limiter (see `--rate-mode`, `--rates`, `--rate-run`).
    Rate,
    /// Clients that need a permit (`--capacity`, default 4) and a turn within `--rates` for
    /// each call: one admission per call beside the permit-then-turn calls, each for
    /// `--rate-run` (default clients: 8).
    Admission,
    /// Fair shares against a flood and between backlogged tenants, beside plain FIFO in the
    /// same run (`--capacity`, default 4; `--hold`, default 20 ms; `--rates`; `--flood`;
    /// each case for `--rate-run`; docs/fair-shares.md).
    Tenants,
    /// W2's shape with etcd's own mutex recipe (its lock API) on the same cluster, the
    /// comparison for `etcd://` (not part of `all`).
    EtcdMutex,
    /// Bounded work: one lock with 10 clients, then with `--clients` (default 1,000), every
    /// client on one shared store connection, each for `--ops` grants or `--duration`; prints
    /// the cost of a hand-off with the deep queue against the shallow one (not part of `all`).
    Depth,
}

/// Options of `tessera bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The workload.
    #[arg(long, value_enum, default_value = "all")]
    pub workload: Workload,
    /// Number of clients (overrides the workload's: 1, 8, 32; rate: 8; many: per name, 4;
    /// depth: the deep run's, 1,000).
    #[arg(long)]
    pub clients: Option<usize>,
    /// Capacity of the semaphore (overrides the workload's: 10, 1, 4).
    #[arg(long)]
    pub capacity: Option<u32>,
    /// Operations per workload: acquire+release pairs for W1, grants for W2 and W3.
    #[arg(long, default_value_t = 20_000)]
    pub ops: u64,
    /// How long each holder keeps its permit (e.g. 0, 500us, 2ms).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub hold: Duration,
    /// The limits of the rate workload (repeatable or comma-separated: 50/s, 1000/min).
    #[arg(long = "rates", value_name = "N/UNIT", value_delimiter = ',', value_parser = parse_rate, default_values = ["50/s", "1000/min"])]
    pub rates: Vec<tessera::RateSpec>,
    /// How the rate workload's clients ask: try_acquire(1) as fast as they can (decisions),
    /// or acquire_within(1, …) with demand above the limit (reserve).
    #[arg(long, value_enum, default_value = "decisions")]
    pub rate_mode: RateBenchMode,
    /// The measured run of the rate workload (admissions counted from the first one for this
    /// long); at most --duration.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub rate_run: Duration,
    /// Hard time bound of each workload.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub duration: Duration,
    /// How long to measure the round-trip limit (bare PINGs of one client on its own
    /// connection): in ten slices between the operations of a single-client workload (so both
    /// see the same machine load), else half before and half after the workload.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    pub rtt_time: Duration,
    /// Extra holders kept on the semaphore during each workload (its capacity raised by as
    /// many, so the workload still sees its own): how the per-operation cost grows with the
    /// number of holders (compare --preload 10 and --preload 10000).
    #[arg(long, default_value_t = 0)]
    pub preload: u32,
    /// On a `mysql://` store: how long each of the server's own baselines runs after the
    /// workloads (one client's INSERT+COMMIT loop, 8 clients on GET_LOCK, 8 clients on a lock
    /// table); 0 skips them.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub baseline_time: Duration,
    /// How many requests the flooding tenant of the tenants workload asks at once.
    #[arg(long, default_value_t = 2_000)]
    pub flood: usize,
    /// Semaphores of the many workload (names spread over a cluster's slots).
    #[arg(long, default_value_t = 64)]
    pub names: usize,
    /// Print one JSON object per workload (one per line) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// On a `postgres://` store: also measure, on the same server in the same run, advisory
    /// lock pairs (W1), advisory lock hand-offs among 8 sessions (W2), one session's
    /// INSERT+COMMIT rate and a SKIP LOCKED semaphore of 32 sessions on 4 slots, each for this
    /// long (0s: skip).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    pub pg_baseline: Duration,
    /// How often the hand-written designs of the SQL baselines (PostgreSQL's SKIP LOCKED
    /// semaphore, MySQL's lock table) ask again after finding nothing free.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2ms")]
    pub baseline_poll: Duration,
    /// Runtime worker threads for the clients: 0 (the default) drives every client from one
    /// thread (tokio's current-thread runtime), which on a small machine shared with the
    /// server avoids cross-thread wake-ups on every reply; N > 0 uses a multi-thread runtime
    /// with N workers, as many services do.
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

fn parse_rate(s: &str) -> Result<tessera::RateSpec, String> {
    s.parse().map_err(|e: tessera::InvalidInput| e.to_string())
}
