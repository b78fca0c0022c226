//! The exit codes of `tessera`, and the failure type every command returns.
//!
//! Codes follow `sysexits.h` where one fits, and the shell's conventions for running a
//! command (`126`, `127`, `128 + N`), so scripts can tell "the command failed" from "tessera
//! could not run it":
//!
//! | code | meaning |
//! |---|---|
//! | `0` | success (for `run`: the command exited 0) |
//! | `1` | admin and `status NAME`: no such semaphore, rate limiter or lease, or no store yet (nothing changed, nothing created) |
//! | `2` | usage error: an unknown command or flag, a missing or unexpected argument (clap's usage errors) |
//! | `64` | invalid value (`EX_USAGE`), whether unparseable (`--ttl soon`, `--rate 2/x`) or out of range (a capacity of 0, a weight above the capacity, a TTL out of range), an invalid name, lease id or store URL, or a capacity or rate limits that differ from the stored ones, or a feature the store lacks (rate limits on etcd); nothing was touched |
//! | `69` | the store failed or could not be reached (`EX_UNAVAILABLE`); a waiting `run` rides out transient faults after the connect, and exits 69 only if `--wait` runs out during one, past its first 5 s (before: 75) |
//! | `71` | an operating-system call failed (`EX_OSERR`), e.g. installing signal handlers or starting `run`'s process-group guard |
//! | `74` | `run`: the permit was lost while the command ran; the command was stopped (SIGTERM, then SIGKILL when the lease could expire) |
//! | `75` | `run`: no permit or no turn within the rate limits within `--wait`, or the wait queue is full (`EX_TEMPFAIL`); try again later |
//! | `126` | `run`: the command was found but could not be executed |
//! | `127` | `run`: the command was not found |
//! | `128+N` | `run`: the command was killed by signal N, or tessera itself was stopped by signal N while waiting for a permit (130 for Ctrl-C) |
//! | other | `run`: the command's own exit code, passed through |
//!
//! `run` passes the command's exit code through, so a command that itself exits with 74 or 75
//! is indistinguishable from tessera's own codes by the code alone; tessera's own failures are
//! always announced by one line on stderr starting with `tessera:`.

use std::fmt;

/// Success.
pub const OK: u8 = 0;
/// No such semaphore or lease (admin commands, `status NAME`).
pub const NOT_FOUND: u8 = 1;
/// A usage error: unknown command or flag, missing or unexpected argument.
pub const PARSE_ERROR: u8 = 2;
/// An invalid value, unparseable or out of range; nothing was touched (`EX_USAGE`).
pub const USAGE: u8 = 64;
/// The store failed or could not be reached (`EX_UNAVAILABLE`).
pub const UNAVAILABLE: u8 = 69;
/// An operating-system call failed (`EX_OSERR`).
pub const OS_ERROR: u8 = 71;
/// The permit was lost while the command ran (`EX_IOERR`).
pub const LOST: u8 = 74;
/// No permit within `--wait`, or the queue is full (`EX_TEMPFAIL`).
pub const TEMPFAIL: u8 = 75;
/// The command could not be executed.
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const COMMAND_NOT_FOUND: u8 = 127;

/// Base of "killed by signal N" codes.
pub const SIGNAL_BASE: u8 = 128;

/// The exit-code table shown at the end of `tessera --help` and `tessera run --help`.
pub const HELP_TABLE: &str = "\
Exit codes:
  0        success (run: the command exited 0)
  1        nothing there: no such semaphore, rate limiter or lease, or no store yet
           (status NAME, revoke, resize, delete); nothing changed or created
  2        usage error: unknown command or flag, missing or unexpected argument
  64       invalid value, unparseable or out of range (--permits, --weight, --ttl,
           --wait, --rate, --cost, name, lease id, store URL), or a capacity or rate
           limits differing from the stored ones; nothing was touched
  69       the store failed or could not be reached (run: at the start; a waiting
           run rides out outages until --wait runs out)
  71       an operating-system call failed
  74       run: the permit was lost while the command ran; the command was stopped
  75       run: no permit or no turn within the rate limits within --wait, or the
           wait queue is full; try again later
  126/127  run: the command could not be executed / was not found
  128+N    run: the command was killed by signal N (or tessera by N while waiting)
  other    run: the command's own exit code";

/// Why a command failed: an exit code and the one line printed on stderr.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// One line, without the `tessera:` prefix.
    pub message: String,
}

