-- tessera_admit: permits and rate windows in one step (docs/admission.md): grants and charges
-- every window, queues as an admission waiter, or refuses; all or nothing. stores/sql/step.rs
-- `admit` (`decide_admit`) in one call, as stores/redis/scripts/admit.lua; the reference
-- model is Model::admit (stores/memory/ops.rs).
--
-- p_name .. p_queue_cap  as tessera_acquire (acquire.sql): the semaphore, the capacity the
--                        client declares, lease id, weight, lease TTL (µs), holder label,
--                        client id, waiter TTL (µs; NULL for a try, which never queues) and
--                        the queue's cap
-- p_config .. p_cost     the limiter of the same name and the cost, as tessera_rate_acquire
--                        (rate_acquire.sql): canonical limits, N, enforced window and
--                        emission interval of each limit, burst (0: exact mode), cost
-- p_update               replace differing stored limits instead of answering 'ratemismatch'
-- p_at_head              join the queue at its head, not its tail (a request that gave back
--                        an admission it could not use before its use-by instant)
-- p_tenant, p_share      the tenant (NULL: none) and its share, as tessera_acquire's; the
--                        start and finish tags count the window cost p_cost (migration 8)
--
-- One row, now_us in every case: outcome 'granted' (the lease: weight, seats, fence, holder,
-- acquired_at = now_us, expires_at, tenant; reservation, the windows' charge, 0 for a retry of a
-- granted lease id whose charge is not kept), 'queued' ("position", 0 at the head;
-- window_at; expires_at: purge_at, as tessera_acquire's 'queued'), 'refused' (available,
-- queued; window_at), 'mismatch' (stored_capacity), 'ratemismatch' (stored_limits) or
-- 'queue_full'. window_at: when the windows admit the cost, if the permits fit and only the
-- windows refused; NULL otherwise. A refusal, a queue place and every error charge no window;
-- they still commit the purge and hand-off (and a rate step's pruning, sweep or `p_update`).
--
-- Locks: the semaphore's row (tessera__load), then, on this request's turn only, the
-- limiter's row of the same name (tessera__rate_step): the order of every step that takes
-- both (rate_common.sql). The rate step reads the clock once it holds the limiter's row; the
-- step goes on at that instant, so the lease and the charge carry the same one. Nobody can
-- change the semaphore in between (its row is locked), and a lease that expired meanwhile
-- still counts (the purge ran at the earlier reading): permits that fit then fit now.
--
-- An admission waiter's row carries `gate`: the instant its windows admit its cost (0 while
-- it waits for permits), which every hand-off stops at and wakes it by (common.sql); only
-- this step grants it, charging its windows.
--
-- Window ceilings (migration 11; docs/fair-shares.md, "A ceiling on a share of the
-- windows"; the reference is Model::admit): on its turn, a request of a tenant with a window
-- ceiling asks the tenant's own limiter first (the shared configuration scaled,
-- tessera__rate_scaled; its state under tessera__rate_tenant_key, its stored configuration
-- replaced as by `p_update` when the percentage changed), charging nothing. A cost above the
-- scaled largest cost raises SQLSTATE TS002 (DETAIL: the cost and that largest cost), which
-- the client reports as InvalidInput::Cost: the statement rolls back, nothing changes. If
-- the tenant's limiter refuses, the tenant is window-capped until the instant it would admit
-- (tessera_limits.capped_until), nothing is charged, window_at is the later of that instant
-- and the shared limiter's own (asked without charging), and the hand-off runs again: the
-- waiters behind a capped tenant's admission waiter may now be the head. If it admits, the
-- shared limiter decides as before; if that admits, the tenant's limiter is charged the same
-- cost at the same instant (`p_now`) and its seq and tail become the shared reservation, so
-- a give-back or a settle names both charges with one id. Locks: the shared limiter's row
-- before the tenant's (the order of every step that takes both). A request of a tenant
-- without a window ceiling runs the statements it ran before.
CREATE OR REPLACE FUNCTION tessera_admit(
    p_name text, p_capacity bigint, p_lease text, p_weight bigint, p_ttl bigint,
    p_holder text, p_client text, p_waiter_ttl bigint, p_queue_cap bigint,
    p_config text, p_n bigint[], p_l bigint[], p_t bigint[], p_burst bigint, p_cost bigint,
    p_update boolean, p_at_head boolean, p_tenant text DEFAULT NULL, p_share bigint DEFAULT 1
) RETURNS TABLE (
    outcome text, now_us bigint, weight bigint, seats int4[], fence bigint, holder text,
    acquired_at bigint, expires_at bigint, reservation bigint, "position" bigint,
    window_at bigint, available bigint, queued bigint, stored_capacity bigint,
    stored_limits text, tenant text
)
LANGUAGE plpgsql AS $$
DECLARE
    st    tessera_step;
    h     tessera_holders;
    seq_  bigint;
    tag_  bigint;
    turn  boolean;
    rate  record;
    v_last   bigint;
    v_start  bigint;
    v_finish bigint;
    v_lead   boolean := false;
    head     record;
    v_i      int;
    v_pct    bigint;
    v_key    text;
    v_own    record;
    scaled   record;
    v_seen   bigint;
