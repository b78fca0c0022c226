-- tessera PostgreSQL store, migration 3: the rate step on the server. This file holds the
-- helpers shared by the rate functions (rate_acquire.sql, rate_cancel.sql,
-- rate_status.sql, rate_delete.sql); none commits or decides anything itself. The decision
-- follows crates/tessera/src/rate/engine.rs line by line, as the Redis scripts do
-- (stores/redis/scripts/rate_*.lua), over the tables of migration 2 (rate_schema.sql),
-- which keep their meaning: a row written by a build that ran the step on the client reads
-- the same here.
--
-- Invariants of every rate function:
-- - The limiter's row is locked (`SELECT … FOR UPDATE`, tessera__rate_lock) before anything
--   else is read; an acquire inserts a placeholder first if the name has none (expired at
--   birth, `expires_at = 0`: it reads as "no state"), so two first requests of one name
--   queue on one row. A row deleted by a concurrent sweep between the insert and the lock is
--   inserted again (at most 8 times, then SQLSTATE 40001, which the client retries).
-- - The clock (`clock_timestamp()`, the server's, never the client's) is read once, after
--   the lock: every time of the step is that one.
-- - Bounded work besides the limiter's own log: at most 16 other limiters whose state
--   expired are swept per call, with `FOR UPDATE SKIP LOCKED`, so two steps never wait on
--   each other's rows. Pruning drops only the log entries older than the longest window.
-- - Every value read is checked; a wrong one raises SQLSTATE TS001 (Error::Corrupt).
--
-- Runs inside the migration transaction (mod.rs `migrate`), after migration 2; every
-- statement is `CREATE OR REPLACE`, so running it again changes nothing.

-- Locks limiter `p_name`'s row and returns it. Without a row: with `p_create`, inserts a
-- placeholder and locks that; without, returns NULL (nothing to lock, nothing to change).
CREATE OR REPLACE FUNCTION tessera__rate_lock(p_name text, p_create boolean)
RETURNS tessera_rate_limiters
LANGUAGE plpgsql AS $$
DECLARE
    r       tessera_rate_limiters;
    attempt int := 0;
BEGIN
    LOOP
        SELECT * INTO r FROM tessera_rate_limiters WHERE name = p_name FOR UPDATE;
        IF FOUND THEN
            RETURN r;
        END IF;
        IF NOT p_create THEN
            RETURN NULL;
        END IF;
        attempt := attempt + 1;
        IF attempt > 8 THEN
            RAISE EXCEPTION USING ERRCODE = '40001',
                MESSAGE = format('rate limiter %L: its row kept vanishing', left(p_name, 64));
        END IF;
        -- A concurrent step may delete it (swept as expired) before we lock it: then the
        -- select above finds nothing and this runs again.
        INSERT INTO tessera_rate_limiters
            (name, config, seq, tail, last, prev_last, p, base, tat, prev_tat, expires_at)
        VALUES (p_name, '', 0, 0, 0, 0, 0, 0, '', '', 0)
        ON CONFLICT (name) DO NOTHING;
    END LOOP;
END $$;

