//! A throwaway MariaDB server (`mariadbd`) on a free loopback port.
//!
//! ```no_run
//! let server = tessera_testkit::servers::mysql::MariaDbServer::start();
//! let url = server.url("app"); // mysql://root@127.0.0.1:PORT/app (created if missing)
//! # drop(url);
//! ```
//!
//! `mariadb-install-db` takes seconds, so it runs once per machine and MariaDB version into a
//! template data directory under the temp dir (built in a private directory, then renamed
//! into place, so concurrent test processes never see half of one); each server starts from
//! a copy (about 26 MB) in its own temp dir, in memory (`/dev/shm`) where the machine has it:
//! on a disk, 10,000 waiters queued from one process took from 27 s to more than 90 s from
//! run to run on the same machine, as the disk's latency varied (the test measures tessera,
//! not the disk). Servers run without binary log, with
//! `innodb_flush_log_at_trx_commit=2` (a commit survives a killed server, not a power cut)
//! and a small buffer pool. The server dies with the process that started it (Linux
//! parent-death signal), also when a test panics or a static holds it.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::process::{free_port, restart_retrying, start_retrying, ServerProcess};

const INSTALL: &str = "mariadbd / mariadb-install-db are not installed (or not on PATH): \
     install them with `apt-get install -y mariadb-server`";

/// A `mariadbd` on `127.0.0.1:<free port>`, killed on drop; user `root`, no password.
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    process: Option<ServerProcess>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

impl MariaDbServer {
    /// Starts a server on a free port and waits until it greets. Panics (failing the test)
    /// with the install line if the MariaDB programs are missing.
    ///
    /// The server is killed when the thread that started it exits (`PR_SET_PDEATHSIG`, which
    /// Linux ties to the thread, not the process): start it on a thread that outlives its use,
    /// such as the test's own, never in `tokio::task::spawn_blocking`, whose threads exit
    /// after 10 s idle.
    pub fn start() -> MariaDbServer {
        MariaDbServer::start_with(&[])
    }

    /// Like [`MariaDbServer::start`], with extra `mariadbd` options (e.g.
    /// `--innodb-flush-log-at-trx-commit=1`).
    pub fn start_with(extra: &[&str]) -> MariaDbServer {
        let template = template();
        let dir = data_root().expect("temp dir for mariadbd");
        copy_dir(&template, &dir.path().join("data")).expect("copy the MariaDB template");
        let mut server = MariaDbServer {
            port: 0,
            process: None,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        start_retrying("mariadbd", 10, || {
            server.port = free_port();
            server.spawn()
        });
        server
    }

    /// The server's Unix socket.
    pub fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("s")
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:<port>/<database>`, creating the database if missing.
    pub fn url(&self, database: &str) -> String {
        self.sql(&format!("CREATE DATABASE IF NOT EXISTS `{database}`"));
        format!("mysql://root@127.0.0.1:{}/{database}", self.port)
    }

    /// Runs SQL with the `mariadb` client as root and returns its tab-separated output
    /// (no column names). Panics on failure.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|e| panic!("mariadb -e {sql:?}: {e}"))
    }

    /// Like [`MariaDbServer::sql`] for an operator's statements that race tessera's own
    /// transactions: sent again (up to 50 times, 100 ms apart) while the server answers a
    /// deadlock (1213) or a lock wait timeout (1205), as an operator would. The statements
    /// must be safe to run again.
    pub fn sql_retrying(&self, sql: &str) -> String {
        for _ in 0..50 {
            match self.try_sql(sql) {
                Ok(out) => return out,
                Err(e) if e.contains("ERROR 1213") || e.contains("ERROR 1205") => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => panic!("mariadb -e {sql:?}: {e}"),
            }
        }
        panic!("mariadb -e {sql:?}: still deadlocked after 50 attempts")
    }

    /// Like [`MariaDbServer::sql`], returning the error text instead of panicking.
    pub fn try_sql(&self, sql: &str) -> Result<String, String> {
        let out = Command::new("mariadb")
            .args([
                "--no-defaults",
                "-h127.0.0.1",
                &format!("-P{}", self.port),
                "-uroot",
                "-N",
                "-B",
                "--comments",
                "-e",
                sql,
            ])
            .output()
            .map_err(|e| format!("mariadb client ({e}): {INSTALL}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Kills the server (SIGKILL: no clean shutdown) and starts it again on the same port
    /// and data directory: committed data survives (InnoDB recovery), connections do not.
    pub fn restart(&mut self) {
        self.kill();
        restart_retrying("mariadbd", Duration::from_secs(30), || self.spawn());
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers until
    /// [`MariaDbServer::thaw`].
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Closes every client connection but the caller's (`KILL CONNECTION` of each).
    pub fn cut_clients(&self) {
        let ids = self.sql(
            "SELECT ID FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND COMMAND <> 'Daemon' AND USER <> 'system user'",
        );
        let kills: String = ids
            .split_whitespace()
            .map(|id| format!("KILL CONNECTION {id};"))
            .collect();
        if !kills.is_empty() {
            // A connection may have ended meanwhile ("unknown thread"): not a failure.
            let _ = self.try_sql(&kills);
        }
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(process) = &self.process {
            process.signal(sig);
        }
    }

    /// Starts `mariadbd` on [`MariaDbServer::port`] and waits until it greets.
    fn spawn(&mut self) -> Result<(), String> {
        let d = self.dir.path();
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg("--user=root")
            .arg(format!("--datadir={}", d.join("data").display()))
            .arg(format!("--socket={}", d.join("s").display()))
            .arg(format!("--pid-file={}", d.join("pid").display()))
            .arg(format!("--log-error={}", d.join("err.log").display()))
            // Its own temp dir: at start-up a server deletes every `#sql*` file in its tmpdir,
            // which in a shared /tmp are the live temp tables of the other servers running.
            .arg(format!("--tmpdir={}", d.display()))
            .arg(format!("--port={}", self.port))
            .arg("--bind-address=127.0.0.1")
            .args([
                "--innodb-log-file-size=8M",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=2",
                "--skip-log-bin",
                "--max-connections=2000",
                "--performance-schema=OFF",
            ])
            .args(&self.extra);
        // SAFETY: prctl in the child before exec; async-signal-safe.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut process = ServerProcess::spawn("mariadbd", cmd, &d.join("err.log"), INSTALL)?;
        let port = self.port;
        process.wait_ready(Duration::from_secs(30), || greets(port))?;
        self.process = Some(process);
        Ok(())
    }

