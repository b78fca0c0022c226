-- tessera_delete: removes a semaphore with its holders and waiters, and its tenants' limits
-- (migration 10); stores/sql/step.rs `delete`, in one call. Runs without purging (as the model), and wakes every holder and
-- waiter it removes, whatever their rows hold: deleting is how an admin clears damaged rows.
--
-- p_name  the semaphore
--
-- Whether it existed (or had limits). Its last fence raises the store-wide high-water mark, so a semaphore
-- created again under this name issues higher fences.
CREATE OR REPLACE FUNCTION tessera_delete(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r    record;
    last bigint;
    n_tenants bigint;
    n_limits  bigint;
BEGIN
    -- Lock the row first, so a concurrent acquire cannot add a holder this delete misses.
    PERFORM 1 FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    -- Then its tail (migration 12), which waits for an enqueue in flight: its waiter is
    -- removed below, and an enqueue after this finds no tail and runs the step.
    DELETE FROM tessera_tails WHERE name = p_name;
    FOR r IN DELETE FROM tessera_holders WHERE name = p_name RETURNING lease_id, client LOOP
        PERFORM tessera__wake(r.client, r.lease_id);
    END LOOP;
    FOR r IN DELETE FROM tessera_waiters WHERE name = p_name RETURNING lease_id, client LOOP
        PERFORM tessera__wake(r.client, r.lease_id);
    END LOOP;
    -- The limits go in the statement that drops the free seats: no statement more.
    WITH l AS (DELETE FROM tessera_limits l WHERE l.name = p_name RETURNING 1),
         f AS (DELETE FROM tessera_free_seats f WHERE f.name = p_name)
    SELECT count(*) INTO n_limits FROM l;
    DELETE FROM tessera_semaphores WHERE name = p_name RETURNING last_fence, tenants
    INTO last, n_tenants;
    IF NOT FOUND THEN
        RETURN n_limits > 0;
    END IF;
    -- Its tenants' tags too: a semaphore made again under this name starts them at 0.
    IF n_tenants <> 0 THEN
        DELETE FROM tessera_tenants WHERE name = p_name;
    END IF;
    UPDATE tessera_meta SET value = last WHERE key = 'fence_hwm' AND value < last;
    RETURN true;
END $$;
