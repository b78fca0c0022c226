-- tessera_rate_cancel: returns the latest admission if it is the one named and not yet due;
-- RateBackend::rate_cancel in one call, following rate/engine.rs `cancel` as
-- stores/redis/scripts/rate_cancel.lua does. See rate_common.sql for the invariants.
--
-- p_name         the limiter
-- p_reservation  the admission's id (RateReply::Admitted's reservation)
-- p_at           its admit time, µs: ids restart with a fresh state, but a stale id's time
--                has passed by then, so the pair never names a new reservation
--
-- Returns true if it was returned (last, and in exact mode the running total, roll back; in
-- smooth mode the pacing values), false if not (nothing changed but the sweep, or an expired
-- state dropped). Commits with the session's `synchronous_commit`.
CREATE OR REPLACE FUNCTION tessera_rate_cancel(p_name text, p_reservation bigint, p_at bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r         tessera_rate_limiters;
    v_now     bigint;
    v_burst   bigint;
    v_horizon bigint;
    v_n       int;
    v_tat     bigint[];
    v_prev    bigint[];
    v_top     bigint;
BEGIN
    r := tessera__rate_lock(p_name, false);
    v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    PERFORM tessera__rate_sweep(p_name, v_now);
    IF r.name IS NULL THEN
        RETURN false;
    END IF;
    PERFORM tessera__rate_check(r);
    IF r.expires_at <= v_now THEN
        PERFORM tessera__rate_drop(p_name);
        RETURN false;
    END IF;
    SELECT l.burst, l.n, l.horizon INTO v_burst, v_n, v_horizon
    FROM tessera__rate_limits(r.config) l;
    v_tat := tessera__rate_tat(r.tat);
    v_prev := tessera__rate_tat(r.prev_tat);
    IF coalesce(cardinality(v_tat), 0) <> v_n OR coalesce(cardinality(v_prev), 0) <> v_n THEN
        PERFORM tessera__corrupt(format('rate limiter %L: %s pacing values for %s limits',
            left(p_name, 64), coalesce(cardinality(v_tat), 0), v_n));
    END IF;
    IF p_reservation = 0 OR r.tail <> p_reservation OR r.last <> p_at OR p_at <= v_now THEN
        RETURN false;
    END IF;
    r.last := r.prev_last;
    r.tail := 0;
    IF v_burst = 0 THEN
        DELETE FROM tessera_rate_log WHERE name = p_name AND p = r.p;
        SELECT max(l.p) INTO v_top FROM tessera_rate_log l WHERE l.name = p_name;
        r.p := coalesce(greatest(v_top, 0), r.base);
    ELSE
        v_tat := v_prev;
    END IF;
    PERFORM tessera__rate_save(r, v_tat, v_prev,
        tessera__rate_expiry(r.last, v_tat, v_burst, v_horizon));
    RETURN true;
END $$;
