//! `tessera`: run commands under distributed semaphores and rate limits, and inspect or
//! administer them. The binary (`main.rs`) only calls [`main`]; being a library lets the fuzz
//! target in `fuzz/` parse command lines with the very definition the binary uses
//! (`try_parse_from`, hidden). Nothing here is a stable API.
//!
//! One file per concern: `run.rs` (hold permits while a command runs), `status.rs`,
//! `admin.rs` (revoke, resize, delete), `serve/` (the HTTP server), `store_url.rs` (which store), `signals.rs` (catching
//! signals with their sender), `exit.rs` (the documented exit codes).

mod admin;
mod bench;
mod exit;
mod progress;
mod run;
mod serve;
mod signals;
mod status;
mod store_url;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory as _, Parser, Subcommand};

const ROOT_HELP: &str = "\
Examples:
  # at most 2 nightly exports at once, across every process using the store
  tessera run --name exports --permits 2 --ttl 30s -- ./export.sh --full
  # at most 50 calls per second and 1,000 per minute, across every process
  tessera run --name sms-api --rate 50/s --rate 1000/min -- ./send-one.sh
  tessera status exports
  tessera --store redis://127.0.0.1:6379 status --json

Stores: --store URL, else TESSERA_STORE, else the embedded SQLite store at
$XDG_STATE_HOME/tessera/tessera.db (default ~/.local/state/tessera/tessera.db).
  sqlite:///absolute/path.db   processes on one host; the path must be absolute
  redis://[user[:password]@]host[:port][/db], rediss://... (TLS)
                               processes on many hosts
  redis+sentinel://host:port[,host:port...]/MASTER[/db][?wait=N]
                               the master that Redis Sentinel names; failovers followed
  redis+cluster://host:port[,host:port...]
                               a Redis Cluster; semaphores spread over its shards
  postgres://[user[:password]@]host[:port]/database[?schema=S], postgresql://...
                               processes on many hosts, on a PostgreSQL database
  mysql://[user[:password]@]host[:port]/database, mariadb://...
                               processes on many hosts, on a MySQL / MariaDB database
  etcd://host:port[,host:port...][/prefix], etcds://... (TLS)
                               consensus-backed (etcd); leases of whole seconds, at least 2 s;
                               no rate limits (etcd has no clock a transaction can read)
  memory://                    this process only (for trying things out)
run and bench create a missing SQLite store; status, revoke, resize and delete never do.
Logging: TESSERA_LOG=debug (an env filter; default: tessera's warnings, other crates' errors), on stderr.

";

/// `tessera --version`: the version and the stores this build takes (the `tessera` features
/// in this crate's Cargo.toml; `--store` with any other scheme is refused).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (stores: memory, sqlite, redis, postgres, mysql, etcd)"
);

/// Distributed semaphores, locks and rate limits: run commands while holding permits, or
/// within rate limits, shared by every process on the same store, and inspect or administer
/// them.
#[derive(Debug, Parser)]
#[command(name = "tessera", version = VERSION, arg_required_else_help = true, after_help = format!("{ROOT_HELP}{}", exit::HELP_TABLE))]
struct Cli {
    /// Store URL: sqlite:///absolute/path.db, redis://host:6379, redis+sentinel://...,
    /// redis+cluster://..., postgres://host/db, mysql://host/db, etcd://host:2379 or memory://
    /// (see tessera --help; passwords are never printed)
    #[arg(
        long,
        global = true,
        env = "TESSERA_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a command while holding permits of a semaphore, or within rate limits, or both
    #[command(after_help = format!("{RUN_HELP}{}", exit::HELP_TABLE))]
    Run(RunCmd),
    /// Show a semaphore's holders and queue and a rate limiter's usage, or a line for each
    #[command(after_help = STATUS_HELP)]
    Status(StatusCmd),
    /// Revoke a holder's lease (admin); the holder is told it lost its permit
    #[command(after_help = REVOKE_HELP)]
    Revoke {
        /// Semaphore name
        name: String,
        /// Lease id, as shown by `tessera status NAME`
        lease_id: String,
    },
    /// Change a semaphore's capacity (admin); shrinking never revokes
    #[command(after_help = RESIZE_HELP)]
    Resize {
        /// Semaphore name
        name: String,
        /// New capacity
        capacity: u32,
    },
    /// Delete a semaphore (holders and waiters) and a rate limiter (history and
    /// reservations) under NAME (admin)
    #[command(after_help = DELETE_HELP)]
    Delete {
        /// Semaphore or rate limiter name
        name: String,
    },
    /// Show or set tenants' ceilings and floors on a semaphore (admin)
    #[command(after_help = TENANTS_HELP)]
    Tenants(admin::TenantsCmd),
    /// Measure the store: W1 (1 client), W2 (8 clients on a lock), W3 (32 clients, capacity 4)
    #[command(after_help = BENCH_HELP)]
    Bench(bench::BenchArgs),
    /// Serve the store's semaphores and rate limits over HTTP/JSON, with metrics and a
    /// dashboard
    #[command(after_help = SERVE_HELP)]
    Serve(ServeCmd),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) to stdout
    #[command(after_help = COMPLETIONS_HELP)]
    Completions {
        /// The shell to complete in
        shell: clap_complete::Shell,
    },
    /// Print tessera's manual page (roff) to stdout, or write every page into a folder
    #[command(after_help = MAN_HELP)]
    Man {
        /// Print the page of this command, tessera-COMMAND(1), instead of tessera(1)
        #[arg(value_name = "COMMAND")]
        command: Option<String>,
        /// Write every page (tessera.1, tessera-run.1, ...) into DIR instead of printing one
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        dir: Option<std::path::PathBuf>,
    },
}

