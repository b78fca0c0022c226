//! Throwaway `etcd` clusters: one member for most tests, three on loopback ports for fault
//! tests (kill the leader, kill a follower, restart a member, compaction), each member in
//! its own temp dir, all killed on drop.
//!
//! ```no_run
//! let cluster = tessera_testkit::servers::etcd::EtcdCluster::start(1);
//! let url = cluster.url(); // etcd://127.0.0.1:PORT
//! # drop(url);
//! ```
//!
//! Members run with a 50 ms heartbeat and a 500 ms election timeout, so an election after
//! a leader's loss takes about a second, not several. Administration (which member leads,
//! compaction) goes through `etcdctl`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::process::{
    free_port, make_ca, poll_until, restart_retrying, sign_leaf, start_retrying, ServerProcess,
};

const INSTALL: &str =
    "etcd is not installed (or not on PATH): install it with `apt-get install -y etcd-server`";
const INSTALL_CTL: &str =
    "etcdctl is not installed (or not on PATH): install it with `apt-get install -y etcd-client`";

/// Election timeout of the test members, in ms.
pub const ELECTION_TIMEOUT_MS: u64 = 500;

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data: PathBuf,
    process: Option<ServerProcess>,
}

/// A cluster of `etcd` members on `127.0.0.1`, killed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    dir: tempfile::TempDir,
    members: Vec<Member>,
    initial_cluster: String,
    tls: Option<EtcdTls>,
    extra: Vec<String>,
}

/// PEM files for a cluster that serves clients over TLS and asks them for a certificate
/// ([`EtcdCluster::start_tls`]): a CA made for the test, the members' certificate (for
/// `127.0.0.1` and `localhost`) and a client certificate, all signed by that CA.
#[derive(Debug, Clone)]
pub struct EtcdTls {
    /// The CA's certificate.
    pub ca: PathBuf,
    /// The members' certificate and key.
    pub server: (PathBuf, PathBuf),
    /// A client certificate and key (common name `root`).
    pub client: (PathBuf, PathBuf),
}

impl EtcdTls {
    /// Makes a CA, a server and a client certificate with `openssl` in `dir`. Panics
    /// (failing the test) with the install line if `openssl` is missing or fails.
    pub fn generate(dir: &std::path::Path) -> EtcdTls {
        make_ca(dir, "ca", "tessera test CA");
        for (name, cn, usage) in [
            ("server", "127.0.0.1", "serverAuth,clientAuth"),
            ("client", "root", "clientAuth"),
        ] {
            let ext =
                format!("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage={usage}\n");
            sign_leaf(dir, "ca", name, cn, &ext);
        }
        EtcdTls {
            ca: dir.join("ca.pem"),
            server: (dir.join("server.pem"), dir.join("server.key")),
            client: (dir.join("client.pem"), dir.join("client.key")),
        }
    }
}

impl EtcdCluster {
    /// Starts `n` members and waits until the cluster has a leader and every member is
    /// healthy. Panics (failing the test) with the install line if `etcd` is missing.
    pub fn start(n: usize) -> EtcdCluster {
        EtcdCluster::start_with(n, None, &[])
    }

    /// Like [`EtcdCluster::start`], with more command-line options for every member (e.g.
    /// `--auth-token-ttl 2`).
    pub fn start_args(n: usize, extra: &[&str]) -> EtcdCluster {
        EtcdCluster::start_with(n, None, extra)
    }

    /// Starts `n` members that serve clients over TLS only (`--cert-file`, `--key-file`,
    /// `--client-cert-auth`, `--trusted-ca-file`): [`EtcdCluster::url`] is then an
    /// `etcds://` URL with the CA and the client certificate.
    pub fn start_tls(n: usize, tls: &EtcdTls) -> EtcdCluster {
        EtcdCluster::start_with(n, Some(tls), &[])
    }

    fn start_with(n: usize, tls: Option<&EtcdTls>, extra: &[&str]) -> EtcdCluster {
        start_retrying("etcd", 5, || EtcdCluster::try_start(n, tls, extra))
    }

