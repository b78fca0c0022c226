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

use std::process::Command;
use std::time::Duration;

use super::process::{free_port, start_retrying, wait_for, ServerProcess};
use super::redis::{command_full, ping, RedisServer};

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
    _process: ServerProcess,
    _dir: tempfile::TempDir,
}

impl Sentinel {
    /// Starts a sentinel that monitors the Redis on `master_port`.
    pub fn start(master_port: u16) -> Sentinel {
        start_retrying("redis-sentinel", 10, || {
            let dir = tempfile::tempdir().expect("temp dir for redis-sentinel");
            let port = free_port();
            let conf = dir.path().join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\ndir {}\n\
                     sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                     sentinel down-after-milliseconds {MASTER_NAME} {}\n\
                     sentinel failover-timeout {MASTER_NAME} 10000\n\
                     sentinel parallel-syncs {MASTER_NAME} 1\n",
                    dir.path().display(),
                    DOWN_AFTER.as_millis()
                ),
            )
            .expect("write sentinel.conf");
            let mut command = Command::new("redis-sentinel");
            command.arg(&conf);
            let log = dir.path().join("sentinel.log");
            let mut process = ServerProcess::spawn("redis-sentinel", command, &log, INSTALL)?;
            process.wait_ready(Duration::from_secs(10), || ping(port))?;
            Ok(Sentinel {
                port,
                _process: process,
                _dir: dir,
            })
        })
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
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
}

impl SentinelTopology {
    /// Starts the topology and waits until every sentinel knows the replica and the other
    /// sentinels (so a failover can be voted). Panics (failing the test) with the install
    /// line if `redis-server` or `redis-sentinel` is missing.
    pub fn start() -> SentinelTopology {
        let args = [
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-sync",
            "yes",
        ];
        let master = RedisServer::start_with(&args);
        let replica = RedisServer::start_with(&args);
        let reply = replica.command(&["REPLICAOF", "127.0.0.1", &master.port().to_string()]);
        assert!(reply.starts_with("+OK"), "REPLICAOF: {reply}");
        let topo = SentinelTopology {
            sentinels: (0..3).map(|_| Sentinel::start(master.port())).collect(),
            servers: vec![master, replica],
        };
        topo.wait_until("the replica is in sync", |t| {
            t.servers[1]
                .command(&["INFO", "replication"])
                .contains("master_link_status:up")
        });
        topo.wait_until(
            "every sentinel knows the replica and 2 other sentinels",
            |t| {
                t.sentinels.iter().all(|s| {
                    let info = command_full(s.port, &["SENTINEL", "MASTER", MASTER_NAME]);
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

    /// `redis+sentinel://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C/<MASTER_NAME>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The master's port as the first sentinel that answers tells it.
    pub fn master_port(&self) -> u16 {
        for s in &self.sentinels {
            let reply = command_full(
                s.port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            );
            if let Some(port) = bulk_strings(&reply).get(1).and_then(|p| p.parse().ok()) {
                return port;
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

    fn master_mut(&mut self) -> &mut RedisServer {
        let port = self.master_port();
        self.servers.iter_mut().find(|s| s.port() == port).unwrap()
    }

    /// `SENTINEL FAILOVER`: returns once the former replica is master (`ROLE`) and the
    /// sentinels name it.
    pub fn failover(&self) {
        let old = self.master_port();
        let reply = command_full(
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
                let fields =
                    bulk_strings(&command_full(s.port, &["SENTINEL", "MASTER", MASTER_NAME]));
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
    pub fn restart_dead(&mut self) {
        let master = self.master_port();
        for s in self.servers.iter_mut().filter(|s| s.port() != master) {
            if !ping(s.port()) {
                s.restart();
            }
        }
    }

    /// Waits until the sentinels name a master other than `old` and it says it is one.
    pub fn wait_new_master(&self, old: u16) {
        self.wait_until("a new master after the failover", |t| {
            let port = t.master_port();
            port != old && command_full(port, &["ROLE"]).contains("master")
        });
    }

    /// Waits until the replica is in sync with the master again (after a failover the
    /// demoted or restarted server rejoins as a replica).
    pub fn wait_replica_in_sync(&self) {
        self.wait_until("the replica back in sync", |t| {
            let r = t.replica();
            ping(r.port())
                && r.command(&["INFO", "replication"])
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
