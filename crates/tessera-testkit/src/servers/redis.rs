//! A throwaway `redis-server` without persistence.
//!
//! ```no_run
//! let server = tessera_testkit::servers::redis::RedisServer::start();
//! let url = server.url(); // redis://127.0.0.1:PORT
//! # drop(url);
//! ```

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use super::process::{
    free_port, make_ca, restart_retrying, sign_leaf, start_retrying, ServerProcess,
};

const INSTALL: &str = "redis-server is not installed (or not on PATH): install it with `apt-get install -y redis-server`";

/// A `redis-server --save '' --appendonly no` on `127.0.0.1:<free port>`, killed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    process: Option<ServerProcess>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// The TLS port and the test CA and certificate.
    tls: Option<(u16, TestCerts)>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`. Panics (failing the
    /// test) with the install line if `redis-server` is missing.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra command-line options (e.g. `--maxmemory 1mb`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        RedisServer::start_on(extra, free_port)
    }

    /// Like [`RedisServer::start_with`], on a port that `pick` chooses (tried again with
    /// another on failure).
    pub(crate) fn start_on(extra: &[&str], pick: fn() -> u16) -> RedisServer {
        let mut server = RedisServer {
            port: 0,
            process: None,
            dir: tempfile::tempdir().expect("temp dir for redis-server"),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls: None,
        };
        start_retrying("redis-server", 10, || {
            server.port = pick();
            server.spawn()
        });
        server
    }

    /// Starts a server that also serves TLS on a second free port, with a fresh test CA
    /// ([`RedisServer::ca_file`]) and a server certificate for `127.0.0.1`. Plain TCP stays on
    /// [`RedisServer::port`] for setup and `PING`. Panics if `openssl` is missing
    /// (`apt-get install -y openssl`).
    pub fn start_tls() -> RedisServer {
        RedisServer::start_tls_with(&TestCerts::make(), &[])
    }

    /// Like [`RedisServer::start_tls`], with the certificates `certs` (shared by the servers of
    /// one topology, so one CA is trusted) and extra command-line options.
    pub fn start_tls_with(certs: &TestCerts, extra: &[&str]) -> RedisServer {
        let tls_port = free_port();
        let mut args: Vec<String> = vec!["--tls-port".into(), tls_port.to_string()];
        for (option, value) in certs.options() {
            args.push(format!("--{option}"));
            args.push(value);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut server = RedisServer::start_with(&args);
        server.tls = Some((tls_port, certs.clone()));
        server
    }

    /// `rediss://127.0.0.1:<tls port>` for a server from [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// The PEM file of the test CA that signed the TLS certificate (e.g. for `SSL_CERT_FILE`).
    pub fn ca_file(&self) -> std::path::PathBuf {
        let (_, certs) = self.tls.as_ref().expect("started with start_tls");
        certs.ca_file()
    }

    /// The TLS port of a server from [`RedisServer::start_tls`], `None` without TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|(port, _)| *port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the server (SIGKILL: no shutdown save) and starts a fresh one on the same port,
    /// without persistence, so it comes back empty.
    pub fn restart(&mut self) {
        self.kill();
        restart_retrying("redis-server", Duration::from_secs(10), || self.spawn());
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers until
    /// [`RedisServer::thaw`].
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen server run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, sig: libc::c_int) {
        if let Some(process) = &self.process {
            process.signal(sig);
        }
    }

    /// Closes every client connection at the server (`CLIENT KILL` of normal and pub/sub
    /// clients); the clients must reconnect.
    pub fn cut_clients(&self) {
        for kind in ["normal", "pubsub"] {
            self.command(&["CLIENT", "KILL", "TYPE", kind]);
        }
    }

    /// Kills the server now.
    pub fn kill(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }

    /// Sends one command (as its words) and returns the raw RESP reply, e.g.
    /// `server.command(&["SCRIPT", "FLUSH"])`.
    pub fn command(&self, words: &[&str]) -> String {
        command_full(self.port, words)
    }

    /// The keys under tessera's key prefix `prefix` that carry no expiry; a store whose state
    /// is bounded leaves none behind.
    pub fn immortal_keys(&self, prefix: &str) -> Vec<String> {
        let reply = self.command(&[
            "EVAL",
            "local out = {} for _, k in ipairs(redis.call('KEYS', ARGV[1])) do \
             if redis.call('PTTL', k) < 0 then out[#out + 1] = k end end return out",
            "0",
            &format!("{{{prefix}:*"),
        ]);
        bulk_strings(&reply).into_iter().map(String::from).collect()
    }

    /// Calls per command so far, from `INFO commandstats` (`"fcall"`, `"evalsha"`,
    /// `"function|load"`, …; the commands that scripts call are counted too).
    pub fn command_calls(&self) -> std::collections::HashMap<String, u64> {
        self.command(&["INFO", "commandstats"])
            .lines()
            .filter_map(|l| {
                let (cmd, rest) = l.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = rest
                    .strip_prefix("calls=")?
                    .split(',')
                    .next()?
                    .parse()
                    .ok()?;
                Some((cmd.to_string(), calls))
            })
            .collect()
    }

    /// Starts `redis-server` on [`RedisServer::port`] and waits until it answers `PING`.
    fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new("redis-server");
        command
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra);
        let log = self.dir.path().join("redis.log");
        let mut process = ServerProcess::spawn("redis-server", command, &log, INSTALL)?;
        let port = self.port;
        process.wait_ready(Duration::from_secs(10), || ping(port))?;
        self.process = Some(process);
        Ok(())
    }
}

