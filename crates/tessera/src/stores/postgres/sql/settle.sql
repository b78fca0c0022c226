-- tessera_settle: an admission's cost settled (docs/admission.md, invariant 6): releases the
-- lease as tessera_release does (the hand-off to the queue included) and settles the charge
-- on the limiter of the same name (tessera__rate_settle, below: rate/engine.rs `settle` line
-- by line, as `settle` in stores/redis/scripts/admission.lua), in one step. The reference is
-- MemoryBackend::settle. Created by step revision 5 (ops.rs STEP_REVISION): a function of its
-- own over the tables of migration 6, so older builds keep connecting beside it.
--
-- p_name         the semaphore and the limiter of that name
-- p_lease        the admission's lease id
-- p_reservation  its charge (tessera_admit's reservation; 0 when the grant's reply was lost)
-- p_at           its admission instant (acquired_at, the rate step's own clock reading), µs
-- p_charged      the cost charged at p_at
-- p_actual       the cost the call had (0 ..= MAX_RATE_COUNT, checked by the client)
-- p_client       the calling process's client id, or NULL
--
-- One row, as tessera_release's: `held`, whether the lease was still held, and `grants`, the
-- wake-up payloads of the waiters of client `p_client` that the freed permits went to. Locks
-- the semaphore's row, then the limiter's (the order of every step that takes both,
-- rate_common.sql). Commits asynchronously as a release does, unless it charged an excess:
-- that is a call already made, which a server crash must not lose.
--
-- Window ceilings (migration 11): when this call released the lease and its tenant has a
-- window ceiling, the tenant's own limiter is settled too, on the same rules (an excess
-- charged to both, a smaller cost given back to both), locked after the shared one's. A
-- settle after the lease was lost no longer knows the tenant: the shared limiter only, so
-- such an excess is not counted against the tenant's ceiling (docs/fair-shares.md, "A
-- ceiling on a share of the windows").

-- The smooth-mode emission interval of each limit of a stored configuration, in µs
-- (rate/engine.rs `emission_intervals`: ceil((period + margin) / N)); the settle gets no
-- limits from the client, and the stored ones are the ones charged.
CREATE OR REPLACE FUNCTION tessera__rate_intervals(config text) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    m      text[];
    lim    text;
    margin bigint := 0;
    n      bigint;
    w      bigint;
    v_out  bigint[] := '{}';
BEGIN
    m := regexp_match(config,
        '^(exact|smooth:([0-9]{1,10}))(\+([0-9]{1,12})(us|ms|s))?\|([0-9a-z/,]+)$');
    IF m IS NULL THEN
        PERFORM tessera__corrupt(format('rate limits %L are unreadable', left(config, 64)));
    END IF;
    IF m[4] IS NOT NULL THEN
        margin := m[4]::bigint * CASE m[5] WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 ELSE 1000000 END;
    END IF;
    FOREACH lim IN ARRAY string_to_array(m[6], ',') LOOP
        m := regexp_match(lim, '^([0-9]{1,10})/([0-9]{0,12})(us|ms|s|min|h|d)$');
        IF m IS NULL OR m[1]::bigint = 0 THEN
            PERFORM tessera__corrupt(format('rate limits %L are unreadable', left(config, 64)));
        END IF;
        n := m[1]::bigint;
        w := coalesce(nullif(m[2], '')::bigint, 1)
            * CASE m[3] WHEN 'us' THEN 1 WHEN 'ms' THEN 1000 WHEN 's' THEN 1000000
                        WHEN 'min' THEN 60000000 WHEN 'h' THEN 3600000000
                        ELSE 86400000000 END
            + margin;
        v_out := v_out || ((w + n - 1) / n);
    END LOOP;
    RETURN v_out;
END $$;

