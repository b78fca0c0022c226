-- tessera PostgreSQL store: the step shared by every operation (stores/sql/step.rs, helper by
-- helper), as PL/pgSQL functions over the state `tessera_step`. Each takes the state and
-- returns it changed (`st := tessera__x(st, …)`); none commits or locks anything itself except
-- `tessera__load`, which every operation but delete calls first.
--
-- Invariants (as in stores/sql/mod.rs): the semaphore row is locked FOR UPDATE before
-- anything is read, and the clock is read once after that lock; `used` is the sum of holder
-- weights and `queued` the number of waiters; seats at or above `seat_high` are free, seats
-- returned below it are rows of tessera_free_seats; a fence is max(last_fence + 1, now in
-- µs), where a new or idle row's last_fence was first raised to fence_hwm (`tessera__load`);
-- every holder's and waiter's expiry is at or after `purge_at`; every waiter's seq is at or
-- above `head_seq`, which is at most next_seq (and below 0 only after admissions joined at
-- the head, admit.sql; a lower bound only: the hand-off, in (tag, seq) order, leaves it
-- where it is); every waiter's start tag is at or above coalesce(low, vtime) (fair shares,
-- migration 8; `low` for ceilings and floors, migration 10: below); an admission waiter (`gate` not NULL, migration 6) is never
-- granted by a hand-off, only by its own step (tessera_admit). Every value read is checked:
-- a wrong one raises SQLSTATE TS001, which the client reports as Error::Corrupt.
--
-- Cost: each statement a step runs costs a few µs of executor work and each PL/pgSQL
-- expression is compiled again in every transaction, so the common paths run few of either:
-- an acquire of a free permit of an idle semaphore runs 5 statements (lock, create, high-water
-- mark, holder, row), a release 4 (lock, holder, row, high-water mark), an enqueue 4 and a
-- release that hands off 5 plus the NOTIFY; the purge runs only once `purge_at` has passed.
--
-- Fair shares (docs/fair-shares.md, "The SQL stores"; migration 8): the semaphore's row keeps
-- the virtual time `vtime`, the finish tag `finish` of requests that name no tenant and the
-- number `tenants` of its rows in tessera_tenants (a named tenant's finish tag). A request of
-- tenant t with share w and cost c starts at S = max(vtime, F[t]) and moves F[t] to
-- S + c * 1000 / w; a waiter's row carries S as `tag`; a grant moves vtime to the granted
-- request's S. The head is the least (tag, seq), which is never below vtime: a grant takes
-- the least key (a newcomer that leads, or the head) and a waiter joins at or above vtime
-- (or at the head's tag), so every lookup of the queue starts from `tag >= vtime` and skips
-- the index entries of waiters granted before. A request without a tenant reads and writes
-- only the semaphore's row: no statement is added without tenants. A newcomer leads (may take
-- free permits) when its key (S, next_seq) is below the head's, read only when a tenant is
-- involved (`tessera__would_lead`); a new waiter's position is counted only then
-- (`tessera__ahead`). Tenants' rows at or below vtime are pruned once there are more than
-- 2 * (used + queued) + 16 of them, and every one goes with an idle semaphore's row.
--
-- Ceilings and floors (docs/fair-shares.md, "Ceilings and floors"; migration 10): a name's
-- limits live in tessera_limits, which outlives the semaphore's row, and the row counts them
-- in `limits`, read after its lock with the fence high-water mark for a new or idle row (a
-- statement that step already runs) and kept by tessera_set_tenant_limits. Without limits
-- every step is as before, statement for statement (`IF st.limits <> 0` guards every
-- addition). With limits a grant may go past the queue's least key, so `vtime` may move past
-- tags still queued: a step with limits pins the lookups' bound `low` at the vtime it began
-- with (or the row's `tag_low`), and its finish stores the queue's least tag in `tag_low`
-- while that is below vtime (one probe, with limits only). Without limits `low` is NULL and
-- the lookups start from vtime, as before; a `tag_low` left by limits since removed is
-- raised by the hand-off to each head it grants (the least key) and cleared once it reaches
-- vtime or the queue empties.
--
-- Window ceilings (docs/fair-shares.md, "A ceiling on a share of the windows"; migration
-- 11): a tenant's window ceiling and window-capped instant are limits of the name too
-- (`lim_window`, `lim_capped`, read with the others). The head passes over the admission
-- waiters of a tenant window-capped now (tessera__limited_head), as over a tenant at its
-- ceiling; plain waiters are never window-capped. tessera_admit asks and charges the
-- tenant's own limiter (admit.sql), tessera_give_back and tessera_settle return or settle
-- its charge with the shared one's, by the lease's tenant (`hit_tenant`).
--
-- The queue's tail (migration 12; docs/sql-queue.md): next_seq, the count `enqueued` of
-- waiters ever inserted, the finish tag F[""] and the waiters' expiry bound `wait_purge_at`
-- live in the row of tessera_tails, the semaphore's row counts `dequeued` (waiters granted,
-- purged or cancelled) and `queued` = enqueued - dequeued. tessera__load reads the tail
-- without its lock (so `queued` is a lower bound, and the state's `dequeued` is exact); a
-- step locks it after the semaphore's row, FOR UPDATE before it compares a newcomer with the
-- queue or writes the tail (tessera__tail), FOR SHARE before it commits with free permits
-- (tessera__requeue, from tessera__finish), and an enqueue that would not lead takes only
-- the tail (tessera_acquire). Tenants' rows (F[t]) are written only while the tail is held.
--
-- Revision: `tessera__step_revision()` returns ops.rs's STEP_REVISION; a connect that finds a
-- lower one creates these functions again (see the PostgreSQL store's module docs).
--
-- Durability: a step commits asynchronously (`synchronous_commit` off for its transaction)
-- unless it grants, renews, revokes or deletes: then the session's own setting (on by
-- default) is restored before the commit (`tessera__grant`, `tessera__durable`). What an asynchronous commit
-- may lose in a server crash only delays or drops work, never over-grants: an enqueue or a
-- waiter's heartbeat (the waiter re-checks and finds itself gone), a release or cancel that
-- granted nothing (the permit comes back by its TTL), a purge (it runs again). A later
-- durable commit flushes every earlier one with it, so a durable grant is never ordered
-- before a lost step it depends on. Without this every step would wait for the disk while
-- holding the semaphore's row lock, and the enqueues of W2 would queue behind each flush.
--
-- Bounded work: a step purges at most 256 expired holders and 4,096 expired waiters and
-- grants at most 1,024 waiters; the rest is left to the next step (the queue head's own
-- heartbeat runs one).

-- Raises tessera's "corrupt" error (SQLSTATE TS001) with `msg`.
CREATE OR REPLACE FUNCTION tessera__corrupt(msg text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = 'TS001', MESSAGE = msg;
END $$;

-- The wake-up channel of client `client` (one per client process).
CREATE OR REPLACE FUNCTION tessera__channel(client text) RETURNS text
LANGUAGE sql IMMUTABLE AS $$ SELECT 'tessera_w' || client $$;

-- Pushes a wake-up for `lease` to `client`'s channel (sent at commit). A client id that is not
-- 1 to 32 hex digits (damaged, or empty) gets none: its waiter's heartbeat finds the grant.
CREATE OR REPLACE FUNCTION tessera__wake(client text, lease text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF client ~ '^[0-9a-f]{1,32}$' THEN
        PERFORM pg_notify(tessera__channel(client), lease);
    END IF;
END $$;

-- Checks a lease id read back from a row.
CREATE OR REPLACE FUNCTION tessera__check_lease(lease text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF lease IS NULL OR lease !~ '^[0-9a-f]{32}$' THEN
        PERFORM tessera__corrupt(format('lease id %L is not 32 hex digits', left(lease, 64)));
    END IF;
END $$;

-- Checks a holder's weight and seats: 1 <= weight, as many seats as the weight, ascending,
-- none negative.
CREATE OR REPLACE FUNCTION tessera__check_seats(weight bigint, seats int4[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    i int;
BEGIN
    IF weight IS NULL OR weight < 1 OR weight > 1000000 THEN
        PERFORM tessera__corrupt(format('weight = %s is out of range', weight));
    END IF;
    IF seats IS NULL OR coalesce(cardinality(seats), 0) <> weight
       OR array_position(seats, NULL) IS NOT NULL OR seats[1] < 0 THEN
        PERFORM tessera__corrupt(format('seats %s for weight %s', left(seats::text, 64), weight));
    END IF;
    FOR i IN 2 .. cardinality(seats) LOOP
        IF seats[i] <= seats[i - 1] THEN
            PERFORM tessera__corrupt(format('seats %s are not ascending', left(seats::text, 64)));
        END IF;
    END LOOP;
END $$;

-- Makes this step's commit durable: restores the session's synchronous_commit (see above).
CREATE OR REPLACE FUNCTION tessera__durable(st tessera_step) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF st.sync IS NOT NULL AND st.sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', st.sync, true);
    END IF;
END $$;

-- The first statement of a step: locks the semaphore's row (creating it with `create` as
-- capacity when `create` is not NULL: an acquire), then reads the clock and the counters,
-- then purges if anything may have expired and hands off if the head may fit. Without a row
-- and without `create`, returns a state with `found` false: nothing to lock, nothing changes.
--
-- The fence high-water mark is read only for a new or idle row (nothing used or queued),
-- whose `last_fence` is raised to it: a live row's `last_fence` already lies above every
-- fence its name had before its last deletion (its row was new then), so reading the mark
-- again could not change a fence of this name. (Fences of different names are not ordered.)
--
-- `purge_at` is a lower bound of every holder's and waiter's expiry (0 is always one), kept
-- by every insert and recomputed by the purge: while `now < purge_at` nothing can have
-- expired and the purge is skipped. A bound further ahead than any TTL allows (damage, or
-- the clock stepped back) is not trusted: the step purges and recomputes it. In the state,
-- NULL means no holder or waiter at all (`least` ignores it).
CREATE OR REPLACE FUNCTION tessera__load(p_name text, p_create bigint) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
    r  record;
BEGIN
    st.name := p_name;
    st.sync := current_setting('synchronous_commit');
    IF st.sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    st.dirty := false;
    st.hit := false;
    -- The tail is read in the same statement, without its lock (migration 12): what it says
    -- is a committed state, possibly older than the semaphore's row (read after waiting for
    -- its lock), so `queued` is a lower bound until tessera__tail locks the tail.
    SELECT s.*, t.next_seq AS t_next_seq, t.enqueued AS t_enqueued, t.finish AS t_finish,
           t.wait_purge_at AS t_wait_purge_at
    INTO r FROM tessera_semaphores s LEFT JOIN tessera_tails t ON t.name = s.name
    WHERE s.name = p_name FOR UPDATE OF s;
    IF NOT FOUND THEN
        IF p_create IS NULL THEN
            st.found := false;
            st.now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
            RETURN st;
        END IF;
        -- A placeholder with nothing used or queued, which the step treats as a missing row;
        -- the upsert locks the row whoever created it (a concurrent delete only makes the
        -- insert run again, inside the statement), then its tail (the insert of the tail
        -- reads the semaphore's row first: the lock order), which this step then holds.
        WITH s AS (
            INSERT INTO tessera_semaphores AS s
                (name, capacity, used, dequeued, last_fence, seat_high, purge_at)
            VALUES (p_name, p_create, 0, 0, 0, 0, 0)
            ON CONFLICT (name) DO UPDATE SET name = s.name
            RETURNING *
        ), t AS (
            INSERT INTO tessera_tails AS t (name, next_seq, enqueued, finish)
            SELECT s.name, 0, 0, 0 FROM s
            ON CONFLICT (name) DO UPDATE SET name = t.name
            RETURNING t.next_seq, t.enqueued, t.finish, t.wait_purge_at
        )
        SELECT s.*, t.next_seq AS t_next_seq, t.enqueued AS t_enqueued, t.finish AS t_finish,
               t.wait_purge_at AS t_wait_purge_at
        INTO r FROM s, t;
        st.tail := 'update';
    END IF;
    -- The clock only now: clock_timestamp() in the locking statement could be read before
    -- the wait for the lock ended.
    st.now_us := (extract(epoch FROM clock_timestamp()) * 1000000)::bigint;
    IF r.capacity IS NULL OR r.capacity < 1 OR r.capacity > 1000000 THEN
        PERFORM tessera__corrupt(format('capacity = %s is out of range', r.capacity));
    END IF;
    IF r.used IS NULL OR r.used < 0 OR r.used > 1000000 OR r.dequeued IS NULL OR r.dequeued < 0
       OR r.last_fence IS NULL OR r.last_fence < 0
       OR r.seat_high IS NULL OR r.seat_high < 0 OR r.seat_high > 1000000
       OR r.head_seq IS NULL
       OR r.vtime IS NULL OR r.vtime < 0
       OR r.tenants IS NULL OR r.tenants < 0 OR r.limits IS NULL OR r.limits < 0
       OR r.tag_low < 0 OR r.t_enqueued IS NULL OR r.t_enqueued < 0 OR r.t_next_seq IS NULL
       OR r.t_next_seq < 0 OR r.t_finish IS NULL OR r.t_finish < 0 THEN
        PERFORM tessera__corrupt(format('semaphore row (used %s, dequeued %s, last_fence %s, seat_high %s, head_seq %s, vtime %s, tenants %s, limits %s, tag_low %s) or its tail (enqueued %s, next_seq %s, finish %s) is out of range',
            r.used, r.dequeued, r.last_fence, r.seat_high, r.head_seq, r.vtime,
            r.tenants, r.limits, r.tag_low, r.t_enqueued, r.t_next_seq, r.t_finish));
    END IF;
    st.enqueued := r.t_enqueued;
    st.dequeued := r.dequeued;
    st.queued := greatest(r.t_enqueued - r.dequeued, 0);
    st.next_seq := r.t_next_seq;
    st.finish := r.t_finish;
    st.wait_purge_at := r.t_wait_purge_at;
    st.found := true;
    st.capacity := r.capacity;
    st.used := r.used;
    st.last_fence := r.last_fence;
    st.head_seq := r.head_seq;
    st.seat_high := r.seat_high;
    st.purge_at := r.purge_at;
    st.vtime := r.vtime;
    st.tenants := r.tenants;
    st.low := CASE WHEN r.tag_low IS NULL THEN NULL ELSE least(r.tag_low, r.vtime) END;
    st.limits := r.limits;
    st.hwm := 0;
    IF st.used = 0 AND st.queued = 0 THEN
        -- A new (placeholder) or idle row: it starts at the store-wide high-water mark, and
        -- there is nothing to purge or hand off. The name's limits (nobody holds anything)
        -- come in the same statement, read after the row lock: a tessera_set_tenant_limits
        -- that committed before it is seen, one after it waits for the row and counts them
        -- itself (migration 10).
        SELECT m.value, l.t, l.c, l.f, l.w, l.u
        INTO st.hwm, st.lim_tenant, st.lim_ceiling, st.lim_floor, st.lim_window, st.lim_capped
        FROM tessera_meta m,
             LATERAL (SELECT array_agg(x.tenant ORDER BY x.tenant) AS t,
                             array_agg(x.ceiling ORDER BY x.tenant) AS c,
                             array_agg(x.floor ORDER BY x.tenant) AS f,
                             array_agg(x.window_ceiling ORDER BY x.tenant) AS w,
                             array_agg(x.capped_until ORDER BY x.tenant) AS u
                      FROM tessera_limits x WHERE x.name = p_name) l
        WHERE m.key = 'fence_hwm';
        IF st.hwm IS NULL OR st.hwm < 0 THEN
            PERFORM tessera__corrupt(format('fence_hwm = %s is missing or negative', st.hwm));
        END IF;
        st.limits := coalesce(cardinality(st.lim_tenant), 0);
        IF st.limits <> 0 THEN
            st.lim_held := array_fill(0::bigint, ARRAY[st.limits::int]);
            st := tessera__check_limits(st);
            st.low := coalesce(st.low, st.vtime);
        END IF;
        IF st.limits <> r.limits THEN
            st.dirty := true;
        END IF;
        st.last_fence := greatest(st.last_fence, st.hwm);
        st.purge_at := NULL;
        RETURN st;
    END IF;
    IF st.purge_at IS NULL OR st.now_us >= st.purge_at
       OR st.purge_at > st.now_us + 2 * 86400000000 OR st.now_us >= st.wait_purge_at THEN
        st := tessera__purge(st);
    END IF;
    IF st.limits <> 0 THEN
        st := tessera__load_limits(st);
        st.low := coalesce(st.low, st.vtime);
    END IF;
    IF st.queued > 0 AND st.used < st.capacity THEN
        st := tessera__hand_off(st);
    END IF;
    RETURN st;
END $$;

-- Locks the semaphore's tail (migration 12) in `p_mode`: 'update' before a step compares a
-- newcomer with the queue or writes the tail (next_seq, enqueued, the tags), 'share' before
-- it commits with free permits, 'reset' (an update) when the purge takes the waiters'
-- expiry bound `wait_purge_at` over. Once locked, `enqueued`, so `queued`, `next_seq` and
-- `finish` are exact: no enqueue is in flight, and every one that committed is seen (a
-- locking read returns the latest committed version). A step holding the semaphore's row
-- takes the tail after it, never before (the lock order).
CREATE OR REPLACE FUNCTION tessera__tail(st tessera_step, p_mode text) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    t record;
BEGIN
    IF p_mode = 'share' THEN
        SELECT x.next_seq, x.enqueued, x.finish, x.wait_purge_at INTO t
        FROM tessera_tails x WHERE x.name = st.name FOR SHARE;
    ELSIF p_mode = 'reset' THEN
        UPDATE tessera_tails x SET wait_purge_at = NULL WHERE x.name = st.name
        RETURNING x.next_seq, x.enqueued, x.finish, x.wait_purge_at INTO t;
        p_mode := 'update';
    ELSE
        SELECT x.next_seq, x.enqueued, x.finish, x.wait_purge_at INTO t
        FROM tessera_tails x WHERE x.name = st.name FOR UPDATE;
    END IF;
    IF NOT FOUND OR t.enqueued IS NULL OR t.enqueued < st.dequeued OR t.next_seq IS NULL
       OR t.next_seq < 0 OR t.next_seq < st.head_seq OR t.finish IS NULL OR t.finish < 0 THEN
        PERFORM tessera__corrupt(format('tail (enqueued %s, next_seq %s, finish %s) of a row with dequeued %s, head_seq %s is out of range',
            t.enqueued, t.next_seq, t.finish, st.dequeued, st.head_seq));
    END IF;
    st.tail := p_mode;
    st.enqueued := t.enqueued;
    st.queued := t.enqueued - st.dequeued;
    st.next_seq := t.next_seq;
    st.finish := t.finish;
    st.wait_purge_at := t.wait_purge_at;
    RETURN st;
END $$;

-- Counts `n` waiters that left the queue (granted, purged, cancelled) in `dequeued`.
CREATE OR REPLACE FUNCTION tessera__dequeued(st tessera_step, n bigint) RETURNS tessera_step
LANGUAGE plpgsql AS $$
BEGIN
    st.dequeued := st.dequeued + n;
    -- Until the tail is locked, `queued` is a lower bound (tessera__load): this step may
    -- have removed waiters it had not counted.
    st.queued := greatest(st.queued - n, 0);
    IF st.enqueued < st.dequeued THEN
        IF st.tail IS NOT NULL THEN
            PERFORM tessera__corrupt(format('enqueued %s < dequeued %s', st.enqueued, st.dequeued));
        END IF;
        st.enqueued := st.dequeued;
    END IF;
    st.dirty := true;
    RETURN st;
END $$;

-- A step that would commit with free permits without holding the tail (migration 12):
-- takes the tail FOR SHARE and hands off again from that fresh read, so that an enqueue in
-- flight is either seen here (it committed before the lock) or sees this step's freed
-- permits (its tail update waits for this commit, and its next read of the semaphore's row
-- is a new snapshot) and asks for a step at once. docs/sql-queue.md, "No lost wake-up".
CREATE OR REPLACE FUNCTION tessera__requeue(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    v_seen bigint := st.enqueued;
BEGIN
    IF st.found AND st.tail IS NULL AND st.used < st.capacity
       AND (st.dirty OR st.queued > 0) THEN
        st := tessera__tail(st, 'share');
        -- The hand-offs of this step saw every waiter counted before: only newer ones may
        -- be granted now.
        IF st.queued > 0 AND st.enqueued <> v_seen THEN
            st := tessera__hand_off(st);
        END IF;
    END IF;
    RETURN st;
END $$;

-- Writes the semaphore row back if it changed, or deletes it (with any free seats) when it
-- has neither holders nor waiters, raising the fence high-water mark to its last fence.
-- Migration 12: the tail goes with it, and only if no waiter was enqueued since the step
-- read it (the delete waits for an enqueue in flight); with free permits the queue is read
-- again under the tail's lock first (tessera__requeue), and grants made then are pushed with
-- pg_notify to every waiter, this step's caller's too (its reply was already made).
CREATE OR REPLACE FUNCTION tessera__finish(st tessera_step) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT st.found THEN
        RETURN;
    END IF;
    IF st.used = 0 AND st.queued = 0 THEN
        DELETE FROM tessera_tails t WHERE t.name = st.name AND t.enqueued = st.dequeued;
        IF FOUND THEN
            DELETE FROM tessera_semaphores WHERE name = st.name;
            IF st.seat_high <> 0 THEN
                DELETE FROM tessera_free_seats WHERE name = st.name;
            END IF;
            -- Idle: the tags restart at 0 with the next request.
            IF st.tenants <> 0 THEN
                DELETE FROM tessera_tenants WHERE name = st.name;
            END IF;
            -- Written only when a semaphore goes, not at every grant: a grant reads the mark
            -- but does not serialize every semaphore of the store on its row.
            UPDATE tessera_meta SET value = st.last_fence
            WHERE key = 'fence_hwm' AND value < st.last_fence;
            RETURN;
        END IF;
        -- Waiters were enqueued meanwhile (with the tail locked, none could be): they are
        -- handed what is free, as below.
        IF st.tail IS NOT NULL THEN
            PERFORM tessera__corrupt(format('the tail of %L counts waiters the step did not see',
                left(st.name, 64)));
        END IF;
        st.local_client := NULL;
        st := tessera__tail(st, 'share');
        IF st.queued > 0 THEN
            st := tessera__hand_off(st);
        END IF;
        st.dirty := true;
    ELSE
        st.local_client := NULL;
        st := tessera__requeue(st);
    END IF;
    IF st.dirty THEN
        IF st.limits <> 0 AND st.queued > 0 AND st.low < st.vtime THEN
            -- The queue's least tag, the tightest bound (one probe from the bound before).
            SELECT w.tag INTO st.low FROM tessera_waiters w
            WHERE w.name = st.name AND w.tag >= st.low ORDER BY w.tag, w.seq LIMIT 1;
        END IF;
        -- `queued` is exact only with the tail locked: head_seq is reset only then. (A
        -- waiter `queued` may not count yet has a tag at or above vtime: tag_low may go.)
        UPDATE tessera_semaphores
        SET capacity = st.capacity, used = st.used, dequeued = st.dequeued,
            last_fence = st.last_fence, seat_high = st.seat_high,
            purge_at = coalesce(st.purge_at, 0),
            head_seq = CASE WHEN st.queued = 0 AND st.tail IS NOT NULL THEN st.next_seq
                            ELSE st.head_seq END,
            vtime = st.vtime, tenants = st.tenants, limits = st.limits,
            tag_low = CASE WHEN st.queued = 0 OR st.low IS NULL OR st.low >= st.vtime THEN NULL
                           ELSE st.low END
        WHERE name = st.name;
    END IF;
    IF st.tail = 'dirty' THEN
        UPDATE tessera_tails t
        SET next_seq = st.next_seq, enqueued = st.enqueued, finish = st.finish
        WHERE t.name = st.name;
    END IF;
END $$;

-- Drops expired holders (at most 256) and waiters (at most 4,096), then sets `purge_at` to
-- the earliest expiry left (at or before now if the limits left some expired ones: the next
-- step purges again).
CREATE OR REPLACE FUNCTION tessera__purge(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    r        record;
    freed    int4[] := '{}';
    n        bigint;
    earliest bigint;
BEGIN
    IF st.used > 0 THEN
        FOR r IN
            DELETE FROM tessera_holders
            WHERE name = st.name AND lease_id IN (
                SELECT lease_id FROM tessera_holders
                WHERE name = st.name AND expires_at <= st.now_us
                ORDER BY expires_at LIMIT 256)
            RETURNING weight, seats
        LOOP
            PERFORM tessera__check_seats(r.weight, r.seats);
            IF st.used < r.weight THEN
                PERFORM tessera__corrupt(format('used %s < a holder''s weight %s', st.used, r.weight));
            END IF;
            st.used := st.used - r.weight;
            freed := freed || r.seats;
            st.dirty := true;
        END LOOP;
        IF cardinality(freed) > 0 THEN
            SELECT array_agg(s ORDER BY s) INTO freed FROM unnest(freed) s;
            st := tessera__return_seats(st, freed);
        END IF;
    END IF;
    -- The waiters' bound in the tail has passed (migration 12): the tail is locked, its
    -- bound cleared and every waiter enqueued so far is seen, so the bound below covers
    -- them all; later enqueues lower the tail's bound again.
    IF st.now_us >= st.wait_purge_at AND (st.tail IS NULL OR st.tail = 'update') THEN
        st := tessera__tail(st, 'reset');
    END IF;
    IF st.queued > 0 THEN
        DELETE FROM tessera_waiters
        WHERE name = st.name AND seq IN (
            SELECT seq FROM tessera_waiters
            WHERE name = st.name AND expires_at <= st.now_us
            ORDER BY expires_at LIMIT 4096);
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n > 0 THEN
            st := tessera__dequeued(st, n);
        END IF;
    END IF;
    earliest := least((SELECT min(expires_at) FROM tessera_holders WHERE name = st.name),
                      (SELECT min(expires_at) FROM tessera_waiters WHERE name = st.name));
    IF earliest IS DISTINCT FROM st.purge_at THEN
        st.purge_at := earliest;
        st.dirty := true;
    END IF;
    RETURN st;
END $$;

-- Strict order: grants the queue head while it fits (at most 1,024 per step); a head that does
-- not fit blocks everyone behind it. The head is the least (tag, seq) from the bound up
-- (every waiter's tag is at or above it: see "Fair shares" above; without tenants the
-- tags grow with seq and this is FIFO), and its grant moves vtime to its tag. Each granted
-- waiter gets a wake-up carrying its grant, so the waiter needs no round trip to learn it:
-- `lease \t now \t fence \t expires_at \t seats (comma-separated) \t holder` (acquired_at =
-- now); a waiter of a tenant (migration 9) has `seats:tenant` in the seats field, which a
-- build before migration 9 does not read as a grant (it asks with a heartbeat instead). A waiter of `st.local_client` (the process that called the step) gets it in
-- `st.local_grants`, which the step returns to its caller; any other on its client's channel
-- (pg_notify, sent at commit), where a payload that would not fit NOTIFY's 8,000 bytes goes
-- out as the bare lease id and the waiter then asks with a heartbeat. A name with limits
-- hands off in tessera__hand_off_limited (below) instead.
--
-- An admission waiter (its row's `gate` is not NULL: admit.sql) blocks the queue too, and is
-- never granted here, since its windows are charged only in its own step: once it fits and
-- its gate's instant (when its windows admit it; 0 while it waited for permits) has come, it
-- is woken without a grant, its bare lease id sent as above, and its gate set to the largest
-- bigint so that later steps do not wake it again before its own step sets the gate anew.
-- The head that does not pop costs one more indexed UPDATE (nothing else changes for plain
-- waiters).
CREATE OR REPLACE FUNCTION tessera__hand_off(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    h       record;
    grants  int := 0;
    payload text;
    lasts   bigint;
BEGIN
    IF st.limits <> 0 THEN
        RETURN tessera__hand_off_limited(st);
    END IF;
    WHILE st.queued > 0 AND st.used < st.capacity AND grants < 1024 LOOP
        DELETE FROM tessera_waiters
        WHERE name = st.name
          AND seq = (SELECT seq FROM tessera_waiters
                     WHERE name = st.name AND tag >= coalesce(st.low, st.vtime) ORDER BY tag, seq LIMIT 1)
          AND weight <= st.capacity - st.used
          AND gate IS NULL
        RETURNING seq, tag, lease_id, weight, holder, client, ttl, expires_at, tenant INTO h;
        IF NOT FOUND THEN
            -- The head does not fit, or it is an admission waiter: wake the latter once it
            -- fits and its windows' instant has come (a NULL gate never compares true).
            UPDATE tessera_waiters
            SET gate = 9223372036854775807
            WHERE name = st.name
              AND seq = (SELECT seq FROM tessera_waiters
                         WHERE name = st.name AND tag >= coalesce(st.low, st.vtime) ORDER BY tag, seq LIMIT 1)
              AND weight <= st.capacity - st.used
              AND gate <= st.now_us
            RETURNING lease_id, client INTO h;
            IF FOUND AND h.client ~ '^[0-9a-f]{1,32}$' THEN
                IF h.client = st.local_client THEN
                    st.local_grants := st.local_grants || h.lease_id;
                ELSE
                    PERFORM pg_notify('tessera_w' || h.client, h.lease_id);
                END IF;
            END IF;
            EXIT;
        END IF;
        st := tessera__dequeued(st, 1);
        st.vtime := greatest(st.vtime, h.tag);
        -- The least key went: every waiter left is at or above its tag.
        IF st.low IS NOT NULL THEN
            st.low := h.tag;
        END IF;
        IF h.lease_id IS NULL OR h.lease_id !~ '^[0-9a-f]{32}$' THEN
            PERFORM tessera__check_lease(h.lease_id);
        END IF;
        IF h.weight < 1 OR h.ttl < 0 THEN
            PERFORM tessera__corrupt(format('waiter weight %s / ttl %s is out of range', h.weight, h.ttl));
        END IF;
        -- Provisional until renewed: no longer than the waiter's entry would have lived.
        lasts := least(h.ttl, h.expires_at - st.now_us);
        st := tessera__grant(st, h.lease_id, h.weight, lasts, h.holder, h.client, h.tenant);
        -- A client id that is not 1 to 32 hex digits (damaged, or empty) gets no wake-up:
        -- its waiter's heartbeat finds the grant.
        IF h.client ~ '^[0-9a-f]{1,32}$' THEN
            payload := concat_ws(E'\t', h.lease_id, st.now_us, st.fence, st.now_us + lasts,
                                 concat_ws(':', array_to_string(st.seats, ','), h.tenant),
                                 h.holder);
            IF h.client = st.local_client THEN
                st.local_grants := st.local_grants || payload;
            ELSE
                IF octet_length(payload) > 7000 THEN
                    payload := h.lease_id;
                END IF;
                PERFORM pg_notify('tessera_w' || h.client, payload);
            END IF;
        END IF;
        grants := grants + 1;
    END LOOP;
    RETURN st;
END $$;

-- Grants `lease` to `p_tenant` (NULL: none): the lowest free seats (returned ones first, then
-- from seat_high up), the next fence, expiry now + ttl. Leaves the seats and fence in `st.seats`, `st.fence`, and
-- makes the step's commit durable (see above).
CREATE OR REPLACE FUNCTION tessera__grant(
    st tessera_step, p_lease text, p_weight bigint, p_ttl bigint, p_holder text, p_client text,
    p_tenant text
) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    taken int4[] := '{}';
    rest  bigint;
    fence bigint;
    i     int;
BEGIN
    IF st.seat_high > 0 THEN
        WITH t AS (
            DELETE FROM tessera_free_seats
            WHERE name = st.name AND seat IN (
                SELECT seat FROM tessera_free_seats
                WHERE name = st.name AND seat < st.capacity
                ORDER BY seat LIMIT p_weight)
            RETURNING seat)
        SELECT coalesce(array_agg(seat::int4 ORDER BY seat), '{}') INTO taken FROM t;
    END IF;
    rest := p_weight - cardinality(taken);
    IF rest > 0 THEN
        -- After a shrinking resize seat_high may exceed the capacity; that is fine as long as
        -- the returned seats below the capacity sufficed.
        IF st.seat_high + rest > st.capacity THEN
            PERFORM tessera__corrupt(format('no %s free seats below capacity %s (seat_high %s)',
                p_weight, st.capacity, st.seat_high));
        END IF;
        IF rest = 1 THEN
            taken := taken || st.seat_high::int4;
        ELSE
            taken := taken || ARRAY(SELECT g::int4 FROM generate_series(st.seat_high, st.seat_high + rest - 1) g);
        END IF;
        st.seat_high := st.seat_high + rest;
    END IF;
    -- The server's time is wall time: it is the fences' floor too.
    fence := greatest(st.last_fence + 1, st.now_us, st.hwm + 1);
    st.last_fence := fence;
    st.hwm := fence;
    st.used := st.used + p_weight;
    st.purge_at := least(st.purge_at, st.now_us + p_ttl);
    st.dirty := true;
    st.seats := taken;
    st.fence := fence;
    INSERT INTO tessera_holders
        (name, lease_id, weight, seats, fence, holder, client, acquired_at, expires_at, tenant)
    VALUES (st.name, p_lease, p_weight, taken, fence, p_holder, p_client, st.now_us,
            st.now_us + p_ttl, p_tenant);
    IF st.limits <> 0 THEN
        i := array_position(st.lim_tenant, p_tenant);
        IF i IS NOT NULL THEN
            st.lim_held[i] := st.lim_held[i] + p_weight;
        END IF;
    END IF;
    IF st.sync <> 'off' THEN
        PERFORM set_config('synchronous_commit', st.sync, true);
    END IF;
    RETURN st;
END $$;

-- Returns ascending `seats` to the free set, lowering seat_high over free seats at its top so
-- the free set stays small.
CREATE OR REPLACE FUNCTION tessera__return_seats(st tessera_step, seats int4[]) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    high    bigint := st.seat_high;
    n       int := coalesce(cardinality(seats), 0);
    i       int;
    top     bigint[];
    s       bigint;
    lowered int;
BEGIN
    IF n = 0 THEN
        RETURN st;
    END IF;
    IF seats[n] >= st.seat_high OR seats[1] < 0 THEN
        PERFORM tessera__corrupt(format('seat %s >= seat_high %s', seats[n], st.seat_high));
    END IF;
    FOR i IN 2 .. n LOOP
        IF seats[i] <= seats[i - 1] THEN
            PERFORM tessera__corrupt(format('seat %s returned twice', seats[i]));
        END IF;
    END LOOP;
    -- Seats right below seat_high need no row: they just lower it.
    WHILE n > 0 AND seats[n] + 1 = high LOOP
        n := n - 1;
        high := high - 1;
    END LOOP;
    IF n > 0 THEN
        INSERT INTO tessera_free_seats (name, seat) SELECT st.name, x FROM unnest(seats[1:n]) x;
    END IF;
    IF high < st.seat_high THEN
        -- seat_high - 1 was returned; keep lowering over free seats already stored.
        WHILE high > 0 LOOP
            top := ARRAY(SELECT seat FROM tessera_free_seats
                         WHERE name = st.name AND seat < high ORDER BY seat DESC LIMIT 256);
            lowered := 0;
            FOREACH s IN ARRAY top LOOP
                EXIT WHEN s + 1 <> high;
                high := high - 1;
                lowered := lowered + 1;
            END LOOP;
            IF lowered > 0 THEN
                DELETE FROM tessera_free_seats WHERE name = st.name AND seat >= high;
            END IF;
            EXIT WHEN lowered < 256;
        END LOOP;
    END IF;
    st.seat_high := high;
    st.dirty := true;
    RETURN st;
END $$;

-- Removes the holder of `lease`, returning its permits and seats; `st.hit` says whether it
-- was held, `st.hit_client` whose it was and `st.hit_tenant` its tenant (migration 11).
CREATE OR REPLACE FUNCTION tessera__remove_holder(st tessera_step, p_lease text) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    i int;
BEGIN
    st.hit := false;
    st.hit_client := NULL;
    st.hit_tenant := NULL;
    DELETE FROM tessera_holders WHERE name = st.name AND lease_id = p_lease
    RETURNING weight, seats, client, tenant INTO r;
    IF NOT FOUND THEN
        RETURN st;
    END IF;
    st.hit_tenant := r.tenant;
    IF r.weight <> 1 OR cardinality(r.seats) <> 1 OR r.seats[1] IS NULL OR r.seats[1] < 0 THEN
        PERFORM tessera__check_seats(r.weight, r.seats);
    END IF;
    IF st.used < r.weight THEN
        PERFORM tessera__corrupt(format('used %s < a holder''s weight %s', st.used, r.weight));
    END IF;
    st.used := st.used - r.weight;
    st.dirty := true;
    st.hit := true;
    st.hit_client := r.client;
    IF st.limits <> 0 THEN
        i := array_position(st.lim_tenant, r.tenant);
        IF i IS NOT NULL THEN
            st.lim_held[i] := greatest(st.lim_held[i] - r.weight, 0);
        END IF;
    END IF;
    RETURN tessera__return_seats(st, r.seats);
END $$;

-- Removes the waiter of `lease`; `st.hit` says whether it was queued.
CREATE OR REPLACE FUNCTION tessera__remove_waiter(st tessera_step, p_lease text) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM tessera_waiters WHERE name = st.name AND lease_id = p_lease;
    GET DIAGNOSTICS n = ROW_COUNT;
    st.hit := n > 0;
    IF n > 0 THEN
        st := tessera__dequeued(st, n);
    END IF;
    RETURN st;
END $$;

-- Sets the waiter's expiry to max(expiry, at); its seq, or NULL if `lease` is not queued.
CREATE OR REPLACE FUNCTION tessera__refresh_waiter(st tessera_step, p_lease text, p_at bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    seq_ bigint;
BEGIN
    UPDATE tessera_waiters SET expires_at = greatest(expires_at, p_at)
    WHERE name = st.name AND lease_id = p_lease
    RETURNING seq INTO seq_;
    RETURN seq_;
END $$;

-- An idle semaphore (nothing used or queued: new, or everything in it expired) forgets every
-- tag: vtime and the finish tags restart at 0 (a statement only when it has tenants' rows).
CREATE OR REPLACE FUNCTION tessera__reset_tags(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
BEGIN
    IF st.vtime <> 0 OR st.finish <> 0 THEN
        st.vtime := 0;
        st.finish := 0;
        st.dirty := true;
        st.tail := 'dirty';
    END IF;
    st.low := NULL;
    IF st.tenants <> 0 THEN
        DELETE FROM tessera_tenants WHERE name = st.name;
        st.tenants := 0;
        st.dirty := true;
    END IF;
    RETURN st;
END $$;

-- The finish tag before a new request of `p_tenant` (NULL: no tenant, the row's `finish`),
-- or NULL when that tenant has no row (it starts at vtime). One statement for a tenant only.
CREATE OR REPLACE FUNCTION tessera__last_finish(st tessera_step, p_tenant text) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    f bigint;
BEGIN
    IF p_tenant IS NULL THEN
        RETURN st.finish;
    END IF;
    SELECT t.finish INTO f FROM tessera_tenants t WHERE t.name = st.name AND t.tenant = p_tenant;
    IF f < 0 THEN
        PERFORM tessera__corrupt(format('tenant finish tag %s is negative', f));
    END IF;
    RETURN f;
END $$;

-- Records a new request's finish tag (granted or queued): in the row without a tenant, in
-- the tenant's row otherwise (`p_stored`: it had one, which last_finish said); granted at
-- once, vtime moves to its start tag. Prunes the tenants' rows at or below vtime (they start
-- at vtime either way) once there are more than 2 * (used + queued) + 16 of them.
CREATE OR REPLACE FUNCTION tessera__take_tags(
    st tessera_step, p_tenant text, p_stored boolean, p_start bigint, p_finish bigint,
    p_granted boolean
) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF p_tenant IS NULL THEN
        st.finish := p_finish;
        st.tail := 'dirty';
    ELSE
        INSERT INTO tessera_tenants AS t (name, tenant, finish)
        VALUES (st.name, p_tenant, p_finish)
        ON CONFLICT (name, tenant) DO UPDATE SET finish = excluded.finish;
        IF NOT p_stored THEN
            st.tenants := st.tenants + 1;
        END IF;
    END IF;
    IF p_granted THEN
        st.vtime := greatest(st.vtime, p_start);
    END IF;
    IF st.tenants > 2 * (st.used + st.queued) + 16 THEN
        DELETE FROM tessera_tenants t WHERE t.name = st.name AND t.finish <= st.vtime;
        GET DIAGNOSTICS n = ROW_COUNT;
        st.tenants := greatest(st.tenants - n, 0);
    END IF;
    st.dirty := true;
    RETURN st;
END $$;

-- Whether a newcomer with start tag `p_start` would be the queue head (and so may take free
-- permits): its key (p_start, next_seq) is below the head's. Without tenants' rows and
-- without a tenant, a non-empty queue holds only requests without a tenant, whose tags are
-- below the newcomer's: the head is not read.
CREATE OR REPLACE FUNCTION tessera__would_lead(st tessera_step, p_tenant text, p_start bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    h record;
BEGIN
    IF st.queued = 0 THEN
        RETURN true;
    END IF;
    IF st.limits <> 0 THEN
        -- With limits the head is the first waiter not at its ceiling (there may be none).
        h := tessera__limited_head(st);
        RETURN h.o_seq IS NULL OR (p_start, st.next_seq) < (h.o_tag, h.o_seq);
    END IF;
    IF st.tenants = 0 AND p_tenant IS NULL THEN
        RETURN false;
    END IF;
    SELECT w.tag, w.seq INTO h FROM tessera_waiters w
    WHERE w.name = st.name AND w.tag >= coalesce(st.low, st.vtime) ORDER BY w.tag, w.seq LIMIT 1;
    IF NOT FOUND THEN
        PERFORM tessera__corrupt(format('queued %s but no queue head', st.queued));
    END IF;
    RETURN (p_start, st.next_seq) < (h.tag, h.seq);
END $$;

-- How many waiters are ahead of the key (p_tag, p_seq), in queue order.
CREATE OR REPLACE FUNCTION tessera__ahead(st tessera_step, p_tag bigint, p_seq bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(*) FROM tessera_waiters w
            WHERE w.name = st.name AND w.tag >= coalesce(st.low, st.vtime) AND (w.tag, w.seq) < (p_tag, p_seq));
END $$;

-- How many waiters are ahead of the queued `p_lease` (0 if it is not queued).
CREATE OR REPLACE FUNCTION tessera__place(st tessera_step, p_lease text) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    RETURN (SELECT count(*) FROM tessera_waiters w, tessera_waiters me
            WHERE me.name = st.name AND me.lease_id = p_lease
              AND w.name = st.name AND w.tag >= coalesce(st.low, st.vtime) AND (w.tag, w.seq) < (me.tag, me.seq));
END $$;

-- Ceilings and floors (migration 10; docs/fair-shares.md, "Ceilings and floors"). Only a
-- name whose row counts limits (`st.limits` <> 0) comes here: the state then carries each
-- limited tenant's ceiling (NULL: none), floor and permits held, in `lim_*` (by tenant). A
-- request of tenant t for w permits may be granted when held[t] + w <= ceiling[t] and
-- w <= free - kept(t), kept(t) being what the other tenants' floors still keep
-- (Σ max(0, floor[u] - held[u])); a tenant below its floor (held[t] + w <= floor[t]) that
-- may be granted goes ahead of the queue, and the head is the first waiter whose tenant is
-- not at its ceiling for it. The reference model is stores/memory/ops.rs (`may_grant`,
-- `below_floor`, `head_key`, `hand_off_limited`).

-- Checks the limits read into the state.
CREATE OR REPLACE FUNCTION tessera__check_limits(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    i int;
BEGIN
    FOR i IN 1 .. st.limits LOOP
        IF st.lim_tenant[i] IS NULL OR st.lim_floor[i] IS NULL OR st.lim_floor[i] < 0
           OR st.lim_ceiling[i] < 1 OR st.lim_ceiling[i] > 1000000
           OR st.lim_floor[i] > coalesce(st.lim_ceiling[i], 1000000)
           OR st.lim_held[i] IS NULL OR st.lim_held[i] < 0
           OR st.lim_window[i] < 1 OR st.lim_window[i] > 100 OR st.lim_capped[i] < 0 THEN
            PERFORM tessera__corrupt(format('limits of tenant %L (ceiling %s, floor %s, held %s, window ceiling %s, capped until %s) are out of range',
                left(st.lim_tenant[i], 64), st.lim_ceiling[i], st.lim_floor[i], st.lim_held[i],
                st.lim_window[i], st.lim_capped[i]));
        END IF;
    END LOOP;
    RETURN st;
END $$;

-- Reads the name's limits, with the permits each limited tenant holds, into the state (and
-- their count into `limits`, which the row keeps).
CREATE OR REPLACE FUNCTION tessera__load_limits(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    SELECT array_agg(l.tenant ORDER BY l.tenant), array_agg(l.ceiling ORDER BY l.tenant),
           array_agg(l.floor ORDER BY l.tenant),
           array_agg(coalesce(g.held, 0) ORDER BY l.tenant),
           array_agg(l.window_ceiling ORDER BY l.tenant),
           array_agg(l.capped_until ORDER BY l.tenant)
    INTO st.lim_tenant, st.lim_ceiling, st.lim_floor, st.lim_held, st.lim_window, st.lim_capped
    FROM tessera_limits l
    LEFT JOIN (SELECT h.tenant, sum(h.weight)::bigint AS held FROM tessera_holders h
               WHERE h.name = st.name AND h.tenant IS NOT NULL GROUP BY h.tenant) g
           ON g.tenant = l.tenant
    WHERE l.name = st.name;
    n := coalesce(cardinality(st.lim_tenant), 0);
    IF n <> st.limits THEN
        st.limits := n;
        st.dirty := true;
    END IF;
    RETURN tessera__check_limits(st);
END $$;

-- Whether `p_tenant` (NULL: none) may be granted `p_weight` permits now (see above); without
-- limits, whether they fit.
CREATE OR REPLACE FUNCTION tessera__may_grant(st tessera_step, p_tenant text, p_weight bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    i    int;
    j    int;
    kept bigint := 0;
BEGIN
    IF st.limits = 0 THEN
        RETURN st.used + p_weight <= st.capacity;
    END IF;
    i := array_position(st.lim_tenant, p_tenant);
    IF i IS NOT NULL AND st.lim_held[i] + p_weight > st.lim_ceiling[i] THEN
        RETURN false;
    END IF;
    FOR j IN 1 .. st.limits LOOP
        IF j IS DISTINCT FROM i THEN
            kept := kept + greatest(st.lim_floor[j] - st.lim_held[j], 0);
        END IF;
    END LOOP;
    RETURN p_weight + kept <= st.capacity - st.used;
END $$;

-- Whether `p_weight` more permits keep `p_tenant` within its floor.
CREATE OR REPLACE FUNCTION tessera__below_floor(st tessera_step, p_tenant text, p_weight bigint)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    i int;
BEGIN
    IF st.limits = 0 THEN
        RETURN false;
    END IF;
    i := array_position(st.lim_tenant, p_tenant);
    RETURN i IS NOT NULL AND st.lim_floor[i] > 0 AND st.lim_held[i] + p_weight <= st.lim_floor[i];
END $$;

-- The head with limits: the first waiter in queue order whose tenant is not at its ceiling
-- for it, and that is not an admission waiter (`gate` set) of a tenant window-capped now
-- (its window ceiling's own limiter refused it until after now: migration 11, stores/memory
-- `head_key`); its key, weight, gate and tenant, all NULL when there is none. The waiters
-- passed over are walked in the index of the queue's order. Without a window-capped tenant
-- the statement is migration 10's.
CREATE OR REPLACE FUNCTION tessera__limited_head(
    st tessera_step, OUT o_tag bigint, OUT o_seq bigint, OUT o_weight bigint, OUT o_gate bigint,
    OUT o_tenant text
)
LANGUAGE plpgsql AS $$
DECLARE
    capped text[];
    i      int;
BEGIN
    FOR i IN 1 .. st.limits LOOP
        IF st.lim_capped[i] > st.now_us AND st.lim_window[i] IS NOT NULL THEN
            capped := capped || st.lim_tenant[i];
        END IF;
    END LOOP;
    IF capped IS NULL THEN
        SELECT w.tag, w.seq, w.weight, w.gate, w.tenant INTO o_tag, o_seq, o_weight, o_gate, o_tenant
        FROM tessera_waiters w
        WHERE w.name = st.name AND w.tag >= coalesce(st.low, st.vtime)
          AND w.weight <= coalesce(st.lim_ceiling[array_position(st.lim_tenant, w.tenant)]
                                   - st.lim_held[array_position(st.lim_tenant, w.tenant)], w.weight)
        ORDER BY w.tag, w.seq LIMIT 1;
        RETURN;
    END IF;
    SELECT w.tag, w.seq, w.weight, w.gate, w.tenant INTO o_tag, o_seq, o_weight, o_gate, o_tenant
    FROM tessera_waiters w
    WHERE w.name = st.name AND w.tag >= coalesce(st.low, st.vtime)
      AND w.weight <= coalesce(st.lim_ceiling[array_position(st.lim_tenant, w.tenant)]
                               - st.lim_held[array_position(st.lim_tenant, w.tenant)], w.weight)
      AND NOT (w.gate IS NOT NULL AND w.tenant = ANY (capped))
    ORDER BY w.tag, w.seq LIMIT 1;
END $$;

-- Grants the waiter of seq `p_seq` (taken out of the queue), as tessera__hand_off grants its
-- head: vtime moves to its tag, and it is told as there.
CREATE OR REPLACE FUNCTION tessera__grant_waiter(st tessera_step, p_seq bigint) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    h       record;
    payload text;
    lasts   bigint;
BEGIN
    DELETE FROM tessera_waiters w WHERE w.name = st.name AND w.seq = p_seq
    RETURNING w.seq, w.tag, w.lease_id, w.weight, w.holder, w.client, w.ttl, w.expires_at,
              w.tenant INTO h;
    IF NOT FOUND THEN
        PERFORM tessera__corrupt(format('waiter seq %s vanished', p_seq));
    END IF;
    st := tessera__dequeued(st, 1);
    st.vtime := greatest(st.vtime, h.tag);
    PERFORM tessera__check_lease(h.lease_id);
    IF h.weight < 1 OR h.ttl < 0 THEN
        PERFORM tessera__corrupt(format('waiter weight %s / ttl %s is out of range', h.weight, h.ttl));
    END IF;
    lasts := least(h.ttl, h.expires_at - st.now_us);
    st := tessera__grant(st, h.lease_id, h.weight, lasts, h.holder, h.client, h.tenant);
    IF h.client ~ '^[0-9a-f]{1,32}$' THEN
        payload := concat_ws(E'\t', h.lease_id, st.now_us, st.fence, st.now_us + lasts,
                             concat_ws(':', array_to_string(st.seats, ','), h.tenant),
                             h.holder);
        IF h.client = st.local_client THEN
            st.local_grants := st.local_grants || payload;
        ELSE
            IF octet_length(payload) > 7000 THEN
                payload := h.lease_id;
            END IF;
            PERFORM pg_notify('tessera_w' || h.client, payload);
        END IF;
    END IF;
    RETURN st;
END $$;

-- tessera__hand_off with limits (stores/memory/ops.rs `hand_off_limited`): first a waiter of
-- a tenant below its floor that may be granted, in queue order, ahead of the head (an
-- admission waiter among them is left to its own step); then the head, granted if it may be
-- (an admission waiter woken, as without limits), else nobody behind it. At most 1,024
-- grants per step. The floor pass reads each tenant below its floor's first waiter that
-- could take its grant (tessera_waiters_by_tenant): one index probe per such tenant.
CREATE OR REPLACE FUNCTION tessera__hand_off_limited(st tessera_step) RETURNS tessera_step
LANGUAGE plpgsql AS $$
DECLARE
    h      record;
    f      record;
    grants int := 0;
    i      int;
    kept   bigint;
    short  bigint;
    v_max  bigint[];
    seq_   bigint;
BEGIN
    WHILE st.queued > 0 AND st.used < st.capacity AND grants < 1024 LOOP
        -- What every floor keeps, and what each tenant may take within its own: no more
        -- than its floor lacks, nor than the others' floors leave free.
        kept := 0;
        FOR i IN 1 .. st.limits LOOP
            kept := kept + greatest(st.lim_floor[i] - st.lim_held[i], 0);
        END LOOP;
        v_max := '{}';
        FOR i IN 1 .. st.limits LOOP
            short := greatest(st.lim_floor[i] - st.lim_held[i], 0);
            v_max[i] := least(short, st.capacity - st.used - (kept - short));
        END LOOP;
        seq_ := NULL;
        IF kept > 0 THEN
            SELECT x.seq INTO seq_
            FROM unnest(st.lim_tenant, v_max) AS c(t, m),
                 LATERAL (SELECT w.tag, w.seq FROM tessera_waiters w
                          WHERE w.name = st.name AND w.tenant = c.t AND w.tag >= coalesce(st.low, st.vtime)
                            AND w.gate IS NULL AND w.weight <= c.m
                          ORDER BY w.tag, w.seq LIMIT 1) x
            WHERE c.m >= 1
            ORDER BY x.tag, x.seq LIMIT 1;
        END IF;
        IF seq_ IS NULL THEN
            h := tessera__limited_head(st);
            EXIT WHEN h.o_seq IS NULL OR NOT tessera__may_grant(st, h.o_tenant, h.o_weight);
            IF h.o_gate IS NOT NULL THEN
                -- An admission waiter: woken once its windows' instant has come.
                IF h.o_gate <= st.now_us THEN
                    UPDATE tessera_waiters w SET gate = 9223372036854775807
                    WHERE w.name = st.name AND w.seq = h.o_seq
                    RETURNING w.lease_id, w.client INTO f;
                    IF FOUND AND f.client ~ '^[0-9a-f]{1,32}$' THEN
                        IF f.client = st.local_client THEN
                            st.local_grants := st.local_grants || f.lease_id;
                        ELSE
                            PERFORM pg_notify('tessera_w' || f.client, f.lease_id);
                        END IF;
                    END IF;
                END IF;
                EXIT;
            END IF;
            seq_ := h.o_seq;
        END IF;
        st := tessera__grant_waiter(st, seq_);
        grants := grants + 1;
    END LOOP;
    RETURN st;
END $$;

-- The step's revision (see the header).
CREATE OR REPLACE FUNCTION tessera__step_revision() RETURNS int
LANGUAGE sql IMMUTABLE AS 'SELECT 11';
