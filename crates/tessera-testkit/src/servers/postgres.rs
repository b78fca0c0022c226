//! A throwaway PostgreSQL server: `initdb` + `pg_ctl` on a free loopback port in a temp dir,
//! stopped (immediate shutdown) and removed on drop.
//!
//! ```no_run
//! let server = tessera_testkit::servers::postgres::PostgresServer::start();
//! let url = server.url(); // postgres://postgres@127.0.0.1:PORT/postgres
//! # drop(url);
//! ```
//!
//! The binaries come from Debian's `postgresql` package (`/usr/lib/postgresql/<v>/bin`, not on
//! PATH) or PATH. PostgreSQL refuses to run as root: as root, every server command runs as
//! the `postgres` user (`runuser -u postgres`), and the temp dir is handed to that user.
//! `initdb` runs once per machine into a template directory (`$TMPDIR/tessera-pg-template-*`);
//! each server copies it, which takes a fraction of `initdb`'s time. Servers run with
//! `fsync=off` unless started with [`PostgresServer::start_durable`] (benchmarks).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use super::process::{free_port, log_tail, poll_until, start_retrying};

const INSTALL: &str = "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb and no \
     initdb on PATH): install it with `apt-get install -y postgresql`";

/// How a server is shut down by [`PostgresServer::restart_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// `pg_ctl -m fast`: sessions are terminated, a checkpoint is written.
    Fast,
    /// `pg_ctl -m immediate`: like a crash; the next start replays the WAL.
    Immediate,
}

/// A server on `127.0.0.1:<port>`, stopped on drop.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: tempfile::TempDir,
    bin: PathBuf,
    durable: bool,
    running: bool,
}

impl PostgresServer {
    /// Starts a server with `fsync=off` and waits until it accepts connections. Panics
    /// (failing the test) with the install line if PostgreSQL is missing.
    pub fn start() -> PostgresServer {
        PostgresServer::start_with(false)
    }

    /// Starts a server with `fsync=on` (for benchmark figures that must be durable).
    pub fn start_durable() -> PostgresServer {
        PostgresServer::start_with(true)
    }