const COMPLETIONS_HELP: &str = "\
Examples:
  tessera completions bash > ~/.local/share/bash-completion/completions/tessera
  tessera completions zsh > \"${fpath[1]}/_tessera\"
  tessera completions fish > ~/.config/fish/completions/tessera.fish

The script completes subcommands, flags and fixed values; it is generated from this build's
command line, so regenerate it after an upgrade.";

const MAN_HELP: &str = "\
Examples:
  tessera man --dir ~/.local/share/man/man1 && man tessera   # every page
  tessera man run | man -l -                                 # one page, tessera-run(1)

The pages are generated from this build's command line: the commands, flags and examples of
tessera --help and tessera COMMAND --help.
Exit codes: 0 printed or written; 64 no such command; 71 cannot write.";

const SERVE_HELP: &str = "\
Examples:
  tessera --store redis://127.0.0.1:6379 serve --listen 127.0.0.1:8080
  tessera serve --listen 0.0.0.0:8443 --tokens /etc/tessera/tokens \\
      --tls-cert cert.pem --tls-key key.pem
  curl -s -H 'Content-Type: application/json' -d '{\"capacity\": 4, \"wait\": \"10s\"}' \\
      http://127.0.0.1:8080/v1/semaphores/exports/acquire
  curl -s -H 'Content-Type: application/json' \\
      -d '{\"limits\": [\"50/s\", \"1000/min\"], \"max_wait\": \"5s\"}' \\
      http://127.0.0.1:8080/v1/rates/sms-api/acquire

The API is under /v1 (OpenAPI document at /v1/openapi.json); request bodies are JSON, sent
with Content-Type: application/json (any other type is refused, 415). Prometheus metrics at
/metrics, a live dashboard at /. Without --tokens only a loopback address is accepted.
The tokens file holds one \"TOKEN PREFIX\" per line (PREFIX * for every name; a token is
at least 16 printable characters, and each token is on one line only); requests
send Authorization: Bearer TOKEN. The first line on stdout names the address bound.
SIGTERM or SIGINT: stop accepting, release the leases held for event streams, finish the
requests in flight (up to 10 s), exit 0.
Exit codes: 0 stopped by a signal; 64 invalid value (address, tokens file, certificate);
69 store fault; 71 cannot listen.";

