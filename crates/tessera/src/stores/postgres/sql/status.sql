-- tessera_status: a snapshot; stores/sql/step.rs `status`, in one call (it purges and hands
-- off first, like every step).
--
-- p_name  the semaphore
--
-- JSON text {"capacity", "used", "now", "holders": [[lease_id, weight, seats, fence, holder,
-- acquired_at, expires_at, tenant], …] by (acquired_at, fence), "queue": [[lease_id, weight,
-- holder, enqueued_at, expires_at, gate, tenant], …] in queue order, (tag, seq)}, or NULL when
-- nobody holds or waits. A tenant is null for a request that named none; the gate and the
-- tenant come last (migration 9), so a build before reads the elements it knows.
CREATE OR REPLACE FUNCTION tessera_status(p_name text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st    tessera_step;
    snap  text;
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        RETURN NULL;
    END IF;
    IF st.used > 0 OR st.queued > 0 THEN
        SELECT json_build_object(
            'capacity', st.capacity, 'used', st.used, 'now', st.now_us,
            'holders', coalesce((
                SELECT json_agg(json_build_array(h.lease_id, h.weight, h.seats, h.fence, h.holder,
                                                 h.acquired_at, h.expires_at, h.tenant)
                                ORDER BY h.acquired_at, h.fence)
                FROM tessera_holders h WHERE h.name = p_name), '[]'::json),
            'queue', coalesce((
                SELECT json_agg(json_build_array(w.lease_id, w.weight, w.holder, w.enqueued_at,
                                                 w.expires_at, w.gate, w.tenant)
                                ORDER BY w.tag, w.seq)
                FROM tessera_waiters w WHERE w.name = p_name), '[]'::json))::text
        INTO snap;
    END IF;
    PERFORM tessera__finish(st);
    RETURN snap;
END $$;
