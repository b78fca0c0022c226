//! A throwaway Sentinel topology: one master, one replica and three sentinels watching them,
//! every process on a free loopback port in its own temp dir, all stopped on drop.
//!
//! ```no_run
//! let topo = tessera_testkit::servers::redis_sentinel::SentinelTopology::start();
//! let url = topo.url(); // redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/tessera
//! topo.failover(); // SENTINEL FAILOVER, returns once the replica is the master
//! # drop(url);
//! ```
//!
//! The servers run with `--repl-diskless-sync-delay 0` (a replica syncs in about 75 ms, not
//! 5 s) and the sentinels with `down-after-milliseconds` [`DOWN_AFTER`], quorum 2.
//!
//! [`SentinelTopology::start_tls`] serves TLS as well (one test CA for every process;
//! replication and the sentinels' own connections use it), and
//! [`SentinelTopology::protect`] puts the data servers and the sentinels behind passwords;
//! the topology's own helpers keep working through both.

use std::process::Command;
use std::time::Duration;

use super::process::{free_port, start_retrying, wait_for, ServerProcess};
use super::redis::{command_as, RedisServer, TestCerts};

const INSTALL: &str = "redis-sentinel is not installed (or not on PATH): install it with `apt-get install -y redis-sentinel`";

/// The master name the sentinels monitor.
pub const MASTER_NAME: &str = "tessera";
/// How long a master may not answer before the sentinels call it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

/// One `redis-sentinel` process monitoring a master as [`MASTER_NAME`], killed on drop. Alone,
/// beside a [`SentinelTopology`], it is a sentinel that never heard of the topology's
/// failovers: it names its own master at configuration epoch 0.
#[derive(Debug)]
pub struct Sentinel {
    port: u16,
    /// Its TLS port, if it serves TLS.
    tls_port: Option<u16>,
    _process: ServerProcess,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel that monitors the Redis on `master_port`.
    pub fn start(master_port: u16) -> Sentinel {
        Sentinel::start_with(master_port, None)
    }

    /// Like [`Sentinel::start`]; with `certs`, it also serves TLS on a second port and speaks
    /// TLS to the servers and the other sentinels (`tls-replication yes`): `master_port` is
    /// then the master's TLS port.
    pub fn start_with(master_port: u16, certs: Option<&TestCerts>) -> Sentinel {
        start_retrying("redis-sentinel", 10, || {
            let dir = tempfile::tempdir().expect("temp dir for redis-sentinel");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            let mut text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir.path().display(),
                DOWN_AFTER.as_millis()
            );
            let tls_port = certs.map(|certs| {
                let tls_port = free_port();
                text.push_str(&format!("tls-port {tls_port}\ntls-replication yes\n"));
                for (option, value) in certs.options() {
                    text.push_str(&format!("{option} {value}\n"));
                }
                tls_port
            });
            std::fs::write(&conf, text).expect("write sentinel.conf");
            let mut command = Command::new("redis-sentinel");
            command.arg(&conf);
            let log = dir.path().join("sentinel.log");
            let mut process = ServerProcess::spawn("redis-sentinel", command, &log, INSTALL)?;
            process.wait_ready(Duration::from_secs(10), || {
                command_as(port, None, &["PING"]).starts_with("+PONG")
            })?;
            Ok(Sentinel {
                port,
                tls_port,
                _process: process,
                _dir: dir,
            })
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its TLS port, `None` without TLS.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }
}

/// The bulk strings of a raw RESP reply, in order (enough for the flat replies used here).
pub(crate) fn bulk_strings(reply: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = reply.split("\r\n");
    while let Some(line) = lines.next() {
        if line.starts_with('$') && line != "$-1" {
            if let Some(v) = lines.next() {
                out.push(v.to_string());
            }
        }
    }
    out
}

/// One master, one replica, three sentinels (quorum 2).
#[derive(Debug)]
pub struct SentinelTopology {
    /// The two data servers; which one is the master changes with failovers.
    servers: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
    /// The certificates, when every process serves TLS too.
    certs: Option<TestCerts>,
    /// The data servers' password (`requirepass`), once [`SentinelTopology::protect`]ed.
    data_password: Option<String>,
    /// The sentinels' user and password, once protected.
    sentinel_login: Option<(String, String)>,
}

impl SentinelTopology {
    /// Starts the topology and waits until every sentinel knows the replica and the other
    /// sentinels (so a failover can be voted). Panics (failing the test) with the install
    /// line if `redis-server` or `redis-sentinel` is missing.
    pub fn start() -> SentinelTopology {
        SentinelTopology::start_with(None)
    }

