-- tessera_set_tenant_limits: sets a tenant's ceiling, floor and window ceiling on a name, or
-- removes them (no ceiling, floor 0 and no window ceiling), then hands off what they let in; the memory store's
-- `set_tenant_limits` (stores/memory/ops.rs), in one call (docs/fair-shares.md, "Ceilings
-- and floors"; migration 10).
--
-- p_name     the semaphore
-- p_tenant   the tenant (1 to 64 bytes, checked by the client)
-- p_ceiling  at most this many permits held by the tenant, 1 to 1,000,000; NULL: none
-- p_floor    permits kept for the tenant, 0 to the ceiling (checked by the client)
-- p_client   the calling process's client id, or NULL: its waiters' grants come in the reply
-- p_window   the tenant's window ceiling, a percentage 1 to 100 (checked by the client);
--            NULL: none (migration 11: a changed one keeps the tenant's window-capped
--            instant, which its own limiter's next answer replaces; none clears it)
--
-- One row: outcome 'set' (`grants`: the wake-up payloads of the waiters of client p_client
-- that the new limits let in, as tessera_release's), or 'floors' (`floors`, what the floors
-- would add up to, above `capacity`, the semaphore's: nothing changed).
--
-- The semaphore's row is locked first, as in every step; a name without a row gets a
-- placeholder that tessera__finish deletes again, so an acquire that creates the row
-- meanwhile waits for this call and then reads the limits it committed (tessera__load reads
-- them after its row lock). Floors are checked against the capacity only while the
-- semaphore has holders or waiters (after the purge): an idle one takes the capacity its
-- next client declares.
CREATE OR REPLACE FUNCTION tessera_set_tenant_limits(
    p_name text, p_tenant text, p_ceiling bigint, p_floor bigint, p_client text,
    p_window bigint DEFAULT NULL
) RETURNS TABLE (outcome text, floors bigint, capacity bigint, grants text[])
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
    v_floors bigint;
BEGIN
    st := tessera__load(p_name, 1);
    st.local_client := p_client;
    IF st.used > 0 OR st.queued > 0 THEN
        SELECT coalesce(sum(l.floor), 0) + p_floor INTO v_floors
        FROM tessera_limits l WHERE l.name = p_name AND l.tenant <> p_tenant;
        IF v_floors > st.capacity THEN
            outcome := 'floors';
            floors := v_floors;
            capacity := st.capacity;
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    IF p_ceiling IS NULL AND p_floor = 0 AND p_window IS NULL THEN
        DELETE FROM tessera_limits l WHERE l.name = p_name AND l.tenant = p_tenant;
    ELSE
        INSERT INTO tessera_limits AS l (name, tenant, ceiling, floor, window_ceiling)
        VALUES (p_name, p_tenant, p_ceiling, p_floor, p_window)
        ON CONFLICT (name, tenant) DO UPDATE
        SET ceiling = excluded.ceiling, floor = excluded.floor,
            window_ceiling = excluded.window_ceiling,
            capped_until = CASE WHEN excluded.window_ceiling IS NULL THEN NULL
                                ELSE l.capped_until END;
    END IF;
    st := tessera__load_limits(st);
    IF st.limits <> 0 THEN
        -- Grants with limits may pass the queue's least key: the lookups keep today's bound.
        st.low := coalesce(st.low, st.vtime);
    END IF;
    st.dirty := true;
    IF st.queued > 0 AND st.used < st.capacity THEN
        st := tessera__hand_off(st);
    END IF;
    PERFORM tessera__finish(st);
    outcome := 'set';
    grants := st.local_grants;
    RETURN NEXT;
END $$;
