//! The `tessera` binary never prints a store password (errors, logs at trace level, help),
//! and random `run` command lines end in a documented exit code with at most one line of
//! complaint, never a panic. Only loopback is contacted (port 1: refused).

use std::process::Output;

use proptest::prelude::*;

mod common;
use common::tessera;

const CANARY: &str = "canary-Zq8xW3vT7pLm";

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[track_caller]
fn assert_hidden(out: &Output) {
    let all = text(out);
    assert!(!all.contains(CANARY), "the password is shown: {all}");
    assert!(
        !all.contains("Zq8xW3"),
        "part of the password is shown: {all}"
    );
}

#[test]
fn a_store_password_never_appears_in_errors_logs_or_help() {
    let home = tempfile::tempdir().unwrap();
    let url = format!("redis://u:{CANARY}@127.0.0.1:1");
    // A refused connection: exit 69, one line, no password.
    let out = tessera(home.path())
        .args(["--store", &url, "status"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
    assert_hidden(&out);
    // The same with every log line the library and the CLI write.
    for args in [
        vec!["--store", &url, "status", "x"],
        vec![
            "--store",
            &url,
            "run",
            "--name",
            "x",
            "--permits",
            "1",
            "--",
            "true",
        ],
        vec![
            "--store",
            &url,
            "revoke",
            "x",
            "0123456789abcdef0123456789abcdef",
        ],
        vec!["--store", &url, "resize", "x", "2"],
        vec!["--store", &url, "delete", "x"],
    ] {
        let out = tessera(home.path())
            .env("TESSERA_LOG", "trace")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(69), "{args:?}: {}", text(&out));
        assert_hidden(&out);
    }
    // Through the environment, and a bad URL (exit 64).
    for (store, code) in [
        (url.clone(), 69),
        (format!("{url}?bogus=1"), 64),
        (format!("nosuch://u:{CANARY}@127.0.0.1:1"), 64),
        (format!("redis://u:{CANARY}@/x"), 64),
    ] {
        let out = tessera(home.path())
            .env("TESSERA_STORE", &store)
            .env("TESSERA_LOG", "trace")
            .arg("status")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{store}: {}", text(&out));
        assert_hidden(&out);
    }
    // Help never shows the environment's store URL.
    for args in [
        vec!["--help"],
        vec!["run", "--help"],
        vec!["status", "--help"],
        vec!["bench", "--help"],
    ] {
        let out = tessera(home.path())
            .env("TESSERA_STORE", &url)
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
        assert_hidden(&out);
    }
    // A usage error with the password on the command line.
    let out = tessera(home.path())
        .args(["--store", &url, "status", "--no-such-flag"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert_hidden(&out);
}

fn token() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("--name".to_string()),
        Just("--permits".to_string()),
        Just("--weight".to_string()),
        Just("--ttl".to_string()),
        Just("--wait".to_string()),
        Just("--rate".to_string()),
        Just("--cost".to_string()),
        Just("--holder".to_string()),
        Just("--update-rates".to_string()),
        Just("--".to_string()),
        Just("jobs".to_string()),
        Just("0".to_string()),
        Just("1".to_string()),
        Just("3".to_string()),
        Just("18446744073709551616".to_string()),
        Just("100ms".to_string()),
        Just("0s".to_string()),
        Just("25h".to_string()),
        Just("5/s".to_string()),
        Just("5/m".to_string()),
        Just("true".to_string()),
        Just("false".to_string()),
        Just("/nonexistent/cmd".to_string()),
        "[ -~]{0,6}",
        any::<String>().prop_filter("no NUL", |s| !s.contains('\0')),
    ]
}

/// Commands with known exit codes: `true` 0, `false` 1, `sh -c 'exit 3'` 3.
fn command() -> impl Strategy<Value = Vec<String>> {
    prop_oneof![
        Just(vec![]),
        Just(vec!["true".to_string()]),
        Just(vec!["false".to_string()]),
        Just(vec!["sh".into(), "-c".into(), "exit 3".into()]),
        Just(vec!["/nonexistent/cmd".to_string()]),
        Just(vec!["/".to_string()]),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_run_command_lines_end_in_a_documented_code_never_a_panic(
        head in proptest::collection::vec(token(), 0..8),
        tail in command(),
    ) {
        let home = tempfile::tempdir().unwrap();
        let mut args: Vec<String> = vec!["--store".into(), "memory://".into(), "run".into()];
        args.extend(head);
        if !tail.is_empty() {
            args.push("--".into());
            args.extend(tail);
        }
        let out = tessera(home.path()).args(&args).output().unwrap();
        let code = out.status.code();
        prop_assert!(
            matches!(code, Some(0 | 1 | 2 | 3 | 64 | 75 | 126 | 127)),
            "{:?}: {:?}\n{}", args, code, text(&out)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        prop_assert!(!stderr.contains("panicked"), "{:?}: {}", args, stderr);
        prop_assert!(stderr.lines().count() <= 1, "{:?}: {}", args, stderr);
    }
}
