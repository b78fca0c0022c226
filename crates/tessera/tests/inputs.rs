//! Bad inputs of every kind get a typed error, never a panic: names, capacities, weights,
//! TTLs, store URLs and rate specs, as arbitrary values (proptest). Stores used: the
//! in-memory one and SQLite in a temporary directory; no generated URL reaches the network.

use std::str::FromStr;
use std::time::Duration;

use proptest::prelude::*;
use tessera::backend::Name;
use tessera::*;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// The documented rule: 1-128 bytes of `A-Z a-z 0-9 . _ - : / @`, first alphanumeric.
fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_LEN
        && s.as_bytes()[0].is_ascii_alphanumeric()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:/@".contains(&b))
}

fn names() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        "[A-Za-z0-9._:/@-]{0,140}",
        "[A-Za-z0-9][A-Za-z0-9._:/@ {}*?-]{0,130}",
        "\\PC{0,3}",
    ]
}

const MAX_RATE_PERIOD_US: u64 = 7 * 24 * 3600 * 1_000_000;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn names_are_valid_exactly_by_the_documented_rule(s in names()) {
        let parsed = Name::new(s.clone());
        prop_assert_eq!(parsed.is_ok(), valid_name(&s), "{:?}: {:?}", s, parsed);
        if let Err(e) = parsed {
            let is_name = matches!(e, InvalidInput::Name { .. });
            prop_assert!(is_name, "{:?}", e);
            prop_assert!(Error::from(e).is_invalid_input());
        }
    }

    #[test]
    fn every_store_entry_point_checks_names(s in names()) {
        let rt = runtime();
        rt.block_on(async {
            let store = Store::connect("memory://inputs-names").await.unwrap();
            let ok = valid_name(&s);
            let results = [
                store.semaphore(&s, 1).err(),
                store.lock(&s).err(),
                store.rate_limiter(&s, &[RateSpec::per_second(1).unwrap()]).err(),
                store.status(&s).await.err(),
                store.delete(&s).await.err(),
                store.resize(&s, 1).await.err(),
                store.rate_status(&s).await.err(),
            ];
            for r in results {
                match r {
                    None => prop_assert!(ok, "{:?} accepted", s),
                    Some(e) => {
                        if !ok {
                            prop_assert!(e.is_invalid_input(), "{:?}: {:?}", s, e);
                        } else {
                            // A valid name: only answers about the (absent) semaphore.
                            prop_assert!(e.is_not_found(), "{:?}: {:?}", s, e);
                        }
                    }
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn capacities_and_weights(capacity in prop_oneof![0u32..=8, any::<u32>(), 999_990u32..=1_000_010],
                              weight in prop_oneof![0u32..=10, any::<u32>()]) {
        let rt = runtime();
        rt.block_on(async {
            let store = Store::connect("memory://inputs-capacity").await.unwrap();
            let valid = (1..=MAX_CAPACITY).contains(&capacity);
            match store.semaphore("cap", capacity) {
                Ok(_) => {
                    prop_assert!(valid, "capacity {} accepted", capacity);
                    let name = format!("w{capacity}");
                    let sem = Semaphore::new(&store, &name, capacity, SemaphoreOptions::default()).unwrap();
                    prop_assert_eq!(sem.capacity(), capacity);
                    let r = sem.try_acquire_many(weight).await;
                    if weight == 0 || weight > capacity {
                        let e = r.unwrap_err();
                        prop_assert!(e.is_invalid_input(), "{:?}", e);
                        // Nothing changed.
                        prop_assert!(store.status(&name).await.unwrap().is_none());
                    } else {
                        let p = r.unwrap().expect("free");
                        prop_assert_eq!(p.weight(), weight);
                        p.release().await.unwrap();
                    }
                }
                Err(e) => {
                    prop_assert!(!valid, "capacity {}: {:?}", capacity, e);
                    prop_assert!(e.is_invalid_input(), "{:?}", e);
                }
            }
            let resized = store.resize("cap", capacity).await.unwrap_err();
            if valid {
                prop_assert!(resized.is_not_found(), "{:?}", resized);
            } else {
                prop_assert!(resized.is_invalid_input(), "{:?}", resized);
            }
            Ok(())
        })?;
    }

    #[test]
    fn ttls(secs in prop_oneof![0u64..=3, any::<u64>(), 86_399u64..=86_401], nanos in 0u32..1_000_000_000) {
        let ttl = Duration::new(secs, nanos);
        let rt = runtime();
        rt.block_on(async {
            let store = Store::connect("memory://inputs-ttl").await.unwrap();
            let valid = (MIN_TTL..=MAX_TTL).contains(&ttl);
            for opts in [
                SemaphoreOptions::default().ttl(ttl),
                SemaphoreOptions::default().waiter_ttl(ttl),
            ] {
                match Semaphore::new(&store, "ttl", 2, opts) {
                    Ok(sem) => {
                        prop_assert!(valid, "{:?} accepted", ttl);
                        sem.try_acquire().await.unwrap().unwrap().release().await.unwrap();
                    }
                    Err(e) => {
                        prop_assert!(!valid, "{:?}: {:?}", ttl, e);
                        let is_ttl = matches!(e, Error::InvalidInput(InvalidInput::Ttl { .. }));
                        prop_assert!(is_ttl, "{:?}", e);
                    }
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn rate_specs_parse_or_fail_typed_and_round_trip(
        s in prop_oneof![
            any::<String>(),
            "[0-9]{0,12}/[0-9]{0,12}(us|ms|s|sec|second|min|minute|h|hour|d|day|m|x|)",
            " ?[0-9]{1,7} ?/ ?[0-9]{0,4}(ms|s|min|h|d) ?",
            "[0-9/a-z ]{0,12}",
        ]
    ) {
        match RateSpec::from_str(&s) {
            Ok(spec) => {
                prop_assert!((1..=1_000_000).contains(&spec.count()), "{:?}", spec);
                let us = spec.period().as_micros();
                prop_assert!((1_000..=u128::from(MAX_RATE_PERIOD_US)).contains(&us), "{:?}", spec);
                let shown = spec.to_string();
                prop_assert_eq!(RateSpec::from_str(&shown).unwrap(), spec, "{}", shown);
                prop_assert_eq!(RateSpec::new(spec.count(), spec.period()).unwrap(), spec);
            }
            Err(e) => {
                let is_rate = matches!(e, InvalidInput::Rate { .. });
                prop_assert!(is_rate, "{:?}", e);
                prop_assert!(e.to_string().len() < 300);
            }
        }
    }

    #[test]
    fn rate_spec_new_accepts_exactly_the_documented_range(count in prop_oneof![0u32..3, any::<u32>()],
                                                         micros in prop_oneof![0u64..2_000, any::<u64>(), MAX_RATE_PERIOD_US - 1..MAX_RATE_PERIOD_US + 2],
                                                         nanos in prop_oneof![Just(0u32), 0u32..1_000]) {
        let period = Duration::from_micros(micros) + Duration::from_nanos(u64::from(nanos));
        let valid = (1..=1_000_000).contains(&count)
            && (1_000..=MAX_RATE_PERIOD_US).contains(&micros)
            && nanos == 0;
        match RateSpec::new(count, period) {
            Ok(spec) => {
                prop_assert!(valid, "{} per {:?} accepted", count, period);
                prop_assert_eq!(RateSpec::from_str(&spec.to_string()).unwrap(), spec);
            }
            Err(e) => {
                let is_rate = matches!(e, InvalidInput::Rate { .. });
                prop_assert!(!valid && is_rate, "{:?}", e);
            }
        }
    }

    #[test]
    fn store_urls_never_panic_and_unknown_schemes_are_invalid_input(
        s in prop_oneof![
            any::<String>(),
            "[a-z+]{0,10}://[ -~]{0,30}",
            "memory://[ -~]{0,20}",
            "(memory|sqlite|redis|rediss|postgres|etcd|MEMORY|nosuch):?/{0,3}[ -~]{0,20}",
        ]
    ) {
        let scheme = s.split_once("://").map(|(scheme, _)| scheme);
        // Never reach the network or the file system outside a temporary directory:
        // redis and sqlite URLs are generated separately below; the URLs of the other
        // server stores name servers, which a well-formed one would be looked up and
        // connected to (`etcd://A0-` asked DNS for `A0-`); their parsing is tested in each
        // store's url.rs, without connecting.
        prop_assume!(!matches!(
            scheme,
            Some(
                "sqlite"
                    | "redis"
                    | "rediss"
                    | "redis+sentinel"
                    | "redis+cluster"
                    | "postgres"
                    | "postgresql"
                    | "mysql"
                    | "mariadb"
                    | "etcd"
                    | "etcds"
            )
        ));
        let rt = runtime();
        let r = rt.block_on(Store::connect(&s));
        match (scheme, r) {
            (Some("memory"), Ok(store)) => prop_assert!(rt.block_on(store.status("x")).is_ok()),
            (Some("memory"), Err(e)) => prop_assert!(e.is_invalid_input(), "{:?}: {:?}", s, e),
            (_, Ok(_)) => prop_assert!(false, "{:?} accepted", s),
            (_, Err(e)) => {
                prop_assert!(e.is_invalid_input(), "{:?}: {:?}", s, e);
                let is_url = matches!(e, Error::InvalidInput(InvalidInput::StoreUrl { .. }));
                prop_assert!(is_url, "{:?}", e);
            }
        }
    }

    #[test]
    fn sqlite_urls_in_a_temporary_directory_never_panic(tail in "[ -~]{0,24}") {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/t.db{tail}", dir.path().display());
        let rt = runtime();
        rt.block_on(async {
            match Store::connect(&url).await {
                Ok(store) => {
                    prop_assert!(store.status("x").await.unwrap().is_none());
                }
                Err(e) => {
                    let typed = e.is_invalid_input() || matches!(e, Error::Store { .. });
                    prop_assert!(typed, "{:?}: {:?}", url, e);
                }
            }
            Ok(())
        })?;
    }

    #[test]
    fn redis_urls_are_parsed_without_touching_a_remote_host(
        user in "[a-z]{0,4}", pw in "[A-Za-z0-9@:%._ -]{0,8}",
        path in "(/[0-9a-z]{0,3})?", query in "(\\?[a-z=&]{0,20})?",
    ) {
        // Loopback port 1 (closed): either an invalid URL or a refused connection.
        let url = format!("redis://{user}:{pw}@127.0.0.1:1{path}{query}");
        if let Ok(u) = url::Url::parse(&url) {
            prop_assume!(u.host_str() == Some("127.0.0.1"));
            prop_assume!(u.port() == Some(1));
        }
        let rt = runtime();
        match rt.block_on(Store::connect(&url)) {
            Ok(_) => prop_assert!(false, "{:?} connected to a closed port", url),
            Err(e) => prop_assert!(
                e.is_invalid_input() || e.is_connection(),
                "{:?}: {:?}", url, e
            ),
        }
    }
}
