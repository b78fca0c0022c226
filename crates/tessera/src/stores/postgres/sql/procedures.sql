-- tessera_acquire_p and tessera_release_p: tessera_acquire and tessera_release (same
-- arguments, same reply columns), with the wait for the disk after the row lock is released.
-- Step revision 3; the client calls them with CALL, outside any transaction block.
--
-- A grant must be on disk before anyone learns of it. A function commits with the statement
-- that called it, so a durable step waits for the WAL flush while it still holds the
-- semaphore's row lock: every other step of that semaphore (the enqueues too, which do not
-- wait for the disk themselves) queues behind each flush, and no two flushes of one
-- semaphore can share a disk write. These procedures run the same step, commit it without
-- waiting for the disk (which releases the row lock at once), and then wait for the flush in
-- a second transaction of their own (`tessera__flush_mark`): its commit record comes later
-- in the WAL, so once that durable commit returns, the step's is on disk too. Steps of other clients run meanwhile,
-- and their flushes share disk writes (group commit).
--
-- Until that flush the step is visible but not durable, so nothing reveals its grants before:
-- - the reply, with the grants to the calling process's own waiters, leaves when the CALL
--   ends, after the flush;
-- - a wake-up to a waiter of another process is left in the step's reply (`>` client `\t`
--   payload, `tessera.defer_notify`, see `tessera__hand_off`) and sent here with pg_notify
--   in the second transaction: NOTIFY is delivered when that transaction commits, after its
--   flush;
-- - any other step that tells a client it holds a lease (a waiter's heartbeat, a retried
--   acquire) makes its own commit durable (`tessera__reveal`), which flushes this one.
-- A server crash before the flush loses the step as if it had never run: nobody learned of
-- it. A step that asked for no durable commit (an enqueue, a release that handed nothing
-- off, or any step with `synchronous_commit` off) commits once, at the end of the CALL.

-- Sends the wake-ups a deferred step left in `grants` and returns the rest (the grants to
-- the calling process's waiters). Runs in the transaction that commits after the step.
CREATE OR REPLACE FUNCTION tessera__send_deferred(grants text[]) RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    g     text;
    tab   int;
    local text[] := '{}';
BEGIN
    FOREACH g IN ARRAY coalesce(grants, '{}') LOOP
        IF left(g, 1) = '>' THEN
            tab := strpos(g, E'\t');
            PERFORM pg_notify('tessera_w' || substr(g, 2, tab - 2), substr(g, tab + 1));
        ELSE
            local := local || g;
        END IF;
    END LOOP;
    RETURN local;
END $$;

CREATE OR REPLACE PROCEDURE tessera_acquire_p(
    p_name text, p_capacity bigint, p_lease text, p_weight bigint, p_ttl bigint,
    p_holder text, p_client text, p_waiter_ttl bigint, p_queue_cap bigint,
    INOUT outcome text DEFAULT NULL, INOUT now_us bigint DEFAULT NULL,
    INOUT weight bigint DEFAULT NULL, INOUT seats int4[] DEFAULT NULL,
    INOUT fence bigint DEFAULT NULL, INOUT holder text DEFAULT NULL,
    INOUT acquired_at bigint DEFAULT NULL, INOUT expires_at bigint DEFAULT NULL,
    INOUT "position" bigint DEFAULT NULL, INOUT available bigint DEFAULT NULL,
    INOUT queued bigint DEFAULT NULL, INOUT stored_capacity bigint DEFAULT NULL
)
LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    wakes  text[];
BEGIN
    PERFORM set_config('tessera.defer_notify', 'on', true);
    SELECT * INTO r FROM tessera__acquire_step(p_name, p_capacity, p_lease, p_weight, p_ttl,
        p_holder, p_client, p_waiter_ttl, p_queue_cap);
    outcome := r.outcome; now_us := r.now_us; weight := r.weight; seats := r.seats;
    fence := r.fence; holder := r.holder; acquired_at := r.acquired_at;
    expires_at := r.expires_at; "position" := r."position"; available := r.available;
    queued := r.queued; stored_capacity := r.stored_capacity;
    wakes := r.grants;
    IF current_setting('synchronous_commit') <> 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
        COMMIT;
        PERFORM tessera__flush_mark();
    END IF;
    -- An acquire's wake-ups all go to waiters (its caller's own process included) by NOTIFY.
    PERFORM tessera__send_deferred(wakes);
END $$;

CREATE OR REPLACE PROCEDURE tessera_release_p(
    p_name text, p_lease text, p_client text,
    INOUT held boolean DEFAULT NULL, INOUT grants text[] DEFAULT NULL
)
LANGUAGE plpgsql AS $$
DECLARE
    r      record;
    wakes  text[];
BEGIN
    PERFORM set_config('tessera.defer_notify', 'on', true);
    SELECT * INTO r FROM tessera_release(p_name, p_lease, p_client);
    held := r.held;
    wakes := r.grants;
    IF current_setting('synchronous_commit') <> 'off' THEN
        PERFORM set_config('synchronous_commit', 'off', true);
        COMMIT;
        PERFORM tessera__flush_mark();
    END IF;
    grants := tessera__send_deferred(wakes);
END $$;
