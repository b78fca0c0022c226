//! A loopback TCP proxy that injects network faults between clients and a store, switchable
//! while it runs.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use tessera_testkit::proxy::{Mode, Proxy};
//! let proxy = Proxy::start("127.0.0.1:6379".parse()?).await?;
//! let url = format!("redis://{}", proxy.addr()); // clients connect here
//! proxy.set(Mode::Blackhole); // a partition: nothing flows, nothing is closed
//! proxy.set(Mode::Pass);      // healed: what was held flows on, in order
//! # Ok(()) }
//! ```
//!
//! Modes, each modelling what TCP can really do to a connection:
//!
//! - [`Mode::Pass`]: bytes flow both ways.
//! - [`Mode::Blackhole`]: nothing flows and nothing is closed, as when packets are dropped on
//!   the path: the proxy stops reading, bytes queue up, and flow on in order when healed
//!   (TCP would have retransmitted them). New connections are accepted but stay silent.
//! - [`Mode::Reset`]: every connection, existing or new, is closed with a RST.
//! - [`Mode::Delay`]: every chunk is held for the given milliseconds, in each direction.
//! - [`Mode::DropReplies`]: requests reach the store, replies are discarded: the store acts
//!   on a request but its caller never learns the answer. Since a byte stream cannot lose a
//!   reply and carry on, every connection that lost a reply is reset when the mode changes.
//!
//! Only loopback addresses are accepted, so a test can never send faults into a network.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward both ways.
    Pass,
    /// Forward nothing, close nothing.
    Blackhole,
    /// Reset every connection.
    Reset,
    /// Hold every chunk this many milliseconds.
    Delay(u64),
    /// Forward requests, discard replies.
    DropReplies,
}

/// Counts of what the proxy did.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: AtomicU64,
    /// Connections reset by the proxy.
    pub resets: AtomicU64,
    /// Reply chunks discarded.
    pub dropped_replies: AtomicU64,
}

/// A running proxy; stops (closing every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    mode: watch::Sender<Mode>,
    stats: Arc<ProxyStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on `127.0.0.1:<free port>` and forwards to `upstream` (must be loopback).
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        anyhow::ensure!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to loopback addresses, not {upstream}"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, rx) = watch::channel(Mode::Pass);
        let stats = Arc::new(ProxyStats::default());
        let st = Arc::clone(&stats);
        let task = tokio::spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            while let Ok((client, _)) = listener.accept().await {
                st.connections.fetch_add(1, Ordering::Relaxed);
                conns.spawn(serve(client, upstream, rx.clone(), Arc::clone(&st)));
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Proxy {
            addr,
            mode,
            stats,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Switches the mode; takes effect at once on every connection.
    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    /// The current mode.
    pub fn mode(&self) -> Mode {
        *self.mode.borrow()
    }

    /// What the proxy did so far.
    pub fn stats(&self) -> &ProxyStats {
        &self.stats
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        // Aborting the accept loop drops the JoinSet, which aborts every connection.
        self.task.abort();
    }
}

/// Serves one connection until either side closes or the mode resets it.
async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<Mode>,
    stats: Arc<ProxyStats>,
) {
    // Zero linger: dropping a socket sends RST, which is how the proxy resets.
    let _ = client.set_zero_linger();
    let _ = client.set_nodelay(true);
    if *mode.borrow() == Mode::Reset {
        stats.resets.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = server.set_zero_linger();
    let _ = server.set_nodelay(true);
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let tainted = Arc::new(AtomicBool::new(false));
    let mut up = tokio::spawn(pump(
        cr,
        sw,
        false,
        mode.clone(),
        Arc::clone(&tainted),
        Arc::clone(&stats),
    ));
    let mut down = tokio::spawn(pump(
        sr,
        cw,
        true,
        mode.clone(),
        Arc::clone(&tainted),
        Arc::clone(&stats),
    ));
    let mut last = *mode.borrow_and_update();
    loop {
        tokio::select! {
            _ = &mut up => break,
            _ = &mut down => break,
            changed = mode.changed() => {
                if changed.is_err() {
                    break;
                }
                let now = *mode.borrow_and_update();
                let lost_reply = last == Mode::DropReplies && now != Mode::DropReplies
                    && tainted.load(Ordering::SeqCst);
                if now == Mode::Reset || lost_reply {
                    stats.resets.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                last = now;
            }
        }
    }
    // Dropping the halves (zero linger) resets both sides.
    up.abort();
    down.abort();
}

/// Copies one direction, obeying the mode for every chunk.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    reply: bool,
    mut mode: watch::Receiver<Mode>,
    tainted: Arc<AtomicBool>,
    stats: Arc<ProxyStats>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // In a black hole, stop reading too: the bytes wait in the kernel, as on a path that
        // drops packets.
        while *mode.borrow_and_update() == Mode::Blackhole {
            if mode.changed().await.is_err() {
                return;
            }
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        loop {
            let m = *mode.borrow_and_update();
            match m {
                Mode::Blackhole => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                Mode::Reset => return,
                Mode::DropReplies if reply => {
                    tainted.store(true, Ordering::SeqCst);
                    stats.dropped_replies.fetch_add(1, Ordering::Relaxed);
                }
                Mode::Delay(ms) => {
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
                _ => {
                    if to.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
        s.write_all(b"ping").await.ok()?;
        let mut b = [0u8; 4];
        match tokio::time::timeout(within, s.read_exact(&mut b)).await {
            Ok(Ok(_)) => Some(b.to_vec()),
            _ => None,
        }
    }

    #[tokio::test]
    async fn modes_switch_at_run_time() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let short = Duration::from_millis(300);
        assert_eq!(
            roundtrip(&mut s, short).await.as_deref(),
            Some(&b"ping"[..])
        );

        // A black hole holds the bytes; healing delivers them.
        proxy.set(Mode::Blackhole);
        assert_eq!(roundtrip(&mut s, short).await, None);
        proxy.set(Mode::Pass);
        let mut b = [0u8; 4];
        tokio::time::timeout(short, s.read_exact(&mut b))
            .await
            .unwrap()
            .unwrap();

        // Delay.
        proxy.set(Mode::Delay(100));
        let t = std::time::Instant::now();
        assert!(roundtrip(&mut s, Duration::from_secs(2)).await.is_some());
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "{:?}",
            t.elapsed()
        );

        // Dropped replies, then the connection is reset on the next switch.
        proxy.set(Mode::DropReplies);
        assert_eq!(roundtrip(&mut s, short).await, None);
        proxy.set(Mode::Pass);
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut b = [0u8; 4];
        let r = tokio::time::timeout(short, s.read(&mut b)).await.unwrap();
        assert!(matches!(r, Ok(0) | Err(_)), "{r:?}");

        // Reset closes new connections too.
        proxy.set(Mode::Reset);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut s, short).await, None);
        proxy.set(Mode::Pass);
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        assert!(roundtrip(&mut s, short).await.is_some());
        assert!(proxy.stats().resets.load(Ordering::Relaxed) >= 2);
    }

    #[tokio::test]
    async fn only_loopback_upstreams_are_accepted() {
        assert!(Proxy::start("192.0.2.1:6379".parse().unwrap())
            .await
            .is_err());
    }
}
