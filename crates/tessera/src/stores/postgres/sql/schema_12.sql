-- tessera PostgreSQL store, migration 12: the queue's tail in a row of its own (issue 49,
-- docs/sql-queue.md; docs/stores/postgres.md, "Two rows per semaphore").
--
-- tessera_tails holds, per semaphore, what an enqueue writes: `next_seq`, `enqueued` (how
-- many waiters were ever inserted, monotone), `finish` (the finish tag of requests without a
-- tenant, F[""]) and `wait_purge_at` (a lower bound of the expiries of the waiters enqueued
-- since the last purge that reset it; NULL: none). It is created and deleted with the
-- semaphore's row. The semaphore's row loses `queued`, `next_seq` and `finish` and gains
-- `dequeued` (how many waiters left the queue: granted, purged, cancelled; monotone, written
-- by the steps that hold the row's lock), so the queue's length is `enqueued - dequeued`.
--
-- Lock order: the semaphore's row, then the tail's. An enqueue that would not lead locks only
-- the tail (tessera_acquire's fast path); every other step locks the semaphore's row first,
-- and the tail FOR UPDATE before it compares a newcomer with the queue, or FOR SHARE before
-- it commits with free permits (tessera__finish), then hands off again from a fresh read.
--
-- The step's state gains `enqueued` (as read: exact once the tail is locked), `dequeued`
-- (exact), `tail` (NULL: not locked; 'share', 'update', or 'dirty': locked and changed) and
-- `wait_purge_at`.
--
-- Existing rows move in this transaction: each semaphore's tail from its row (`next_seq`,
-- `finish`, `enqueued = queued`), `dequeued = 0`, then the three columns go. The tables are
-- locked first, so calls in flight finish before and wait after. No function changes its
-- arguments or result: processes of the previous build that are connected call the new
-- step at once; one that starts later is refused, as after any migration. A build before
-- this migration never runs its own step on these tables (its migration version is older,
-- so it refuses the schema instead of creating its functions again).
--
-- Idempotent, like migrations 4 to 11.
CREATE TABLE IF NOT EXISTS tessera_tails (
    name          text PRIMARY KEY,
    next_seq      bigint NOT NULL,
    enqueued      bigint NOT NULL,
    finish        bigint NOT NULL,
    wait_purge_at bigint
);
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS dequeued bigint NOT NULL DEFAULT 0;
DO $$
DECLARE
    a text[];
BEGIN
    IF EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = 'tessera_semaphores'::regclass AND attname = 'queued' AND NOT attisdropped
    ) THEN
        LOCK TABLE tessera_semaphores, tessera_waiters, tessera_tails IN ACCESS EXCLUSIVE MODE;
        INSERT INTO tessera_tails (name, next_seq, enqueued, finish)
        SELECT s.name, s.next_seq, s.queued, s.finish FROM tessera_semaphores s
        ON CONFLICT (name) DO UPDATE
        SET next_seq = excluded.next_seq, enqueued = excluded.enqueued, finish = excluded.finish;
        UPDATE tessera_semaphores SET dequeued = 0 WHERE dequeued <> 0;
    END IF;
    -- (Also when migration 8 ran again over this schema and added `finish` back.)
    ALTER TABLE tessera_semaphores DROP COLUMN IF EXISTS queued,
        DROP COLUMN IF EXISTS next_seq, DROP COLUMN IF EXISTS finish;
    FOREACH a SLICE 1 IN ARRAY ARRAY[
        ['enqueued', 'bigint'], ['dequeued', 'bigint'], ['tail', 'text'],
        ['wait_purge_at', 'bigint']
    ] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = 'tessera_step'::regclass AND attname = a[1] AND NOT attisdropped
        ) THEN
            EXECUTE format('ALTER TYPE tessera_step ADD ATTRIBUTE %I %s', a[1], a[2]);
        END IF;
    END LOOP;
END $$;
