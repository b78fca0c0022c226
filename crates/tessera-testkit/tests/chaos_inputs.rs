//! Bad input to the chaos runner and its worker never panics, and what they accept is what
//! they should: property tests over store specs and worker command lines.

use clap::Parser;
use proptest::prelude::*;
use tessera_testkit::chaos::StoreSpec;
use tessera_testkit::worker::WorkerArgs;

proptest! {
    #[test]
    fn any_store_spec_parses_or_errors_without_panicking(s in ".{0,80}") {
        let _ = StoreSpec::parse(&s);
    }

    #[test]
    fn only_loopback_redis_urls_are_accepted(
        host in "[a-z0-9.]{1,20}",
        port in 1u16..,
    ) {
        let url = format!("redis://{host}:{port}");
        let loopback = host == "127.0.0.1" || host == "localhost";
        prop_assert_eq!(StoreSpec::parse(&url).is_ok(), loopback, "{}", url);
    }

    #[test]
    fn sqlite_specs_need_an_absolute_path(path in "[a-z/._-]{0,30}") {
        let spec = StoreSpec::parse(&format!("sqlite://{path}"));
        prop_assert_eq!(spec.is_ok(), path.is_empty() || path.starts_with('/'));
    }

    #[test]
    fn worker_arguments_survive_the_command_line(
        permits in 1u32..100,
        ops in 0u64..1_000_000,
        ttl_ms in 1u64..100_000,
        seed in proptest::option::of(any::<u64>()),
        timeout_ms_max in proptest::option::of(0u64..100_000),
        waiters in proptest::option::of(1u32..20_000),
        name in "[a-z][a-z0-9._:/@-]{0,40}",
        worker in "[a-z0-9-]{1,10}",
    ) {
        let mut a = WorkerArgs::new("memory://x", &name, permits, "/tmp/w.jsonl".into(), &worker);
        a.ops = ops;
        a.ttl_ms = ttl_ms;
        a.seed = seed;
        a.timeout_ms_max = timeout_ms_max;
        a.waiters = waiters;
        a.fenced = Some("127.0.0.1:9".into());
        let argv = std::iter::once("tessera-worker".to_string()).chain(a.to_args());
        let b = WorkerArgs::try_parse_from(argv).unwrap();
        prop_assert_eq!(format!("{a:?}"), format!("{b:?}"));
    }

    #[test]
    fn garbage_worker_command_lines_are_refused_not_panicked_on(
        args in proptest::collection::vec("[-a-z0-9=.:/ ]{0,12}", 0..8),
    ) {
        let argv = std::iter::once("tessera-worker".to_string()).chain(args);
        let _ = WorkerArgs::try_parse_from(argv);
    }
}
