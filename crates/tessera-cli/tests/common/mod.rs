//! What the CLI tests share. Each test binary uses only some of it.
#![allow(dead_code)]

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

/// The binary, isolated from the caller's environment: no inherited store or log filter, and
/// a state directory inside `home` so the default store never touches the real one.
pub fn tessera(home: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
    cmd.env_remove("TESSERA_STORE")
        .env_remove("TESSERA_LOG")
        .env("XDG_STATE_HOME", home.join("state"))
        .env("HOME", home)
        .stdin(Stdio::null());
    cmd
}

/// `tessera --store <store> <args…>` in `home`, run to its end.
pub fn tessera_on(home: &Path, store: &str, args: &[&str]) -> Output {
    tessera(home)
        .args(["--store", store])
        .args(args)
        .output()
        .unwrap()
}

/// `tessera --store <store> run --name <name> <args…>` in `home`, run to its end.
pub fn tessera_run(home: &Path, store: &str, name: &str, args: &[&str]) -> Output {
    tessera_on(home, store, &[&["run", "--name", name][..], args].concat())
}

/// The rest of a child's piped stderr, read to its end (empty if it was taken already).
pub fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut err).unwrap();
    }
    err
}