#[derive(Debug, Args)]
struct ServeCmd {
    /// Address to listen on (IP:PORT; port 0 picks a free one)
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8080")]
    listen: std::net::SocketAddr,
    /// Bearer tokens, one \"TOKEN PREFIX\" per line (PREFIX * for every name); required to
    /// listen on a non-loopback address
    #[arg(long, value_name = "FILE")]
    tokens: Option<std::path::PathBuf>,
    /// TLS certificate chain (PEM); with --tls-key
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// TLS private key (PEM); with --tls-cert
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// How long a store call may take before the request fails (503 store_unavailable);
    /// waits (acquire's wait, max_wait) come on top
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = humantime::parse_duration)]
    request_timeout: Duration,
    /// How long the server's probes of the store may go unanswered (two in a row, each given
    /// half of it) before the store is taken as down: /healthz then answers 503, and so does
    /// every request that needs the store, at once, until a probe is answered again. The
    /// embedded stores (memory, SQLite) are not probed
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = humantime::parse_duration)]
    store_timeout: Duration,
    /// Print the OpenAPI document and exit
    #[arg(long)]
    openapi: bool,
}

const BENCH_HELP: &str = "\
Examples:
  tessera --store redis://127.0.0.1:6379 bench                 # W1, W2 and W3, a table
  tessera --store redis://127.0.0.1:6379 bench --workload w2 --json
  tessera bench --workload w3 --ops 5000                       # the embedded SQLite store

Every client has its own connection; a progress bar shows on a terminal. Measured: ops/s,
acquire latency p50/p99/max, hand-offs/s, grants per client, over-grants seen by an
independent counter, and on a single Redis server (redis://) its CPU per grant and one
client's bare round trips per second (on redis+cluster://, --workload many reports the CPU
per grant of each primary; the other stores and layouts leave these columns empty). Run it on a store no one else uses: it creates and deletes semaphores named
tessera-bench-*.
Exit codes: 0 clean; 1 an over-grant was seen; 2 errors or --duration reached; 64 bad input.";

const RUN_HELP: &str = "\
Examples:
  # at most 2 exports at once; give up after 10 s of waiting (exit 75)
  tessera run --name exports --permits 2 --wait 10s -- ./export.sh --full
  # a GPU pool of 8 seats; this job takes 2 and learns which ones
  tessera run --name gpus --permits 8 --weight 2 -- sh -c 'echo \"GPUs $TESSERA_SEATS\"; ./train'
  # at most 50 calls per second and 1,000 per minute across every host
  tessera run --name sms-api --rate 50/s --rate 1000/min -- ./send-one.sh
  # one of 4 slots, then a turn within 10 calls per second; --wait bounds both waits
  tessera run --name sms-api --permits 4 --rate 10/s --wait 30s -- ./send-batch.sh

