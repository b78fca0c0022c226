//! Wake-ups across processes for the SQLite store: Unix datagram sockets in a folder beside
//! the database file (`<file>.wake/`).
//!
//! Every backend binds one socket there (`<pid>-<random>`) and a task that turns each
//! datagram — a batch of 16-byte lease ids — into [`tessera_core::wake::notify`] calls. A backend
//! records its socket's name with every waiter it queues (`tessera_waiters.wake`), so after a
//! step commits, a granted waiter's id goes to its own process's socket only. Ids without a
//! recorded socket (revocations and deletions of held leases, waiters queued by an older
//! build) go to every socket in the folder; a process wakes only the tasks waiting on those
//! ids, others ignore them. A grant therefore reaches a waiter in another process in one
//! datagram instead of at its next poll, and wakes no other process: with every grant told
//! to every process, each grant among 8 processes cost 7 process wake-ups.
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

use tessera_core::model::LeaseId;
use tessera_core::wake;

/// How long the list of peer sockets is reused before the folder is read again.
const PEER_REFRESH: Duration = Duration::from_millis(100);
/// Unix socket paths are limited to about 108 bytes; longer ones fall back to polling.
const MAX_SOCKET_PATH: usize = 100;
/// Lease ids per datagram.
const IDS_PER_DATAGRAM: usize = 256;

/// This process's end of the wake-up folder.
pub(crate) struct Notifier {
    me: PathBuf,
    /// The file name of `me` in the folder.
    name: String,
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
        let name = format!("{}", me.file_name().unwrap_or_default().to_string_lossy());
        Some(Notifier {
            me,
            name,
            dir,
            sender,
            peers: Mutex::new((None, Vec::new())),
            receiver,
        })
    }

    /// This backend's socket: its name in the wake-up folder.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Tells the processes waiting on `ids` that their lease was granted or revoked: an id
    /// with a socket in `sockets` (`(lease id, socket name)`, as the waiter's row recorded
    /// it) goes to that socket alone, and to nobody if it is this backend's own (the step
    /// woke it in-process); the others, and any whose socket refuses it, go to every
    /// backend ([`Notifier::broadcast`]). Never blocks; failures are left to polling.
    pub(crate) fn wake(&self, ids: &[LeaseId], sockets: &[(String, String)]) {
        let mut rest = Vec::new();
        for &id in ids {
            let text = id.to_string();
            let socket = sockets
                .iter()
                .find(|(lease, _)| *lease == text)
                .map(|(_, socket)| socket.as_str());
            match socket {
                Some(s) if s == self.name => {}
                Some(s) if is_socket_name(s) => {
                    let sent = self
                        .sender
                        .send_to(&id.as_u128().to_be_bytes(), self.dir.join(s));
                    if sent.is_err() {
                        rest.push(id);
                    }
                }
                _ => rest.push(id),
            }
        }
        self.broadcast(&rest);
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

/// Whether `s`, read from the shared file, can only name a socket inside the wake-up folder.
fn is_socket_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SOCKET_PATH && !s.contains('/') && s != "." && s != ".."
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

    /// A socket of the folder standing for another process, read without blocking.
    fn peer(dir: &Path, name: &str) -> StdDatagram {
        let sock = StdDatagram::bind(dir.join(name)).unwrap();
        sock.set_nonblocking(true).unwrap();
        sock
    }

    fn received(sock: &StdDatagram) -> Vec<LeaseId> {
        let mut buf = [0u8; 4096];
        let mut ids = Vec::new();
        while let Ok(n) = sock.recv(&mut buf) {
            for id in buf[..n].chunks_exact(16) {
                ids.push(LeaseId::from_u128(u128::from_be_bytes(
                    id.try_into().unwrap(),
                )));
            }
        }
        ids
    }

    #[tokio::test]
    async fn a_grant_goes_only_to_the_socket_its_waiter_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let sender = Notifier::start(&db).expect("sender socket");
        let wake_dir = db.with_extension("db.wake");
        let (waiter, other) = (peer(&wake_dir, "1-0000000a"), peer(&wake_dir, "2-0000000b"));
        let lease = LeaseId::random();
        sender.wake(&[lease], &[(lease.to_string(), "1-0000000a".into())]);
        assert_eq!(received(&waiter), vec![lease]);
        assert!(received(&other).is_empty(), "another process was woken");
    }

    #[tokio::test]
    async fn an_id_without_a_usable_socket_goes_to_every_process() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("t.db");
        let sender = Notifier::start(&db).expect("sender socket");
        let wake_dir = db.with_extension("db.wake");
        let (a, b) = (peer(&wake_dir, "1-0000000a"), peer(&wake_dir, "2-0000000b"));
        // No socket recorded (a revocation, an older build's waiter), a name that would
        // leave the folder, and a socket nobody listens on any more.
        let (none, escaping, gone) = (LeaseId::random(), LeaseId::random(), LeaseId::random());
        let sockets = [
            (escaping.to_string(), "../1-0000000a".to_string()),
            (gone.to_string(), "3-0000000c".to_string()),
        ];
        sender.wake(&[none, escaping, gone], &sockets);
        for sock in [&a, &b] {
            let mut ids = received(sock);
            ids.sort();
            let mut want = vec![none, escaping, gone];
            want.sort();
            assert_eq!(ids, want);
        }
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
