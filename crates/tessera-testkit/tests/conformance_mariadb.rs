//! The conformance suite against a throwaway MariaDB per test (`mysql://`).
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::mariadb());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::mariadb());
