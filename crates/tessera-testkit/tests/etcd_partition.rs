//! A holder partitioned from its etcd member by a real network fault: the holder runs in a
//! network namespace this test creates, reaching the member over a veth pair; the test
//! takes the link down (packets dropped, nothing closed). The partitioned holder must see
//! `lost()` before a client on the other side of the partition gets the permit, and the
//! semaphore never holds more than its capacity.
//!
//! Needs root and `ip` (iproute2). It fails, never skips, when it cannot set up. The
//! namespace and the veth pair are removed when the test ends, however it ends. Addresses
//! are link-local (169.254.0.0/16) on the veth pair only: no traffic leaves the machine.

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tessera::*;
use tessera_testkit::conformance::{opts, status, unique};
use tessera_testkit::harness::{Harness, StoreTraits};
use tessera_testkit::hold::holder_binary;
use tessera_testkit::servers::etcd::EtcdCluster;
use tessera_testkit::servers::process::run_checked;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;

/// Runs `ip ARGS`, failing the test with its error output if it does not succeed.
fn ip(args: &[&str]) {
    run_checked(
        Command::new("ip").args(args),
        "install iproute2; the test needs root",
    );
}

/// A network namespace with a veth pair to the host, removed on drop.
struct Netns {
    ns: String,
    host_if: String,
    host_addr: String,
}

impl Netns {
    /// `ip netns add`, a veth pair, `169.254.N.1/30` on the host side and `.2/30` inside.
    fn create() -> Netns {
        let tag = format!("{:06x}", rand::random::<u32>() & 0xff_ffff);
        let n = 1 + rand::random::<u8>() % 254;
        let netns = Netns {
            ns: format!("tessera-{tag}"),
            host_if: format!("ts{tag}h"),
            host_addr: format!("169.254.{n}.1"),
        };
        let inner_if = format!("ts{tag}n");
        // From here on, a failure drops `netns`, which removes whatever was made.
        ip(&["netns", "add", &netns.ns]);
        ip(&[
            "link",
            "add",
            &netns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &inner_if,
            "netns",
            &netns.ns,
        ]);
        ip(&[
            "addr",
            "add",
            &format!("{}/30", netns.host_addr),
            "dev",
            &netns.host_if,
        ]);
        ip(&["link", "set", &netns.host_if, "up"]);
        let inner_addr = format!("169.254.{n}.2/30");
        ip(&[
            "-n",
            &netns.ns,
            "addr",
            "add",
            &inner_addr,
            "dev",
            &inner_if,
        ]);
        ip(&["-n", &netns.ns, "link", "set", &inner_if, "up"]);
        ip(&["-n", &netns.ns, "link", "set", "lo", "up"]);
        netns
    }

    /// Takes the host side of the link down: the namespace is cut off, nothing is closed.
    fn partition(&self) {
        ip(&["link", "set", &self.host_if, "down"]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth inside it and so its host-side peer; the
        // host side is deleted first in case the namespace is already gone.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(Stdio::null())
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns])
            .stderr(Stdio::null())
            .status();
    }
}

/// Forwards connections made to `listen` (on the host side of the veth pair) to the etcd
/// member on `127.0.0.1:port`, until the test ends.
async fn forward(listen: &str, port: u16) -> u16 {
    let listener = TcpListener::bind((listen, 0))
        .await
        .unwrap_or_else(|e| panic!("cannot listen on {listen}: {e}"));
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut member) = TcpStream::connect(("127.0.0.1", port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut member).await;
                }
            });
        }
    });
    addr.port()
}

fn unix_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_loses_its_permit_before_anyone_else_gets_it() {
    let netns = Netns::create();
    let cluster = EtcdCluster::start(1);
    let member = cluster.client_port(0);
    let prefix = format!("t{:08x}", rand::random::<u32>());
    let h = Harness::new(
        "etcd://",
        format!("{}/{prefix}", cluster.url()),
        StoreTraits::OWN_ETCD,
        Box::new(cluster),
    );
    let port = forward(&netns.host_addr, member).await;
    let inner_url = format!("etcd://{}:{port}/{prefix}", netns.host_addr);
    let name = unique("partition");
    let ttl = Duration::from_secs(3);

    // The holder, inside the namespace.
    let mut holder = tokio::process::Command::new("ip")
        .args(["netns", "exec", &netns.ns])
        .arg(holder_binary())
        .args(["--store", &inner_url, "--name", &name, "--permits", "1"])
        .args(["--ttl-ms", &ttl.as_millis().to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start tessera-hold in the namespace");
    let mut lines = BufReader::new(holder.stdout.take().unwrap()).lines();
    let held = timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the holder in the namespace did not report in time")
        .unwrap()
        .expect("the holder in the namespace exited");
    assert!(held.starts_with("HELD "), "{held}");
    let fence: u64 = held.split(' ').nth(2).unwrap().parse().unwrap();

    // A client outside waits for the permit.
    let client = h.client().await;
    let sem = Semaphore::new(&client.store, &name, 1, opts(ttl.as_millis() as u64)).unwrap();
    let store = client.store.clone();
    let waiter = tokio::spawn(async move {
        let p = sem.acquire().await;
        (p, unix_micros(), sem)
    });
    tessera_testkit::conformance::wait_queued(&store, &name, 1).await;

    netns.partition();
    let cut = unix_micros();
    let lost = timeout(ttl * 3, lines.next_line())
        .await
        .expect("the partitioned holder never saw lost()")
        .unwrap()
        .expect("the partitioned holder exited without reporting lost()");
    let lost_at: u128 = lost
        .strip_prefix("LOST ")
        .unwrap_or_else(|| panic!("{lost}"))
        .parse()
        .unwrap();
    let (p, granted_at, _sem) = timeout(ttl * 4, waiter)
        .await
        .expect("the permit never came back after the partition")
        .unwrap();
    let p = p.unwrap();
    assert!(
        lost_at < granted_at,
        "the partitioned holder saw lost() {} µs after the permit went to another client",
        lost_at - granted_at
    );
    assert!(p.fence() > fence);
    let s = status(&store, &name).await.unwrap();
    assert_eq!(s.holders.len(), 1, "{s:?}");
    assert_eq!(s.holders[0].lease_id, p.lease_id());
    eprintln!(
        "partition: lost() {} ms after the cut, the permit elsewhere {} ms after the cut",
        (lost_at - cut) / 1000,
        (granted_at - cut) / 1000
    );
    p.release().await.unwrap();
    let _ = holder.kill().await;
    drop(netns);
}
