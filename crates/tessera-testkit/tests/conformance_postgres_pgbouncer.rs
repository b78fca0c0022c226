//! The conformance suite against a throwaway PostgreSQL server behind a throwaway PgBouncer
//! in session pooling mode, with PgBouncer's stock settings (which refuse unknown startup
//! parameters), per test.
tessera_testkit::conformance_tests!(tessera_testkit::harness::Harness::postgres_pgbouncer());
tessera_testkit::rate_conformance_tests!(tessera_testkit::harness::Harness::postgres_pgbouncer());