impl Failure {
    /// A failure with `code` and a one-line `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Failure {
            code,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The exit code for a library error, through its classifiers.
pub fn code_for(error: &tessera::Error) -> u8 {
    if error.is_invalid_input()
        || error.is_capacity_mismatch()
        || error.is_rate_mismatch()
        || matches!(error, tessera::Error::Unsupported(_))
    {
        USAGE
    } else if error.is_queue_full() {
        TEMPFAIL
    } else if error.is_not_found() || error.is_no_store() {
        NOT_FOUND
    } else if error.is_lost() {
        LOST
    } else {
        UNAVAILABLE
    }
}

impl From<tessera::Error> for Failure {
    fn from(error: tessera::Error) -> Self {
        let message = match &error {
            // The library names its API (`RateOptions::update`); here the flag does it.
            tessera::Error::RateMismatch {
                name,
                stored,
                declared,
            } => rate_mismatch(name, stored, declared, "--rate", "add --update-rates"),
            // Library messages carry no password (store URLs are redacted inside the library).
            _ => error.to_string(),
        };
        Failure::new(code_for(&error), one_line(&message))
    }
}

impl From<tessera::InvalidInput> for Failure {
    fn from(error: tessera::InvalidInput) -> Self {
        Failure::from(tessera::Error::from(error))
    }
}

/// The message of a rate mismatch, with the limits as a user writes them (`2/s, 5/min`),
/// the mode and margin named only where they differ, who declared the others (`--rate`, "this
/// request") and how to replace the stored ones. `stored` and `declared` are the library's
/// encoded configurations; one that does not decode is shown as it is.
pub fn rate_mismatch(name: &str, stored: &str, declared: &str, who: &str, update: &str) -> String {
    use tessera::backend::RateConfig;
    let (stored, declared) = match (RateConfig::decode(stored), RateConfig::decode(declared)) {
        (Some(s), Some(d)) => {
            let text = |c: &RateConfig| {
                let limits: Vec<String> = c.limits().iter().map(ToString::to_string).collect();
                let mut notes = Vec::new();
                if s.mode() != d.mode() {
                    notes.push(match c.mode() {
                        tessera::RateMode::Smooth { burst } => format!("smooth, burst {burst}"),
                        _ => "exact".to_string(),
                    });
                }
                if s.margin() != d.margin() {
                    notes.push(format!("margin {}", humantime::format_duration(c.margin())));
                }
                match notes.is_empty() {
                    true => limits.join(", "),
                    false => format!("{} ({})", limits.join(", "), notes.join(", ")),
                }
            };
            (text(&s), text(&d))
        }
        _ => (stored.to_string(), declared.to_string()),
    };
    format!(
        "rate limiter {name:?} has limits {stored} in the store, but {who} declared {declared}; \
         {update} to replace the stored limits"
    )
}

/// Collapses a message to one line, so every failure prints exactly one line.
pub fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The result every command returns: its exit code on success.
pub type Outcome = Result<u8, Failure>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rate_mismatch_shows_the_limits_as_written_and_how_to_replace_them() {
        let m = rate_mismatch(
            "sms",
            "exact+20ms|2/s,5/min",
            "exact+20ms|7/s",
            "this request",
            "send \"update\": true",
        );
        assert_eq!(
            m,
            "rate limiter \"sms\" has limits 2/s, 5/min in the store, but this request declared \
             7/s; send \"update\": true to replace the stored limits"
        );
        // Only what differs besides the limits is named.
        let m = rate_mismatch(
            "sms",
            "exact+20ms|2/s",
            "exact+50ms|2/s",
            "--rate",
            "add --update-rates",
        );
        assert!(
            m.contains(
                "limits 2/s (margin 20ms) in the store, but --rate declared 2/s (margin 50ms)"
            ),
            "{m}"
        );
        let m = rate_mismatch(
            "sms",
            "smooth:2|2/s",
            "exact|2/s",
            "--rate",
            "add --update-rates",
        );
        assert!(m.contains("2/s (smooth, burst 2) in the store"), "{m}");
        assert!(m.contains("declared 2/s (exact)"), "{m}");
        // A configuration this build cannot read is shown as stored.
        let m = rate_mismatch(
            "sms",
            "future|x",
            "exact|2/s",
            "--rate",
            "add --update-rates",
        );
        assert!(m.contains("limits future|x in the store"), "{m}");
    }
}
