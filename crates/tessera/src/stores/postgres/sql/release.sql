-- tessera_release: releases a lease (idempotent); stores/sql/step.rs `release`, in one call.
--
-- p_name   the semaphore
-- p_lease  the lease id
--
-- Whether the lease was still held. The freed permits go to the queue head in this same
-- call, which wakes it (pg_notify on its client's channel, sent at commit).
CREATE OR REPLACE FUNCTION tessera_release(p_name text, p_lease text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        RETURN false;
    END IF;
    st := tessera__remove_holder(st, p_lease);
    st := tessera__hand_off(st);
    PERFORM tessera__finish(st);
    RETURN st.hit;
END $$;
