//! End-to-end tests of the `tessera` binary.
//!
//! Tests of one process use `--store memory://`. Tests across processes need a store shared
//! between processes: they use SQLite in a temporary directory, one database per test.

use std::path::Path;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{tessera, tessera_on, tessera_run};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn sqlite(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("t.db").display())
}

fn stderr_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

/// Asserts that tessera failed with `code` and said why in exactly one line.
#[track_caller]
fn assert_fails_with_one_line(out: &Output, code: i32) -> String {
    let lines = stderr_lines(out);
    assert_eq!(out.status.code(), Some(code), "stderr: {lines:?}");
    assert_eq!(lines.len(), 1, "expected one line on stderr, got {lines:?}");
    assert!(lines[0].starts_with("tessera: "), "{lines:?}");
    lines[0].clone()
}

fn wait_for_file(path: &Path, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on a process this test spawned.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

fn alive(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only checks for existence.
    unsafe { libc::kill(pid, 0) == 0 }
}

// ---------------------------------------------------------------------------------------------
// One process (memory://)
// ---------------------------------------------------------------------------------------------

#[test]
fn every_command_has_help_with_an_example() {
    let home = tmp();
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["status", "--help"],
        &["revoke", "--help"],
        &["resize", "--help"],
        &["delete", "--help"],
        &["completions", "--help"],
        &["man", "--help"],
    ] {
        let out = tessera(home.path()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = String::from_utf8(out.stdout).unwrap();
        assert!(help.contains("Example"), "{args:?}: {help}");
        assert!(help.contains("tessera "), "{args:?}: {help}");
    }
    for args in [&["--help"][..], &["run", "--help"]] {
        let out = tessera(home.path()).args(args).output().unwrap();
        let help = String::from_utf8(out.stdout).unwrap();
        for code in ["64", "69", "74", "75", "127", "128+N"] {
            assert!(
                help.contains(code),
                "{args:?} does not document exit code {code}"
            );
        }
    }
}

/// Logs written to a file or a pipe are plain text: no terminal colour codes.
#[test]
fn logs_to_a_pipe_carry_no_colour_codes() {
    let home = tmp();
    let out = tessera(home.path())
        .env("TESSERA_LOG", "debug")
        .args([
            "--store",
            &sqlite(home.path()),
            "run",
            "--name",
            "plain",
            "--permits",
            "1",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let lines = stderr_lines(&out);
    assert!(lines.iter().any(|l| l.contains("DEBUG")), "{lines:?}");
    assert!(
        !out.stderr.contains(&0x1b),
        "escape codes in piped logs: {:?}",
        lines.iter().find(|l| l.contains('\x1b'))
    );
}

#[test]
fn run_passes_the_exit_code_through() {
    let home = tmp();
    for (script, code) in [("exit 0", 0), ("exit 7", 7), ("exit 255", 255)] {
        let out = tessera_run(
            home.path(),
            "memory://",
            "demo",
            &["--permits", "1", "--", "sh", "-c", script],
        );
        assert_eq!(out.status.code(), Some(code), "{script}");
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `--tenant` and `--share` (docs/fair-shares.md): taken on the memory store, checked before
/// anything runs, and refused in one line by a store that cannot order by shares, with the
/// command not run.
#[test]
fn a_tenant_is_taken_where_the_store_orders_by_shares_and_refused_elsewhere() {
    let home = tmp();
    let marker = home.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let out = tessera_run(
        home.path(),
        "memory://",
        "tenants",
        &[
            "--permits",
            "1",
            "--tenant",
            "billing",
            "--share",
            "3",
            "--",
            "sh",
            "-c",
            &touch,
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(marker.exists());
    std::fs::remove_file(&marker).unwrap();
    // etcd orders its queue by create revision, not by tags.
    let etcd = tessera_testkit::servers::etcd::EtcdCluster::start(1);
    for (store, args, says) in [
        (
            "memory://".to_string(),
            ["--tenant", "billing", "--share", "0"],
            "share",
        ),
        (
            etcd.url(),
            ["--tenant", "billing", "--share", "1"],
            "fair shares",
        ),
    ] {
        let out = tessera_run(
            home.path(),
            &store,
            "tenants",
            &[&["--permits", "1"][..], &args, &["--", "sh", "-c", &touch]].concat(),
        );
        let line = assert_fails_with_one_line(&out, 64);
        assert!(line.contains(says), "{line}");
        assert!(!marker.exists(), "{store}: the command ran");
    }
}

#[test]
fn a_command_killed_by_a_signal_exits_128_plus_the_signal() {
    let home = tmp();
    let out = tessera_run(
        home.path(),
        "memory://",
        "demo",
        &["--permits", "1", "--", "sh", "-c", "kill -KILL $$"],
    );
    assert_eq!(out.status.code(), Some(128 + libc::SIGKILL));
}

#[test]
fn run_exports_the_lease_to_the_command() {
    let home = tmp();
    let out = tessera_run(
        home.path(),
        "memory://",
        "gpus",
        &[
            "--permits",
            "3",
            "--weight",
            "2",
            "--",
            "sh",
            "-c",
            "echo \"$TESSERA_LEASE_ID|$TESSERA_FENCE|$TESSERA_SEATS|$TESSERA_NAME\"",
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8(out.stdout).unwrap();
    let fields: Vec<&str> = stdout.trim().split('|').collect();
    assert_eq!(fields.len(), 4, "{stdout}");
    assert_eq!(fields[0].len(), 32);
    assert!(fields[0].bytes().all(|b| b.is_ascii_hexdigit()), "{stdout}");
    assert!(fields[1].parse::<u64>().unwrap() > 0);
    assert_eq!(fields[2], "0,1");
    assert_eq!(fields[3], "gpus");
}

#[test]
fn a_missing_command_exits_127_and_an_unrunnable_one_126() {
    let home = tmp();
    let base = [
        "--store",
        "memory://",
        "run",
        "--name",
        "demo",
        "--permits",
        "1",
        "--",
    ];
    let out = tessera(home.path())
        .args(base)
        .arg(home.path().join("nope"))
        .output()
        .unwrap();
    assert_fails_with_one_line(&out, 127);
    let out = tessera(home.path())
        .args(base)
        .arg(home.path())
        .output()
        .unwrap();
    assert_fails_with_one_line(&out, 126);
}

#[test]
fn bad_input_exits_64_with_one_line_and_runs_nothing() {
    let home = tmp();
    let marker = home.path().join("ran");
    let touch = ["--", "touch", marker.to_str().unwrap()];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "0",
            ],
            "capacity",
        ),
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
                "--weight",
                "3",
            ],
            "weight",
        ),
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
                "--weight",
                "0",
            ],
            "weight",
        ),
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "a b",
                "--permits",
                "2",
            ],
            "name",
        ),
        (
            vec!["--store", "memory://", "run", "--name=-x", "--permits", "2"],
            "name",
        ),
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
                "--ttl",
                "10ms",
            ],
            "TTL",
        ),
        (
            vec![
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
                "--ttl",
                "30d",
            ],
            "TTL",
        ),
        (
            vec![
                "--store",
                "nonsense",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
            ],
            "store URL",
        ),
        (
            vec![
                "--store",
                "ftp://x",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
            ],
            "store URL",
        ),
        (
            vec![
                "--store",
                "nosuch://user:hunter2@127.0.0.1:6379",
                "run",
                "--name",
                "demo",
                "--permits",
                "2",
            ],
            "store URL",
        ),
    ];
    for (args, what) in cases {
        let out = tessera(home.path())
            .args(&args)
            .args(touch)
            .output()
            .unwrap();
        let line = assert_fails_with_one_line(&out, 64);
        assert!(line.contains(what), "{args:?}: {line}");
        assert!(!line.contains("hunter2"), "password printed: {line}");
        assert!(!marker.exists(), "{args:?} ran the command");
    }
    // Invalid input touches nothing, not even the default store's directory.
    let out = tessera(home.path())
        .args(["run", "--name", "demo", "--permits", "0"])
        .args(touch)
        .output()
        .unwrap();
    assert_fails_with_one_line(&out, 64);
    assert!(!home.path().join("state").exists());
}

