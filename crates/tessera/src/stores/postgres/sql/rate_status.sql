-- tessera_rate_status: the state after pruning, with its whole log (at most N of the longest
-- limit plus reservations); the snapshot is computed by the client with the shared engine
-- (rate/engine.rs `status`), as with stores/redis/scripts/rate_status.lua. See
-- rate_common.sql for the invariants.
--
-- p_name  the limiter
--
-- One row: now_us always; the other columns NULL when the limiter has no state (none, or
-- expired: then it is dropped). Otherwise the row's columns (st_config … st_prev_tat, as
-- stored), st_expired (admissions given back past their use-by instant, migration 7) and
-- the log as two arrays in order of the running total, log_t (admit times) and
-- log_p (running totals); both NULL when the log is empty. A prune that moved `base` is
-- written back. Commits with the session's `synchronous_commit`.
CREATE OR REPLACE FUNCTION tessera_rate_status(
    p_name text,
    OUT now_us bigint, OUT st_config text, OUT st_seq bigint, OUT st_tail bigint,
    OUT st_last bigint, OUT st_prev_last bigint, OUT st_p bigint, OUT st_base bigint,
    OUT st_tat text, OUT st_prev_tat text, OUT log_t bigint[], OUT log_p bigint[],
    OUT st_expired bigint
)
LANGUAGE plpgsql AS $$
DECLARE
    r         tessera_rate_limiters;
    v_burst   bigint;
    v_horizon bigint;
    v_base    bigint;
BEGIN
    r := tessera__rate_lock(p_name, false);
    now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    PERFORM tessera__rate_sweep(p_name, now_us);
    IF r.name IS NULL THEN
        RETURN;
    END IF;
    PERFORM tessera__rate_check(r);
    IF r.expires_at <= now_us THEN
        PERFORM tessera__rate_drop(p_name);
        RETURN;
    END IF;
    SELECT l.burst, l.horizon INTO v_burst, v_horizon FROM tessera__rate_limits(r.config) l;
    IF v_burst = 0 THEN
        v_base := tessera__rate_prune(p_name, now_us - v_horizon);
        IF v_base IS NOT NULL THEN
            r.base := v_base;
            UPDATE tessera_rate_limiters l SET base = v_base WHERE l.name = p_name;
        END IF;
        SELECT array_agg(l.t ORDER BY l.p), array_agg(l.p ORDER BY l.p) INTO log_t, log_p
        FROM tessera_rate_log l WHERE l.name = p_name;
    END IF;
    st_config := r.config;
    st_seq := r.seq;
    st_tail := r.tail;
    st_last := r.last;
    st_prev_last := r.prev_last;
    st_p := r.p;
    st_base := r.base;
    st_tat := r.tat;
    st_prev_tat := r.prev_tat;
    st_expired := r.expired;
END $$;
