-- tessera_cancel: gives up a wait; stores/sql/step.rs `cancel`, in one call.
--
-- p_name   the semaphore
-- p_lease  the waiter's lease id
--
-- 'dequeued' (removed from the queue), 'released' (it had been granted: released) or
-- 'not_found'. Removing the head or freeing permits hands off to the next in the queue.
CREATE OR REPLACE FUNCTION tessera_cancel(p_name text, p_lease text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    st    tessera_step;
    reply text := 'not_found';
BEGIN
    st := tessera__load(p_name, NULL);
    IF NOT st.found THEN
        RETURN reply;
    END IF;
    st := tessera__remove_waiter(st, p_lease);
    IF st.hit THEN
        reply := 'dequeued';
    ELSE
        st := tessera__remove_holder(st, p_lease);
        IF st.hit THEN
            reply := 'released';
        END IF;
    END IF;
    IF reply <> 'not_found' THEN
        st := tessera__hand_off(st);
    END IF;
    PERFORM tessera__finish(st);
    RETURN reply;
END $$;