-- Settles an admission's cost on limiter `p_name` (rate/engine.rs `settle` and
-- `settle_block`): `p_charged` was charged at `p_at` under `p_reservation`, the call cost
-- `p_actual`, and `p_held` says whether this step released the lease. Locks the limiter's
-- row and reads the clock once the lock is held. Nothing when the limiter has no state (or it
-- expired: no window that can still decide holds `p_at`); a state is never created.
-- - More: the excess e charged at t = max(now, last): last = t, tail = 0; exact, p += e and
--   the entry (t, p); smooth, tat = max(tat, t) + e·T per limit.
-- - Less, and only if `p_held`: exact, the block at the latest admit time t* <= p_at (times
--   are the rate step's own µs, so no slack) lowered by d = min(charged - actual, its own
--   cost) unless t* is at or before the pruning cutoff: the block becomes (t*, last - d)
--   (none if that is the total before it), every later entry moves down by d, p -= d;
--   smooth, only while the admission is the latest (tail and last name it):
--   tat = max(prev_tat, at) + actual·T. Either makes tail 0.
-- Returns true if it charged an excess.
CREATE OR REPLACE FUNCTION tessera__rate_settle(
    p_name text, p_reservation bigint, p_at bigint, p_charged bigint, p_actual bigint,
    p_held boolean
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
    v_ivl     bigint[];
    v_e       bigint;
    v_t       bigint;
    v_ts      bigint;
    v_last    bigint;
    v_before  bigint;
    v_d       bigint;
    i         int;
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

    IF p_actual > p_charged THEN
        -- The excess, charged at once as a forced admission.
        v_e := p_actual - p_charged;
        v_t := greatest(v_now, r.last);
        r.last := v_t;
        r.tail := 0;
        IF v_burst = 0 THEN
            r.p := r.p + v_e;
            INSERT INTO tessera_rate_log (name, p, t) VALUES (p_name, r.p, v_t);
        ELSE
            v_ivl := tessera__rate_intervals(r.config);
            FOR i IN 1 .. v_n LOOP
                v_tat[i] := greatest(v_tat[i], v_t) + v_e * v_ivl[i];
            END LOOP;
        END IF;
        PERFORM tessera__rate_save(r, v_tat, v_prev,
            tessera__rate_expiry(r.last, v_tat, v_burst, v_horizon));
        RETURN true;
    END IF;
    IF p_actual = p_charged OR NOT p_held THEN
        RETURN false;
    END IF;

    IF v_burst = 0 THEN
        -- The block: the latest entry at or before p_at (the entries after it are the few
        -- admitted since), and the running total before its instant.
        SELECT l.t, l.p INTO v_ts, v_last FROM tessera_rate_log l
        WHERE l.name = p_name AND l.t <= p_at ORDER BY l.p DESC LIMIT 1;
        IF NOT FOUND OR v_ts <= v_now - v_horizon THEN
            RETURN false;
        END IF;
        SELECT l.p INTO v_before FROM tessera_rate_log l
        WHERE l.name = p_name AND l.p < v_last AND l.t < v_ts ORDER BY l.p DESC LIMIT 1;
        v_before := coalesce(v_before, r.base);
        IF v_last <= v_before THEN
            RETURN false;
        END IF;
        v_d := least(p_charged - p_actual, v_last - v_before);
        DELETE FROM tessera_rate_log l
        WHERE l.name = p_name AND l.p > v_before AND l.p <= v_last;
        -- Every later entry moves down by d. Row by row the unique (name, p) could meet an
        -- entry not moved yet: through the negatives, which no entry has.
        UPDATE tessera_rate_log l SET p = -(l.p - v_d) WHERE l.name = p_name AND l.p > v_last;
        UPDATE tessera_rate_log l SET p = -l.p WHERE l.name = p_name AND l.p < 0;
        IF v_last - v_d > v_before THEN
            INSERT INTO tessera_rate_log (name, p, t) VALUES (p_name, v_last - v_d, v_ts);
        END IF;
        r.p := r.p - least(v_d, r.p);
    ELSE
        IF p_reservation = 0 OR r.tail <> p_reservation OR r.last <> p_at THEN
            RETURN false;
        END IF;
        v_ivl := tessera__rate_intervals(r.config);
        FOR i IN 1 .. v_n LOOP
            v_tat[i] := greatest(v_prev[i], p_at) + p_actual * v_ivl[i];
        END LOOP;
    END IF;
    r.tail := 0;
    PERFORM tessera__rate_save(r, v_tat, v_prev,
        tessera__rate_expiry(r.last, v_tat, v_burst, v_horizon));
    RETURN false;
END $$;

CREATE OR REPLACE FUNCTION tessera_settle(
    p_name text, p_lease text, p_reservation bigint, p_at bigint, p_charged bigint,
    p_actual bigint, p_client text
) RETURNS TABLE (held boolean, grants text[])
LANGUAGE plpgsql AS $$
DECLARE
    st      tessera_step;
    v_i     int;
    v_more  boolean;
BEGIN
    st := tessera__load(p_name, NULL);
    IF st.found THEN
        st.local_client := p_client;
        st := tessera__remove_holder(st, p_lease);
        st := tessera__hand_off(st);
        PERFORM tessera__finish(st);
        held := st.hit;
        grants := st.local_grants;
    ELSE
        held := false;
    END IF;
    v_more := tessera__rate_settle(p_name, p_reservation, p_at, p_charged, p_actual, held);
    IF held AND st.limits <> 0 THEN
        v_i := array_position(st.lim_tenant, st.hit_tenant);
        IF st.lim_window[v_i] IS NOT NULL THEN
            IF tessera__rate_settle(tessera__rate_tenant_key(p_name, st.hit_tenant),
                                    p_reservation, p_at, p_charged, p_actual, held) THEN
                v_more := true;
            END IF;
        END IF;
    END IF;
    IF v_more THEN
        PERFORM tessera__durable(st);
    END IF;
    RETURN NEXT;
END $$;