The command gets TESSERA_LEASE_ID, TESSERA_FENCE (pass it to the protected resource),
TESSERA_SEATS (comma-separated seat numbers) and TESSERA_NAME. SIGINT, SIGTERM, SIGHUP,
SIGQUIT, SIGUSR1 and SIGUSR2 sent to tessera are forwarded to the command (a terminal's
Ctrl-C already reaches it and is not sent twice). If the permit is lost, the command gets
SIGTERM at once and SIGKILL just before the lease could expire, and tessera exits 74.
If tessera is killed (kill -9), the command dies with it, and so does every process it
started, unless stdin is a terminal (an interactive command shares tessera's process group).
The permit is released when the command exits. With --rate, tessera reserves the earliest
time every limit allows (in arrival order, no polling) and starts the command then; if that
time is beyond --wait, nothing is charged and tessera exits 75.
A wait outlasts store outages: if the store stops answering, tessera says so in one line,
retries until it answers again (one more line), then waits again from the tail of the
queue. Only a store unreachable at the start, an outage still on when --wait runs out, or
a non-transient store error (e.g. refused credentials) ends the wait with exit 69.

";

const STATUS_HELP: &str = "\
Examples:
  tessera status                 # one line per semaphore and per rate limiter
  tessera status exports         # capacity, holders (lease, seats, fence, ...) and queue,
                                 # and the usage of the rate limiter named exports, if any
  tessera status exports --json  # the same as JSON
  tessera status exports --watch 500ms

status never creates a store: a SQLite file that does not exist yet, or a PostgreSQL or MySQL
database without tessera's tables (a mistyped ?schema=), shows as nothing yet.
With --watch the screen is redrawn on a terminal; into a pipe or file, each refresh is
printed after the previous one (with --json, one document per line).
Exit codes: 0 shown (the list form also when the store is empty or does not exist yet:
--json prints []); 1 nothing for NAME, or no store yet (--json prints null); 64 invalid
value (name, store URL, --watch interval); 69 store fault.";

const REVOKE_HELP: &str = "\
Example:
  tessera revoke exports 5f0c3f4e9b0a4d21a3c1e2f3a4b5c6d7

Exit codes: 0 revoked; 1 that lease does not hold NAME, or no store yet; 64 invalid value;
69 store fault.";

const RESIZE_HELP: &str = "\
Example:
  tessera resize exports 4

Clients that declared the old capacity get a capacity-mismatch error (exit 64) from then on.
Exit codes: 0 resized; 1 no such semaphore, or no store yet; 64 invalid value; 69 store
fault.";

const TENANTS_HELP: &str = "\
Examples:
  tessera tenants provider                           # each tenant's ceiling and floor
  tessera tenants provider bulk --ceiling 3          # bulk never holds more than 3
  tessera tenants provider alerts --floor 1          # 1 permit kept for alerts
  tessera tenants provider alerts --ceiling 2 --floor 1
  tessera tenants provider bulk --clear

Setting replaces both values: one left out is none (no ceiling, floor 0). Limits are kept
for NAME while nobody holds or waits, until changed or `tessera delete NAME`; floors must
fit the capacity of a semaphore that exists. The tenants are those of `tessera run --tenant`
(docs/fair-shares.md#ceilings-and-floors).
Exit codes: 0 shown or set; 64 invalid value, or a store that keeps no tenant limits; 69
store fault.";

const DELETE_HELP: &str = "\
Example:
  tessera delete exports

Deleting a rate limiter resets it: its history and reservations are gone, and a full limit
admits again at once. Holders of the semaphore are told they lost their permits.
Exit codes: 0 deleted (the line says what: the semaphore, the rate limiter or both); 1 neither
exists under NAME, or no store yet; 64 invalid value; 69 store fault.";

#[derive(Debug, Args)]
struct RunCmd {
    /// Name of the semaphore and of the --rate limiter (A-Z a-z 0-9 . _ - : / @, starting
    /// with a letter or digit)
    #[arg(long)]
    name: String,
    /// Capacity of the semaphore: how many permits exist in all (optional with --rate)
    #[arg(long, value_name = "C", required_unless_present = "rate")]
    permits: Option<u32>,
    /// Permits this command takes, as one lease (1..=C)
    #[arg(long, value_name = "W", default_value_t = 1)]
    weight: u32,
    /// Lease TTL: how long the permit outlives tessera if it is killed (100ms..24h)
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Give up (exit 75) if the permit (and the turn within --rate) does not come within
    /// this time; default: wait as long as it takes, store outages included. 0s: only if
    /// free now
    #[arg(long, value_name = "DURATION", value_parser = humantime::parse_duration)]
    wait: Option<Duration>,
    /// Holder label shown by `tessera status` (default: hostname/pid)
    #[arg(long, value_name = "LABEL")]
    holder: Option<String>,
    /// The tenant this command's permit counts against: under contention, permits go to the
    /// waiting tenants in proportion to their --share, FIFO within each, within the ceiling
    /// and floor `tessera tenants` sets (docs/fair-shares.md; every store but etcd, which
    /// refuses it)
    #[arg(long, value_name = "NAME", requires = "permits")]
    tenant: Option<String>,
    /// The tenant's share (1..=1000; default 1)
    #[arg(long, value_name = "N", requires = "tenant", default_value_t = 1)]
    share: u32,
    /// A rate limit N/PERIOD on NAME (e.g. 50/s, 1000/min, 20000/h); repeat for several,
    /// all charged at once. With --permits, the permit is taken first, then the rate
    #[arg(long, value_name = "N/PERIOD")]
    rate: Vec<tessera::RateSpec>,
    /// Cost charged to every --rate limit (1..=the smallest N)
    #[arg(long, value_name = "K", default_value_t = 1, requires = "rate")]
    cost: u32,
    /// Replace the limits stored under NAME if they differ from --rate (otherwise a
    /// mismatch is refused with exit 64)
    #[arg(long, requires = "rate")]
    update_rates: bool,
    /// Margin between a --rate turn's admission and the command's start (0..1s, at most the
    /// shortest PERIOD; default 20ms, and 100ms with --permits, where the permit and the
    /// windows are one admission). The limits are enforced on windows of PERIOD + margin,
    /// so commands started within the margin of their admission never exceed N per PERIOD;
    /// it costs margin/(PERIOD + margin) of the throughput. Stored with the limits: every
    /// client of NAME must declare the same (or use --update-rates)
    #[arg(long, value_name = "DURATION", requires = "rate", value_parser = humantime::parse_duration)]
    rate_margin: Option<Duration>,
    /// Draw no waiting line on the terminal (the line shows what the wait is for, the place
    /// in the queue, the time waited and the deadline; never drawn when stderr is not a
    /// terminal)
    #[arg(long, short = 'q')]
    quiet: bool,
    /// The command and its arguments; put them after -- if the command starts with -
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    command: Vec<OsString>,
}

#[derive(Debug, Args)]
struct StatusCmd {
    /// Semaphore or rate limiter name; without it, one line per semaphore and per limiter
    name: Option<String>,
    /// Print JSON: one object for NAME, an array otherwise (one document per refresh with
    /// --watch)
    #[arg(long)]
    json: bool,
    /// Refresh every INTERVAL (default 1s) until Ctrl-C
    #[arg(
        long,
        value_name = "INTERVAL",
        num_args = 0..=1,
        default_missing_value = "1s",
        value_parser = humantime::parse_duration
    )]
    watch: Option<Duration>,
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    // The library logs a lost lease at `warn`; `run` reports it itself in one line. Other
    // crates' warnings (a cluster client's failed node connect, a slow SQL statement) would
    // only repeat, in their words, the one line tessera prints about the same fault.
    let filter = EnvFilter::try_from_env("TESSERA_LOG").unwrap_or_else(|_| {
        EnvFilter::new("error,tessera=warn,tessera_cli=warn,tessera::permit=error")
    });
    // Colours only on a terminal: a log file or a pipe gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .with_env_filter(filter)
        .init();
}

