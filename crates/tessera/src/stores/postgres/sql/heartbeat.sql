-- tessera_heartbeat: a waiter's heartbeat; stores/sql/step.rs `heartbeat`, in one call.
--
-- p_name        the semaphore
-- p_lease       the waiter's lease id
-- p_waiter_ttl  renews the queue entry until now + p_waiter_ttl (µs)
--
-- One row: outcome 'granted' (the hand-off gave it the lease: weight, seats, fence, holder,
-- acquired_at, expires_at, tenant), 'waiting' (renewed; expires_at: purge_at, as tessera_acquire's
-- 'queued') or 'gone'; now_us.
CREATE OR REPLACE FUNCTION tessera_heartbeat(p_name text, p_lease text, p_waiter_ttl bigint)
RETURNS TABLE (
    outcome text, now_us bigint, weight bigint, seats int4[], fence bigint, holder text,
    acquired_at bigint, expires_at bigint, tenant text
)
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
    h  tessera_holders;
BEGIN
    st := tessera__load(p_name, NULL);
    now_us := st.now_us;
    outcome := 'gone';
    IF NOT st.found THEN
        RETURN NEXT;
        RETURN;
    END IF;
    IF st.used > 0 THEN
        SELECT * INTO h FROM tessera_holders t WHERE t.name = p_name AND t.lease_id = p_lease;
        IF FOUND THEN
            outcome := 'granted';
            weight := h.weight; seats := h.seats; fence := h.fence; holder := h.holder;
            acquired_at := h.acquired_at; expires_at := h.expires_at; tenant := h.tenant;
        END IF;
    END IF;
    IF outcome = 'gone' AND tessera__refresh_waiter(st, p_lease, st.now_us + p_waiter_ttl) IS NOT NULL THEN
        outcome := 'waiting';
        expires_at := st.purge_at;
    END IF;
    PERFORM tessera__finish(st);
    RETURN NEXT;
END $$;