    fn start_with(durable: bool) -> PostgresServer {
        let bin = bin_dir().unwrap_or_else(|| panic!("{INSTALL}"));
        let template = template(&bin);
        let dir = tempfile::tempdir().expect("temp dir for postgres");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
            .expect("chmod temp dir");
        let data = dir.path().join("data");
        let out = Command::new("cp")
            .arg("-a")
            .arg(&template)
            .arg(&data)
            .output()
            .expect("cp");
        assert!(out.status.success(), "copy the template: {}", text(&out));
        let mut server = PostgresServer {
            port: 0,
            dir,
            bin,
            durable,
            running: false,
        };
        start_retrying("postgres", 10, || {
            server.port = free_port();
            server.pg_ctl_start()
        });
        server
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres` (trust authentication).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The URL with `?schema=…`.
    pub fn url_with_schema(&self, schema: &str) -> String {
        format!("{}?schema={schema}", self.url())
    }

    /// Stops the server with `mode` and starts it again on the same port, with its data.
    pub fn restart_with(&mut self, mode: Shutdown) {
        self.stop(mode);
        self.pg_ctl_start()
            .unwrap_or_else(|e| panic!("postgres restart on port {}: {e}", self.port));
    }

    /// Stops the server (it stays stopped until [`PostgresServer::restart_with`] or
    /// [`PostgresServer::start_again`]).
    pub fn stop(&mut self, mode: Shutdown) {
        let m = match mode {
            Shutdown::Fast => "fast",
            Shutdown::Immediate => "immediate",
        };
        let data = self.data();
        let out = self.run("pg_ctl", &["-D", &data, "-m", m, "-w", "stop"]);
        self.running = false;
        assert!(
            out.status.success() || text(&out).contains("not running"),
            "pg_ctl stop: {}",
            text(&out)
        );
    }

    /// Starts a stopped server again on the same port.
    pub fn start_again(&mut self) {
        self.pg_ctl_start()
            .unwrap_or_else(|e| panic!("postgres start on port {}: {e}", self.port));
    }

    /// The postmaster's pid (the first line of `postmaster.pid`) and those of its children
    /// (the backends and auxiliary processes), postmaster first.
    fn processes(&self) -> Vec<libc::pid_t> {
        let pidfile = self.dir.path().join("data").join("postmaster.pid");
        let Some(pm) = std::fs::read_to_string(pidfile).ok().and_then(|s| {
            s.lines()
                .next()
                .and_then(|l| l.trim().parse::<libc::pid_t>().ok())
        }) else {
            return vec![];
        };
        let mut pids = vec![pm];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<libc::pid_t>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid …: the comm may hold spaces, so read after its ')'.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|v| v.parse::<libc::pid_t>().ok());
            if ppid == Some(pm) {
                pids.push(pid);
            }
        }
        pids
    }

    fn signal_all(&self, sig: libc::c_int) {
        for pid in self.processes() {
            // SAFETY: kill(2) on the server's own processes, read from its pid file.
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// Freezes the whole server (SIGSTOP to the postmaster and every backend): connections
    /// stay open, nothing answers, no new session starts, until [`PostgresServer::thaw`].
    pub fn freeze(&self) {
        self.signal_all(libc::SIGSTOP);
    }

    /// Lets a frozen server run again (SIGCONT to the postmaster and every backend).
    pub fn thaw(&self) {
        self.signal_all(libc::SIGCONT);
    }

    /// SIGKILLs the postmaster and every backend at once (a crash: no shutdown, no
    /// checkpoint) and starts the server again on the same port and data, which replays
    /// the WAL: committed data survives, sessions do not.
    pub fn kill9_restart(&mut self) {
        let pids = self.processes();
        for &pid in &pids {
            // SAFETY: as in `signal_all`.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        // Gone, or zombies nobody reaps (the postmaster is pg_ctl's orphan): either way they
        // hold no shared memory any more.
        let gone = |pid: libc::pid_t| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| {
                    s.rsplit_once(')')
                        .is_some_and(|(_, r)| r.trim_start().starts_with(['Z', 'X']))
                })
                .unwrap_or(true)
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pids.iter().all(|&p| gone(p)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.running = false;
        // A zombie postmaster's pid would still answer kill(pid, 0): the lock file goes, as
        // after a reboot.
        let _ = std::fs::remove_file(self.dir.path().join("data").join("postmaster.pid"));
        super::process::restart_retrying("postgres", Duration::from_secs(30), || {
            self.pg_ctl_start()
        });
    }

    /// Runs `sql` with psql as the superuser on database `postgres`; stdout (unaligned,
    /// tuples only). Panics if psql fails.
    pub fn psql(&self, sql: &str) -> String {
        let out = self.try_psql(sql);
        match out {
            Ok(s) => s,
            Err(e) => panic!("psql {sql:?}: {e}"),
        }
    }

    /// Like [`PostgresServer::psql`], returning psql's error instead of panicking.
    pub fn try_psql(&self, sql: &str) -> Result<String, String> {
        self.try_psql_as("postgres", sql)
    }

    /// [`PostgresServer::try_psql`] as `role`, never asking for a password.
    fn try_psql_as(&self, role: &str, sql: &str) -> Result<String, String> {
        let port = self.port.to_string();
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-w",
                "-U",
                role,
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .output()
            .map_err(|e| format!("psql: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            Err(text(&out))
        }
    }

    /// Terminates (`pg_terminate_backend`) every session whose `application_name` is `app`
    /// (`tessera`: the operation pools; `tessera-listener`: the wake-up listeners); how many.
    pub fn terminate(&self, app: &str) -> usize {
        let n = self.psql(&format!(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = '{}'",
            app.replace('\'', "''")
        ));
        n.parse().unwrap_or(0)
    }

    /// Terminates every client session but psql's own.
    pub fn terminate_all(&self) -> usize {
        let n = self.psql(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
        );
        n.parse().unwrap_or(0)
    }

    /// Makes every new transaction read-only (`default_transaction_read_only`), or writable
    /// again.
    pub fn set_read_only(&self, on: bool) {
        self.psql(&format!(
            "ALTER SYSTEM SET default_transaction_read_only = {}",
            if on { "on" } else { "off" }
        ));
        self.psql("SELECT pg_reload_conf()");
        // Sessions pick up a reload at their next command; give the postmaster a moment.
        std::thread::sleep(Duration::from_millis(200));
    }

    /// Makes `role` log in over TCP with its password (`scram-sha-256`), where every other
    /// role keeps trust authentication: a line for it at the top of `pg_hba.conf`, then a
    /// reload. Give the role a password first (`CREATE ROLE r LOGIN PASSWORD '…'`).
    pub fn require_password(&self, role: &str) {
        let hba = self.dir.path().join("data").join("pg_hba.conf");
        let rest = std::fs::read_to_string(&hba).expect("read pg_hba.conf");
        let line = format!("host all \"{role}\" 127.0.0.1/32 scram-sha-256\n");
        std::fs::write(&hba, format!("{line}{rest}")).expect("write pg_hba.conf");
        assert_eq!(self.psql("SELECT pg_reload_conf()"), "t");
        // The reload reaches the postmaster by signal: done once the role, without its
        // password, is asked for one.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match self.try_psql_as(role, "SELECT 1") {
                Err(e) if e.contains("password") => return,
                _ if Instant::now() > deadline => panic!("pg_hba.conf was not reloaded"),
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The directory of the server's Unix socket (`.s.PGSQL.<port>`).
    pub fn socket_dir(&self) -> std::path::PathBuf {
        self.dir.path().to_path_buf()
    }

    fn data(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    fn pg_ctl_start(&mut self) -> Result<(), String> {
        let data = self.data();
        let log = self.dir.path().join("server.log");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync={} -c synchronous_commit=on \
             -c max_connections=300 -c shared_buffers=16MB -c full_page_writes={}",
            self.port,
            self.dir.path().display(),
            if self.durable { "on" } else { "off" },
            if self.durable { "on" } else { "off" },
        );
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                &data,
                "-l",
                &log.to_string_lossy(),
                "-w",
                "-t",
                "30",
                "-o",
                &opts,
                "start",
            ],
        );
        if !out.status.success() {
            let log = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!("{}\n{log}", text(&out)));
        }
        self.running = true;
        // pg_ctl -w waits for the socket; wait for TCP too.
        poll_until(Duration::from_secs(10), || {
            Ok(self.try_psql("SELECT 1").is_ok())
        })
        .map_err(|e| {
            format!(
                "postgres started but does not answer on TCP ({e}); log: {}",
                log_tail(&log, 8)
            )
        })
    }

    /// Runs a server binary, as the `postgres` user when we are root.
    fn run(&self, program: &str, args: &[&str]) -> Output {
        run_as_postgres(&self.bin.join(program), args)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.running {
            let data = self.data();
            let _ = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn run_as_postgres(program: &Path, args: &[&str]) -> Output {
    let mut cmd = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    };
    cmd.args(args)
        .current_dir("/")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}; {INSTALL}", program.display()))
}

/// The newest `/usr/lib/postgresql/<v>/bin` with `initdb`, else the folder of `initdb` on PATH.
pub fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    found.sort();
    if let Some((_, bin)) = found.pop() {
        return Some(bin);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p).find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    })
}

/// A data directory made by `initdb` once per machine and binary folder, copied by each
/// server. Made in a temp dir and renamed into place, so concurrent tests never see half of
/// one.
fn template(bin: &Path) -> PathBuf {
    let tag: String = bin
        .to_string_lossy()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    let root = std::env::temp_dir();
    let path = root.join(format!("tessera-pg-template-{tag}"));
    if path.join("PG_VERSION").is_file() {
        return path;
    }
    let tmp = tempfile::Builder::new()
        .prefix("tessera-pg-initdb")
        .tempdir_in(&root)
        .expect("temp dir for initdb");
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o777))
        .expect("chmod temp dir");
    let data = tmp.path().join("data");
    let out = run_as_postgres(
        &bin.join("initdb"),
        &[
            "-D",
            &data.to_string_lossy(),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        ],
    );
    assert!(out.status.success(), "initdb: {}", text(&out));
    // Another test may have won the race: then keep its template.
    if std::fs::rename(&data, &path).is_err() && !path.join("PG_VERSION").is_file() {
        panic!("could not put the initdb template at {}", path.display());
    }
    path
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
