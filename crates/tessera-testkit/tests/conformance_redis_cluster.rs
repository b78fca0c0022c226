//! The conformance suite on `redis+cluster://` (a throwaway 3-primary cluster per test).
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::redis_cluster(false));
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::redis_cluster(false));