/// A test CA and a server certificate for `127.0.0.1` that it signed, in a temp dir (removed
/// when the last clone is dropped); for Redis servers and sentinels with TLS.
#[derive(Debug, Clone)]
pub struct TestCerts {
    dir: std::sync::Arc<tempfile::TempDir>,
}

impl TestCerts {
    /// Makes a fresh CA and certificate. Panics if `openssl` is missing
    /// (`apt-get install -y openssl`).
    pub fn make() -> TestCerts {
        let certs = tempfile::tempdir().expect("temp dir for certificates");
        make_ca(certs.path(), "ca", "tessera test CA");
        sign_leaf(
            certs.path(),
            "ca",
            "server",
            "127.0.0.1",
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n",
        );
        TestCerts {
            dir: std::sync::Arc::new(certs),
        }
    }

    /// The CA's PEM file (e.g. for `SSL_CERT_FILE`).
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// The Redis options that serve TLS with this certificate (without `tls-port`), as
    /// `(name, value)` pairs for a command line (`--name value`) or a config file: clients
    /// are not asked for certificates; outgoing connections (a replica's, a sentinel's) trust
    /// the CA.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        let path = |f: &str| self.dir.path().join(f).to_string_lossy().into_owned();
        vec![
            ("tls-cert-file", path("server.pem")),
            ("tls-key-file", path("server.key")),
            ("tls-ca-cert-file", path("ca.pem")),
            ("tls-auth-clients", "no".into()),
        ]
    }
}

pub(crate) fn ping(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    read_reply(&mut s).starts_with("+PONG")
}

/// Reads whatever arrives within the read timeout after the first bytes (enough for the
/// short replies the tests look at).
fn read_reply(s: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    match s.read(&mut buf) {
        Ok(n) => out.extend_from_slice(&buf[..n]),
        Err(_) => return String::new(),
    }
    s.set_read_timeout(Some(Duration::from_millis(20))).ok();
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The strings of a raw RESP array of bulk strings (a reply of [`RedisServer::command`]).
pub fn bulk_strings(reply: &str) -> Vec<&str> {
    let lines: Vec<&str> = reply.split("\r\n").collect();
    lines
        .iter()
        .zip(&lines[1..])
        .filter(|(len, _)| len.starts_with('$'))
        .map(|(_, s)| *s)
        .collect()
}

/// Sends one command to a Redis on a loopback port that the caller does not own (e.g. one
/// given by URL) and returns the raw reply.
pub fn command_at(port: u16, words: &[&str]) -> std::io::Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", words.len());
    for w in words {
        req.push_str(&format!("${}\r\n{}\r\n", w.len(), w));
    }
    s.write_all(req.as_bytes())?;
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Sends one command (as its words) to the Redis or Sentinel on a loopback `port` and returns
/// the whole raw RESP reply (empty if nothing answers).
pub(crate) fn command_full(port: u16, words: &[&str]) -> String {
    command_as(port, None, words)
}

/// Like [`command_full`], logged in first as `login` (user, password) if given; the reply to
/// `AUTH` is returned instead if it refused.
pub(crate) fn command_as(port: u16, login: Option<(&str, &str)>, words: &[&str]) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let send = |s: &mut TcpStream, words: &[&str]| {
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let mut req = format!("*{}\r\n", words.len());
        for w in words {
            req.push_str(&format!("${}\r\n{}\r\n", w.len(), w));
        }
        match s.write_all(req.as_bytes()) {
            Ok(()) => read_reply(s),
            Err(_) => String::new(),
        }
    };
    if let Some((user, password)) = login {
        let reply = send(&mut s, &["AUTH", user, password]);
        if !reply.starts_with("+OK") {
            return reply;
        }
    }
    send(&mut s, words)
}
