-- tessera PostgreSQL store, migration 3: the rate step on the server. This file holds the
-- helpers shared by the rate functions (rate_acquire.sql, rate_cancel.sql,
-- rate_status.sql, rate_delete.sql) and by the admission's (admit.sql, give_back.sql): the
-- decision itself (tessera__rate_step) and the return of an admission (tessera__rate_undo);
-- none commits or sets the commit's durability. The decision follows
-- crates/tessera/src/rate/engine.rs line by line, as the Redis scripts do
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
-- - Lock order: a step that takes a semaphore's row as well (tessera_admit,
--   tessera_give_back) locks the semaphore's row first and the limiter's of the same name
--   second; nothing locks them the other way round, and the sweep never waits, so the rate
--   functions, the semaphore's and the admission's never deadlock one another.
-- - Bounded work besides the limiter's own log: at most 16 other limiters whose state
--   expired are swept per call, with `FOR UPDATE SKIP LOCKED`, so two steps never wait on
--   each other's rows. Pruning drops only the log entries older than the longest window.
-- - Every value read is checked; a wrong one raises SQLSTATE TS001 (Error::Corrupt).
--
-- Runs inside the migration transaction (mod.rs `migrate`), after migration 2, and again
-- with migration 6 and every newer step revision (ops.rs `STEP_AGAIN`); every statement is
-- `CREATE OR REPLACE`, so running it again changes nothing.

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

-- Writes a limiter's row back (the row is locked by this step). Its expiry is never lowered
-- (RateState::kept_until): tessera_give_back keeps a state with a count of expired
-- admissions for a horizon.
CREATE OR REPLACE FUNCTION tessera__rate_save(
    r tessera_rate_limiters, p_tat bigint[], p_prev_tat bigint[], p_expires_at bigint
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE tessera_rate_limiters l
    SET config = r.config, seq = r.seq, tail = r.tail, last = r.last,
        prev_last = r.prev_last, p = r.p, base = r.base,
        tat = array_to_string(p_tat, ','), prev_tat = array_to_string(p_prev_tat, ','),
        expires_at = greatest(r.expires_at, p_expires_at)
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

-- The rate step: locks limiter `p_name`'s row (a placeholder first if it has none), reads the
-- clock once the lock is held, sweeps, prunes, and admits, reserves or answers limited, all
-- limits charged or none: rate/engine.rs (`check_config`, `thresholds`, `earliest`,
-- `decide`) line by line, as stores/redis/scripts/rate_acquire.lua. Arguments and outcome as
-- tessera_rate_acquire's (rate_acquire.sql), whose step this is; tessera_admit (admit.sql)
-- runs it too, on its turn, with the semaphore's row locked first and `p_max_wait` NULL (the
-- windows are asked for now only). Leaves `synchronous_commit` to its caller.
--
-- For a tenant's own limiter under a window ceiling (migration 11, admit.sql; `p_name` is
-- then its key, tessera__rate_tenant_key) tessera_admit passes the last two arguments:
-- `p_peek` asks without charging (outcome 'admitted' or 'limited' with at_us as for a try;
-- only pruning and an `update` of the limits are saved, as a limited request saves them),
-- and `p_now` charges at that instant, the shared limiter's charge's, instead of the clock
-- (read after the shared charge, so never before it: an instant the peek before admitted).
CREATE OR REPLACE FUNCTION tessera__rate_step(
    p_name text, p_config text, p_n bigint[], p_l bigint[], p_t bigint[], p_burst bigint,
    p_cost bigint, p_max_wait bigint, p_update boolean,
    p_peek boolean DEFAULT false, p_now bigint DEFAULT NULL,
    OUT outcome text, OUT at_us bigint, OUT now_us bigint, OUT reservation bigint,
    OUT stored text
)
LANGUAGE plpgsql AS $$
DECLARE
    r         tessera_rate_limiters;
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
        RAISE EXCEPTION USING ERRCODE = '22023', MESSAGE = 'tessera__rate_step: one N, L and T per limit';
    END IF;
    r := tessera__rate_lock(p_name, true);
    -- The clock only now: clock_timestamp() in the locking statement could be read before
    -- the wait for the lock ended.
    now_us := coalesce(p_now, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
    PERFORM tessera__rate_sweep(p_name, now_us);
    PERFORM tessera__rate_check(r);
    FOR i IN 1 .. v_n LOOP
        v_horizon := greatest(v_horizon, p_l[i]);
    END LOOP;

    IF r.expires_at <= now_us THEN
        -- No state: a placeholder, or a state that expired (its log and its count of expired
        -- admissions go). A fresh one.
        DELETE FROM tessera_rate_log WHERE name = p_name;
        IF r.expired <> 0 THEN
            UPDATE tessera_rate_limiters l SET expired = 0 WHERE l.name = p_name;
        END IF;
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

    IF (p_max_wait IS NULL AND v_t <> now_us) OR v_t - now_us > p_max_wait OR p_peek THEN
        -- Nothing charged. Entries that no longer change any answer were pruned: base must
        -- follow them; limits replaced by update stay replaced (as in the memory store).
        IF v_pruned OR v_replace THEN
            PERFORM tessera__rate_save(r, v_tat, v_prev,
                tessera__rate_expiry(r.last, v_tat, p_burst, v_horizon));
        END IF;
        outcome := CASE WHEN p_peek AND v_t = now_us THEN 'admitted' ELSE 'limited' END;
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
    outcome := 'admitted';
    at_us := v_t;
    reservation := r.seq;
END $$;

-- Returns limiter `p_name`'s latest admission if it is the one named (`p_reservation`, made
-- at `p_at`) and, unless `p_due_too`, not yet due: rate/engine.rs `cancel` (`p_due_too`
-- false: tessera_rate_cancel, rate_cancel.sql) and `undo_latest` (`p_due_too` true: an
-- admission given back unused, tessera_give_back), as `undo` in
-- stores/redis/scripts/rate_prelude.lua. Locks the limiter's row and reads the clock once
-- the lock is held. True if it was returned (last, and in exact mode the running total, roll
-- back; in smooth mode the pacing values), false if not (nothing changed but the sweep, or an
-- expired state dropped). A later admission keeps it charged: the windows may count more
-- than was used, never less.
CREATE OR REPLACE FUNCTION tessera__rate_undo(
    p_name text, p_reservation bigint, p_at bigint, p_due_too boolean
) RETURNS boolean
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
    IF p_reservation = 0 OR r.tail <> p_reservation OR r.last <> p_at
       OR (p_at <= v_now AND NOT p_due_too) THEN
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

