//! The `tessera` binary; the command lives in the library (`lib.rs`).

fn main() -> std::process::ExitCode {
    tessera_cli::main()
}
