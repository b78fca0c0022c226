-- tessera_give_back: an admission given back unused (docs/admission.md): releases the lease
-- and returns its windows' charge while it is the limiter's latest, due or not, in one step:
-- tessera_release and tessera__rate_undo(…, due_too = true) (rate_common.sql;
-- rate/engine.rs `undo_latest`), as stores/redis/scripts/give_back.lua.
--
-- p_name         the semaphore and the limiter of that name
-- p_lease        the admission's lease id
-- p_reservation  its charge (tessera_admit's reservation; 0 returns nothing)
-- p_at           its admission instant (acquired_at), µs
-- p_client       the calling process's client id, or NULL
-- p_expired      it was past its use-by instant: counted in the limiter's row (`expired`)
--                if this call released the lease, whether or not its charge came back
--                (migration 7)
--
-- One row, as tessera_release's: `held`, whether the lease was still held, and `grants`, the
-- wake-up payloads of the waiters of client `p_client` that the freed permits went to. The
-- charge is returned whether or not the lease was still held; a later admission keeps it
-- charged (the windows may count more than was used, never less). Locks the semaphore's row,
-- then the limiter's (the order of every step that takes both, rate_common.sql).
--
-- Window ceilings (migration 11): when this call released the lease and its tenant has a
-- window ceiling, the charge is returned to the tenant's own limiter too, on the same rule
-- (while it is that limiter's latest: its tail is the reservation and its last the
-- admission's instant), locked after the shared one's; `expired` counts in the shared state
-- only. A give-back after the lease was lost no longer knows the tenant: the shared limiter
-- only (docs/fair-shares.md, "A ceiling on a share of the windows").
CREATE OR REPLACE FUNCTION tessera_give_back(
    p_name text, p_lease text, p_reservation bigint, p_at bigint, p_client text,
    p_expired boolean DEFAULT false
) RETURNS TABLE (held boolean, grants text[])
LANGUAGE plpgsql AS $$
DECLARE
    st       tessera_step;
    v_now    bigint;
    v_undone boolean := false;
    v_i      int;
BEGIN
    st := tessera__load(p_name, NULL);
    IF p_reservation <> 0 THEN
        v_undone := tessera__rate_undo(p_name, p_reservation, p_at, true);
    END IF;
    IF NOT st.found THEN
        held := false;
        RETURN NEXT;
        RETURN;
    END IF;
    st.local_client := p_client;
    st := tessera__remove_holder(st, p_lease);
    IF st.hit AND st.limits <> 0 AND p_reservation <> 0 THEN
        v_i := array_position(st.lim_tenant, st.hit_tenant);
        IF st.lim_window[v_i] IS NOT NULL THEN
            PERFORM tessera__rate_undo(tessera__rate_tenant_key(p_name, st.hit_tenant),
                                       p_reservation, p_at, true);
        END IF;
    END IF;
    IF p_expired AND st.hit THEN
        -- Only when this step released the lease (a give-back sent twice counts once). The
        -- limiter's row is locked after the semaphore's, as in every step that takes both;
        -- a state that expired (dropped by the undo, or not yet swept) counts nothing. A
        -- give-back of the only admission leaves a state that would expire at once: the
        -- state, and so the count, is kept at least one horizon from now, so the count
        -- outlives it (stores/sql/rate.rs `give_back`).
        v_now := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
        UPDATE tessera_rate_limiters l SET expired = l.expired + 1,
            expires_at = greatest(l.expires_at,
                v_now + (SELECT m.horizon FROM tessera__rate_limits(l.config) m))
        WHERE l.name = p_name AND (v_undone OR l.expires_at > v_now);
    END IF;
    st := tessera__hand_off(st);
    PERFORM tessera__finish(st);
    held := st.hit;
    grants := st.local_grants;
    RETURN NEXT;
END $$;
