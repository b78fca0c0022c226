//! The line `tessera run` keeps updated on a terminal while it waits: what for, its place in
//! the queue, an expected wait once the queue has moved, how long it has waited and when it
//! gives up. Nothing is drawn when stderr is not a terminal or with `--quiet`, and nothing
//! for a wait shorter than [`FIRST_DRAW`], so scripts, logs and quick grants see no change.
//!
//! The expected wait is the library's estimator ([`tessera::QueuePace`], the one a watched
//! acquire and `tessera serve` use): the hand-offs left times the pace at which this
//! waiter's place went down over the last [`tessera::PACE_WINDOW`] (its own samples, one a
//! redraw), so it says nothing until the place has moved once, and it follows a pace that
//! changes within about half a minute.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tessera::{QueuePace, Store};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How long a wait lasts before the line first shows.
const FIRST_DRAW: Duration = Duration::from_secs(1);
/// How often the line is redrawn, and the queue read again (one status call each time).
const REDRAW: Duration = Duration::from_secs(1);

/// What a wait is for.
pub struct Wait<'a> {
    pub store: &'a Store,
    pub name: &'a str,
    /// "a permit" or "a turn within the rate limits".
    pub what: &'static str,
    /// The holder label to look for in the semaphore's queue; `None`: no queue to show.
    pub holder: Option<String>,
    pub deadline: Option<Instant>,
}

/// The line while it is drawn; dropping it stops the redraws and clears the line.
pub struct WaitLine {
    drawing: Option<(ProgressBar, JoinHandle<()>)>,
}

impl WaitLine {
    /// Starts the line for `wait`, unless `quiet` or stderr is not a terminal.
    pub fn start(wait: Wait<'_>, quiet: bool) -> WaitLine {
        if quiet || !std::io::stderr().is_terminal() {
            return WaitLine { drawing: None };
        }
        let (store, name) = (wait.store.clone(), wait.name.to_string());
        let (what, holder, deadline) = (wait.what, wait.holder, wait.deadline);
        // Hidden until the wait has lasted FIRST_DRAW.
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {wide_msg}").expect("a valid template"),
        );
        let drawn = bar.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            tokio::time::sleep(FIRST_DRAW).await;
            drawn.set_draw_target(ProgressDrawTarget::stderr());
            drawn.enable_steady_tick(Duration::from_millis(120));
            let mut pace = QueuePace::new();
            loop {
                let place = match &holder {
                    Some(h) => queue_place(&store, &name, h).await,
                    None => None,
                };
                if let Some((at, _)) = place {
                    pace.record(Instant::now(), at as u64 - 1);
                }
                let expected = place.and(pace.expected_wait(None));
                let waited = started.elapsed();
                drawn.set_message(line(what, &name, place, expected, waited, deadline));
                tokio::time::sleep(REDRAW).await;
            }
        });
        WaitLine {
            drawing: Some((bar, task)),
        }
    }
}

impl Drop for WaitLine {
    fn drop(&mut self) {
        if let Some((bar, task)) = self.drawing.take() {
            task.abort();
            bar.finish_and_clear();
        }
    }
}

/// This process's place in the semaphore's queue (1-based) and the queue's length, found by
/// its holder label; `None` if the store does not say (not queued yet, or a status error).
async fn queue_place(store: &Store, name: &str, holder: &str) -> Option<(usize, usize)> {
    let status = store.status(name).await.ok()??;
    let at = status.queue.iter().position(|w| w.holder == holder)?;
    Some((at + 1, status.queue.len()))
}

/// The text of the line.
fn line(
    what: &str,
    name: &str,
    place: Option<(usize, usize)>,
    expected: Option<Duration>,
    waited: Duration,
    deadline: Option<Instant>,
) -> String {
    let secs = |d: Duration| humantime::format_duration(Duration::from_secs(d.as_secs()));
    let mut out = format!("waiting for {what} on {name}");
    if let Some((at, of)) = place {
        out.push_str(&format!(": {at} of {of} in the queue"));
        if let Some(e) = expected {
            out.push_str(&format!(
                " (about {} to go)",
                secs(e.max(Duration::from_secs(1)))
            ));
        }
    }
    out.push_str(&format!(", waited {}", secs(waited)));
    match deadline {
        Some(d) => out.push_str(&format!(
            ", gives up in {} (--wait)",
            secs(d.saturating_duration_since(Instant::now()))
        )),
        None => out.push_str(", no deadline"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_line_names_the_wait_the_place_and_the_deadline() {
        let deadline = Some(Instant::now() + Duration::from_millis(9_500));
        let text = line(
            "a permit",
            "exports",
            Some((3, 5)),
            None,
            Duration::from_millis(2_400),
            deadline,
        );
        assert!(
            text.starts_with(
                "waiting for a permit on exports: 3 of 5 in the queue, waited 2s, gives up in "
            ),
            "{text}"
        );
        assert!(text.ends_with("(--wait)"), "{text}");
        let text = line(
            "a turn within the rate limits",
            "sms",
            None,
            None,
            Duration::ZERO,
            None,
        );
        assert_eq!(
            text,
            "waiting for a turn within the rate limits on sms, waited 0s, no deadline"
        );
    }

    #[test]
    fn the_line_shows_the_expected_wait_when_known() {
        let text = line(
            "a permit",
            "exports",
            Some((4, 9)),
            Some(Duration::from_millis(2_500)),
            Duration::from_secs(3),
            None,
        );
        assert_eq!(
            text,
            "waiting for a permit on exports: 4 of 9 in the queue (about 2s to go), waited 3s, \
             no deadline"
        );
    }

    #[tokio::test]
    async fn a_waiter_finds_its_place_by_its_holder_label() {
        let store = Store::connect("memory://progress-place").await.unwrap();
        let sem = store.semaphore("one", 1).unwrap();
        let held = sem.acquire().await.unwrap();
        let opts = |h: &str| tessera::SemaphoreOptions::default().holder(h);
        let a = tessera::Semaphore::new(&store, "one", 1, opts("a")).unwrap();
        let b = tessera::Semaphore::new(&store, "one", 1, opts("b")).unwrap();
        let wait_a = tokio::spawn(async move { a.acquire().await });
        while store.status("one").await.unwrap().unwrap().queue.is_empty() {
            tokio::task::yield_now().await;
        }
        let wait_b = tokio::spawn(async move { b.acquire().await });
        while store.status("one").await.unwrap().unwrap().queue.len() < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(queue_place(&store, "one", "b").await, Some((2, 2)));
        assert_eq!(queue_place(&store, "one", "a").await, Some((1, 2)));
        assert_eq!(queue_place(&store, "one", "nobody").await, None);
        assert_eq!(queue_place(&store, "never-made", "a").await, None);
        drop(held);
        drop(wait_a.await.unwrap().unwrap());
        drop(wait_b.await.unwrap().unwrap());
    }
}
