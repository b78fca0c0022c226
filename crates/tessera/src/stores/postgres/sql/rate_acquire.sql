-- tessera_rate_acquire: prune -> check the limits -> earliest admissible time -> admit,
-- reserve or answer limited (all limits charged, or none); RateBackend::rate_acquire in one
-- call, following rate/engine.rs (`check_config`, `thresholds`, `earliest`, `decide`) as
-- stores/redis/scripts/rate_acquire.lua does. See rate_common.sql for the invariants.
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
    r         tessera_rate_limiters;
    v_sync    text;
    v_n       int := cardinality(p_n);
    v_tat     bigint[];
    v_prev    bigint[];
    v_horizon bigint := 0;
    v_replace boolean := false;
    v_pruned  boolean := false;
    v_t       bigint;
    v_x       bigint;
    v_at      bigint;
    v_slack   bigint;
    i         int;
BEGIN
    IF v_n IS NULL OR v_n = 0 OR cardinality(p_l) IS DISTINCT FROM v_n
       OR cardinality(p_t) IS DISTINCT FROM v_n THEN
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'tessera_rate_acquire: one N, L and T per limit';
    END IF;
    v_sync := current_setting('synchronous_commit');
    IF v_sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    r := tessera__rate_lock(p_name, true);
    -- The clock only now: clock_timestamp() in the locking statement could be read before
    -- the wait for the lock ended.
    now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    PERFORM tessera__rate_sweep(p_name, now_us);
    PERFORM tessera__rate_check(r);
    FOR i IN 1 .. v_n LOOP
        v_horizon := greatest(v_horizon, p_l[i]);
    END LOOP;

    IF r.expires_at <= now_us THEN
        -- No state: a placeholder, or a state that expired (its log goes). A fresh one.
        DELETE FROM tessera_rate_log WHERE name = p_name;
        r.config := p_config;
        r.seq := 0; r.tail := 0; r.last := 0; r.prev_last := 0; r.p := 0; r.base := 0;
        v_tat := array_fill(0::bigint, ARRAY[v_n]);
        v_prev := v_tat;
    ELSE
        v_tat := tessera__rate_tat(r.tat);
        v_prev := tessera__rate_tat(r.prev_tat);
        IF r.config <> p_config THEN
            IF NOT p_update THEN
                outcome := 'mismatch';
                stored := r.config;
                RETURN;
            END IF;
            -- Exact history is kept (it is the true admission history); smooth pacing
            -- restarts from max(now, last).
            v_t := greatest(now_us, r.last);
            r.config := p_config;
            v_tat := array_fill(v_t, ARRAY[v_n]);
            v_prev := v_tat;
            r.tail := 0;
            v_replace := true;
        ELSIF coalesce(cardinality(v_tat), 0) <> v_n OR coalesce(cardinality(v_prev), 0) <> v_n THEN
            PERFORM tessera__corrupt(format('rate limiter %L: %s pacing values for %s limits',
                left(p_name, 64), coalesce(cardinality(v_tat), 0), v_n));
        END IF;
        IF p_burst = 0 THEN
            v_x := tessera__rate_prune(p_name, now_us - v_horizon);
            IF v_x IS NOT NULL THEN
                r.base := v_x;
                v_pruned := true;
            END IF;
        END IF;
    END IF;

    -- The earliest admissible time.
    v_t := greatest(now_us, r.last);
    IF p_burst = 0 THEN
        FOR i IN 1 .. v_n LOOP
            -- The first entry with P >= p - N + k binds: admissible from its time + L.
            v_x := r.p + p_cost - p_n[i];
            IF v_x > r.base THEN
                SELECT l.t INTO v_at FROM tessera_rate_log l
                WHERE l.name = p_name AND l.p >= v_x ORDER BY l.p LIMIT 1;
                IF NOT FOUND THEN
                    PERFORM tessera__corrupt(format(
                        'rate log has no entry at or above running total %s (total %s)', v_x, r.p));
                END IF;
                v_t := greatest(v_t, greatest(v_at, 0) + p_l[i]);
            END IF;
        END LOOP;
    ELSE
        v_slack := greatest(p_burst - p_cost, 0);
        FOR i IN 1 .. v_n LOOP
            v_t := greatest(v_t, v_tat[i] - v_slack * p_t[i]);
        END LOOP;
    END IF;

    IF (p_max_wait IS NULL AND v_t <> now_us) OR v_t - now_us > p_max_wait THEN
        -- Nothing charged. Entries that no longer change any answer were pruned: base must
        -- follow them; limits replaced by update stay replaced (as in the memory store).
        IF v_pruned OR v_replace THEN
            PERFORM tessera__rate_save(r, v_tat, v_prev,
                tessera__rate_expiry(r.last, v_tat, p_burst, v_horizon));
        END IF;
        outcome := 'limited';
        at_us := v_t;
        RETURN;
    END IF;

    r.prev_last := r.last;
    r.last := v_t;
    r.seq := r.seq + 1;
    r.tail := r.seq;
    IF p_burst = 0 THEN
        r.p := r.p + p_cost;
        INSERT INTO tessera_rate_log (name, p, t) VALUES (p_name, r.p, v_t);
    ELSE
        v_prev := v_tat;
        FOR i IN 1 .. v_n LOOP
            v_tat[i] := greatest(v_tat[i], v_t) + p_cost * p_t[i];
        END LOOP;
    END IF;
    PERFORM tessera__rate_save(r, v_tat, v_prev,
        tessera__rate_expiry(r.last, v_tat, p_burst, v_horizon));
    IF v_sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', v_sync, true);
    END IF;
    outcome := 'admitted';
    at_us := v_t;
    reservation := r.seq;
END $$;
