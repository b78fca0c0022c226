//! The programs in `examples/`, run as a user would: several processes at once on one SQLite
//! file, their promises checked on what they print at the moment they act.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// An example binary built next to this test (`cargo test` and `cargo nextest` build them).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/<profile>/deps/<this test> → target/<profile>/examples/<name>
    let p = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples")
        .join(name);
    assert!(
        p.exists(),
        "{} is not built: cargo test and cargo nextest build the examples unless a --test filter narrows them",
        p.display()
    );
    p
}

fn spawn(name: &str, args: &[&str]) -> Child {
    Command::new(example(name))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn finish(child: Child) -> Vec<String> {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn four_sms_senders_never_make_more_than_50_calls_in_any_second() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/sms.db", dir.path().display());
    let senders: Vec<Child> = (0..4)
        .map(|_| spawn("sms_rate_limit", &[url.as_str(), "30"]))
        .collect();
    // (made, admitted) of every call, µs: the SQLite store's time is this host's clock.
    let calls: Vec<(u64, u64)> = senders
        .into_iter()
        .flat_map(finish)
        .map(|line| {
            let w: Vec<&str> = line.split(' ').collect();
            assert_eq!((w[0], w[2], w[4]), ("sent", "at", "admitted"), "{line:?}");
            (w[3].parse().unwrap(), w[5].parse().unwrap())
        })
        .collect();
    assert_eq!(calls.len(), 120);
    // The promise covers calls made within the margin after their admission (a process that
    // does not run in time is beyond any margin); most must be, or nothing was checked.
    let margin = tessera::DEFAULT_RATE_MARGIN.as_micros() as u64;
    let mut on_time: Vec<u64> = calls
        .iter()
        .filter(|(made, admitted)| made.saturating_sub(*admitted) <= margin)
        .map(|&(made, _)| made)
        .collect();
    assert!(
        on_time.len() * 2 >= calls.len(),
        "the machine was too loaded to check anything"
    );
    on_time.sort_unstable();
    // Every window of one second that starts at a call holds at most 50 calls.
    for (i, &start) in on_time.iter().enumerate() {
        let within = on_time[i..]
            .iter()
            .take_while(|&&t| t < start + 1_000_000)
            .count();
        assert!(within <= 50, "{within} calls within 1 s from {start}");
    }
}

#[test]
fn six_jobs_on_eight_gpus_never_share_a_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/gpus.db", dir.path().display());
    let weights = ["1", "2", "1", "2", "1", "2"];
    let jobs: Vec<Child> = weights
        .iter()
        .map(|w| spawn("gpu_slots", &[url.as_str(), w, "300ms"]))
        .collect();
    // (start, end, seats) of every job, from what it printed.
    let runs: Vec<(u64, u64, Vec<u32>)> = jobs
        .into_iter()
        .zip(weights)
        .map(|(job, w)| {
            let lines = finish(job);
            let start: Vec<&str> = lines[0].split(' ').collect();
            assert_eq!(start[0], "start", "{lines:?}");
            let seats: Vec<u32> = start[3].split(',').map(|s| s.parse().unwrap()).collect();
            assert_eq!(seats.len(), w.parse::<usize>().unwrap(), "{lines:?}");
            assert!(seats.iter().all(|&s| s < 8), "{lines:?}");
            let end: Vec<&str> = lines[1].split(' ').collect();
            assert_eq!(end[0], "end", "{lines:?}");
            (start[1].parse().unwrap(), end[1].parse().unwrap(), seats)
        })
        .collect();
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            let overlap = a.0 < b.1 && b.0 < a.1;
            if overlap {
                assert!(
                    a.2.iter().all(|s| !b.2.contains(s)),
                    "two jobs on one GPU at once: {a:?} {b:?}"
                );
            }
        }
    }
}
