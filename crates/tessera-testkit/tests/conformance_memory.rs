//! The conformance suite against the in-memory reference store.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::memory());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::memory());
