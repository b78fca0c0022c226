-- tessera_rate_acquire: prune -> check the limits -> earliest admissible time -> admit,
-- reserve or answer limited (all limits charged, or none); RateBackend::rate_acquire in one
-- call, following rate/engine.rs (`check_config`, `thresholds`, `earliest`, `decide`) as
-- stores/redis/scripts/rate_acquire.lua does. The step is tessera__rate_step
-- (rate_common.sql, shared with tessera_admit), which states the invariants; this function
-- adds the commit's durability.
--
-- p_name      the limiter
-- p_config    its canonical limits as the client declares them (RateConfig::encode)
-- p_n         N of each limit, in the configuration's order
-- p_l         the enforced window of each limit (period plus margin), µs
-- p_t         the smooth-mode emission interval of each limit, ceil(window / N), µs
-- p_burst     the smooth-mode burst; 0 in exact mode
-- p_cost      the request's cost k, 1 <= k <= the largest cost (checked by the client)
-- p_max_wait  NULL: admit now or answer limited (try); otherwise reserve the earliest
--             admissible time if it is at most this many µs from now
-- p_update    replace differing stored limits instead of answering 'mismatch'
--
-- One row: outcome 'admitted' (at_us, now_us, reservation), 'limited' (at_us = the earliest
-- admissible time, now_us) or 'mismatch' (stored = the stored limits, now_us). A limited
-- request changes nothing but what pruning, the sweep or an update of the limits changed.
--
-- Durability: only an admission must survive a crash (a lost one could be admitted again);
-- a step that admits nothing commits asynchronously (what it may lose in a server crash,
-- pruned entries or swept limiters, is done again by the next step), one that admits with
-- the session's own `synchronous_commit` (on by default), as tessera__durable does for the
-- semaphores.
CREATE OR REPLACE FUNCTION tessera_rate_acquire(
    p_name text, p_config text, p_n bigint[], p_l bigint[], p_t bigint[], p_burst bigint,
    p_cost bigint, p_max_wait bigint, p_update boolean,
    OUT outcome text, OUT at_us bigint, OUT now_us bigint, OUT reservation bigint,
    OUT stored text
)
LANGUAGE plpgsql AS $$
DECLARE
    v_sync text;
BEGIN
    v_sync := current_setting('synchronous_commit');
    IF v_sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT s.outcome, s.at_us, s.now_us, s.reservation, s.stored
    INTO outcome, at_us, now_us, reservation, stored
    FROM tessera__rate_step(p_name, p_config, p_n, p_l, p_t, p_burst, p_cost, p_max_wait,
                            p_update) s;
    IF outcome = 'admitted' AND v_sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', v_sync, true);
    END IF;
END $$;
