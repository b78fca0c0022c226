//! The conformance suite against the embedded SQLite store.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::sqlite());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::sqlite());