    /// Like [`SentinelTopology::start`], every server and sentinel also serving TLS with one
    /// fresh test CA ([`SentinelTopology::ca_file`]); replication and the sentinels use TLS,
    /// so the sentinels name the servers' TLS ports, and [`SentinelTopology::url`] is a
    /// `rediss+sentinel://` URL of the sentinels' TLS ports. The plain ports stay open for
    /// the topology's own helpers.
    pub fn start_tls() -> SentinelTopology {
        SentinelTopology::start_with(Some(TestCerts::make()))
    }

    fn start_with(certs: Option<TestCerts>) -> SentinelTopology {
        let args = [
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-sync",
            "yes",
        ];
        let start = || match &certs {
            Some(certs) => {
                let tls_args = [&args[..], &["--tls-replication", "yes"]].concat();
                RedisServer::start_tls_with(certs, &tls_args)
            }
            None => RedisServer::start_with(&args),
        };
        let master = start();
        let replica = start();
        // The port the master is known by: its TLS port when replication uses TLS.
        let named = master.tls_port().unwrap_or(master.port()).to_string();
        let reply = replica.command(&["REPLICAOF", "127.0.0.1", &named]);
        assert!(reply.starts_with("+OK"), "REPLICAOF: {reply}");
        let monitored = master.tls_port().unwrap_or(master.port());
        let topo = SentinelTopology {
            sentinels: (0..3)
                .map(|_| Sentinel::start_with(monitored, certs.as_ref()))
                .collect(),
            servers: vec![master, replica],
            certs,
            data_password: None,
            sentinel_login: None,
        };
        topo.wait_until("the replica is in sync", |t| {
            t.data_command(t.servers[1].port(), &["INFO", "replication"])
                .contains("master_link_status:up")
        });
        topo.wait_until(
            "every sentinel knows the replica and 2 other sentinels",
            |t| {
                t.sentinels.iter().all(|s| {
                    let info = t.sentinel_command(s.port, &["SENTINEL", "MASTER", MASTER_NAME]);
                    let fields = bulk_strings(&info);
                    let field = |k: &str| {
                        fields
                            .iter()
                            .position(|f| f == k)
                            .and_then(|i| fields.get(i + 1))
                            .cloned()
                            .unwrap_or_default()
                    };
                    field("num-slaves") == "1" && field("num-other-sentinels") == "2"
                })
            },
        );
        topo
    }

    /// `redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/<MASTER_NAME>` (with TLS,
    /// `rediss+sentinel://` and the sentinels' TLS ports). No credentials: add them.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.tls_port.unwrap_or(s.port)))
            .collect();
        let scheme = if self.certs.is_some() {
            "rediss+sentinel"
        } else {
            "redis+sentinel"
        };
        format!("{scheme}://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The PEM file of the test CA of a topology from [`SentinelTopology::start_tls`] (e.g.
    /// for `SSL_CERT_FILE`).
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.certs
            .as_ref()
            .expect("started with start_tls")
            .ca_file()
    }