-- Deletes up to 16 other limiters whose state expired by `p_now`, and their logs. Rows
-- locked by a running step are skipped.
CREATE OR REPLACE FUNCTION tessera__rate_sweep(p_name text, p_now bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (
        DELETE FROM tessera_rate_limiters
        WHERE name IN (
            SELECT l.name FROM tessera_rate_limiters l
            WHERE l.expires_at <= p_now AND l.name <> p_name
            ORDER BY l.expires_at LIMIT 16
            FOR UPDATE SKIP LOCKED)
        RETURNING name)
    DELETE FROM tessera_rate_log WHERE name IN (SELECT g.name FROM gone g);
END $$;

-- Deletes limiter `p_name`'s log and row.
CREATE OR REPLACE FUNCTION tessera__rate_drop(p_name text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM tessera_rate_log WHERE name = p_name;
    DELETE FROM tessera_rate_limiters WHERE name = p_name;
END $$;

-- Checks the integers of a row read back: none may be negative.
CREATE OR REPLACE FUNCTION tessera__rate_check(r tessera_rate_limiters) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF r.seq < 0 OR r.tail < 0 OR r.last < 0 OR r.prev_last < 0 OR r.p < 0 OR r.base < 0
       OR r.expires_at < 0 THEN
        PERFORM tessera__corrupt(format(
            'rate limiter %L: seq %s, tail %s, last %s, prev_last %s, p %s, base %s, expires_at %s: a value is negative',
            left(r.name, 64), r.seq, r.tail, r.last, r.prev_last, r.p, r.base, r.expires_at));
    END IF;
END $$;

-- The pacing values of a row ('' or comma-separated non-negative integers).
CREATE OR REPLACE FUNCTION tessera__rate_tat(s text) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF s IS NULL OR s !~ '^([0-9]{1,18}(,[0-9]{1,18})*)?$' THEN
        PERFORM tessera__corrupt(format('rate tat %L', left(s, 64)));
    END IF;
    IF s = '' THEN
        RETURN '{}'::bigint[];
    END IF;
    RETURN string_to_array(s, ',')::bigint[];
END $$;

-- The burst (0 in exact mode), the number of limits and the longest enforced window, in µs,
-- of a stored configuration (RateConfig::encode: `exact|50/s,1000/min`, `smooth:2+20ms|10/s`):
-- RateConfig::horizon_us, the longest period plus the margin. An acquire gets these from the
-- client with its declared limits; cancel and status, which get no limits, read the stored
-- ones here.
CREATE OR REPLACE FUNCTION tessera__rate_limits(
    config text, OUT burst bigint, OUT n int, OUT horizon bigint
)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m    text[];
    lim  text;
    unit text;
    us   bigint;
BEGIN
    m := regexp_match(config,
        '^(exact|smooth:([0-9]{1,10}))(\+([0-9]{1,12})(us|ms|s))?\|([0-9a-z/,]+)$');
    IF m IS NULL THEN
        PERFORM tessera__corrupt(format('rate limits %L are unreadable', left(config, 64)));
    END IF;
    burst := coalesce(m[2]::bigint, 0);
    IF m[2] IS NOT NULL AND burst = 0 THEN
        PERFORM tessera__corrupt(format('rate limits %L: a smooth burst of 0', left(config, 64)));
    END IF;
    horizon := 0;
    n := 0;
    FOREACH lim IN ARRAY string_to_array(m[6], ',') LOOP
        m := regexp_match(lim, '^[0-9]{1,10}/([0-9]{0,12})(us|ms|s|min|h|d)$');
        IF m IS NULL THEN
            PERFORM tessera__corrupt(format('rate limits %L are unreadable', left(config, 64)));
        END IF;
        n := n + 1;
        unit := m[2];
        us := CASE unit WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 WHEN 's' THEN 1000000
                        WHEN 'min' THEN 60000000 WHEN 'h' THEN 3600000000
                        ELSE 86400000000 END;
        horizon := greatest(horizon, coalesce(nullif(m[1], '')::bigint, 1) * us);
    END LOOP;
    m := regexp_match(config, '^[^|+]*\+([0-9]{1,12})(us|ms|s)\|');
    IF m IS NOT NULL THEN
        horizon := horizon + m[1]::bigint
            * CASE m[2] WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 ELSE 1000000 END;
    END IF;
END $$;

-- When a state stops mattering (RateState::expires_at): exact mode (burst 0), the latest
-- admission plus the longest window; smooth mode, the latest admission or pacing value.
CREATE OR REPLACE FUNCTION tessera__rate_expiry(
    p_last bigint, p_tat bigint[], p_burst bigint, p_horizon bigint
) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_burst = 0 THEN p_last + p_horizon
                ELSE greatest(p_last, (SELECT max(v) FROM unnest(p_tat) v)) END
$$;

-- Writes a limiter's row back (the row is locked by this step).
CREATE OR REPLACE FUNCTION tessera__rate_save(
    r tessera_rate_limiters, p_tat bigint[], p_prev_tat bigint[], p_expires_at bigint
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tessera_rate_limiters l
    SET config = r.config, seq = r.seq, tail = r.tail, last = r.last,
        prev_last = r.prev_last, p = r.p, base = r.base,
        tat = array_to_string(p_tat, ','), prev_tat = array_to_string(p_prev_tat, ','),
        expires_at = p_expires_at
    WHERE l.name = r.name;
END $$;

-- Drops the log entries at or before `cutoff`; returns the running total of the last one
-- dropped (the new base), or NULL if none was.
CREATE OR REPLACE FUNCTION tessera__rate_prune(p_name text, cutoff bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    top bigint;
BEGIN
    WITH gone AS (
        DELETE FROM tessera_rate_log WHERE name = p_name AND t <= cutoff RETURNING p)
    SELECT max(g.p) INTO top FROM gone g;
    RETURN top;
END $$;