    fn try_start(n: usize, tls: Option<&EtcdTls>, extra: &[&str]) -> Result<EtcdCluster, String> {
        let dir = tempfile::tempdir().expect("temp dir for etcd");
        let token = format!("t{:08x}", rand::random::<u32>());
        let members: Vec<Member> = (0..n)
            .map(|i| Member {
                name: format!("m{i}"),
                client_port: free_port(),
                peer_port: free_port(),
                data: dir.path().join(format!("m{i}")),
                process: None,
            })
            .collect();
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = EtcdCluster {
            dir,
            members,
            initial_cluster: format!("{initial_cluster}|{token}"),
            tls: tls.cloned(),
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        for i in 0..n {
            cluster.spawn(i)?;
        }
        cluster.wait_healthy(Duration::from_secs(20))?;
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<(), String> {
        let (cluster, token) = self
            .initial_cluster
            .split_once('|')
            .expect("cluster and token");
        let m = &mut self.members[i];
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let client = format!("{scheme}://127.0.0.1:{}", m.client_port);
        let peer = format!("http://127.0.0.1:{}", m.peer_port);
        let log = self.dir.path().join(format!("{}.log", m.name));
        let mut command = Command::new("etcd");
        if let Some(tls) = &self.tls {
            command
                .arg("--cert-file")
                .arg(&tls.server.0)
                .arg("--key-file")
                .arg(&tls.server.1)
                .arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(&tls.ca);
        }
        command
            .args(["--name", &m.name])
            .arg("--data-dir")
            .arg(&m.data)
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", cluster])
            .args(["--initial-cluster-token", token])
            .args(["--heartbeat-interval", "50"])
            .args(["--election-timeout", &ELECTION_TIMEOUT_MS.to_string()])
            .args(["--logger", "zap", "--log-level", "warn"])
            .args(&self.extra);
        let name = format!("etcd {}", m.name);
        m.process = Some(ServerProcess::spawn(&name, command, &log, INSTALL)?);
        Ok(())
    }

    /// Waits until every running member answers `/health` with a leader.
    fn wait_healthy(&mut self, limit: Duration) -> Result<(), String> {
        let tls = &self.tls;
        let members = &mut self.members;
        poll_until(limit, || {
            let mut all = true;
            for m in members.iter_mut() {
                if let Some(process) = m.process.as_mut() {
                    process.check_running()?;
                    all &= match tls {
                        None => healthy(m.client_port),
                        Some(tls) => healthy_tls(m.client_port, tls),
                    };
                }
            }
            Ok(all)
        })
        .map_err(|e| {
            if e.contains("; log: ") {
                return e;
            }
            let tails: Vec<String> = members
                .iter()
                .filter_map(|m| m.process.as_ref())
                .map(|p| p.log_tail())
                .collect();
            format!("etcd: {e}; log: {}", tails.join("\n"))
        })
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,…` (every member).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        match &self.tls {
            None => format!("etcd://{}", hosts.join(",")),
            Some(tls) => format!(
                "etcds://{}?ca={}&cert={}&key={}",
                hosts.join(","),
                tls.ca.display(),
                tls.client.0.display(),
                tls.client.1.display()
            ),
        }
    }

    /// `etcdctl` with the TLS flags of a TLS cluster.
    fn etcdctl(&self) -> Command {
        let mut c = Command::new("etcdctl");
        c.env("ETCDCTL_API", "3");
        if let Some(tls) = &self.tls {
            c.arg(format!("--cacert={}", tls.ca.display()))
                .arg(format!("--cert={}", tls.client.0.display()))
                .arg(format!("--key={}", tls.client.1.display()));
        }
        c
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client_port
    }

    /// Number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never, once started).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `http://127.0.0.1:P,…` of the running members, for etcdctl.
    fn endpoints(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        self.members
            .iter()
            .filter(|m| m.process.is_some())
            .map(|m| format!("{scheme}://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs `etcdctl` against the running members and returns its stdout.
    pub fn ctl(&self, args: &[&str]) -> String {
        self.try_ctl(args)
            .unwrap_or_else(|e| panic!("etcdctl {args:?}: {e}"))
    }

    /// Runs `etcdctl` like [`EtcdCluster::ctl`]; a refusal is its stderr as the error.
    pub fn try_ctl(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .etcdctl()
            .arg(format!("--endpoints={}", self.endpoints()))
            .args(args)
            .output()
            .unwrap_or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => panic!("{INSTALL_CTL}"),
                _ => panic!("etcdctl: {e}"),
            });
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The index of the member that leads now (waits up to 10 s for one).
    pub fn leader(&self) -> usize {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            for (i, m) in self.members.iter().enumerate() {
                if m.process.is_none() {
                    continue;
                }
                let out = Command::new("etcdctl")
                    .env("ETCDCTL_API", "3")
                    .arg(format!("--endpoints=http://127.0.0.1:{}", m.client_port))
                    .args(["endpoint", "status", "-w", "fields", "--command-timeout=1s"])
                    .output();
                if let Ok(out) = out {
                    let text = String::from_utf8_lossy(&out.stdout);
                    let field = |name: &str| {
                        text.lines()
                            .find(|l| l.starts_with(&format!("\"{name}\"")))
                            .and_then(|l| l.split(':').nth(1))
                            .map(|v| v.trim().to_string())
                    };
                    if let (Some(leader), Some(me)) = (field("Leader"), field("MemberID")) {
                        if leader == me && leader != "0" {
                            return i;
                        }
                    }
                }
            }
            assert!(Instant::now() < deadline, "no etcd leader within 10 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The cluster's current revision.
    pub fn revision(&self) -> i64 {
        let out = self.ctl(&["get", "tessera-revision-probe", "-w", "fields"]);
        out.lines()
            .find(|l| l.starts_with("\"Revision\""))
            .and_then(|l| l.split(':').nth(1))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no revision in {out}"))
    }

    /// Compacts the history up to the current revision: watches from older revisions are
    /// cancelled by the server.
    pub fn compact(&self) {
        let rev = self.revision();
        self.ctl(&["compaction", &rev.to_string()]);
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut process) = self.members[i].process.take() {
            process.kill();
        }
    }

    /// Starts member `i` again on its data (after [`EtcdCluster::kill`]) and waits until
    /// the cluster is healthy.
    pub fn restart(&mut self, i: usize) {
        self.kill(i);
        restart_retrying("etcd", Duration::from_secs(20), || {
            self.spawn(i)?;
            self.wait_healthy(Duration::from_secs(10))
                .inspect_err(|_| self.kill(i))
        });
    }

    /// Freezes member `i` (SIGSTOP) until [`EtcdCluster::thaw`].
    pub fn freeze(&self, i: usize) {
        self.signal(i, libc::SIGSTOP);
    }

    /// Lets a frozen member run again (SIGCONT).
    pub fn thaw(&self, i: usize) {
        self.signal(i, libc::SIGCONT);
    }

    fn signal(&self, i: usize, sig: libc::c_int) {
        if let Some(process) = &self.members[i].process {
            process.signal(sig);
        }
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.thaw(i);
            self.kill(i);
        }
    }
}

/// `etcdctl endpoint health` over TLS succeeds once the member has a leader.
fn healthy_tls(port: u16, tls: &EtcdTls) -> bool {
    Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints=https://127.0.0.1:{port}"))
        .arg(format!("--cacert={}", tls.ca.display()))
        .arg(format!("--cert={}", tls.client.0.display()))
        .arg(format!("--key={}", tls.client.1.display()))
        .args(["endpoint", "health", "--command-timeout=1s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// `GET /health` answers `{"health":"true"}` once the member has a leader.
fn healthy(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(2))).ok();
    if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.contains("\"health\":\"true\"")
}