    /// Puts the data servers behind `data_password` (`requirepass`, and `masterauth` for
    /// the replica; the sentinels get it as `auth-pass`) and the sentinels behind their own
    /// user and password: `sentinel_user` `default` gives the default user a password,
    /// another name makes that user (all commands) and turns `default` off; the sentinels
    /// log in to each other with it (`sentinel-user`, `sentinel-pass`). Clients without
    /// credentials get NOAUTH from every process afterwards.
    pub fn protect(&mut self, data_password: &str, sentinel_user: &str, sentinel_password: &str) {
        let ok = |what: &str, reply: String| assert!(reply.starts_with("+OK"), "{what}: {reply}");
        for s in self.sentinel_ports() {
            let set = ["SENTINEL", "SET", MASTER_NAME, "auth-pass", data_password];
            ok("SENTINEL SET auth-pass", self.sentinel_command(s, &set));
        }
        let ports: Vec<u16> = self.servers.iter().map(|s| s.port()).collect();
        for port in &ports {
            let masterauth = ["CONFIG", "SET", "masterauth", data_password];
            ok(
                "CONFIG SET masterauth",
                self.data_command(*port, &masterauth),
            );
            let requirepass = ["CONFIG", "SET", "requirepass", data_password];
            ok(
                "CONFIG SET requirepass",
                self.data_command(*port, &requirepass),
            );
        }
        self.data_password = Some(data_password.to_string());
        for s in self.sentinel_ports() {
            if sentinel_user != "default" {
                let user = ["SENTINEL", "CONFIG", "SET", "sentinel-user", sentinel_user];
                ok(
                    "SENTINEL CONFIG SET sentinel-user",
                    self.sentinel_command(s, &user),
                );
            }
            let pass = [
                "SENTINEL",
                "CONFIG",
                "SET",
                "sentinel-pass",
                sentinel_password,
            ];
            ok(
                "SENTINEL CONFIG SET sentinel-pass",
                self.sentinel_command(s, &pass),
            );
        }
        let secret = format!(">{sentinel_password}");
        for s in self.sentinel_ports() {
            let all = ["allcommands", "allkeys", "allchannels"];
            let setuser = [&["ACL", "SETUSER", sentinel_user, "on", &secret][..], &all].concat();
            ok("ACL SETUSER", self.sentinel_command(s, &setuser));
            if sentinel_user != "default" {
                let off = ["ACL", "SETUSER", "default", "off"];
                // Sent logged in as the new user: `default` may be turned off already.
                let reply = command_as(s, Some((sentinel_user, sentinel_password)), &off);
                ok("ACL SETUSER default off", reply);
            }
        }
        self.sentinel_login = Some((sentinel_user.to_string(), sentinel_password.to_string()));
        for port in ports.iter().copied().chain(self.sentinel_ports()) {
            let reply = command_as(port, None, &["PING"]);
            assert!(reply.starts_with("-NOAUTH"), "{port} still open: {reply}");
        }
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The (plain) port of the master as the first sentinel that answers names it.
    pub fn master_port(&self) -> u16 {
        for s in &self.sentinels {
            let reply = self.sentinel_command(
                s.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            );
            if let Some(port) = bulk_strings(&reply).get(1).and_then(|p| p.parse().ok()) {
                // With TLS the sentinels name the server's TLS port.
                return self
                    .servers
                    .iter()
                    .find(|s| s.tls_port() == Some(port))
                    .map_or(port, RedisServer::port);
            }
        }
        panic!("no sentinel names the master");
    }

    /// The data server that is the master now (as the sentinels say).
    pub fn master(&self) -> &RedisServer {
        let port = self.master_port();
        self.servers.iter().find(|s| s.port() == port).unwrap()
    }

    /// The data server that is not the master now.
    pub fn replica(&self) -> &RedisServer {
        let port = self.master_port();
        self.servers.iter().find(|s| s.port() != port).unwrap()
    }

    /// One command to the data server on (plain) `port`, logged in once protected.
    fn data_command(&self, port: u16, words: &[&str]) -> String {
        let login = self.data_password.as_deref().map(|p| ("default", p));
        command_as(port, login, words)
    }

    /// One command to the sentinel on (plain) `port`, logged in once protected.
    fn sentinel_command(&self, port: u16, words: &[&str]) -> String {
        let login = self
            .sentinel_login
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()));
        command_as(port, login, words)
    }