#[test]
fn admin_commands_validate_before_touching_the_store() {
    let home = tmp();
    let cases: [&[&str]; 5] = [
        &["revoke", "demo", "not-a-lease"],
        &["revoke", "bad name", "0123456789abcdef0123456789abcdef"],
        &["resize", "demo", "0"],
        &["delete", "{demo}"],
        &["status", "bad name"],
    ];
    for args in cases {
        let out = tessera(home.path()).args(args).output().unwrap();
        assert_fails_with_one_line(&out, 64);
        assert!(
            !home.path().join("state").exists(),
            "{args:?} touched the default store"
        );
    }
}

#[test]
fn admin_commands_exit_1_when_there_is_nothing_to_change() {
    let home = tmp();
    let lease = "0123456789abcdef0123456789abcdef";
    for args in [
        &["revoke", "demo", lease][..],
        &["resize", "demo", "3"],
        &["delete", "demo"],
    ] {
        let out = tessera(home.path())
            .args(["--store", "memory://"])
            .args(args)
            .output()
            .unwrap();
        assert_fails_with_one_line(&out, 1);
    }
}

#[test]
fn status_of_an_empty_store() {
    let home = tmp();
    let out = tessera(home.path())
        .args(["--store", "memory://", "status", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all, serde_json::json!([]));
    let out = tessera(home.path())
        .args(["--store", "memory://", "status", "demo", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "null");
}

#[test]
fn the_store_comes_from_tessera_store_and_passwords_are_never_printed() {
    let home = tmp();
    let out = tessera(home.path())
        .env("TESSERA_STORE", "nosuch://user:hunter2@127.0.0.1:6379")
        .args(["status"])
        .output()
        .unwrap();
    let line = assert_fails_with_one_line(&out, 64);
    assert!(line.contains("nosuch://user:***@127.0.0.1:6379"), "{line}");
    // A store that refuses the connection (nothing listens on loopback port 1): a store
    // fault, and still no password.
    let out = tessera(home.path())
        .env("TESSERA_STORE", "redis://user:hunter2@127.0.0.1:1")
        .args(["status"])
        .output()
        .unwrap();
    let line = assert_fails_with_one_line(&out, 69);
    assert!(!line.contains("hunter2"), "password printed: {line}");
    let help = tessera(home.path())
        .env("TESSERA_STORE", "redis://user:hunter2@127.0.0.1:1")
        .arg("--help")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&help.stdout).contains("hunter2"));
}

/// A server store where nothing listens: one line in the same words on every store, what
/// failed, the URL with its password masked, the plain cause and whether the server runs
/// there (etcd printed a debug dump of its gRPC layers and no URL); exit 69.
#[test]
fn a_store_where_nothing_listens_says_so_with_the_url_on_every_server_store() {
    let home = tmp();
    let port = tessera_testkit::servers::free_port();
    // (The listener is closed again here: nothing listens on the port.)
    for (url, what) in [
        (format!("redis://u:Hunter2-pw@127.0.0.1:{port}"), "redis"),
        (
            format!("postgres://u:Hunter2-pw@127.0.0.1:{port}/db"),
            "PostgreSQL",
        ),
        (format!("mysql://u:Hunter2-pw@127.0.0.1:{port}/db"), "MySQL"),
        (format!("etcd://u:Hunter2-pw@127.0.0.1:{port}"), "etcd"),
    ] {
        let out = tessera_run(
            home.path(),
            &url,
            "x",
            &["--permits", "1", "--wait", "5s", "--", "echo", "ok"],
        );
        let line = assert_fails_with_one_line(&out, 69);
        assert!(out.stdout.is_empty(), "the command ran: {line}");
        let masked = url.replace("Hunter2-pw", "***");
        assert!(
            line.starts_with(&format!("tessera: store error (connection): {what}: ")),
            "{line}"
        );
        assert!(line.contains("Connection refused"), "{line}");
        assert!(
            line.ends_with(&format!(
                "(nothing accepts connections at {masked}: is the server running, on this \
                 host and port?)"
            )),
            "{line}"
        );
        assert!(!line.contains("Hunter2"), "password printed: {line}");
        assert!(
            !line.contains("source:") && !line.contains("tonic"),
            "a debug dump: {line}"
        );
    }
}

#[test]
fn the_default_store_lives_in_the_state_directory() {
    let home = tmp();
    let out = tessera(home.path()).arg("status").output().unwrap();
    let expected = home.path().join("state").join("tessera").join("tessera.db");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(all.contains(expected.to_str().unwrap()), "{all}");
    assert!(
        !home.path().join("state").exists(),
        "status created a store"
    );
    let out = tessera(home.path())
        .args(["run", "--name", "demo", "--permits", "1", "--", "true"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert!(expected.is_file(), "run did not create the default store");
}

/// `status`, `revoke`, `resize` and `delete` only act on existing state: on a store that does
/// not exist (the default one before any `run`, or a mistyped path) they say so and create
/// nothing. The list form exits 0 (nothing to list), the others 1 (nothing there).
#[test]
fn read_only_and_admin_commands_never_create_a_store() {
    let home = tmp();
    let typo = home.path().join("no-such-dir").join("typo.db");
    let typo_url = format!("sqlite://{}", typo.display());
    for store in [None, Some(typo_url.as_str())] {
        let cmd = |args: &[&str]| {
            let mut cmd = tessera(home.path());
            if let Some(url) = store {
                cmd.args(["--store", url]);
            }
            cmd.args(args).output().unwrap()
        };
        let out = cmd(&["status"]);
        assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("nothing yet: no store at sqlite://"),
            "{text}"
        );
        let out = cmd(&["status", "--json"]);
        assert_eq!(out.status.code(), Some(0));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
        let out = cmd(&["status", "demo"]);
        assert_eq!(out.status.code(), Some(1));
        assert!(String::from_utf8_lossy(&out.stdout).contains("nothing yet"));
        let out = cmd(&["status", "demo", "--json"]);
        assert_eq!(out.status.code(), Some(1));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "null");
        for (args, done) in [
            (
                &["revoke", "demo", "0123456789abcdef0123456789abcdef"][..],
                "nothing revoked",
            ),
            (&["resize", "demo", "3"], "nothing resized"),
            (&["delete", "demo"], "nothing deleted"),
        ] {
            let line = assert_fails_with_one_line(&cmd(args), 1);
            assert!(line.contains("no store at sqlite://"), "{line}");
            assert!(line.ends_with(done), "{line}");
        }
        assert!(!home.path().join("state").exists(), "{store:?}: created");
        assert!(!typo.parent().unwrap().exists(), "{store:?}: created");
    }
    // Once `run` has made the store, status shows it.
    let store = sqlite(home.path());
    let out = tessera_run(
        home.path(),
        &store,
        "demo",
        &["--permits", "1", "--", "true"],
    );
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    let out = tessera(home.path())
        .args(["--store", &store, "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("no semaphore is held or waited for in")
    );
}

/// `status NAME` of a limiter shows the store's count of admissions given back past their
/// use-by instant, after the process that gave them back has closed its store, in the table
/// and in `--json`.
#[test]
fn status_of_a_limiter_shows_the_admissions_that_expired_unused() {
    let home = tmp();
    let store = sqlite(home.path());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let s = tessera::Store::connect(&store).await.unwrap();
        // A margin of 1 µs: every ticket is late by the time it is given back.
        let late = s
            .admission("sms")
            .permits(1)
            .rate_options(tessera::RateOptions::default().margin(Duration::from_micros(1)))
            .rate("5/min".parse().unwrap())
            .unwrap();
        for _ in 0..2 {
            let t = late.try_acquire().await.unwrap().expect("admitted");
            tokio::time::sleep(Duration::from_millis(2)).await;
            assert!(!t.is_fresh());
            assert!(t.give_back().await.unwrap());
        }
        s.close().await.unwrap();
    });
    let out = tessera(home.path())
        .args(["--store", &store, "status", "sms"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("expired unused: 2 admissions given back past the use-by instant"),
        "{text}"
    );
    let out = tessera(home.path())
        .args(["--store", &store, "status", "sms", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"expired_unused\":2"), "{json}");
}

