//! The conformance suite against a throwaway single-member etcd per test.
//!
//! etcd leases are whole seconds, at least 2 s ([`tessera::backend::Capabilities`] of the
//! store), so the tests whose TTLs are shorter or fractional (they check expiry bounds at
//! the 100 ms scale) cannot run here as written; `crates/tessera-testkit/tests/etcd_store.rs` checks
//! the same properties with whole-second TTLs.
tessera_testkit::conformance_tests!(@each tessera_testkit::harness::Harness::etcd();
    never_over_grants_under_concurrency_and_cancellation,
    waiters_are_served_in_arrival_order,
    large_acquire_is_not_starved_by_smaller_ones,
    try_acquire_does_not_jump_the_queue,
    lost_fires_on_revoke,
    lost_fires_when_the_semaphore_is_deleted,
    release_renew_and_acquire_retries_are_idempotent,
    dropped_and_timed_out_acquires_leak_nothing,
    grant_racing_with_cancellation_is_given_back,
    racing_ends_of_one_lease_free_its_permit_once,
    capacity_mismatch_is_refused_and_changes_nothing,
    resize_grows_to_the_queue_and_shrinks_without_revoking,
    fences_increase_and_seats_are_distinct,
    fences_never_repeat_after_delete,
    queue_cap_is_enforced,
    waiter_rides_out_a_store_blip_shorter_than_its_ttl,
    acquire_is_retried_through_a_store_blip,
    waiter_is_woken_without_waiting_for_its_heartbeat,
    an_expired_lease_reaches_the_waiter_without_waiting_for_its_heartbeat,
    nothing_is_left_after_all_leases_end,
    ping_answers_and_changes_nothing,
    close_releases_every_held_permit_and_tells_its_holder,
    lock_is_mutually_exclusive,
    semaphore_of_one_is_mutually_exclusive,
    lock_try_and_timeout_answer_without_holding,
    lock_waiters_are_served_in_order
);
