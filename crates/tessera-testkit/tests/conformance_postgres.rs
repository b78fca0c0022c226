//! The conformance suite against a throwaway PostgreSQL server per test.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::postgres());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::postgres());
