//! One way to run a throwaway server process: a free loopback port, a child whose output
//! goes to a log file in its temp dir, a bounded wait until a readiness probe passes (the
//! error names the exit status or the timeout and ends with the log's last lines), signals,
//! and a kill on drop.

use std::fs::OpenOptions;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago (the listener that found it is closed again).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The last `n` lines of the file at `path` (empty if there is none).
pub(crate) fn log_tail(path: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Calls `step` every 10 ms until it answers `Ok(true)` or fails; after `limit`, fails with
/// "not ready within …".
pub(crate) fn poll_until(
    limit: Duration,
    mut step: impl FnMut() -> Result<bool, String>,
) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if step()? {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("not ready within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits until `ok` holds, checking every 50 ms; panics with `what` ("no …") after `limit`.
pub(crate) fn wait_for(what: &str, limit: Duration, ok: impl Fn() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "{what} in {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `openssl req` options of a new unencrypted P-256 key, for test certificates.
const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

/// Runs `cmd` to its end and returns its output; panics with its stderr if it fails, or with
/// `missing` (what to install) if it cannot be started.
pub fn run_checked(cmd: &mut Command, missing: &str) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?} ({e}): {missing}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs `openssl <args>` in `dir` (making test certificates) with [`run_checked`].
fn openssl(dir: &Path, args: &[&str]) {
    run_checked(
        Command::new("openssl").args(args).current_dir(dir),
        "install it with `apt-get install -y openssl`",
    );
}

/// Makes a certificate authority for a test in `dir`: `{name}.key` and the self-signed
/// `{name}.pem` (P-256, valid two days, common name `cn`). Panics as [`run_checked`] does.
pub fn make_ca(dir: &Path, name: &str, cn: &str) {
    let subj = format!("/CN={cn}");
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    let mut args = vec!["req", "-x509", "-days", "2", "-subj", &subj];
    args.extend(EC_KEY);
    args.extend(["-keyout", &key, "-out", &pem]);
    args.extend([
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    openssl(dir, &args);
}

/// Makes `{name}.key` and `{name}.pem` in `dir`: a P-256 certificate for common name `cn`,
/// valid two days, signed by the CA `ca` (made by [`make_ca`] in `dir`), with the X.509 v3
/// extensions `ext` (lines of an `openssl x509 -extfile`, e.g. `subjectAltName=…`). Panics as
/// [`run_checked`] does.
pub fn sign_leaf(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) {
    let subj = format!("/CN={cn}");
    let (key, csr, pem) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.pem"),
    );
    let mut req = vec!["req", "-subj", &subj];
    req.extend(EC_KEY);
    req.extend(["-keyout", &key, "-out", &csr]);
    openssl(dir, &req);
    let extfile = format!("{name}.ext");
    std::fs::write(dir.join(&extfile), ext).expect("write the extensions file");
    let (ca_pem, ca_key) = (format!("{ca}.pem"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-extfile",
            &extfile,
            "-out",
            &pem,
        ],
    );
}

/// Runs `attempt` up to `tries` times (each one cleans up after itself on failure) and
/// returns its first success; panics with `what` and the last error if none succeeds.
pub(crate) fn start_retrying<T>(
    what: &str,
    tries: usize,
    mut attempt: impl FnMut() -> Result<T, String>,
) -> T {
    let mut last = String::new();
    for _ in 0..tries {
        match attempt() {
            Ok(t) => return t,
            Err(e) => last = e,
        }
    }
    panic!("{what} did not start: {last}");
}

/// Runs `attempt` again, 100 ms apart, until it succeeds (a port may still be in
/// TIME_WAIT after a kill); panics with `what` and the error once `limit` has passed.
pub(crate) fn restart_retrying(
    what: &str,
    limit: Duration,
    mut attempt: impl FnMut() -> Result<(), String>,
) {
    let deadline = Instant::now() + limit;
    loop {
        match attempt() {
            Ok(()) => return,
            Err(e) if Instant::now() > deadline => panic!("{what} did not restart: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// A server child process, killed (SIGKILL) on drop. Its stdout and stderr are appended to a
/// log file, whose last lines end every error about it.
#[derive(Debug)]
pub(crate) struct ServerProcess {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl ServerProcess {
    /// Spawns `command` as the server `name` with its output appended to `log`. A missing
    /// program panics (failing the test) with `install`, the line that installs it.
    pub(crate) fn spawn(
        name: &str,
        mut command: Command,
        log: &Path,
        install: &str,
    ) -> Result<ServerProcess, String> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| format!("{name} log {}: {e}", log.display()))?;
        let out = file.try_clone().map_err(|e| format!("{name} log: {e}"))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(file)
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => panic!("{install}"),
                _ => format!("could not start {name}: {e}"),
            })?;
        Ok(ServerProcess {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// An error if the process has exited (or was killed), with its status and log tail.
    pub(crate) fn check_running(&mut self) -> Result<(), String> {
        let status = match self.child.as_mut() {
            None => "killed".to_string(),
            Some(child) => match child.try_wait() {
                Ok(Some(status)) => status.to_string(),
                _ => return Ok(()),
            },
        };
        Err(format!(
            "{} exited with {status}; log: {}",
            self.name,
            self.log_tail()
        ))
    }

    /// Waits until `ready` passes, at most `limit`; fails at once if the process exits.
    /// The error ends with the log tail.
    pub(crate) fn wait_ready(
        &mut self,
        limit: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        poll_until(limit, || {
            self.check_running()?;
            Ok(ready())
        })
        .map_err(|e| match e.contains("; log: ") {
            true => e,
            false => format!("{}: {e}; log: {}", self.name, self.log_tail()),
        })
    }

    /// The last lines of the log.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.log, 8)
    }

    /// Sends `sig` (e.g. SIGSTOP, SIGCONT) to the process if it runs.
    pub(crate) fn signal(&self, sig: libc::c_int) {
        if let Some(child) = &self.child {
            // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
