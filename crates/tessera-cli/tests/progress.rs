//! The waiting line of `tessera run`: drawn on a terminal (a pseudo-terminal from `script`,
//! util-linux), with the place in the queue; never with `--quiet`, never into a pipe.

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::tessera;

/// A holder of the one permit of `name` that keeps it until the file `go` appears.
fn hold_until_go(dir: &Path, url: &str, name: &str) -> Child {
    let (held, go) = (dir.join("held"), dir.join("go"));
    let script = format!(
        "touch '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
        held.display(),
        go.display()
    );
    let child = tessera(dir)
        .args([
            "--store",
            url,
            "run",
            "--name",
            name,
            "--permits",
            "1",
            "--",
            "sh",
            "-c",
        ])
        .arg(script)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !held.exists() {
        assert!(Instant::now() < deadline, "the holder never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `tessera run` for the permit of `name` on a pseudo-terminal; its transcript grows in the
/// returned buffer.
fn waiter_on_a_terminal(
    dir: &Path,
    url: &str,
    name: &str,
    extra: &str,
) -> (Child, Arc<Mutex<String>>) {
    let cmd = format!(
        "'{}' --store '{url}' run --name {name} --permits 1 --wait 60s {extra} -- true",
        env!("CARGO_BIN_EXE_tessera")
    );
    let mut child = Command::new("script")
        .args(["-qfec", &cmd, "/dev/null"])
        .env_remove("TESSERA_STORE")
        .env_remove("TESSERA_LOG")
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("`script` (util-linux) must be installed");
    let seen = Arc::new(Mutex::new(String::new()));
    let mut out = child.stdout.take().unwrap();
    let sink = Arc::clone(&seen);
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    (child, seen)
}

fn queue_len(dir: &Path, url: &str, name: &str) -> usize {
    let out = tessera(dir)
        .args(["--store", url, "status", name, "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["queue"].as_array().map_or(0, Vec::len)
}

fn wait_for_queue(dir: &Path, url: &str, name: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while queue_len(dir, url, name) < len {
        assert!(Instant::now() < deadline, "the waiters never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_wait_on_a_terminal_shows_the_place_in_the_queue_and_clears_it_when_granted() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut holder = hold_until_go(dir.path(), &url, "line");
    let (mut waiter, seen) = waiter_on_a_terminal(dir.path(), &url, "line", "");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.lock().unwrap().contains("in the queue") {
        assert!(
            Instant::now() < deadline,
            "no waiting line within 30 s: {:?}",
            seen.lock().unwrap()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    assert!(
        waiter.wait().unwrap().success(),
        "{:?}",
        seen.lock().unwrap()
    );
    let text = seen.lock().unwrap().clone();
    assert!(
        text.contains("waiting for a permit on line: 1 of 1 in the queue, waited "),
        "{text:?}"
    );
    assert!(text.contains("gives up in "), "{text:?}");
    // Cleared once granted: the line's last drawing is followed by an erase of the line.
    let last = text.rfind("in the queue").unwrap();
    assert!(
        text[last..].contains("\x1b[2K") || text[last..].contains("\r\x1b[K"),
        "{text:?}"
    );
}

#[test]
fn no_line_with_quiet_or_into_a_pipe() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let mut holder = hold_until_go(dir.path(), &url, "calm");
    let (mut quiet, seen) = waiter_on_a_terminal(dir.path(), &url, "calm", "--quiet");
    let piped = tessera(dir.path())
        .args([
            "--store",
            &url,
            "run",
            "--name",
            "calm",
            "--permits",
            "1",
            "--wait",
            "60s",
            "--",
            "true",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_queue(dir.path(), &url, "calm", 2);
    // Well past the moment a line would first be drawn (1 s into the wait).
    std::thread::sleep(Duration::from_millis(2_500));
    std::fs::write(dir.path().join("go"), "").unwrap();
    assert!(holder.wait().unwrap().success());
    assert!(quiet.wait().unwrap().success());
    let piped = piped.wait_with_output().unwrap();
    assert!(piped.status.success());
    let text = seen.lock().unwrap().clone();
    assert!(!text.contains("waiting for"), "--quiet drew: {text:?}");
    let err = String::from_utf8_lossy(&piped.stderr);
    assert!(!err.contains("waiting for"), "a pipe got: {err:?}");
}