    /// Whether the data server on `port` answers.
    fn answers(&self, port: u16) -> bool {
        self.data_command(port, &["PING"]).starts_with("+PONG")
    }

    fn master_mut(&mut self) -> &mut RedisServer {
        let port = self.master_port();
        self.servers.iter_mut().find(|s| s.port() == port).unwrap()
    }

    /// `SENTINEL FAILOVER`: returns once the former replica is master (`ROLE`) and the
    /// sentinels name it.
    pub fn failover(&self) {
        let old = self.master_port();
        let reply = self.sentinel_command(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", MASTER_NAME],
        );
        assert!(reply.starts_with("+OK"), "SENTINEL FAILOVER: {reply}");
        self.wait_new_master(old);
    }

    /// The highest configuration epoch a sentinel reports for the master: each failover
    /// raises it by one, so it counts the failovers the sentinels made, asked for or not.
    pub fn config_epoch(&self) -> Option<u64> {
        self.sentinels
            .iter()
            .filter_map(|s| {
                let fields = bulk_strings(
                    &self.sentinel_command(s.port, &["SENTINEL", "MASTER", MASTER_NAME]),
                );
                let i = fields.iter().position(|f| f == "config-epoch")?;
                fields.get(i + 1)?.parse().ok()
            })
            .max()
    }

    /// SIGKILLs the master (it stays dead until [`SentinelTopology::restart_dead`]) and
    /// returns once the sentinels promoted the replica.
    pub fn kill_master(&mut self) {
        let old = self.master_port();
        self.master_mut().kill();
        self.wait_new_master(old);
    }

    /// SIGSTOPs the master until the sentinels promoted the replica, then lets it run again
    /// (it is demoted to a replica by the sentinels soon after). Returns the old master's port.
    pub fn freeze_master(&self) -> u16 {
        let old = self.master_port();
        self.master().freeze();
        self.wait_new_master(old);
        self.servers
            .iter()
            .find(|s| s.port() == old)
            .unwrap()
            .thaw();
        old
    }

    /// Kills the master and starts it again at once (empty) on its port, well within the
    /// sentinels' [`DOWN_AFTER`]: a restart, not a failover.
    pub fn restart_master(&mut self) {
        self.master_mut().restart();
    }

    /// Starts a killed server again (empty) on its port; the sentinels make it a replica.
    /// (After [`SentinelTopology::protect`] it comes back without a password.)
    pub fn restart_dead(&mut self) {
        let master = self.master_port();
        let dead: Vec<u16> = (self.servers.iter())
            .map(RedisServer::port)
            .filter(|p| *p != master && command_as(*p, None, &["PING"]).is_empty())
            .collect();
        for s in self.servers.iter_mut().filter(|s| dead.contains(&s.port())) {
            s.restart();
        }
    }

    /// Waits until the sentinels name a master other than `old` and it says it is one.
    pub fn wait_new_master(&self, old: u16) {
        self.wait_until("a new master after the failover", |t| {
            let port = t.master_port();
            port != old && t.data_command(port, &["ROLE"]).contains("master")
        });
    }

    /// Waits until the replica is in sync with the master again (after a failover the
    /// demoted or restarted server rejoins as a replica).
    pub fn wait_replica_in_sync(&self) {
        self.wait_until("the replica back in sync", |t| {
            let r = t.replica().port();
            t.answers(r)
                && t.data_command(r, &["INFO", "replication"])
                    .contains("master_link_status:up")
        });
    }

    fn wait_until(&self, what: &str, ok: impl Fn(&SentinelTopology) -> bool) {
        wait_for(
            &format!("sentinel topology: no {what}"),
            Duration::from_secs(60),
            || ok(self),
        );
    }
}