    /// The server's error log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("err.log")).unwrap_or_default()
    }
}

/// The server's handshake packet arrived: it accepts connections.
fn greets(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    let mut buf = [0u8; 64];
    // Packet header (4 bytes), then protocol version 10.
    matches!(s.read(&mut buf), Ok(n) if n > 5 && buf[4] == 10)
}

/// The template data directory for this machine's MariaDB version, built once.
fn template() -> PathBuf {
    let version = Command::new("mariadbd")
        .arg("--version")
        .output()
        .unwrap_or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => panic!("{INSTALL}"),
            _ => panic!("mariadbd --version: {e}"),
        });
    let version = String::from_utf8_lossy(&version.stdout);
    let tag: String = version
        .split_whitespace()
        .nth(2)
        .unwrap_or("unknown")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '.')
        .collect();
    let uid = unsafe { libc::getuid() };
    let path = std::env::temp_dir().join(format!("tessera-mariadb-template-{tag}-{uid}"));
    if path.join("data").join("mysql").is_dir() {
        return path.join("data");
    }
    let building = tempfile::Builder::new()
        .prefix("tessera-mariadb-template-build")
        .tempdir_in(std::env::temp_dir())
        .expect("temp dir for the MariaDB template");
    let out = Command::new("mariadb-install-db")
        .args([
            "--no-defaults",
            "--user=root",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=8M",
        ])
        .arg(format!(
            "--datadir={}",
            building.path().join("data").display()
        ))
        .arg(format!("--tmpdir={}", building.path().display()))
        .output()
        .unwrap_or_else(|e| match e.kind() {
            std::io::ErrorKind::NotFound => panic!("{INSTALL}"),
            _ => panic!("mariadb-install-db: {e}"),
        });
    assert!(
        out.status.success(),
        "mariadb-install-db failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let built = building.keep();
    // Another process may have finished first: then its template stays and ours goes.
    if std::fs::rename(&built, &path).is_err() {
        let _ = std::fs::remove_dir_all(&built);
    }
    path.join("data")
}

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// A temp dir for one server's data: in `/dev/shm` (memory) where it is a writable
/// directory, otherwise in the temp dir. Files there outlive a killed server, as on a disk.
fn data_root() -> std::io::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::Builder::new()
            .prefix("tessera-mariadb")
            .tempdir_in(shm)
        {
            return Ok(dir);
        }
    }
    tempfile::tempdir()
}