async fn dispatch(cli: Cli) -> exit::Outcome {
    let store = cli.store.as_deref();
    match cli.command {
        Command::Run(r) => {
            let args = run::RunArgs {
                name: r.name,
                permits: r.permits,
                weight: r.weight,
                ttl: r.ttl,
                wait: r.wait,
                holder: r.holder,
                tenant: r.tenant.map(|t| (t, r.share)),
                rates: r.rate,
                cost: r.cost,
                update_rates: r.update_rates,
                rate_margin: r.rate_margin,
                quiet: r.quiet,
                command: r.command,
            };
            run::run(store, args).await
        }
        Command::Status(s) => {
            let args = status::StatusArgs {
                name: s.name,
                json: s.json,
                watch: s.watch,
            };
            status::status(store, args).await
        }
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tessera", &mut script);
            print_or_fail(&script)
        }
        Command::Man { command, dir } => man(command.as_deref(), dir.as_deref()),
        Command::Revoke { name, lease_id } => admin::revoke(store, &name, &lease_id).await,
        Command::Resize { name, capacity } => admin::resize(store, &name, capacity).await,
        Command::Delete { name } => admin::delete(store, &name).await,
        Command::Tenants(cmd) => admin::tenants(store, cmd).await,
        Command::Serve(s) => {
            if s.openapi {
                use std::io::Write as _;
                let _ = writeln!(std::io::stdout(), "{}", serve::openapi_json());
                return Ok(exit::OK);
            }
            let args = serve::ServeArgs {
                listen: s.listen,
                tokens: s.tokens,
                tls_cert: s.tls_cert,
                tls_key: s.tls_key,
                request_timeout: s.request_timeout,
                store_timeout: s.store_timeout,
            };
            serve::serve(store, args).await
        }
        Command::Bench(args) => {
            let url = match store {
                Some(u) => u.to_string(),
                None => format!("sqlite://{}", store_url::default_db_path()?.display()),
            };
            match bench::run(&url, &args).await {
                Ok(code) => Ok(code as u8),
                Err(e) => Err(exit::Failure::new(
                    exit::UNAVAILABLE,
                    exit::one_line(&format!("{e:#}")),
                )),
            }
        }
    }
}

