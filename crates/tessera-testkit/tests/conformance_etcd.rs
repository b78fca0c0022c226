//! The conformance suite against a throwaway single-member etcd per test.
//!
//! etcd leases are whole seconds, at least 2 s ([`tessera::backend::Capabilities`] of the
//! store), so the tests whose TTLs are shorter or fractional (they check expiry bounds at
//! the 100 ms scale) cannot run here as written; `crates/tessera-testkit/tests/etcd_store.rs` checks
//! the same properties with whole-second TTLs.
tessera_testkit::conformance_tests!(@whole_seconds tessera_testkit::harness::Harness::etcd());
