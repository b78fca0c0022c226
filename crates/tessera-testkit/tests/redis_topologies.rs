//! The throwaway Sentinel and Cluster topologies of the test kit start, fail over and stop
//! as they say (the stores' tests build on them).

use tessera_testkit::servers::redis_cluster::RedisCluster;
use tessera_testkit::servers::redis_sentinel::SentinelTopology;

#[test]
fn sentinel_topology_fails_over_on_request_and_on_a_killed_master() {
    let mut topo = SentinelTopology::start();
    assert!(topo.url().starts_with("redis+sentinel://127.0.0.1:"));
    let first = topo.master_port();
    assert!(topo.master().command(&["ROLE"]).contains("master"));
    topo.failover();
    let second = topo.master_port();
    assert_ne!(first, second);
    topo.wait_replica_in_sync();
    topo.kill_master();
    assert_eq!(topo.master_port(), first);
    topo.restart_dead();
    topo.wait_replica_in_sync();
}

#[test]
fn cluster_splits_the_slots_and_promotes_a_replica_of_a_killed_primary() {
    let mut cluster = RedisCluster::start(true);
    assert_eq!(cluster.primaries().len(), 3);
    assert!(cluster.url().starts_with("redis+cluster://127.0.0.1:"));
    let old = cluster.primary_for("{x}").port();
    let killed = cluster.kill_primary_for("{x}");
    assert_eq!(old, killed);
    assert_ne!(cluster.primary_for("{x}").port(), killed);
    cluster.restart_dead();
    assert_eq!(cluster.primaries().len(), 3);
}

#[test]
fn a_frozen_sentinel_master_rejoins_as_a_replica_after_it_runs_again() {
    let topo = SentinelTopology::start();
    let old = topo.freeze_master();
    assert_ne!(topo.master_port(), old);
    topo.wait_replica_in_sync();
    assert_eq!(topo.replica().port(), old);
}
