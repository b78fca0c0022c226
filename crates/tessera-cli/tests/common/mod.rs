//! What the CLI tests share.

use std::path::Path;
use std::process::{Command, Stdio};

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
