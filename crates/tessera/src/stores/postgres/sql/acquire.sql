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
    v_seen   bigint;
    f        record;
    g        record;
    v_enq    bigint;
    v_cost   bigint;
BEGIN
    -- The enqueue (migration 12; docs/sql-queue.md): a request without a tenant, on a
    -- semaphore without tenants' rows or limits, that finds the permits taken or a queue
    -- ahead of it, and is not a retry (its lease neither holds nor waits), joins the queue
    -- under the tail's lock alone, without the semaphore's. Everything else runs the step.
    IF p_waiter_ttl IS NOT NULL AND p_tenant IS NULL THEN
        v_cost := p_weight * 1000 / greatest(p_share, 1);
        -- One statement decides and takes the tail's lock, held to the commit: seqs are
        -- taken in commit order, F[""] moves under it, and a step that commits with free
        -- permits meanwhile either waits for this commit (and sees the waiter) or is seen
        -- by the read below. The semaphore's row is read without a lock (as of this
        -- statement's start, also after a wait for the tail). Nothing may be due to expire
        -- either: the step would purge first, and might grant.
        UPDATE tessera_tails t
        SET next_seq = t.next_seq + 1, enqueued = t.enqueued + 1,
            finish = greatest(t.finish, s.vtime) + v_cost,
            wait_purge_at = least(t.wait_purge_at,
                (extract(epoch FROM clock_timestamp()) * 1000000)::bigint + p_waiter_ttl)
        FROM tessera_semaphores s
        WHERE t.name = p_name AND s.name = p_name AND s.capacity = p_capacity
          AND s.tenants = 0 AND s.limits = 0 AND s.tag_low IS NULL
          AND (s.used + p_weight > s.capacity OR t.enqueued > s.dequeued)
          AND (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
              < least(s.purge_at, t.wait_purge_at)
          AND s.purge_at <= (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
              + 2 * 86400000000
          AND NOT EXISTS (SELECT 1 FROM tessera_holders x
                          WHERE x.name = p_name AND x.lease_id = p_lease)
          AND NOT EXISTS (SELECT 1 FROM tessera_waiters x
                          WHERE x.name = p_name AND x.lease_id = p_lease)
        RETURNING t.next_seq - 1, t.finish - v_cost, t.enqueued, t.wait_purge_at,
                  (extract(epoch FROM clock_timestamp()) * 1000000)::bigint
        INTO seq_, tag_, v_enq, at_, now_us;
        IF FOUND THEN
            IF current_setting('synchronous_commit') <> 'off' THEN
                PERFORM set_config('synchronous_commit', 'off', true);
            END IF;
            BEGIN
                -- A new snapshot: every step that committed before the tail was ours.
                SELECT s.capacity, s.used, s.dequeued, s.purge_at, s.vtime, s.tenants,
                       s.limits, s.tag_low,
                       (SELECT w.weight FROM tessera_waiters w
                        WHERE w.name = p_name AND w.tag >= coalesce(s.tag_low, s.vtime)
                        ORDER BY w.tag, w.seq LIMIT 1) AS head
                INTO g FROM tessera_semaphores s WHERE s.name = p_name;
                IF NOT FOUND OR g.dequeued > v_enq - 1 THEN
                    PERFORM tessera__corrupt(format('the tail of %L (enqueued %s) has no semaphore row or fewer waiters than dequeued %s',
                        left(p_name, 64), v_enq, g.dequeued));
                END IF;
                -- A tenant or limits came meanwhile: the grants made before this commit may
                -- pass this waiter's tag (vtime beyond it would hide it from every lookup).
                -- The call is undone and the client sends it again (SQLSTATE 40001 is a
                -- transient error), which finds them and runs the step.
                IF g.tenants <> 0 OR g.limits <> 0 OR g.tag_low IS NOT NULL THEN
                    RAISE EXCEPTION USING ERRCODE = '40001',
                        MESSAGE = 'tessera: a tenant or limits arrived during an enqueue; retry';
                END IF;
                -- Requests without a tenant have tags at most F[""]: no grant before this
                -- commit moves vtime past this tag (vtime read now is at most it, but an
                -- older read of it may be lower than vtime now).
                tag_ := greatest(tag_, g.vtime);
                IF v_enq - 1 - g.dequeued >= p_queue_cap OR g.capacity <> p_capacity THEN
                    -- Nothing joins: the tail as it was (F[""] at max(F[""], vtime), the same
                    -- tags for every later request). A capacity changed since the first
                    -- read (a resize, or the semaphore made again) is answered as if it had
                    -- changed before this call.
                    UPDATE tessera_tails t
                    SET next_seq = t.next_seq - 1, enqueued = t.enqueued - 1,
                        finish = t.finish - v_cost
                    WHERE t.name = p_name;
                    IF g.capacity <> p_capacity THEN
                        outcome := 'mismatch';
                        stored_capacity := g.capacity;
                    ELSE
                        outcome := 'queue_full';
                    END IF;
                    RETURN NEXT;
                    RETURN;
                END IF;
                INSERT INTO tessera_waiters AS w
                    (name, seq, tag, lease_id, weight, holder, client, ttl, enqueued_at,
                     expires_at)
                VALUES (p_name, seq_, tag_, p_lease, p_weight, p_holder, p_client, p_ttl,
                        now_us, now_us + p_waiter_ttl)
                ON CONFLICT (name, lease_id) DO NOTHING;
                outcome := 'queued';
                IF FOUND THEN
                    "position" := v_enq - 1 - g.dequeued;
                    expires_at := least(g.purge_at, at_);
                ELSE
                    -- The same lease joined meanwhile (a retry that overtook its first
                    -- call): the tail as it was, and the waiter asks at once.
                    UPDATE tessera_tails t
                    SET next_seq = t.next_seq - 1, enqueued = t.enqueued - 1,
                        finish = t.finish - v_cost
                    WHERE t.name = p_name;
                    "position" := 0;
                    expires_at := now_us + 1;
                END IF;
                -- Permits free for the head (this waiter when none is seen): they were freed
                -- while this enqueue ran, and the waiter asks for a step at once (an expiry
                -- hint 1 µs ahead). The step must not be taken here: the semaphore's row is
                -- locked before the tail, never after.
                IF g.used + coalesce(g.head, p_weight) <= g.capacity THEN
                    expires_at := now_us + 1;
                END IF;
                RETURN NEXT;
                RETURN;
            END;
        END IF;
        -- Otherwise (no row, a newcomer that may lead, a retry, a tenant's rows or limits,
        -- something due to expire) the step, which may also create the row and its tail.
    END IF;
    st := tessera__load(p_name, p_capacity);
    now_us := st.now_us;
    -- The tail before the newcomer is compared with the queue: every waiter enqueued so far
    -- is seen, and none joins until this step commits. A try that finds no room (without
    -- limits) answers from the semaphore's row alone: it compares itself with nobody.
    IF st.tail IS NULL AND NOT (p_waiter_ttl IS NULL AND st.limits = 0
                                AND st.capacity = p_capacity
                                AND st.used + p_weight > st.capacity) THEN
        v_seen := st.enqueued;
        st := tessera__tail(st, 'update');
        IF st.enqueued <> v_seen AND st.queued > 0 AND st.used < st.capacity THEN
            st := tessera__hand_off(st);
        END IF;
    END IF;
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
        st.enqueued := st.enqueued + 1;
        st.tail := 'dirty';
        st.purge_at := least(st.purge_at, st.now_us + p_waiter_ttl);
        st.dirty := true;
    ELSE
        "position" := tessera__ahead(st, tag_, seq_);
    END IF;
    expires_at := st.purge_at;
    PERFORM tessera__finish(st);
    RETURN NEXT;
END $$;
