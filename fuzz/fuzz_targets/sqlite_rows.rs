//! Column text read back from the SQLite store (`tessera::fuzzing::sqlite_rows`): a holder's
//! seats (`"0-3,7"`), a lease id, a rate limiter's stored configuration and pacing values. A
//! row is whatever the file holds (another version, a hand edit), so it is arbitrary input.
//!
//! Properties, beyond "no panic":
//! - unreadable text is `Error::Corrupt` (a lease id: `InvalidInput::LeaseId`);
//! - seats that decode are strictly ascending and number the weight, and encode back to text
//!   that decodes to the same seats; ascending seats round-trip through their text;
//! - a lease id that parses prints back as the same 32 hex digits (case aside); a stored
//!   configuration that decodes round-trips (see the `rate_spec` target).
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use tessera::fuzzing::sqlite_rows as rows;
use tessera::backend::RateConfig;
use tessera::LeaseId;

#[derive(Arbitrary, Debug)]
enum Input {
    /// The seats column of a holder of `weight`.
    Seats { text: String, weight: u32 },
    /// Ascending seats, from first seat and gaps.
    SeatRuns { first: u32, gaps: Vec<u8> },
    /// A lease id column.
    LeaseId(String),
    /// A stored rate configuration column.
    Config(String),
    /// A `tat` column.
    Tat(String),
}

fuzz_target!(|input: Input| match input {
    Input::Seats { text, weight } => {
        // Small weights too, so valid texts are found.
        for weight in [weight, weight % 64] {
            match rows::decode_seats(&text, weight) {
                Ok(seats) => {
                    assert_eq!(seats.len() as u64, weight as u64, "{text:?}");
                    assert!(seats.windows(2).all(|w| w[0] < w[1]), "{text:?}: {seats:?}");
                    let again = rows::encode_seats(&seats);
                    assert_eq!(rows::decode_seats(&again, weight).unwrap(), seats);
                }
                Err(e) => assert!(e.is_corrupt(), "{text:?}: {e:?}"),
            }
        }
    }
    Input::SeatRuns { first, gaps } => {
        let mut seats = vec![first];
        for g in gaps {
            match seats.last().unwrap().checked_add(u32::from(g) + 1) {
                Some(s) => seats.push(s),
                None => break,
            }
        }
        let text = rows::encode_seats(&seats);
        let weight = seats.len() as u32;
        assert_eq!(
            rows::decode_seats(&text, weight).unwrap(),
            seats,
            "{text:?}"
        );
    }
    Input::LeaseId(s) => {
        if let Ok(id) = s.parse::<LeaseId>() {
            assert_eq!(id.to_string(), s.to_ascii_lowercase());
            assert_eq!(id.to_string().parse::<LeaseId>().unwrap(), id);
        }
    }
    Input::Config(s) => {
        if let Some(c) = RateConfig::decode(&s) {
            assert_eq!(RateConfig::decode(&c.encode()), Some(c));
        }
    }
    Input::Tat(s) => match rows::decode_tat(&s) {
        Ok(v) => {
            let text = v.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
            assert_eq!(rows::decode_tat(&text).unwrap(), v);
        }
        Err(e) => assert!(e.is_corrupt(), "{s:?}: {e:?}"),
    },
});
