-- tessera_resize: changes the capacity; stores/sql/step.rs `resize`, in one call.
--
-- p_name      the semaphore
-- p_capacity  the new capacity (1..=1,000,000, checked by the client)
--
-- The old capacity, or NULL when the semaphore has no holders or waiters (not found).
-- Shrinking never revokes; growing hands the new permits to the queue in this call.
CREATE OR REPLACE FUNCTION tessera_resize(p_name text, p_capacity bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    st  tessera_step;
    old bigint;
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        RETURN NULL;
    END IF;
    IF st.used = 0 AND st.queued = 0 THEN
        -- Everything in it had expired: the purge is committed and the row deleted.
        PERFORM tessera__finish(st);
        RETURN NULL;
    END IF;
    old := st.capacity;
    st.capacity := p_capacity;
    st.dirty := true;
    st := tessera__hand_off(st);
    PERFORM tessera__finish(st);
    RETURN old;
END $$;
