//! The fenced resource: a small loopback server standing for whatever a semaphore protects
//! (a file, a database row, a GPU slot). It remembers the highest fence accepted per seat and
//! rejects a write carrying a lower one, as a protected resource should (docs/contract.md).
//!
//! Protocol, one line each way: `W <seat> <fence>\n` → `OK\n` or `STALE <highest>\n`.
//!
//! Every decision is kept in a journal on the [`crate::grantlog::monotonic_ns`] clock, so
//! [`FencedResource::audit`] can check afterwards, independently of the code that decided,
//! that no write was accepted with a fence below one accepted before on its seat (a *stale
//! accept*).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::grantlog::monotonic_ns;

/// One write the resource decided on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// When, on [`monotonic_ns`].
    pub t_ns: u64,
    /// The seat written.
    pub seat: u32,
    /// The fence it carried.
    pub fence: u64,
    /// Whether it was accepted.
    pub accepted: bool,
}

/// What [`FencedResource::audit`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Audit {
    /// Writes accepted.
    pub accepted: u64,
    /// Writes rejected as stale (a holder that believed it held a seat that a newer holder
    /// had already written).
    pub stale_rejects: u64,
    /// Writes accepted although a higher fence had been accepted before on the seat.
    pub stale_accepts: u64,
    /// One line per stale accept.
    pub witnesses: Vec<String>,
}

#[derive(Debug, Default)]
struct State {
    highest: HashMap<u32, u64>,
    journal: Vec<Decision>,
}

/// A running fenced resource on `127.0.0.1:<free port>`; stops when dropped.
#[derive(Debug)]
pub struct FencedResource {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<State>>,
    task: tokio::task::JoinHandle<()>,
}

impl FencedResource {
    /// Starts the server on a free loopback port (inside a tokio runtime).
    pub async fn start() -> anyhow::Result<FencedResource> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let shared = Arc::clone(&state);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    let (r, mut w) = stream.into_split();
                    let mut lines = BufReader::new(r).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        let answer = decide(&state, &line);
                        if w.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(FencedResource { addr, state, task })
    }

    /// `127.0.0.1:PORT`.
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Every decision so far, in order.
    pub fn journal(&self) -> Vec<Decision> {
        self.state.lock().unwrap().journal.clone()
    }

    /// Forgets everything (between scenarios).
    pub fn reset(&self) {
        *self.state.lock().unwrap() = State::default();
    }

    /// Checks the journal: per seat, every accepted fence is at least the highest accepted
    /// before it.
    pub fn audit(&self) -> Audit {
        audit(&self.journal())
    }
}

impl Drop for FencedResource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn decide(state: &Mutex<State>, line: &str) -> String {
    let mut words = line.split_whitespace();
    let (Some("W"), Some(seat), Some(fence)) = (words.next(), words.next(), words.next()) else {
        return "ERR expected W <seat> <fence>\n".into();
    };
    let (Ok(seat), Ok(fence)) = (seat.parse::<u32>(), fence.parse::<u64>()) else {
        return "ERR bad number\n".into();
    };
    let mut s = state.lock().unwrap();
    let highest = s.highest.get(&seat).copied().unwrap_or(0);
    let accepted = fence >= highest;
    if accepted {
        s.highest.insert(seat, fence);
    }
    s.journal.push(Decision {
        t_ns: monotonic_ns(),
        seat,
        fence,
        accepted,
    });
    if accepted {
        "OK\n".into()
    } else {
        format!("STALE {highest}\n")
    }
}

/// The audit of a journal, on its own so tests can feed it a broken one.
pub fn audit(journal: &[Decision]) -> Audit {
    let mut a = Audit::default();
    let mut highest: HashMap<u32, (u64, u64)> = HashMap::new();
    for d in journal {
        if !d.accepted {
            a.stale_rejects += 1;
            continue;
        }
        a.accepted += 1;
        match highest.get(&d.seat) {
            Some(&(h, t)) if d.fence < h => {
                a.stale_accepts += 1;
                a.witnesses.push(format!(
                    "stale accept on seat {}: fence {} accepted at {} ns after fence {h} at {t} ns",
                    d.seat, d.fence, d.t_ns
                ));
            }
            _ => {
                highest.insert(d.seat, (d.fence, d.t_ns));
            }
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stale_fences_are_rejected_and_the_audit_counts_them() {
        let r = FencedResource::start().await.unwrap();
        let s = tokio::net::TcpStream::connect(r.addr()).await.unwrap();
        let (rd, mut w) = s.into_split();
        let mut lines = BufReader::new(rd).lines();
        for l in ["W 0 5\n", "W 0 7\n", "W 0 6\n", "W 1 1\n", "W 0 7\n"] {
            w.write_all(l.as_bytes()).await.unwrap();
        }
        let mut answers = vec![];
        for _ in 0..5 {
            answers.push(lines.next_line().await.unwrap().unwrap());
        }
        assert_eq!(answers, ["OK", "OK", "STALE 7", "OK", "OK"]);
        let a = r.audit();
        assert_eq!((a.accepted, a.stale_rejects, a.stale_accepts), (4, 1, 0));
    }

    #[test]
    fn the_audit_catches_a_resource_that_accepted_a_stale_fence() {
        let d = |t, fence| Decision {
            t_ns: t,
            seat: 3,
            fence,
            accepted: true,
        };
        let a = audit(&[d(1, 9), d(2, 4)]);
        assert_eq!(a.stale_accepts, 1, "{a:?}");
        assert!(a.witnesses[0].contains("fence 4"));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever arrives, the resource answers, accepts exactly the writes whose fence is
        /// at least the highest accepted on the seat, and its audit finds no stale accept.
        #[test]
        fn the_resource_accepts_exactly_the_non_stale_writes(
            lines in proptest::collection::vec(
                prop_oneof![
                    (0u32..4, 0u64..20).prop_map(|(s, f)| format!("W {s} {f}")),
                    ".{0,20}",
                ],
                0..60,
            )
        ) {
            let state = Mutex::new(State::default());
            let mut highest: HashMap<u32, u64> = HashMap::new();
            for line in &lines {
                let answer = decide(&state, line);
                let mut w = line.split_whitespace();
                let parsed = match (w.next(), w.next(), w.next()) {
                    (Some("W"), Some(s), Some(f)) => s.parse::<u32>().ok().zip(f.parse::<u64>().ok()),
                    _ => None,
                };
                match parsed {
                    Some((seat, fence)) => {
                        let h = highest.get(&seat).copied().unwrap_or(0);
                        prop_assert_eq!(answer == "OK\n", fence >= h, "{} -> {}", line, answer);
                        if fence >= h {
                            highest.insert(seat, fence);
                        }
                    }
                    None => prop_assert!(answer.starts_with("ERR"), "{} -> {}", line, answer),
                }
            }
            let journal = state.lock().unwrap().journal.clone();
            prop_assert_eq!(audit(&journal).stale_accepts, 0);
        }
    }
}
