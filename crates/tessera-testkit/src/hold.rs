//! A holder in another process: `tessera-hold` acquires and holds until killed. Used by the
//! crash tests.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Path of the `tessera-hold` binary built next to the running test.
pub fn holder_binary() -> std::path::PathBuf {
    testkit_binary("tessera-hold")
}

/// Path of one of the test kit's binaries (`src/bin/`), built next to the running test.
pub fn testkit_binary(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let dir = exe.parent().expect("exe dir");
    // Test binaries live in target/<profile>/deps; binaries in target/<profile>.
    for d in [dir, dir.parent().unwrap_or(dir)] {
        let p = d.join(name);
        if p.exists() {
            return p;
        }
    }
    panic!(
        "{name} not built next to {}; run the tests through cargo",
        exe.display()
    );
}

/// Starts `tessera-hold` and waits until it holds `weight` permits of `name`.
pub async fn spawn_holder(url: &str, name: &str, capacity: u32, ttl: Duration) -> Child {
    let mut child = Command::new(holder_binary())
        .args(["--store", url, "--name", name])
        .args(["--permits", &capacity.to_string()])
        .args(["--ttl-ms", &ttl.as_millis().to_string()])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn tessera-hold");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("tessera-hold did not report in time")
        .expect("read tessera-hold")
        .expect("tessera-hold exited");
    assert!(line.starts_with("HELD "), "tessera-hold said {line:?}");
    child
}
