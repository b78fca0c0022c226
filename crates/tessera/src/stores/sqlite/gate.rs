//! The write gate: an exclusive `flock` on `<file>.lock`, taken around every step's write
//! transaction (semaphore and rate steps), so that a process waiting for SQLite's write lock
//! sleeps in the kernel and wakes the moment the holder commits.
//!
//! SQLite itself offers no waiting on its lock: a connection that finds it taken calls the
//! busy handler, which can only sleep and try again. Short sleeps burn the two cores that 8
//! contending processes share; growing ones (ours: 50 µs doubling to 1 ms) leave the lock
//! idle while the next process still sleeps, and those idle stretches land on the permit
//! holders' releases too: measured with 8 processes on 2 permits, the wait p99 was 11.5–13.9
//! ms with the growing sleeps and 8.3–8.5 ms with constant 50 µs ones, at 10–15% fewer grants
//! per second.
//!
//! The gate only orders the processes that use it; SQLite's own lock stays the one that
//! keeps the data consistent. A connection without the gate (an older build, the `sqlite3`
//! shell, the schema check at connect) still meets the gated ones in the busy handler, as
//! before. The gate is released right after COMMIT (or with the rollback of a failed step),
//! and by the kernel when its process dies. A file that cannot be opened or locked (a
//! read-only folder, a file system without `flock`) leaves the backend without a gate, as
//! before it existed.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The gate of one backend: its own open file description, so two backends of one process
/// exclude each other too (`flock` locks belong to the open file, not to the process).
#[derive(Clone)]
pub(crate) struct Gate {
    file: Arc<File>,
    /// Held by the thread waiting in [`Gate::take`]. A blocked `flock` cannot be called off:
    /// a step that gave up waiting leaves its thread blocked until the gate comes free, and
    /// while it is, the next steps go without the gate (into the busy handler, which gives up
    /// by itself) instead of blocking one more thread each.
    waiting: Arc<std::sync::Mutex<()>>,
}

/// The gate, held; released when dropped.
pub(crate) struct GateHeld {
    file: Arc<File>,
}

impl Gate {
    /// The gate file beside `db` (`<db>.lock`; [`Gate::open`] creates it if missing).
    pub(crate) fn path(db: &Path) -> PathBuf {
        let mut p = db.as_os_str().to_owned();
        p.push(".lock");
        PathBuf::from(p)
    }

    /// Opens the gate of `db`; `None` (logged) if its file cannot be opened. A file another
    /// user created, which this one may only read, still serves: `flock` needs no write
    /// access.
    pub(crate) fn open(db: &Path) -> Option<Gate> {
        let path = Gate::path(db);
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .or_else(|_| File::open(&path));
        match opened {
            Ok(file) => Some(Gate {
                file: Arc::new(file),
                waiting: Arc::default(),
            }),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "no SQLite write gate; waits for the write lock poll");
                None
            }
        }
    }

    /// Takes the gate if it is free, without waiting.
    pub(crate) fn try_take(&self) -> Option<GateHeld> {
        self.lock(libc::LOCK_EX | libc::LOCK_NB)
    }

    /// Waits for the gate (on a blocking thread only). `None` at once if an earlier wait on
    /// this gate is still blocked (see [`Gate::waiting`]), or if `flock` fails for a reason
    /// other than an interruption: the caller then goes on without it.
    pub(crate) fn take(&self) -> Option<GateHeld> {
        let _waiting = self.waiting.try_lock().ok()?;
        self.lock(libc::LOCK_EX)
    }

    fn lock(&self, op: libc::c_int) -> Option<GateHeld> {
        loop {
            // SAFETY: a plain system call on a file descriptor this value keeps open.
            let r = unsafe { libc::flock(self.file.as_raw_fd(), op) };
            if r == 0 {
                return Some(GateHeld {
                    file: Arc::clone(&self.file),
                });
            }
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                return None;
            }
        }
    }
}

impl Drop for GateHeld {
    fn drop(&mut self) {
        // SAFETY: as in `Gate::lock`.
        unsafe {
            libc::flock(self.file.as_raw_fd(), libc::LOCK_UN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_gates_on_one_file_exclude_each_other_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("g.db");
        let (a, b) = (Gate::open(&db).unwrap(), Gate::open(&db).unwrap());
        assert!(Gate::path(&db).exists());
        let held = a.try_take().expect("a free gate");
        assert!(b.try_take().is_none(), "taken twice");
        let waiter = std::thread::spawn(move || b.take().is_some());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "the waiter did not wait");
        drop(held);
        assert!(
            waiter.join().unwrap(),
            "the waiter never got the released gate"
        );
        assert!(a.try_take().is_some(), "the waiter's gate was not released");
    }

    #[test]
    fn a_second_wait_while_one_is_blocked_goes_on_without_the_gate() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("g.db");
        let (a, b) = (Gate::open(&db).unwrap(), Gate::open(&db).unwrap());
        let held = a.try_take().unwrap();
        // What a thread blocked in `take` holds while it waits.
        let blocked = b.waiting.lock().unwrap();
        // (On a thread, so that a second wait that does block fails the test, not hangs it.)
        let second = b.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || tx.send(second.take().is_none()).unwrap());
        let answer = rx.recv_timeout(std::time::Duration::from_secs(5));
        drop(blocked);
        drop(held);
        waiter.join().unwrap();
        assert_eq!(answer, Ok(true), "a second wait blocked too");
        assert!(
            b.take().is_some(),
            "the gate stayed unusable after the blocked wait"
        );
    }
}