BEGIN
    st := tessera__load(p_name, p_capacity);
    now_us := st.now_us;
    -- The tail before anything is compared with the queue (migration 12, as tessera_acquire).
    IF st.tail IS NULL THEN
        v_seen := st.enqueued;
        st := tessera__tail(st, 'update');
        IF st.enqueued <> v_seen AND st.queued > 0 AND st.used < st.capacity THEN
            st := tessera__hand_off(st);
        END IF;
    END IF;
    -- Every lease and waiter expired: the semaphore is idle, as if it did not exist, and
    -- takes the capacity this client declares (as tessera_acquire); its tags restart.
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
    -- A retry whose reply was lost: the grant stands (its charge id is not kept, so a
    -- give-back of it releases the permits and leaves the windows charged).
    IF st.used > 0 THEN
        SELECT * INTO h FROM tessera_holders t WHERE t.name = p_name AND t.lease_id = p_lease;
        IF FOUND THEN
            outcome := 'granted';
            weight := h.weight; seats := h.seats; fence := h.fence; holder := h.holder;
            acquired_at := h.acquired_at; expires_at := h.expires_at; tenant := h.tenant;
            reservation := 0;
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    -- A queued lease id renews its entry (a try never has one) and keeps its key.
    IF p_waiter_ttl IS NOT NULL AND st.queued > 0 THEN
        UPDATE tessera_waiters w SET expires_at = greatest(w.expires_at, st.now_us + p_waiter_ttl)
        WHERE w.name = p_name AND w.lease_id = p_lease
        RETURNING w.seq, w.tag INTO seq_, tag_;
    END IF;
    "position" := 0;
    IF seq_ IS NOT NULL THEN
        "position" := tessera__ahead(st, tag_, seq_);
    ELSE
        -- A newcomer's tags (recorded only if it is granted or queued), counting the cost.
        v_last := tessera__last_finish(st, p_tenant);
        v_start := greatest(coalesce(v_last, 0), st.vtime);
        v_finish := v_start + p_cost * 1000 / greatest(p_share, 1);
        IF st.used + p_weight <= st.capacity OR st.limits <> 0 THEN
            v_lead := tessera__would_lead(st, p_tenant, v_start);
        END IF;
    END IF;
    -- A waiter's turn is at the head; a newcomer's when it would lead (without tenants: when
    -- nobody waits), or first of all for one that gave back an admission it could not use in
    -- time. Either way its weight must fit. With limits (migration 10) the head is the first
    -- waiter not at its ceiling, a tenant below its floor has its turn too, and the weight
    -- must be one it may be granted.
    IF st.limits = 0 THEN
        turn := st.used + p_weight <= st.capacity
            AND CASE WHEN seq_ IS NOT NULL THEN "position" = 0
                     ELSE v_lead OR p_at_head END;
    ELSE
        head := tessera__limited_head(st);
        turn := tessera__may_grant(st, p_tenant, p_weight)
            AND (tessera__below_floor(st, p_tenant, p_weight)
                 OR CASE WHEN seq_ IS NOT NULL THEN (head.o_tag, head.o_seq) = (tag_, seq_)
                         ELSE v_lead OR p_at_head END);
    END IF;
    IF turn AND st.limits <> 0 THEN
        v_i := array_position(st.lim_tenant, p_tenant);
        v_pct := st.lim_window[v_i];
    END IF;
    IF v_pct IS NOT NULL THEN
        -- A window ceiling: the tenant's own limiter first, charging nothing.
        SELECT * INTO scaled FROM tessera__rate_scaled(p_config, p_n, p_l, p_burst, v_pct);
        IF p_cost > scaled.max_cost THEN
            RAISE EXCEPTION USING ERRCODE = 'TS002',
                MESSAGE = format('cost %s is above %s, the largest under tenant %L''s window ceiling of %s%%',
                                 p_cost, scaled.max_cost, left(p_tenant, 64), v_pct),
                DETAIL = p_cost || ' ' || scaled.max_cost;
        END IF;
        PERFORM tessera__rate_lock(p_name, true);
        v_key := tessera__rate_tenant_key(p_name, p_tenant);
        SELECT * INTO v_own FROM tessera__rate_step(v_key, scaled.config, scaled.n, scaled.l,
            scaled.t, scaled.burst, p_cost, NULL, true, true);
        IF v_own.outcome <> 'admitted' THEN
            -- Window-capped: the shared limiter only says when it would admit.
            SELECT * INTO rate FROM tessera__rate_step(p_name, p_config, p_n, p_l, p_t,
                p_burst, p_cost, NULL, p_update, true);
            st.now_us := rate.now_us;
            now_us := st.now_us;
            IF rate.outcome = 'mismatch' THEN
                outcome := 'ratemismatch';
                stored_limits := rate.stored;
                PERFORM tessera__finish(st);
                RETURN NEXT;
                RETURN;
            END IF;
            UPDATE tessera_limits l SET capped_until = v_own.at_us
            WHERE l.name = p_name AND l.tenant = p_tenant;
            st.lim_capped[v_i] := v_own.at_us;
            window_at := greatest(v_own.at_us, rate.at_us);
            -- The waiters behind this tenant's admission waiters may be the head now.
            IF st.queued > 0 AND st.used < st.capacity THEN
                st := tessera__hand_off(st);
            END IF;
            turn := false;
        END IF;
    END IF;
    IF turn THEN
        -- The windows, asked for now only (a try: NULL max wait).
        SELECT * INTO rate FROM tessera__rate_step(p_name, p_config, p_n, p_l, p_t, p_burst,
                                                   p_cost, NULL, p_update);
        st.now_us := rate.now_us;
        now_us := st.now_us;
        IF rate.outcome = 'admitted' AND v_pct IS NOT NULL THEN
            -- The tenant's charge, at the shared one's instant and under its id.
            SELECT * INTO v_own FROM tessera__rate_step(v_key, scaled.config, scaled.n,
                scaled.l, scaled.t, scaled.burst, p_cost, NULL, true, false, rate.at_us);
            IF v_own.outcome <> 'admitted' THEN
                PERFORM tessera__corrupt(format('tenant %L''s limiter on %L admitted %s at %s, not at %s',
                    left(p_tenant, 64), left(p_name, 64), p_cost, v_own.at_us, rate.at_us));
            END IF;
            UPDATE tessera_rate_limiters l SET seq = rate.reservation, tail = rate.reservation
            WHERE l.name = v_key;
            IF st.lim_capped[v_i] IS NOT NULL THEN
                UPDATE tessera_limits l SET capped_until = NULL
                WHERE l.name = p_name AND l.tenant = p_tenant;
                st.lim_capped[v_i] := NULL;
            END IF;
        END IF;
        IF rate.outcome = 'admitted' THEN
            IF seq_ IS NOT NULL THEN
                st.vtime := greatest(st.vtime, tag_);
                st := tessera__remove_waiter(st, p_lease);
            ELSE
                -- At the head by a give-back, vtime stays where the head is.
                st := tessera__take_tags(st, p_tenant, v_last IS NOT NULL, v_start, v_finish,
                                         v_lead);
            END IF;
            st := tessera__grant(st, p_lease, p_weight, p_ttl, p_holder, p_client, p_tenant);
            outcome := 'granted';
            weight := p_weight; seats := st.seats; fence := st.fence; holder := p_holder;
            acquired_at := st.now_us; expires_at := st.now_us + p_ttl; tenant := p_tenant;
            -- The waiters behind a head that was an admission get what still fits.
            IF st.queued > 0 AND st.used < st.capacity THEN
                st := tessera__hand_off(st);
            END IF;
            reservation := rate.reservation;
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        ELSIF rate.outcome = 'mismatch' THEN
            outcome := 'ratemismatch';
            stored_limits := rate.stored;
            PERFORM tessera__finish(st);
            RETURN NEXT;
            RETURN;
        END IF;
        window_at := rate.at_us;
    END IF;
    IF seq_ IS NOT NULL THEN
        -- Queued: the entry lives on, and its gate says when a hand-off may wake it.
        UPDATE tessera_waiters w SET gate = coalesce(window_at, 0)
        WHERE w.name = p_name AND w.lease_id = p_lease;
        outcome := 'queued';
        expires_at := st.purge_at;
        PERFORM tessera__finish(st);
        RETURN NEXT;
        RETURN;
    END IF;
    IF p_waiter_ttl IS NULL THEN
        outcome := 'refused';
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
    st := tessera__take_tags(st, p_tenant, v_last IS NOT NULL, v_start, v_finish, false);
    IF p_at_head AND st.queued > 0 THEN
        -- First in the queue: the head's tag and a seq below every waiter's (head_seq, a
        -- lower bound of every waiter's seq, follows it down), so seq stays unique.
        SELECT w.tag INTO tag_ FROM tessera_waiters w
        WHERE w.name = p_name AND w.tag >= coalesce(st.low, st.vtime) ORDER BY w.tag, w.seq LIMIT 1;
        IF tag_ IS NULL THEN
            PERFORM tessera__corrupt(format('queued %s without a waiter row', st.queued));
        END IF;
        seq_ := st.head_seq - 1;
        st.head_seq := seq_;
        "position" := 0;
    ELSE
        tag_ := v_start;
        seq_ := st.next_seq;
        -- Last without tenants; counted otherwise.
        IF st.tenants = 0 AND p_tenant IS NULL THEN
            "position" := st.queued;
        ELSE
            "position" := tessera__ahead(st, tag_, seq_);
        END IF;
        st.next_seq := st.next_seq + 1;
    END IF;
    INSERT INTO tessera_waiters
        (name, seq, tag, lease_id, weight, holder, client, ttl, enqueued_at, expires_at, gate,
         tenant)
    VALUES (p_name, seq_, tag_, p_lease, p_weight, p_holder, p_client, p_ttl, st.now_us,
            st.now_us + p_waiter_ttl, coalesce(window_at, 0), p_tenant);
    st.queued := st.queued + 1;
    st.enqueued := st.enqueued + 1;
    st.tail := 'dirty';
    st.purge_at := least(st.purge_at, st.now_us + p_waiter_ttl);
    st.dirty := true;
    outcome := 'queued';
    expires_at := st.purge_at;
    PERFORM tessera__finish(st);
    RETURN NEXT;
END $$;
