//! The conformance suite on `redis+sentinel://` (a throwaway 1 master + 1 replica + 3
//! sentinels per test), plain and with `?wait=1`.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::redis_sentinel(""));
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::redis_sentinel(""));

mod wait_one {
    tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::redis_sentinel(
        "&wait=1"
    ));
}
