-- tessera_release: releases a lease (idempotent); stores/sql/step.rs `release`, in one call.
--
-- p_name    the semaphore
-- p_lease   the lease id
-- p_client  the calling process's client id, or NULL
--
-- One row: `held`, whether the lease was still held, and `grants`, the wake-up payloads
-- (`tessera__hand_off`) of the waiters of client `p_client` that this call granted. The
-- freed permits go to the queue head in this same call: a waiter of `p_client` learns its
-- grant from this reply, which the client reads only after the commit (so a crash can lose
-- the reply, never make a grant seen that was not committed); any other waiter gets a
-- pg_notify on its client's channel, sent at commit.
CREATE OR REPLACE FUNCTION tessera_release(p_name text, p_lease text, p_client text)
RETURNS TABLE (held boolean, grants text[])
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        held := false;
        RETURN NEXT;
        RETURN;
    END IF;
    st.local_client := p_client;
    st := tessera__remove_holder(st, p_lease);
    st := tessera__hand_off(st);
    PERFORM tessera__finish(st);
    held := st.hit;
    grants := st.local_grants;
    RETURN NEXT;
END $$;

-- The release of clients built before migration 5: every grant is notified.
CREATE OR REPLACE FUNCTION tessera_release(p_name text, p_lease text) RETURNS boolean
LANGUAGE sql AS $$ SELECT held FROM tessera_release(p_name, p_lease, NULL) $$;