/// `sqlite://file.db` would be a different file in each working directory: refused (64)
/// with the absolute URL to write, and nothing created in the working directory.
#[test]
fn a_relative_sqlite_path_is_refused_with_the_absolute_url() {
    let home = tmp();
    let out = tessera(home.path())
        .current_dir(home.path())
        .args([
            "--store",
            "sqlite://t.db",
            "run",
            "--name",
            "demo",
            "--permits",
            "1",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let line = assert_fails_with_one_line(&out, 64);
    let absolute = format!("sqlite://{}", home.path().join("t.db").display());
    assert!(
        line.contains("relative") && line.ends_with(&absolute),
        "{line}"
    );
    assert_eq!(std::fs::read_dir(home.path()).unwrap().count(), 0);
}

/// The top-level help names rate limits and every store URL available.
#[test]
fn the_top_level_help_names_rate_limits_and_every_store() {
    let home = tmp();
    let out = tessera(home.path()).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    for needle in [
        "rate limits",
        "--rate 50/s",
        "memory://",
        "sqlite:///absolute/path.db",
        "redis://",
        "rediss://",
        "redis+sentinel://",
        "redis+cluster://",
        "postgres://",
        "mysql://",
        "etcd://",
    ] {
        assert!(
            help.contains(needle),
            "--help does not mention {needle}: {help}"
        );
    }
}

/// `--version` names the stores this build takes, so a user can tell whether `--store`
/// with their scheme will work before trying it.
#[test]
fn the_version_names_every_store_compiled_in() {
    let home = tmp();
    let out = tessera(home.path()).arg("--version").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let version = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        version.trim_end(),
        format!(
            "tessera {} (stores: memory, sqlite, redis, postgres, mysql, etcd)",
            env!("CARGO_PKG_VERSION")
        )
    );
    // Every store the line names is one this build opens: its scheme is not refused as
    // missing from the build (the address itself may be unreachable).
    for url in [
        "sqlite:///nonexistent-dir-for-tessera-version-test/t.db",
        "redis://127.0.0.1:1",
        "postgres://127.0.0.1:1/db",
        "mysql://127.0.0.1:1/db",
        "etcd://127.0.0.1:1",
    ] {
        let out = tessera(home.path())
            .args(["--store", url, "status", "--json"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("cargo feature") && !err.contains("unknown scheme"),
            "{url}: {err}"
        );
    }
}

/// `tessera completions SHELL` prints a script generated from the command line: bash parses
/// it, and it offers every subcommand.
#[test]
fn completion_scripts_name_the_subcommands_and_bash_parses_its_own() {
    let home = tmp();
    for shell in ["bash", "zsh", "fish"] {
        let out = tessera(home.path())
            .args(["completions", shell])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {out:?}");
        assert!(out.stderr.is_empty(), "{shell}: {out:?}");
        let script = String::from_utf8(out.stdout).unwrap();
        for sub in [
            "run", "serve", "status", "revoke", "resize", "delete", "bench",
        ] {
            assert!(script.contains(sub), "{shell} script lacks {sub}: {script}");
        }
        for flag in ["store", "permits", "rate", "watch", "listen"] {
            // fish spells a long flag `-l store`.
            let spelled = match shell {
                "fish" => format!("-l {flag}"),
                _ => format!("--{flag}"),
            };
            assert!(script.contains(&spelled), "{shell} script lacks {spelled}");
        }
        if shell == "bash" {
            let path = home.path().join("tessera.bash");
            std::fs::write(&path, &script).unwrap();
            let check = std::process::Command::new("bash")
                .arg("-n")
                .arg(&path)
                .output()
                .unwrap();
            assert!(check.status.success(), "bash -n: {check:?}");
        }
    }
    // An unknown shell is a usage error naming the choices, and prints no script.
    let out = tessera(home.path())
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    let line = assert_fails_with_one_line(&out, 64);
    assert!(line.contains("bash") && line.contains("zsh"), "{line}");
    assert!(out.stdout.is_empty());
}

/// `tessera man` prints tessera(1), a roff page naming every command; `man COMMAND`
/// prints that command's page and `--dir` writes them all.
#[test]
fn the_man_pages_are_roff_and_cover_every_command() {
    let home = tmp();
    let out = tessera(home.path()).arg("man").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let page = String::from_utf8(out.stdout).unwrap();
    assert!(page.starts_with('.'), "not roff: {page}");
    assert!(
        page.lines().any(|l| l.starts_with(".TH tessera 1 ")),
        "{page}"
    );
    let commands = [
        "run",
        "status",
        "revoke",
        "resize",
        "delete",
        "bench",
        "serve",
        "completions",
        "man",
    ];
    for sub in commands {
        assert!(
            page.lines().any(|l| l == format!("tessera\\-{sub}(1)")),
            "tessera(1) does not name {sub}: {page}"
        );
    }
    assert!(!page.contains("tessera\\-help"), "{page}");
    let out = tessera(home.path()).args(["man", "run"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let run = String::from_utf8(out.stdout).unwrap();
    assert!(
        run.lines().any(|l| l.starts_with(".TH tessera-run 1 ")),
        "{run}"
    );
    assert!(run.contains("\\-\\-permits"), "{run}");
    let dir = home.path().join("man1");
    std::fs::create_dir(&dir).unwrap();
    let out = tessera(home.path())
        .args(["man", "--dir"])
        .arg(&dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("tessera.1")).unwrap(),
        page
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("tessera-run.1")).unwrap(),
        run
    );
    for sub in commands {
        assert!(dir.join(format!("tessera-{sub}.1")).exists(), "{sub}");
    }
    let out = tessera(home.path()).args(["man", "nope"]).output().unwrap();
    let line = assert_fails_with_one_line(&out, 64);
    assert!(
        line.contains("\"nope\"") && line.contains("serve"),
        "{line}"
    );
}

/// Each forwarded signal reaches the command, which decides the exit code.
#[test]
fn signals_sent_to_tessera_are_forwarded_to_the_command() {
    let home = tmp();
    for sig in ["TERM", "INT", "HUP", "QUIT", "USR1", "USR2"] {
        let ready = home.path().join(format!("ready-{sig}"));
        let got = home.path().join(format!("got-{sig}"));
        let script = format!(
            "trap 'echo {sig} > {got}; kill $! 2>/dev/null; exit 3' {sig}; sleep 30 & echo ready > {ready}; wait",
            got = got.display(),
            ready = ready.display()
        );
        let child = tessera(home.path())
            .args([
                "--store",
                "memory://",
                "run",
                "--name",
                "demo",
                "--permits",
                "1",
                "--",
            ])
            .args(["sh", "-c", &script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for_file(&ready, Duration::from_secs(10));
        let number = match sig {
            "TERM" => libc::SIGTERM,
            "INT" => libc::SIGINT,
            "HUP" => libc::SIGHUP,
            "QUIT" => libc::SIGQUIT,
            "USR1" => libc::SIGUSR1,
            _ => libc::SIGUSR2,
        };
        signal(&child, number);
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(3),
            "{sig}: {:?}",
            stderr_lines(&out)
        );
        assert_eq!(
            std::fs::read_to_string(&got).unwrap().trim(),
            sig,
            "delivered once, by name"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Across processes (SQLite)
// ---------------------------------------------------------------------------------------------

fn spawn_run(home: &Path, store: &str, extra: &[&str], script: &str) -> Child {
    tessera(home)
        .args(["--store", store, "run", "--name", "demo"])
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// [`spawn_run`] of a command that holds its permit for 30 s, once it holds it.
fn spawn_holder(home: &Path, store: &str, extra: &[&str]) -> Child {
    let ready = home.join("ready");
    let holder = spawn_run(
        home,
        store,
        extra,
        &format!("echo ready > {}; sleep 30", ready.display()),
    );
    wait_for_file(&ready, Duration::from_secs(10));
    holder
}

fn status_json(home: &Path, store: &str) -> serde_json::Value {
    let out = tessera(home)
        .args(["--store", store, "status", "demo", "--json"])
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
}

/// Spawns a `run` with `--holder label` and returns once the store has it as a holder or a
/// waiter (or it already ran), so runs arrive at the store in a known order.
fn spawn_arrived(home: &Path, store: &str, label: &str, extra: &[&str], script: &str) -> Child {
    let mut args = vec!["--holder", label];
    args.extend_from_slice(extra);
    let mut run = spawn_run(home, store, &args, script);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = status_json(home, store);
        let present = ["holders", "queue"].iter().any(|k| {
            s[k].as_array()
                .is_some_and(|v| v.iter().any(|e| e["holder"] == label))
        });
        if present || run.try_wait().unwrap().is_some() {
            return run;
        }
        assert!(
            Instant::now() < deadline,
            "{label} never reached the store: {s}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A monotonic clock shared by every process of the test: seconds since boot.
const NOW: &str = "cut -d' ' -f1 /proc/uptime";

#[test]
fn five_runs_on_two_permits_never_overlap_more_than_two_and_serve_in_arrival_order() {
    let home = tmp();
    let store = sqlite(home.path());
    let log = home.path().join("log");
    let mut runs = Vec::new();
    for i in 0..5 {
        let script = format!(
            "echo \"start {i} $({NOW})\" >> {log}; sleep 1; echo \"end {i} $({NOW})\" >> {log}",
            log = log.display()
        );
        runs.push(spawn_arrived(
            home.path(),
            &store,
            &format!("run-{i}"),
            &["--permits", "2", "--ttl", "2s"],
            &script,
        ));
    }
    for run in runs {
        let out = run.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    }
    let log = std::fs::read_to_string(&log).unwrap();
    let events: Vec<(String, usize, f64)> = log
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (
                f[0].to_string(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(events.len(), 10, "all five ran:\n{log}");
    // Appends are ordered: replaying the file is replaying time.
    let mut running = 0;
    let mut last = 0.0;
    for (what, _, at) in &events {
        assert!(*at >= last, "timestamps go back:\n{log}");
        last = *at;
        running += if what == "start" { 1 } else { -1 };
        assert!(running <= 2, "more than two at once:\n{log}");
    }
    let starts: Vec<usize> = events
        .iter()
        .filter(|e| e.0 == "start")
        .map(|e| e.1)
        .collect();
    assert_eq!(
        &starts[2..],
        &[2, 3, 4],
        "waiters served out of arrival order:\n{log}"
    );
}

#[test]
fn status_json_shows_holders_and_the_queue() {
    let home = tmp();
    let store = sqlite(home.path());
    let mut runs = Vec::new();
    for holder in ["first", "second", "third"] {
        runs.push(spawn_arrived(
            home.path(),
            &store,
            holder,
            &["--permits", "2"],
            "sleep 30",
        ));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let s = status_json(home.path(), &store);
        if s["holders"].as_array().map(Vec::len) == Some(2)
            && s["queue"].as_array().map(Vec::len) == Some(1)
        {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "never saw 2 holders and 1 waiter: {s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status["name"], "demo");
    assert_eq!(status["capacity"], 2);
    assert_eq!(status["used"], 2);
    assert_eq!(status["available"], 0);
    let holders = status["holders"].as_array().unwrap();
    assert_eq!(holders[0]["holder"], "first");
    assert_eq!(holders[1]["holder"], "second");
    assert_ne!(holders[0]["seats"], holders[1]["seats"]);
    assert!(holders[0]["fence"].as_u64() < holders[1]["fence"].as_u64());
    assert_eq!(status["queue"][0]["holder"], "third");
    assert_eq!(status["queue"][0]["weight"], 1);
    // The human view shows the same.
    let out = tessera(home.path())
        .args(["--store", &store, "status", "demo"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "capacity 2",
        "first",
        "second",
        "third",
        "EXPIRES IN",
        "WAITING FOR",
    ] {
        assert!(text.contains(needle), "{needle} missing from:\n{text}");
    }
    for run in &runs {
        signal(run, libc::SIGTERM);
    }
    for run in runs {
        let out = run.wait_with_output().unwrap();
        // Holders' commands die of the forwarded SIGTERM; the waiter stops waiting.
        assert_eq!(
            out.status.code(),
            Some(128 + libc::SIGTERM),
            "{:?}",
            stderr_lines(&out)
        );
    }
}

/// Starts a `tessera run` holding the one permit of `demo` (TTL 2 s) whose command, made by
/// `script` from the path of a pid file, writes a pid there; SIGKILLs tessera once the pid is
/// written, and returns it.
fn kill_a_holder_once_it_wrote(
    home: &Path,
    store: &str,
    script: impl Fn(&str) -> String,
) -> libc::pid_t {
    let pid_file = home.join("pid");
    let mut holder = spawn_run(
        home,
        store,
        &["--permits", "1", "--ttl", "2s"],
        &script(&pid_file.display().to_string()),
    );
    let pid = wait_for_file(&pid_file, Duration::from_secs(10))
        .trim()
        .parse()
        .unwrap();
    signal(&holder, libc::SIGKILL);
    holder.wait().unwrap();
    pid
}

#[test]
fn a_killed_holder_gives_its_permit_back_within_the_ttl_and_its_command_dies_with_it() {
    let home = tmp();
    let store = sqlite(home.path());
    let command_pid = kill_a_holder_once_it_wrote(home.path(), &store, |pid_file| {
        format!("echo $$ > {pid_file}; exec sleep 30")
    });
    let killed_at = Instant::now();
    let out = tessera_run(
        home.path(),
        &store,
        "demo",
        &["--permits", "1", "--wait", "10s", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    assert!(
        killed_at.elapsed() < Duration::from_millis(3000),
        "took {:?}",
        killed_at.elapsed()
    );
    // PR_SET_PDEATHSIG: the command did not outlive tessera (and so the permit).
    let deadline = Instant::now() + Duration::from_secs(2);
    while alive(command_pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(command_pid),
        "the command outlived its killed tessera"
    );
}

/// PR_SET_PDEATHSIG reaches only the command itself; a background job it started must die
/// with a killed tessera too (the guard kills the command's process group), or it would run
/// on while the next holder has the permit.
#[test]
fn a_killed_holder_takes_the_commands_background_jobs_down_with_it() {
    let home = tmp();
    let store = sqlite(home.path());
    let job = kill_a_holder_once_it_wrote(home.path(), &store, |pid_file| {
        format!("sleep 30 & echo $! > {pid_file}; wait")
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while running(job) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !running(job),
        "the command's background job outlived its killed tessera"
    );
}

/// Alive and not a zombie (an orphan is reaped by whoever adopts it, maybe late).
fn running(pid: libc::pid_t) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')),
        Err(_) => alive(pid),
    }
}

/// A waiting `tessera run` killed outright, then handed the permit by the holder's release,
/// holds it only until its queue entry would have expired (the waiter TTL, 5 s), not for
/// its 60 s lease TTL: the next run gets it within seconds.
#[test]
fn a_killed_waiter_handed_the_permit_gives_it_back_within_its_waiter_ttl() {
    let home = tmp();
    let store = sqlite(home.path());
    let go = home.path().join("go");
    let long = ["--permits", "1", "--ttl", "60s", "--wait", "60s"];
    let holder = spawn_arrived(
        home.path(),
        &store,
        "holder",
        &long,
        &format!("while [ ! -e {} ]; do sleep 0.05; done", go.display()),
    );
    let mut waiter = spawn_arrived(home.path(), &store, "doomed", &long, "true");
    signal(&waiter, libc::SIGKILL);
    waiter.wait().unwrap();
    std::fs::write(&go, "").unwrap();
    let out = holder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let status = status_json(home.path(), &store);
    assert_eq!(
        status["holders"][0]["holder"], "doomed",
        "the release did not hand the permit to the killed waiter: {status}"
    );
    let released = Instant::now();
    let out = tessera_run(
        home.path(),
        &store,
        "demo",
        &[&long[..], &["--", "true"]].concat(),
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    assert!(
        released.elapsed() < Duration::from_secs(20),
        "the killed waiter held the permit for {:?}",
        released.elapsed()
    );
}

#[test]
fn wait_gives_up_with_75_while_another_holds() {
    let home = tmp();
    let store = sqlite(home.path());
    let holder = spawn_holder(home.path(), &store, &["--permits", "1"]);
    let marker = home.path().join("ran");
    let started = Instant::now();
    let out = tessera_run(
        home.path(),
        &store,
        "demo",
        &[
            "--permits",
            "1",
            "--wait",
            "200ms",
            "--",
            "touch",
            marker.to_str().unwrap(),
        ],
    );
    let line = assert_fails_with_one_line(&out, 75);
    assert!(line.contains("--wait"), "{line}");
    assert!(!marker.exists());
    assert!(started.elapsed() < Duration::from_secs(3));
    // The abandoned wait left the queue.
    assert_eq!(
        status_json(home.path(), &store)["queue"],
        serde_json::json!([])
    );
    signal(&holder, libc::SIGTERM);
    holder.wait_with_output().unwrap();
}

#[test]
fn ctrl_c_while_waiting_leaves_the_queue_and_exits_130() {
    let home = tmp();
    let store = sqlite(home.path());
    let holder = spawn_holder(home.path(), &store, &["--permits", "1"]);
    let marker = home.path().join("ran");
    let waiter = spawn_run(
        home.path(),
        &store,
        &["--permits", "1"],
        &format!("touch {}", marker.display()),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while status_json(home.path(), &store)["queue"]
        .as_array()
        .map(Vec::len)
        != Some(1)
    {
        assert!(Instant::now() < deadline, "the waiter never queued");
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&waiter, libc::SIGINT);
    let out = waiter.wait_with_output().unwrap();
    assert_fails_with_one_line(&out, 130);
    assert!(!marker.exists());
    assert_eq!(
        status_json(home.path(), &store)["queue"],
        serde_json::json!([])
    );
    signal(&holder, libc::SIGTERM);
    holder.wait_with_output().unwrap();
}

#[test]
fn a_revoked_permit_stops_the_command_and_exits_74() {
    let home = tmp();
    let store = sqlite(home.path());
    let lease_file = home.path().join("lease");
    let got = home.path().join("got");
    let script = format!(
        "trap 'echo TERM > {got}; kill $! 2>/dev/null; exit 0' TERM; sleep 30 & echo $TESSERA_LEASE_ID > {lease}; wait",
        got = got.display(),
        lease = lease_file.display()
    );
    let holder = spawn_run(
        home.path(),
        &store,
        &["--permits", "1", "--ttl", "3s"],
        &script,
    );
    let lease = wait_for_file(&lease_file, Duration::from_secs(10))
        .trim()
        .to_string();
    let out = tessera(home.path())
        .args(["--store", &store, "revoke", "demo", &lease])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let revoked_at = Instant::now();
    let out = holder.wait_with_output().unwrap();
    let line = assert_fails_with_one_line(&out, 74);
    assert!(line.contains("lost the permit"), "{line}");
    assert_eq!(std::fs::read_to_string(&got).unwrap().trim(), "TERM");
    assert!(revoked_at.elapsed() < Duration::from_secs(3));
}

#[test]
fn resize_and_delete_report_one_line() {
    let home = tmp();
    let store = sqlite(home.path());
    let holder = spawn_holder(home.path(), &store, &["--permits", "1", "--ttl", "3s"]);
    let out = tessera(home.path())
        .args(["--store", &store, "resize", "demo", "3"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "resized demo: capacity 1 -> 3"
    );
    assert_eq!(status_json(home.path(), &store)["capacity"], 3);
    let out = tessera(home.path())
        .args(["--store", &store, "delete", "demo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 1);
    // The holder learns it lost its permit.
    let out = holder.wait_with_output().unwrap();
    assert_fails_with_one_line(&out, 74);
}

#[test]
fn usage_errors_exit_2_with_one_line() {
    let home = tmp();
    for args in [
        &["run", "--name", "demo", "--", "true"][..],
        &["run", "--name", "demo", "--permits", "1"],
        &[
            "run",
            "--name",
            "demo",
            "--permits",
            "1",
            "--bogus",
            "--",
            "true",
        ],
        &["status", "a", "b"],
        &["bogus"],
    ] {
        let out = tessera(home.path()).args(args).output().unwrap();
        assert_fails_with_one_line(&out, 2);
    }
}

/// An invalid value exits 64 ("invalid value" in --help) whether it cannot be parsed or is
/// out of range; 2 is kept for usage errors. Nothing runs and no store is created.
#[test]
fn unparseable_and_out_of_range_values_both_exit_64() {
    let home = tmp();
    let marker = home.path().join("ran");
    let run = |extra: &[&str]| {
        tessera(home.path())
            .args(["run", "--name", "demo"])
            .args(extra)
            .args(["--", "touch", marker.to_str().unwrap()])
            .output()
            .unwrap()
    };
    for extra in [
        &["--permits", "abc"][..],
        &["--permits", "0"],
        &["--permits", "1", "--ttl", "soon"],
        &["--permits", "1", "--ttl", "10ms"],
        &["--permits", "1", "--wait", "later"],
        &["--permits", "1", "--weight", "many"],
        &["--rate", "2/x"],
        &["--rate", "0/s"],
        &["--rate", "2/s", "--cost", "many"],
        &["--rate", "2/s", "--cost", "3"],
    ] {
        assert_fails_with_one_line(&run(extra), 64);
    }
    let out = tessera(home.path())
        .args(["status", "--watch", "often"])
        .output()
        .unwrap();
    assert_fails_with_one_line(&out, 64);
    assert!(!marker.exists(), "an invalid value ran the command");
    assert!(!home.path().join("state").exists(), "a store was created");
    let help = tessera(home.path()).arg("--help").output().unwrap();
    let help = String::from_utf8(help.stdout).unwrap();
    let code_2 = help
        .lines()
        .find(|l| l.trim_start().starts_with("2 "))
        .unwrap();
    assert!(code_2.contains("usage error"), "{code_2}");
    let code_64 = help
        .lines()
        .find(|l| l.trim_start().starts_with("64 "))
        .unwrap();
    assert!(code_64.contains("unparseable or out of range"), "{code_64}");
}

/// The TTL range is named in one unit style, the one --ttl takes.
#[test]
fn the_ttl_range_is_named_in_one_unit_style() {
    let home = tmp();
    let out = tessera_run(
        home.path(),
        "memory://",
        "demo",
        &["--permits", "1", "--ttl", "30d", "--", "true"],
    );
    let line = assert_fails_with_one_line(&out, 64);
    assert!(line.contains("between 100ms and 24h"), "{line}");
}

#[test]
fn the_command_may_follow_the_options_without_a_double_dash() {
    let home = tmp();
    let out = tessera_run(
        home.path(),
        "memory://",
        "demo",
        &["--permits", "1", "echo", "--name", "-x"],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "--name -x\n");
}

#[test]
fn status_watch_refreshes_until_ctrl_c() {
    let home = tmp();
    let watch = tessera(home.path())
        .args([
            "--store",
            "memory://",
            "status",
            "--json",
            "--watch",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    signal(&watch, libc::SIGINT);
    let out = watch.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let frames: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    assert!(frames.len() >= 2, "{frames:?}");
    assert!(frames.iter().all(|f| f == "[]"), "{frames:?}");
}

/// Into a pipe, `--watch` prints one frame after another, without clear-screen codes.
/// After semaphores were used and released, the list still speaks of semaphores: it says
/// that none is held and why (a store keeps one only while it is used), next to the rate
/// limiter that is still kept; asked by name, a released one says the same.
#[test]
fn status_says_why_released_semaphores_are_not_listed() {
    let home = tmp();
    let store = sqlite(home.path());
    for name in ["alpha", "beta", "gamma"] {
        let out = tessera_run(home.path(), &store, name, &["--permits", "2", "--", "true"]);
        assert!(out.status.success(), "{:?}", stderr_lines(&out));
    }
    let out = tessera_run(home.path(), &store, "sms", &["--rate", "5/s", "--", "true"]);
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    let out = tessera(home.path())
        .args(["--store", &store, "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!(
            "no semaphore is held or waited for in {store} (a store keeps a semaphore only \
             while it is held or waited for: a released one leaves nothing)\n"
        )),
        "{text}"
    );
    assert!(
        text.contains("RATE LIMITER") && text.contains("sms"),
        "{text}"
    );
    let out = tessera(home.path())
        .args(["--store", &store, "status", "beta"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!(
            "beta: not held or waited for in {store}; a store keeps"
        )) && text.contains("released or whose leases expired leaves nothing"),
        "{text}"
    );
}

#[test]
fn status_watch_into_a_pipe_writes_no_escape_codes() {
    let home = tmp();
    let watch = tessera(home.path())
        .args(["--store", "memory://", "status", "--watch", "100ms"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(600));
    signal(&watch, libc::SIGINT);
    let out = watch.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(!text.contains('\x1b'), "escape codes in a pipe: {text:?}");
    let frames = text
        .matches("no semaphore is held or waited for in memory://")
        .count();
    assert!(frames >= 2, "{text:?}");
}

/// `--permits` with `--rate` on a store with admission (memory) takes both in one step: the
/// command runs holding a seat and a fence, the log says it was admitted (not "permit
/// acquired" and then a rate turn), and the store's windows were charged for it.
#[test]
fn permits_and_rates_together_are_one_admission_where_the_store_has_it() {
    let home = tmp();
    let out = tessera(home.path())
        .env("TESSERA_LOG", "info")
        .args(["--store", "memory://", "run", "--name", "both"])
        .args(["--permits", "2", "--rate", "5/s", "--rate", "100/min"])
        .args([
            "--",
            "sh",
            "-c",
            "echo seat=$TESSERA_SEATS fence=$TESSERA_FENCE",
        ])
        .output()
        .unwrap();
    let lines = stderr_lines(&out);
    assert_eq!(out.status.code(), Some(0), "{lines:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("seat=0 fence="), "{stdout}");
    assert!(lines.iter().any(|l| l.contains("admitted")), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.contains("permit acquired")),
        "{lines:?}"
    );
    // A cost above the smallest limit is refused before anything is taken.
    let out = tessera_on(
        home.path(),
        "memory://",
        &[
            "run",
            "--name",
            "both",
            "--permits",
            "2",
            "--rate",
            "2/s",
            "--cost",
            "3",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(64), "{:?}", stderr_lines(&out));
}

// ---------------------------------------------------------------------------------------------
// Rate limits (--rate)
// ---------------------------------------------------------------------------------------------

/// Processes sharing `--permits` and `--rate` on the embedded SQLite store take both in one
/// admission: measured where the user observes it, by the commands themselves (their start
/// and end on the host clock), never more than the capacity run at once and never more than
/// the limit start in any window of its period (the margin covers the start of `sh`).
#[test]
fn permits_and_rates_hold_at_the_commands_across_processes() {
    let home = tmp();
    let store = sqlite(home.path());
    permits_and_rates_hold_at_the_commands(home.path(), &store);
}

/// The same on a throwaway Redis, where the admission is one `FCALL`.
#[test]
fn permits_and_rates_hold_at_the_commands_across_processes_on_redis() {
    let home = tmp();
    let server = tessera_testkit::servers::redis::RedisServer::start();
    permits_and_rates_hold_at_the_commands(home.path(), &server.url());
}

/// The same on a throwaway MariaDB.
#[test]
fn permits_and_rates_hold_at_the_commands_across_processes_on_mariadb() {
    let home = tmp();
    let server = tessera_testkit::servers::mysql::MariaDbServer::start();
    permits_and_rates_hold_at_the_commands(home.path(), &server.url("admission"));
}

/// The same on a throwaway PostgreSQL, where the admission is one function call.
#[test]
fn permits_and_rates_hold_at_the_commands_across_processes_on_postgres() {
    let home = tmp();
    let server = tessera_testkit::servers::postgres::PostgresServer::start();
    permits_and_rates_hold_at_the_commands(home.path(), &server.url_with_schema("cli"));
}

fn permits_and_rates_hold_at_the_commands(home: &Path, store: &str) {
    const PERMITS: usize = 2;
    const PER_SECOND: usize = 3;
    let out_dir = home.join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let children: Vec<Child> = (0..8)
        .map(|i| {
            tessera(home)
                .env("TESSERA_LOG", "info")
                .args(["--store", store, "run", "--name", "sms", "--wait", "60s"])
                .args(["--permits", &PERMITS.to_string()])
                .args([
                    "--rate",
                    &format!("{PER_SECOND}/s"),
                    "--rate-margin",
                    "250ms",
                ])
                .args([
                    "--",
                    "sh",
                    "-c",
                    &format!(
                        "s=$(date +%s%N); sleep 0.3; echo \"$s $(date +%s%N)\" > {}/r{i}",
                        out_dir.display()
                    ),
                ])
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        let lines = stderr_lines(&out);
        assert_eq!(out.status.code(), Some(0), "{lines:?}");
        assert!(lines.iter().any(|l| l.contains("admitted")), "{lines:?}");
    }
    let mut runs: Vec<(u128, u128)> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|f| {
            let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
            let mut it = text.split_whitespace().map(|n| n.parse::<u128>().unwrap());
            (it.next().unwrap(), it.next().unwrap())
        })
        .collect();
    assert_eq!(runs.len(), 8, "every run ran");
    runs.sort();
    for (i, &(start, _)) in runs.iter().enumerate() {
        let running = runs[..=i].iter().filter(|&&(_, end)| end > start).count();
        assert!(
            running <= PERMITS,
            "{running} commands ran at once: {runs:?}"
        );
        let in_a_second = runs[i..]
            .iter()
            .take_while(|&&(s, _)| s < start + 1_000_000_000)
            .count();
        assert!(
            in_a_second <= PER_SECOND,
            "{in_a_second} commands started within a second: {runs:?}"
        );
    }
}

/// Processes sharing `--rate` limits all run, and the store's log of admissions never holds
/// more than a limit allows; a wait beyond `--wait` charges nothing and exits 75.
#[test]
fn rate_limited_runs_across_processes() {
    let home = tmp();
    let store = sqlite(home.path());
    let out_dir = home.path().join("out");
    std::fs::create_dir_all(&out_dir).unwrap();
    let children: Vec<Child> = (0..6)
        .map(|i| {
            tessera(home.path())
                .args(["--store", &store, "run", "--name", "api"])
                .args(["--rate", "2/s", "--rate", "5/3s"])
                .args([
                    "--",
                    "sh",
                    "-c",
                    &format!("echo $TESSERA_NAME > {}/r{i}", out_dir.display()),
                ])
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(
        std::fs::read_dir(&out_dir).unwrap().count(),
        6,
        "every run ran"
    );
    let out = tessera(home.path())
        .args(["--store", &store, "status", "api", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let limits = v["rate"]["limits"].as_array().expect("rate status");
    assert_eq!(limits.len(), 2);
    for l in limits {
        let (used, limit) = (l["used"].as_u64().unwrap(), l["limit"].as_str().unwrap());
        let n: u64 = limit.split('/').next().unwrap().parse().unwrap();
        assert!(used <= n, "{used} used of {limit}");
    }
    // New limits replace the stored ones only when asked (history is kept: 2 of the last
    // second's admissions still count against 10/s, which leaves room).
    let out = tessera_run(
        home.path(),
        &store,
        "api",
        &[
            "--rate",
            "10/s",
            "--update-rates",
            "--wait",
            "5s",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));

    // The next turn is a minute away: a short --wait gives up, charges nothing, exits 75.
    let run_once = |wait: Option<&str>| {
        let mut cmd = tessera(home.path());
        cmd.args([
            "--store", &store, "run", "--name", "minutely", "--rate", "1/min",
        ]);
        if let Some(w) = wait {
            cmd.args(["--wait", w]);
        }
        cmd.args(["--", "true"]).output().unwrap()
    };
    assert!(run_once(Some("1s")).status.success());
    let line = assert_fails_with_one_line(&run_once(Some("200ms")), 75);
    assert!(line.contains("rate"), "{line}");
    let v: serde_json::Value = serde_json::from_slice(
        &tessera(home.path())
            .args(["--store", &store, "status", "minutely", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(
        v["rate"]["limits"][0]["used"].as_u64(),
        Some(1),
        "the refused run was charged"
    );
}

/// Bad rate input is refused before anything runs: a malformed spec, a cost above the
/// smallest limit, and limits that differ from the stored ones without --update-rates.
#[test]
fn bad_rate_input_is_refused() {
    let home = tmp();
    let store = sqlite(home.path());
    let marker = home.path().join("ran");
    let touch = ["--", "touch", marker.to_str().unwrap()];
    let out = tessera_run(
        home.path(),
        &store,
        "api",
        &[&["--rate", "2/x"][..], &touch].concat(),
    );
    assert_fails_with_one_line(&out, 64);
    let rate = ["--rate", "2/s", "--cost", "3"];
    let out = tessera_run(home.path(), &store, "api", &[&rate[..], &touch].concat());
    assert_fails_with_one_line(&out, 64);
    let ok = tessera_run(home.path(), &store, "api", &["--rate", "2/s", "--", "true"]);
    assert!(ok.status.success());
    let out = tessera_run(
        home.path(),
        &store,
        "api",
        &[&["--rate", "3/s"][..], &touch].concat(),
    );
    let line = assert_fails_with_one_line(&out, 64);
    assert!(line.contains("add --update-rates"), "{line}");
    // The limits as written on the command line, not the stored encoding.
    assert!(
        line.contains("has limits 2/s in the store, but --rate declared 3/s;"),
        "{line}"
    );
    assert!(!marker.exists(), "a refused run ran its command");
}

/// With --permits and --rate, the command holds the permit (and gets its seats) and its
/// turn within the rate.
#[test]
fn permit_then_rate() {
    let home = tmp();
    let out = tessera_run(
        home.path(),
        "memory://",
        "job",
        &[
            "--permits",
            "2",
            "--weight",
            "2",
            "--rate",
            "10/s",
            "--",
            "sh",
            "-c",
            "echo $TESSERA_SEATS",
        ],
    );
    assert!(out.status.success(), "{:?}", stderr_lines(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "0,1");
}

/// `delete NAME` deletes the rate limiter too, says which of the two existed, and a full
/// limit admits again at once; with neither it exits 1.
#[test]
fn delete_removes_the_rate_limiter_and_says_which() {
    let home = tmp();
    let store = sqlite(home.path());
    let run_minutely = |wait: &str| {
        tessera_run(
            home.path(),
            &store,
            "minutely",
            &["--rate", "1/min", "--wait", wait, "--", "true"],
        )
    };
    assert!(run_minutely("1s").status.success());
    assert_fails_with_one_line(&run_minutely("200ms"), 75);
    let out = tessera(home.path())
        .args(["--store", &store, "delete", "minutely"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let line = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        line.starts_with("deleted the rate limiter minutely"),
        "{line}"
    );
    assert!(!line.contains("semaphore"), "{line}");
    // The limit is full again at once.
    assert!(run_minutely("200ms").status.success());

    // A semaphore with a holder and a rate limiter under one name: both go.
    let holder = spawn_holder(
        home.path(),
        &store,
        &["--permits", "1", "--ttl", "3s", "--rate", "1/min"],
    );
    let out = tessera(home.path())
        .args(["--store", &store, "delete", "demo"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{:?}", stderr_lines(&out));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        stdout.starts_with("deleted the semaphore and the rate limiter demo"),
        "{stdout}"
    );
    assert_fails_with_one_line(&holder.wait_with_output().unwrap(), 74);
    let out = tessera(home.path())
        .args(["--store", &store, "delete", "demo"])
        .output()
        .unwrap();
    let line = assert_fails_with_one_line(&out, 1);
    assert!(line.contains("no semaphore or rate limiter"), "{line}");
}

/// `--rate-margin` is stored with the limits: status shows it, another margin is refused
/// like other limits, and one out of range is refused before the store is touched.
#[test]
fn rate_margin_is_stored_with_the_limits() {
    let home = tmp();
    let store = sqlite(home.path());
    let run = |margin: &str| {
        tessera_run(
            home.path(),
            &store,
            "api",
            &["--rate", "5/s", "--rate-margin", margin, "--", "true"],
        )
    };
    let ok = run("50ms");
    assert!(ok.status.success(), "{:?}", stderr_lines(&ok));
    let v: serde_json::Value = serde_json::from_slice(
        &tessera(home.path())
            .args(["--store", &store, "status", "api", "--json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(v["rate"]["margin_us"].as_u64(), Some(50_000), "{v}");
    assert_eq!(v["rate"]["limits"][0]["limit"].as_str(), Some("5/s"), "{v}");
    let line = assert_fails_with_one_line(&run("0s"), 64);
    assert!(line.contains("update"), "{line}");
    let fresh = tmp();
    let out = tessera(fresh.path())
        .args([
            "run",
            "--name",
            "api",
            "--rate",
            "5/s",
            "--rate-margin",
            "2s",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    assert_fails_with_one_line(&out, 64);
    assert!(!fresh.path().join("state").exists());
}

/// `tessera tenants` (docs/fair-shares.md#ceilings-and-floors): sets a tenant's ceiling and
/// floor on the embedded store ahead of any traffic, lists them (a table and JSON), and the
/// ceiling is kept where the user sees it: a `run --tenant` at it does not run its command,
/// another tenant's does. Bad values and a store that keeps no limits exit 64 in one line,
/// changing nothing.
#[test]
fn tenants_sets_lists_and_clears_limits_that_run_obeys() {
    let home = tmp();
    let store = sqlite(home.path());
    let on = |args: &[&str]| tessera_on(home.path(), &store, args);
    let out = on(&["tenants", "demo", "bulk", "--ceiling", "1"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "bulk on demo: ceiling 1, floor 0"
    );
    let out = on(&[
        "tenants",
        "demo",
        "alerts",
        "--ceiling",
        "2",
        "--floor",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = on(&["tenants", "demo"]);
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        table.lines().collect::<Vec<_>>(),
        [
            "TENANT  CEILING  FLOOR  WINDOWS",
            "alerts        2      1        -",
            "bulk          1      0        -"
        ],
        "{table}"
    );
    // Idle, the name has no semaphore to show, but its limits are kept and said so.
    let out = on(&["status", "demo"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        text.contains(
            "tenant limits kept for it: alerts ceiling 2 floor 1, bulk ceiling 1 floor 0"
        ),
        "{text}"
    );
    let out = on(&["tenants", "demo", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["bulk"], serde_json::json!({"ceiling": 1, "floor": 0}));
    assert_eq!(
        json["alerts"],
        serde_json::json!({"ceiling": 2, "floor": 1})
    );

    // bulk holds one permit of 3; its second request, at its ceiling, does not run (0s: only
    // if granted now), while another tenant's does.
    let mut holder = spawn_holder(home.path(), &store, &["--permits", "3", "--tenant", "bulk"]);
    let marker = home.path().join("ran");
    let touch = format!("touch {}", marker.display());
    let run = |tenant: &str| {
        tessera_run(
            home.path(),
            &store,
            "demo",
            &[
                "--permits",
                "3",
                "--tenant",
                tenant,
                "--wait",
                "0s",
                "--",
                "sh",
                "-c",
                &touch,
            ],
        )
    };
    let out = run("bulk");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(!marker.exists(), "bulk ran past its ceiling");
    let out = run("web");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(marker.exists());
    holder.kill().unwrap();
    holder.wait().unwrap();

    // Bad values: one line, exit 64, nothing changed.
    for args in [
        &["tenants", "demo", "bulk", "--ceiling", "0"][..],
        &["tenants", "demo", "bulk", "--ceiling", "1", "--floor", "2"],
        &["tenants", "demo", "", "--floor", "1"],
        &["tenants", "bad name", "bulk", "--floor", "1"],
    ] {
        assert_fails_with_one_line(&on(args), 64);
    }
    let out = on(&["tenants", "demo", "bulk", "--clear"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "cleared bulk's limits on demo"
    );
    let out = on(&["tenants", "demo", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"alerts": {"ceiling": 2, "floor": 1}})
    );

    // etcd keeps no limits.
    let etcd = tessera_testkit::servers::etcd::EtcdCluster::start(1);
    let out = tessera_on(
        home.path(),
        &etcd.url(),
        &["tenants", "demo", "bulk", "--floor", "1"],
    );
    let line = assert_fails_with_one_line(&out, 64);
    assert!(line.contains("tenant"), "{line}");
}

/// `tessera tenants NAME TENANT --window-ceiling 20%` (docs/fair-shares.md, "A ceiling on a
/// share of the windows") on the embedded store, where the user sees it: on `10/min`, the
/// tenant's third `tessera run` within the minute does not run its command (exit 75) while
/// another tenant's does; the table and JSON show it; a bad percentage exits 64 in one line.
#[test]
fn a_window_ceiling_keeps_a_tenants_runs_to_its_share_of_the_windows() {
    let home = tmp();
    let store = sqlite(home.path());
    let on = |args: &[&str]| tessera_on(home.path(), &store, args);
    let out = on(&["tenants", "sms", "bulk", "--window-ceiling", "20%"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "bulk on sms: no ceiling, floor 0, at most 20% of each rate window"
    );
    let out = on(&["tenants", "sms"]);
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    assert_eq!(
        table.lines().collect::<Vec<_>>(),
        [
            "TENANT  CEILING  FLOOR  WINDOWS",
            "bulk          -      0      20%"
        ],
        "{table}"
    );
    let out = on(&["tenants", "sms", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"bulk": {"ceiling": null, "floor": 0, "window_ceiling": 20}})
    );
    for bad in ["0", "101%", "twenty"] {
        assert_fails_with_one_line(
            &on(&["tenants", "sms", "bulk", "--window-ceiling", bad]),
            64,
        );
    }

    let runs = home.path().join("runs");
    let append = format!("echo x >> {}", runs.display());
    let run = |tenant: &str| {
        tessera_run(
            home.path(),
            &store,
            "sms",
            &[
                "--permits",
                "4",
                "--rate",
                "10/min",
                "--tenant",
                tenant,
                "--wait",
                "0s",
                "--",
                "sh",
                "-c",
                &append,
            ],
        )
    };
    let ran = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    for _ in 0..2 {
        let out = run("bulk");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
    let out = run("bulk");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert_eq!(ran(), 2, "bulk ran past its share of the window");
    let out = run("alerts");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(ran(), 3);
}