-- A tenant's own limiter under a window ceiling (migration 11; docs/fair-shares.md, "A
-- ceiling on a share of the windows") is an ordinary limiter's row and log, kept beside the
-- shared one under this key: the name, '#', the tenant. No name has a '#' (Name allows
-- `A-Z a-z 0-9 . _ - : / @`), so a key is never a name and two keys never meet; every rate
-- function above serves it unchanged, and it expires and is swept as any limiter. The rate
-- list and status read names only (rate.rs), and tessera_rate_delete drops a name's keys with
-- it.
CREATE OR REPLACE FUNCTION tessera__rate_tenant_key(p_name text, p_tenant text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT p_name || '#' || p_tenant $$;

-- The shared limiter's configuration scaled for a tenant's window ceiling of `p_pct`
-- percent (1 to 100), as RateConfig::scaled: each limit N per L becomes
-- max(1, floor(N * pct / 100)) per L, a smooth burst B likewise, in the same mode with the
-- same margin; limits made equal are one (the canonical order is kept: scaling keeps it).
-- Returns the canonical text (RateConfig::scaled(pct).encode(), which the tenant's state is
-- saved with), the arguments tessera__rate_step takes for it (`l`, the enforced windows,
-- unchanged; `t` = ceil(l / N)) and its largest cost (RateConfig::max_cost). The arguments
-- are tessera_admit's own (`p_config`, `p_n`, `p_l`, `p_burst`).
CREATE OR REPLACE FUNCTION tessera__rate_scaled(
    p_config text, p_n bigint[], p_l bigint[], p_burst bigint, p_pct bigint,
    OUT config text, OUT n bigint[], OUT l bigint[], OUT t bigint[], OUT burst bigint,
    OUT max_cost bigint
)
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m     text[];
    lims  text[];
    parts text[] := '{}';
    lim   text;
    prev  text;
    k     bigint;
    i     int;
BEGIN
    m := regexp_match(p_config,
        '^(exact|smooth:[0-9]{1,10})((\+[0-9]{1,12}(us|ms|s))?)\|([0-9a-z/,]+)$');
    lims := string_to_array(m[5], ',');
    IF m IS NULL OR p_pct IS NULL OR p_pct < 1 OR p_pct > 100
       OR cardinality(lims) IS DISTINCT FROM cardinality(p_n)
       OR cardinality(p_l) IS DISTINCT FROM cardinality(p_n) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('tessera__rate_scaled: limits %L, %s%%', left(p_config, 64), p_pct);
    END IF;
    burst := CASE WHEN p_burst = 0 THEN 0 ELSE greatest(p_burst * p_pct / 100, 1) END;
    n := '{}';
    l := '{}';
    t := '{}';
    FOR i IN 1 .. cardinality(lims) LOOP
        k := greatest(p_n[i] * p_pct / 100, 1);
        lim := k || substr(lims[i], strpos(lims[i], '/'));
        CONTINUE WHEN lim = prev;
        prev := lim;
        parts := parts || lim;
        n := n || k;
        l := l || p_l[i];
        t := t || ((p_l[i] + k - 1) / k);
    END LOOP;
    config := CASE WHEN p_burst = 0 THEN 'exact' ELSE 'smooth:' || burst END
        || m[2] || '|' || array_to_string(parts, ',');
    max_cost := CASE WHEN p_burst = 0 THEN (SELECT min(x) FROM unnest(n) x) ELSE burst END;
END $$;
