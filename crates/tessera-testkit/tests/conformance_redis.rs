//! The conformance suite against a throwaway redis-server per test.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::redis());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::redis());
