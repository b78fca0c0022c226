-- tessera_rate_delete: drops the limiter's state and log (admin): its limits, history and
-- every reservation, due or not; RateBackend::rate_delete in one call, as
-- stores/redis/scripts/rate_delete.lua. See rate_common.sql for the invariants.
--
-- p_name  the limiter
--
-- Returns true if the limiter had state (not yet expired), false otherwise (an expired
-- state is dropped all the same). The name's tenants' own limiters (window ceilings,
-- migration 11: rate_common.sql, tessera__rate_tenant_key) go with it, locked after its
-- row as in every step. Its values are not checked: deleting is how an admin
-- clears a damaged limiter. Commits with the session's `synchronous_commit`.
CREATE OR REPLACE FUNCTION tessera_rate_delete(p_name text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    r     tessera_rate_limiters;
    v_now bigint;
BEGIN
    r := tessera__rate_lock(p_name, false);
    v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    PERFORM tessera__rate_sweep(p_name, v_now);
    DELETE FROM tessera_rate_log l WHERE starts_with(l.name, p_name || '#');
    DELETE FROM tessera_rate_limiters l WHERE starts_with(l.name, p_name || '#');
    IF r.name IS NULL THEN
        RETURN false;
    END IF;
    PERFORM tessera__rate_drop(p_name);
    RETURN r.expires_at > v_now;
END $$;
