//! Wake-ups across processes for the SQLite store: Unix datagram sockets in a folder beside
//! the database file (`<file>.wake/`).
//!
//! Every backend binds one socket there (`<pid>-<random>`) and a task that turns each
//! datagram — a batch of 16-byte lease ids — into [`crate::wake::notify`] calls. After a step
//! commits, the lease ids it granted or revoked are sent to every socket in the folder; a
//! process wakes only the tasks waiting on those ids, others ignore them. A grant therefore
//! reaches a waiter in another process in one datagram instead of at its next poll.
//!
//! Nothing depends on delivery: a datagram dropped because a receiver's buffer is full, or a
//! process that joined after the folder listing was cached, only falls back to the waiter's
//! poll (see [`super::SqliteBackend`]'s `waking`). A socket whose process died is found when a
//! send to it is refused, and removed. The folder listing is cached for
//! [`PEER_REFRESH`], so a burst of grants costs one directory read.

use std::io::ErrorKind;
use std::os::unix::net::UnixDatagram as StdDatagram;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::net::UnixDatagram;
use tokio::task::JoinHandle;

use crate::model::LeaseId;
use crate::wake;

/// How long the list of peer sockets is reused before the folder is read again.
const PEER_REFRESH: Duration = Duration::from_millis(100);
/// Unix socket paths are limited to about 108 bytes; longer ones fall back to polling.
const MAX_SOCKET_PATH: usize = 100;
/// Lease ids per datagram.
const IDS_PER_DATAGRAM: usize = 256;

/// This process's end of the wake-up folder.
pub(crate) struct Notifier {
    me: PathBuf,
    dir: PathBuf,
    sender: StdDatagram,
    peers: Mutex<(Option<Instant>, Vec<PathBuf>)>,
    receiver: JoinHandle<()>,
}

impl Notifier {
    /// Binds this backend's socket beside `db`. `None` (with a warning) when the folder or
    /// socket cannot be made; waiters then rely on polling alone.
    pub(crate) fn start(db: &Path) -> Option<Notifier> {
        let mut dir = db.as_os_str().to_owned();
        dir.push(".wake");
        let dir = PathBuf::from(dir);
        let me = dir.join(format!(
            "{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        if me.as_os_str().len() > MAX_SOCKET_PATH {
            tracing::warn!(path = %me.display(), "the wake-up socket path is too long; waiters in other processes will poll");
            return None;
        }
        let made = std::fs::create_dir_all(&dir)
            .and_then(|_| UnixDatagram::bind(&me))
            .and_then(|sock| StdDatagram::unbound().map(|s| (sock, s)))
            .and_then(|(sock, sender)| sender.set_nonblocking(true).map(|_| (sock, sender)));
        let (sock, sender) = match made {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "no wake-up socket; waiters in other processes will poll");
                return None;
            }
        };
        let receiver = tokio::spawn(async move {
            let mut buf = vec![0u8; 16 * IDS_PER_DATAGRAM];
            while let Ok(n) = sock.recv(&mut buf).await {
                for id in buf[..n].chunks_exact(16) {
                    let raw = u128::from_be_bytes(id.try_into().expect("16-byte chunk"));
                    wake::notify(LeaseId::from_u128(raw));
                }
            }
        });
        Some(Notifier {
            me,
            dir,
            sender,
            peers: Mutex::new((None, Vec::new())),
            receiver,
        })
    }

    /// Sends `ids` to every other backend sharing the database. Never blocks; failures are
    /// left to polling.
    pub(crate) fn broadcast(&self, ids: &[LeaseId]) {
        if ids.is_empty() {
            return;
        }
        let peers = self.peers();
        for batch in ids.chunks(IDS_PER_DATAGRAM) {
            let msg: Vec<u8> = batch
                .iter()
                .flat_map(|id| id.as_u128().to_be_bytes())
                .collect();
            for peer in &peers {
                match self.sender.send_to(&msg, peer) {
                    Ok(_) => {}
                    // Nobody is bound there any more: its process died without cleaning up.
                    Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                        let _ = std::fs::remove_file(peer);
                        self.peers.lock().unwrap().0 = None;
                    }
                    Err(e) => {
                        tracing::trace!(peer = %peer.display(), error = %e, "wake-up not sent")
                    }
                }
            }
        }
    }

    fn peers(&self) -> Vec<PathBuf> {
        let mut cache = self.peers.lock().unwrap();
        if cache.0.is_none_or(|t| t.elapsed() > PEER_REFRESH) {
            let listed = std::fs::read_dir(&self.dir)
                .map(|rd| {
                    rd.filter_map(|e| e.ok().map(|e| e.path()))
                        .filter(|p| *p != self.me)
                        .collect()
                })
                .unwrap_or_default();
            *cache = (Some(Instant::now()), listed);
        }
        cache.1.clone()
    }
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.receiver.abort();
        let _ = std::fs::remove_file(&self.me);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_broadcast_wakes_the_task_waiting_on_that_lease_in_another_backend() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let sender = Notifier::start(&db).expect("sender socket");
        let receiver = Notifier::start(&db).expect("receiver socket");
        let (mine, other) = (LeaseId::random(), LeaseId::random());
        let registration = wake::Registration::new(mine);
        sender.broadcast(&[other, mine]);
        tokio::time::timeout(Duration::from_secs(5), registration.notified())
            .await
            .expect("the datagram did not wake the waiter");
        drop(receiver);
    }

    #[tokio::test]
    async fn a_dead_peer_socket_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let sender = Notifier::start(&db).expect("sender socket");
        // A socket file nobody listens on any more, as left by a killed process.
        let stale = db.with_extension("db.wake").join("1-deadbeef");
        drop(std::os::unix::net::UnixDatagram::bind(&stale).unwrap());
        assert!(stale.exists());
        sender.broadcast(&[LeaseId::random()]);
        assert!(!stale.exists(), "the stale socket was kept");
    }
}
