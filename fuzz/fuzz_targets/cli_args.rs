//! Command lines of the `tessera` binary: `tessera_cli::try_parse_from`, the clap definition
//! the binary uses (value parsers included: durations, rate specs, numbers).
//!
//! Properties, beyond "no panic" (which also covers clap's own checks of the definition and
//! the rendering of every error, usage and help text): parsing is deterministic.
#![no_main]

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Arg {
    /// A word the parser knows, so the fuzzer reaches past the first one quickly.
    Known(Known),
    /// Any text.
    Text(String),
    /// Any bytes (not UTF-8 on Unix command lines).
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Known {
    Run,
    Status,
    Revoke,
    Resize,
    Delete,
    Bench,
    Help,
    DashDash,
    Store,
    Name,
    Permits,
    Weight,
    Ttl,
    Wait,
    Holder,
    Rate,
    Cost,
    UpdateRates,
    Json,
    Watch,
    Workload,
    Rates,
    Version,
}

impl Known {
    fn word(self) -> &'static str {
        match self {
            Known::Run => "run",
            Known::Status => "status",
            Known::Revoke => "revoke",
            Known::Resize => "resize",
            Known::Delete => "delete",
            Known::Bench => "bench",
            Known::Help => "--help",
            Known::DashDash => "--",
            Known::Store => "--store",
            Known::Name => "--name",
            Known::Permits => "--permits",
            Known::Weight => "--weight",
            Known::Ttl => "--ttl",
            Known::Wait => "--wait",
            Known::Holder => "--holder",
            Known::Rate => "--rate",
            Known::Cost => "--cost",
            Known::UpdateRates => "--update-rates",
            Known::Json => "--json",
            Known::Watch => "--watch",
            Known::Workload => "--workload",
            Known::Rates => "--rates",
            Known::Version => "--version",
        }
    }
}

fn argv(args: &[Arg]) -> Vec<OsString> {
    std::iter::once(OsString::from("tessera"))
        .chain(args.iter().map(|a| match a {
            Arg::Known(k) => OsString::from(k.word()),
            Arg::Text(s) => OsString::from(s),
            Arg::Bytes(b) => OsString::from_vec(b.clone()),
        }))
        .collect()
}

fn outcome(argv: &[OsString]) -> String {
    match tessera_cli::try_parse_from(argv) {
        Ok(()) => "ok".to_string(),
        // What the binary prints: the rendered message (help, version, or the error).
        Err(e) => format!("{:?} {} {}", e.kind(), e.use_stderr(), e.render()),
    }
}

fuzz_target!(|args: Vec<Arg>| {
    let argv = argv(&args);
    let first = outcome(&argv);
    assert_eq!(first, outcome(&argv), "{argv:?}");
});
