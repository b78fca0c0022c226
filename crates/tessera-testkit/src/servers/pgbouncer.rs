//! A throwaway PgBouncer in front of a PostgreSQL server: `pgbouncer` on a free loopback port
//! with its configuration in a temp dir, killed and removed on drop.
//!
//! ```no_run
//! use tessera_testkit::servers::{pgbouncer::PgBouncer, postgres::PostgresServer};
//! let pg = PostgresServer::start();
//! let pooler = PgBouncer::start(pg.port());
//! let url = pooler.url(); // postgres://postgres@127.0.0.1:PORT/postgres, through the pooler
//! # drop(url);
//! ```
//!
//! It runs PgBouncer's defaults where tessera's users meet them: session pooling, and no
//! `ignore_startup_parameters`, so a client that sends a startup parameter PgBouncer does not
//! know is refused, as in a stock installation. Authentication is `trust` (the upstream
//! server trusts loopback too). PgBouncer refuses to run as root: as root it runs as the
//! `postgres` user, like the server. The binary comes from Debian's `pgbouncer` package
//! (`/usr/sbin/pgbouncer`) or PATH.

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use super::process::{free_port, start_retrying, ServerProcess};

const INSTALL: &str =
    "PgBouncer is not installed (no pgbouncer in /usr/sbin or on PATH): install it with \
     `apt-get install -y pgbouncer`";

/// A PgBouncer on `127.0.0.1:<port>` in session pooling mode, killed on drop.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    _process: ServerProcess,
    dir: tempfile::TempDir,
}

impl PgBouncer {
    /// Starts a pooler in front of the server on `127.0.0.1:upstream` (every database, user
    /// `postgres`) and waits until it accepts connections. Panics (failing the test) with the
    /// install line if PgBouncer is missing.
    pub fn start(upstream: u16) -> PgBouncer {
        let bin = binary().unwrap_or_else(|| panic!("{INSTALL}"));
        start_retrying("pgbouncer", 10, || {
            let dir = tempfile::tempdir().expect("temp dir for pgbouncer");
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777))
                .expect("chmod temp dir");
            let port = free_port();
            let ini = dir.path().join("pgbouncer.ini");
            let users = dir.path().join("users.txt");
            std::fs::write(&users, "\"postgres\" \"\"\n").expect("write users.txt");
            std::fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     * = host=127.0.0.1 port={upstream}\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = trust\n\
                     auth_file = {users}\n\
                     pool_mode = session\n\
                     max_client_conn = 1000\n\
                     default_pool_size = 250\n\
                     logfile = {log}\n",
                    users = users.display(),
                    log = dir.path().join("pgbouncer.log").display(),
                ),
            )
            .expect("write pgbouncer.ini");
            let mut cmd = Command::new(&bin);
            cmd.arg(&ini).current_dir("/");
            if let Some((uid, gid)) = postgres_ids() {
                cmd.uid(uid).gid(gid);
            }
            // Its stderr carries the lines of `logfile` and what fails before it is open.
            let out = dir.path().join("pgbouncer.out");
            let mut process = ServerProcess::spawn("pgbouncer", cmd, &out, INSTALL)?;
            process.wait_ready(Duration::from_secs(10), || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
            })?;
            Ok(PgBouncer {
                port,
                _process: process,
                dir,
            })
        })
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// What the pooler logged so far (refused clients, server connections).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("pgbouncer.log")).unwrap_or_default()
    }
}

/// `/usr/sbin/pgbouncer` (Debian), else `pgbouncer` on PATH.
fn binary() -> Option<PathBuf> {
    let debian = PathBuf::from("/usr/sbin/pgbouncer");
    if debian.is_file() {
        return Some(debian);
    }
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("pgbouncer"))
            .find(|b| b.is_file())
    })
}

/// The `postgres` user's uid and gid when running as root (PgBouncer refuses root).
fn postgres_ids() -> Option<(u32, u32)> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return None;
    }
    let name = std::ffi::CString::new("postgres").expect("no NUL");
    // SAFETY: `name` is a valid C string; the returned record is read at once, on this
    // thread, before any other getpw* call.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    assert!(
        !pw.is_null(),
        "running as root needs the postgres user (from the postgresql package) for pgbouncer"
    );
    // SAFETY: `pw` is non-null and points to a valid passwd record.
    unsafe { Some(((*pw).pw_uid, (*pw).pw_gid)) }
}