/// The manual pages, tessera(1) first, then tessera-COMMAND(1) for each command: (file
/// name, roff text).
fn man_pages() -> Vec<(String, Vec<u8>)> {
    let mut root = Cli::command().disable_help_subcommand(true);
    root.build();
    let source = format!("tessera {}", env!("CARGO_PKG_VERSION"));
    let mut pages = Vec::new();
    for cmd in std::iter::once(&root).chain(root.get_subcommands()) {
        let man = clap_mangen::Man::new(cmd.clone()).source(source.clone());
        let mut page = Vec::new();
        // Rendering into memory cannot fail.
        let _ = man.render(&mut page);
        pages.push((man.get_filename(), page));
    }
    pages
}

/// `tessera man [COMMAND] [--dir DIR]`.
fn man(command: Option<&str>, dir: Option<&std::path::Path>) -> exit::Outcome {
    let pages = man_pages();
    if let Some(dir) = dir {
        for (file, page) in &pages {
            let path = dir.join(file);
            std::fs::write(&path, page).map_err(|e| {
                exit::Failure::new(
                    exit::OS_ERROR,
                    format!("cannot write {}: {e}", path.display()),
                )
            })?;
        }
        return Ok(exit::OK);
    }
    let wanted = match command {
        None => "tessera.1".to_string(),
        Some(c) => format!("tessera-{c}.1"),
    };
    match pages.iter().find(|(file, _)| *file == wanted) {
        Some((_, page)) => print_or_fail(page),
        None => {
            let names: Vec<&str> = pages
                .iter()
                .skip(1)
                .filter_map(|(file, _)| file.strip_prefix("tessera-")?.strip_suffix(".1"))
                .collect();
            Err(exit::Failure::new(
                exit::USAGE,
                format!(
                    "no command {:?}: tessera man takes one of {}",
                    command.unwrap_or_default(),
                    names.join(", ")
                ),
            ))
        }
    }
}

/// Writes `bytes` to stdout: exit 0, or 71 naming the failure. A reader that
/// closed the pipe early (`tessera man | head`) is not a failure.
fn print_or_fail(bytes: &[u8]) -> exit::Outcome {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(exit::OK),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(exit::OK),
        Err(e) => Err(exit::Failure::new(
            exit::OS_ERROR,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

/// Parses the command line. Help and version go to stdout (exit 0). Every failure is one line
/// on stderr: an invalid value, unparseable or out of range (`--ttl soon`, `--permits abc`,
/// `--rate 2/x`), exits 64 like the values checked later (`--ttl 30d`); any other usage
/// error (unknown flag or command, missing argument) exits 2.
fn parse() -> Result<Cli, ExitCode> {
    use clap::error::ErrorKind;
    match Cli::try_parse() {
        Ok(cli) => Ok(cli),
        Err(e)
            if !e.use_stderr()
                || e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            e.exit()
        }
        Err(e) => {
            let rendered = e.render().to_string();
            // The first paragraph is the error itself; usage and tips follow.
            let first: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            eprintln!("tessera: {first} (see --help)");
            let code = match e.kind() {
                ErrorKind::InvalidValue | ErrorKind::ValueValidation | ErrorKind::InvalidUtf8 => {
                    exit::USAGE
                }
                _ => exit::PARSE_ERROR,
            };
            Err(ExitCode::from(code))
        }
    }
}

/// Parses `argv` (the program name first) as the binary does, and runs nothing: for the
/// `cli_args` fuzz target.
#[doc(hidden)]
pub fn try_parse_from<I, T>(argv: I) -> Result<(), clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    Cli::try_parse_from(argv).map(drop)
}

/// The `tessera` command: parses the command line, runs the command, returns its exit code.
pub fn main() -> ExitCode {
    let cli = match parse() {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    init_logging();
    // Current-thread: `run` spawns its command from the main thread, which PR_SET_PDEATHSIG
    // relies on (see run.rs). `bench --threads N` picks its own.
    let mut builder = match &cli.command {
        Command::Bench(b) if b.threads > 0 => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(b.threads);
            builder
        }
        // A server: every core serves connections.
        Command::Serve(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tessera: cannot start the async runtime: {e}");
            return ExitCode::from(exit::OS_ERROR);
        }
    };
    let outcome = runtime.block_on(dispatch(cli));
    runtime.shutdown_background();
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("tessera: {failure}");
            ExitCode::from(failure.code)
        }
    }
}
