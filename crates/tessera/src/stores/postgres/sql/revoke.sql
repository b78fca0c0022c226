-- tessera_revoke: removes another holder's lease (admin); stores/sql/step.rs `revoke`, in
-- one call.
--
-- p_name   the semaphore
-- p_lease  the victim's lease id
--
-- Whether it was held. The victim's client gets a wake-up for its lease (its keeper then
-- learns the lease is gone), and the freed permits go to the queue head.
CREATE OR REPLACE FUNCTION tessera_revoke(p_name text, p_lease text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        RETURN false;
    END IF;
    st := tessera__remove_holder(st, p_lease);
    IF st.hit THEN
        PERFORM tessera__durable(st);
        PERFORM tessera__wake(st.hit_client, p_lease);
        st := tessera__hand_off(st);
    END IF;
    PERFORM tessera__finish(st);
    RETURN st.hit;
END $$;
