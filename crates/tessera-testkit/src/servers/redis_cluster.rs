//! A throwaway Redis Cluster: three primaries splitting the 16,384 slots, optionally one
//! replica each, every node on a free loopback port at most 55,535 (its cluster bus is the
//! port + 10,000) in its own temp dir, all stopped on drop.
//!
//! ```no_run
//! let cluster = tessera_testkit::servers::redis_cluster::RedisCluster::start(true);
//! let url = cluster.url(); // redis+cluster://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C
//! # drop(url);
//! ```
//!
//! Nodes run with `--cluster-node-timeout` [`NODE_TIMEOUT`]: a replica takes over about that
//! long after its primary stops answering.

use std::net::TcpListener;
use std::time::Duration;

use super::process::{free_port, wait_for};
use super::redis::{ping, RedisServer};
use super::redis_sentinel::bulk_strings;

/// How long a node may not answer before the cluster fails it over.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(2000);

/// The slot ranges of the three primaries.
const RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// A free loopback port whose bus port (+10,000) is free too.
fn cluster_port() -> u16 {
    for _ in 0..200 {
        let p = free_port();
        if p <= 55535 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
            return p;
        }
    }
    panic!("no free loopback port below 55536 with a free bus port");
}

/// Three primaries (and, if asked, one replica each).
#[derive(Debug)]
pub struct RedisCluster {
    /// Nodes `0..3` started as the primaries of [`RANGES`]; `3..6` their replicas.
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the cluster and waits until every node reports `cluster_state:ok` and every
    /// replica is in sync. Panics (failing the test) if `redis-server` is missing.
    pub fn start(replicas: bool) -> RedisCluster {
        let n = if replicas { 6 } else { 3 };
        let timeout = NODE_TIMEOUT.as_millis().to_string();
        let args = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &timeout,
            "--repl-diskless-sync-delay",
            "0",
            "--repl-diskless-sync",
            "yes",
        ];
        let nodes: Vec<RedisServer> = (0..n)
            .map(|_| RedisServer::start_on(&args, cluster_port))
            .collect();
        let cluster = RedisCluster { nodes };
        for (node, (lo, hi)) in cluster.nodes.iter().zip(RANGES) {
            let reply =
                node.command(&["CLUSTER", "ADDSLOTSRANGE", &lo.to_string(), &hi.to_string()]);
            assert!(reply.starts_with("+OK"), "CLUSTER ADDSLOTSRANGE: {reply}");
        }
        let first = cluster.nodes[0].port().to_string();
        for node in &cluster.nodes[1..] {
            let reply = node.command(&["CLUSTER", "MEET", "127.0.0.1", &first]);
            assert!(reply.starts_with("+OK"), "CLUSTER MEET: {reply}");
        }
        if replicas {
            let ids: Vec<String> = cluster.nodes[..3]
                .iter()
                .map(|p| bulk_strings(&p.command(&["CLUSTER", "MYID"]))[0].clone())
                .collect();
            for (replica, id) in cluster.nodes[3..].iter().zip(&ids) {
                cluster.wait_until("the replica to learn its primary", |_| {
                    replica.command(&["CLUSTER", "NODES"]).contains(id.as_str())
                });
                let reply = replica.command(&["CLUSTER", "REPLICATE", id]);
                assert!(reply.starts_with("+OK"), "CLUSTER REPLICATE: {reply}");
            }
        }
        cluster.wait_ok();
        cluster
    }

    /// `redis+cluster://` with the primaries' addresses.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self.nodes[..3]
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }

    /// Every node, primaries first (as started; roles change with failovers).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes that are primaries now and answer.
    pub fn primaries(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| ping(n.port()) && n.command(&["ROLE"]).contains("master"))
            .collect()
    }

    /// The node that is primary for `key`'s slot now.
    pub fn primary_for(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        self.primaries()
            .into_iter()
            .find(|p| {
                let nodes = p.command(&["CLUSTER", "NODES"]);
                nodes.lines().any(|l| l.contains("myself") && owns(l, slot))
            })
            .unwrap_or_else(|| panic!("no primary for slot {slot}"))
    }

    /// SIGKILLs the primary for `key`'s slot and waits until its replica took over and the
    /// cluster is ok again (needs replicas). Returns the killed node's port.
    pub fn kill_primary_for(&mut self, key: &str) -> u16 {
        let port = self.primary_for(key).port();
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap()
            .kill();
        self.wait_until("a replica promoted in place of the killed primary", |c| {
            c.primaries().len() == 3
        });
        self.wait_ok();
        port
    }

    /// Starts killed nodes again (they keep their `nodes.conf` and rejoin as replicas).
    pub fn restart_dead(&mut self) {
        for n in self.nodes.iter_mut() {
            if !ping(n.port()) {
                n.restart();
            }
        }
        self.wait_ok();
    }

    /// The slot of `key` (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, key: &str) -> u16 {
        let any = self
            .nodes
            .iter()
            .find(|n| ping(n.port()))
            .expect("a live node");
        let slot = any.command(&["CLUSTER", "KEYSLOT", key]);
        slot.trim_start_matches(':').trim().parse().unwrap()
    }

    /// Moves `key`'s slot to the primary on `to_port` as `redis-cli --cluster reshard` does:
    /// the target `IMPORTING`, the source `MIGRATING`, the slot's keys moved with `MIGRATE …
    /// KEYS` `batch` at a time (each batch atomically; `between` runs after each, so clients
    /// meet a slot whose keys are split between the two nodes), then `SETSLOT … NODE` on the
    /// target, the source and the other primaries. Meanwhile the source answers `ASK` for a
    /// call whose keys all left and `TRYAGAIN` for one whose keys are split; the target
    /// serves an `ASKING` call whose keys all arrived. Returns the number of keys moved; 0
    /// if the slot is on `to_port` already.
    pub fn migrate_slot_of(
        &self,
        key: &str,
        to_port: u16,
        batch: usize,
        mut between: impl FnMut(),
    ) -> usize {
        let slot = self.slot_of(key).to_string();
        let source = self.primary_for(key);
        if source.port() == to_port {
            return 0;
        }
        let primaries = self.primaries();
        let target = primaries
            .iter()
            .find(|p| p.port() == to_port)
            .unwrap_or_else(|| panic!("no primary on port {to_port}"));
        let id = |n: &RedisServer| bulk_strings(&n.command(&["CLUSTER", "MYID"]))[0].clone();
        let (source_id, target_id) = (id(source), id(target));
        let ok = |what: &str, reply: String| assert!(reply.starts_with("+OK"), "{what}: {reply}");
        let importing = ["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id];
        ok("SETSLOT IMPORTING", target.command(&importing));
        let migrating = ["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id];
        ok("SETSLOT MIGRATING", source.command(&migrating));
        let (to, count) = (to_port.to_string(), batch.max(1).to_string());
        let mut moved = 0;
        loop {
            let keys = bulk_strings(&source.command(&["CLUSTER", "GETKEYSINSLOT", &slot, &count]));
            if keys.is_empty() {
                break;
            }
            let mut migrate = vec![
                "MIGRATE",
                "127.0.0.1",
                &to,
                "",
                "0",
                "5000",
                "REPLACE",
                "KEYS",
            ];
            migrate.extend(keys.iter().map(String::as_str));
            let reply = source.command(&migrate);
            // NOKEY: the keys expired or were deleted meanwhile.
            assert!(
                reply.starts_with("+OK") || reply.starts_with("+NOKEY"),
                "MIGRATE: {reply}"
            );
            moved += keys.len();
            between();
        }
        let node = ["CLUSTER", "SETSLOT", &slot, "NODE", &target_id];
        ok("SETSLOT NODE on the target", target.command(&node));
        ok("SETSLOT NODE on the source", source.command(&node));
        for p in primaries
            .iter()
            .filter(|p| p.port() != to_port && p.port() != source.port())
        {
            ok("SETSLOT NODE", p.command(&node));
        }
        self.wait_until("every primary to agree on the moved slot", |c| {
            c.primary_for(key).port() == to_port
        });
        moved
    }

    /// Waits until every live node says `cluster_state:ok` and knows the same 3 primaries.
    pub fn wait_ok(&self) {
        self.wait_until("cluster_state:ok on every node", |c| {
            c.nodes.iter().filter(|n| ping(n.port())).all(|n| {
                n.command(&["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && n.command(&["CLUSTER", "NODES"])
                        .lines()
                        .filter(|l| l.contains("master") && !l.contains("fail"))
                        .count()
                        == 3
            })
        });
    }

    fn wait_until(&self, what: &str, ok: impl Fn(&RedisCluster) -> bool) {
        wait_for(
            &format!("redis cluster: no {what}"),
            Duration::from_secs(60),
            || ok(self),
        );
    }
}

/// Whether a `CLUSTER NODES` line lists `slot` among its ranges.
fn owns(line: &str, slot: u16) -> bool {
    line.split(' ').skip(8).any(|r| {
        let mut it = r.split('-');
        let lo = it.next().and_then(|v| v.parse::<u16>().ok());
        let hi = it.next().and_then(|v| v.parse::<u16>().ok()).or(lo);
        matches!((lo, hi), (Some(lo), Some(hi)) if lo <= slot && slot <= hi)
    })
}
