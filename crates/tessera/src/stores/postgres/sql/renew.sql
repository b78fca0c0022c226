-- tessera_renew: extends a held lease; stores/sql/step.rs `renew`, in one call.
--
-- p_name   the semaphore
-- p_lease  the lease id
-- p_ttl    the lease runs until max(its expiry, now + p_ttl) (µs)
--
-- One row: expires_at (NULL: the lease is gone) and now_us.
CREATE OR REPLACE FUNCTION tessera_renew(p_name text, p_lease text, p_ttl bigint)
RETURNS TABLE (expires_at bigint, now_us bigint)
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
BEGIN
    st := tessera__load(p_name, NULL);
    now_us := st.now_us;
    IF st.found THEN
        UPDATE tessera_holders t SET expires_at = greatest(t.expires_at, st.now_us + p_ttl)
        WHERE t.name = p_name AND t.lease_id = p_lease
        RETURNING t.expires_at INTO expires_at;
        -- A renewal the holder was told about must survive a crash (its certain validity
        -- counts from it).
        PERFORM tessera__durable(st);
        PERFORM tessera__finish(st);
    END IF;
    RETURN NEXT;
END $$;
