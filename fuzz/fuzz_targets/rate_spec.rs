//! Rate specs and the stored text of a limiter's configuration: `RateSpec::from_str`,
//! `RateSpec::new`, `RateConfig::new`, `RateConfig::encode` and `RateConfig::decode`.
//!
//! Properties, beyond "no panic":
//! - a spec that parses prints to a text that parses back to the same spec, and that text is
//!   canonical (it prints to itself);
//! - `decode` takes any text (it is read back from a store) and what it decodes round-trips:
//!   `decode(encode(c)) == c`, and `encode` of that is the same text again. Nothing here
//!   depends on the encoding's exact fields, so the target stays valid when they change;
//! - a configuration built from any limits and mode round-trips through its text.
#![no_main]

use std::time::Duration;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::backend::RateConfig;
use tessera::{RateMode, RateSpec};

#[derive(Arbitrary, Debug)]
enum Input {
    /// `RateSpec::from_str` of any text.
    Spec(String),
    /// `RateConfig::decode` of any text.
    Stored(String),
    /// A configuration built from `(count, period in ns)` limits.
    Built {
        limits: Vec<(u32, u64)>,
        smooth: Option<u32>,
    },
}

fn spec_round_trips(spec: RateSpec) {
    let text = spec.to_string();
    let back: RateSpec = text
        .parse()
        .unwrap_or_else(|e| panic!("{spec:?} prints as {text:?}, which does not parse: {e}"));
    assert_eq!(back, spec, "{text:?}");
    assert_eq!(back.to_string(), text);
}

fn config_round_trips(config: &RateConfig) {
    let text = config.encode();
    let back = RateConfig::decode(&text)
        .unwrap_or_else(|| panic!("{config:?} encodes as {text:?}, which does not decode"));
    assert_eq!(&back, config, "{text:?}");
    assert_eq!(back.encode(), text);
    assert_eq!(config.to_string(), text);
    for &l in config.limits() {
        spec_round_trips(l);
    }
}

fuzz_target!(|input: Input| match input {
    Input::Spec(s) => {
        if let Ok(spec) = s.parse::<RateSpec>() {
            assert!(spec.count() >= 1 && spec.period() >= Duration::from_millis(1));
            spec_round_trips(spec);
        }
    }
    Input::Stored(s) => {
        if let Some(config) = RateConfig::decode(&s) {
            config_round_trips(&config);
        }
    }
    Input::Built { limits, smooth } => {
        let specs: Vec<RateSpec> = limits
            .iter()
            .filter_map(|&(n, ns)| RateSpec::new(n, Duration::from_nanos(ns)).ok())
            .collect();
        for &s in &specs {
            spec_round_trips(s);
        }
        let mode = match smooth {
            None => RateMode::Exact,
            Some(burst) => RateMode::Smooth { burst },
        };
        if let Ok(config) = RateConfig::new(&specs, mode) {
            config_round_trips(&config);
        }
    }
});
