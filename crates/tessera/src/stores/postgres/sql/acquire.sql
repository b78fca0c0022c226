-- tessera_acquire: grants, queues (p_waiter_ttl not NULL) or refuses; stores/sql/step.rs
-- `acquire`, in one call.
--
-- p_name        the semaphore
-- p_capacity    the capacity the client declares (creates the semaphore if it has no row)
-- p_lease       the lease id (32 hex digits); a retry with the same id returns what it has
-- p_weight      permits wanted, 1 <= p_weight <= p_capacity (checked by the client)
-- p_ttl         lease TTL, µs
-- p_holder      the holder label
-- p_client      this client's id (its wake-up channel is tessera_w<p_client>)
-- p_waiter_ttl  waiter heartbeat TTL, µs; NULL for a try (never queues)
-- p_queue_cap   the queue's cap (with p_waiter_ttl)
-- p_tenant      the tenant (1 to 64 bytes, checked by the client), NULL for none: the
--               tenant "" with share 1 (docs/fair-shares.md; migration 8)
-- p_share       the tenant's share, 1 to 1,000 (checked by the client)
--
-- The queue is ordered by start tags (common.sql, "Fair shares"): a newcomer takes free
-- permits only if its key is below the queue head's, which without tenants means only when
-- nobody waits; a new waiter's position is counted only when a tenant is involved (it is
-- last otherwise).
--
-- One row: outcome 'granted' (weight, seats, fence, holder, acquired_at, expires_at, tenant:
-- the lease's, migration 9),
-- 'queued' (position; expires_at: purge_at, a lower bound of every expiry of the semaphore,
-- when an expiry may free permits), 'no_permit' (available, queued), 'mismatch' (stored_capacity) or
-- 'queue_full'; now_us in every case. A mismatch or a full queue still commits the purge.
CREATE OR REPLACE FUNCTION tessera_acquire(
    p_name text, p_capacity bigint, p_lease text, p_weight bigint, p_ttl bigint,
    p_holder text, p_client text, p_waiter_ttl bigint, p_queue_cap bigint,
    p_tenant text DEFAULT NULL, p_share bigint DEFAULT 1
) RETURNS TABLE (
    outcome text, now_us bigint, weight bigint, seats int4[], fence bigint, holder text,
    acquired_at bigint, expires_at bigint, "position" bigint, available bigint,
    queued bigint, stored_capacity bigint, tenant text
)
LANGUAGE plpgsql AS $$
DECLARE
    st   tessera_step;
    h    tessera_holders;
    seq_ bigint;
    at_  bigint;
    tag_ bigint;
    v_last   bigint;
    v_start  bigint;
    v_finish bigint;
    v_lead   boolean;
BEGIN
    st := tessera__load(p_name, p_capacity);
    now_us := st.now_us;
    -- Every lease and waiter expired: the semaphore is idle, as if it did not exist, and
    -- takes the capacity this client declares (as in the reference model); its tags restart.
    IF st.used = 0 AND st.queued = 0 THEN
        IF st.capacity <> p_capacity THEN
            st.capacity := p_capacity;
            st.dirty := true;
        END IF;
        st := tessera__reset_tags(st);
    END IF;
    IF st.capacity <> p_capacity THEN
        outcome := 'mismatch';
        stored_capacity := st.capacity;
        PERFORM tessera__finish(st);
        RETURN NEXT;
        RETURN;
    END IF;
    -- A retry of an acquire whose reply was lost: report what it already has.
    IF st.used > 0 THEN
        SELECT * INTO h FROM tessera_holders t WHERE t.name = p_name AND t.lease_id = p_lease;
        IF FOUND THEN
            outcome := 'granted';
            weight := h.weight; seats := h.seats; fence := h.fence; holder := h.holder;
            acquired_at := h.acquired_at; expires_at := h.expires_at; tenant := h.tenant;
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- A retry of a queued acquire renews its entry and reports its place, like a heartbeat;
    -- with room in the queue, the insert of a new waiter does both in one statement (below).
    IF p_waiter_ttl IS NOT NULL AND st.queued >= p_queue_cap THEN
        seq_ := tessera__refresh_waiter(st, p_lease, st.now_us + p_waiter_ttl);
        IF seq_ IS NOT NULL THEN
            outcome := 'queued';
            expires_at := st.purge_at;
            "position" := tessera__place(st, p_lease);
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- Its tags (recorded only if it is granted or queued as a new waiter).
    v_last := tessera__last_finish(st, p_tenant);
    v_start := greatest(coalesce(v_last, 0), st.vtime);
    v_finish := v_start + p_weight * 1000 / greatest(p_share, 1);
    -- Only a request that would be the head may take free permits: without tenants, one
    -- that finds nobody waiting; neither a try nor a newcomer jumps the queue.
    v_lead := false;
    IF st.limits = 0 THEN
        IF st.used + p_weight <= st.capacity THEN
            v_lead := tessera__would_lead(st, p_tenant, v_start);
        END IF;
    ELSIF tessera__may_grant(st, p_tenant, p_weight) THEN
        -- With limits (migration 10): a tenant below its floor goes ahead of the queue, and
        -- the head it must be below is the first waiter not at its ceiling.
        v_lead := tessera__below_floor(st, p_tenant, p_weight)
            OR tessera__would_lead(st, p_tenant, v_start);
    END IF;
    IF v_lead THEN
        st := tessera__take_tags(st, p_tenant, v_last IS NOT NULL, v_start, v_finish, true);
        st := tessera__grant(st, p_lease, p_weight, p_ttl, p_holder, p_client, p_tenant);
        outcome := 'granted';
        weight := p_weight; seats := st.seats; fence := st.fence; holder := p_holder;
        acquired_at := st.now_us; expires_at := st.now_us + p_ttl; tenant := p_tenant;
        PERFORM tessera__finish(st);
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_waiter_ttl IS NULL THEN
        outcome := 'no_permit';
        available := greatest(st.capacity - st.used, 0);
        queued := st.queued;
        PERFORM tessera__finish(st);
        RETURN NEXT;
        RETURN;
    END IF;
    IF st.queued >= p_queue_cap THEN
        outcome := 'queue_full';
        PERFORM tessera__finish(st);
        RETURN NEXT;
        RETURN;
    END IF;
    -- A new waiter takes its start tag and seq next_seq (and keeps its tenant); a queued
    -- retry keeps its (lower) key and only renews.
    INSERT INTO tessera_waiters AS w
        (name, seq, tag, lease_id, weight, holder, client, ttl, enqueued_at, expires_at, tenant)
    VALUES (p_name, st.next_seq, v_start, p_lease, p_weight, p_holder, p_client, p_ttl,
            st.now_us, st.now_us + p_waiter_ttl, p_tenant)
    ON CONFLICT (name, lease_id) DO UPDATE SET expires_at = greatest(w.expires_at, excluded.expires_at)
    RETURNING w.seq, w.tag, w.enqueued_at INTO seq_, tag_, at_;
    outcome := 'queued';
    IF seq_ >= st.next_seq AND (seq_ > st.next_seq OR at_ <> st.now_us) THEN
        PERFORM tessera__corrupt(format('waiter seq %s is not below next_seq %s', seq_, st.next_seq));
    END IF;
    IF seq_ = st.next_seq THEN
        st := tessera__take_tags(st, p_tenant, v_last IS NOT NULL, v_start, v_finish, false);
        -- Last without tenants; counted otherwise (it is in the table already).
        IF st.tenants = 0 AND p_tenant IS NULL THEN
            "position" := st.queued;
        ELSE
            "position" := tessera__ahead(st, tag_, seq_);
        END IF;
        st.next_seq := st.next_seq + 1;
        st.queued := st.queued + 1;
        st.purge_at := least(st.purge_at, st.now_us + p_waiter_ttl);
        st.dirty := true;
    ELSE
        "position" := tessera__ahead(st, tag_, seq_);
    END IF;
    expires_at := st.purge_at;
    PERFORM tessera__finish(st);
    RETURN NEXT;
END $$;
