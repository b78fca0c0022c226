-- tessera PostgreSQL store, migration 5: the queue head found from a bound, and grants to the
-- calling process's waiters handed back in the step's reply.
--
-- `head_seq` (semaphore row and step state): a lower bound of every waiter's seq, at most
-- next_seq. The hand-off looks for the head from it up (`tessera__hand_off`), so it never
-- walks the index entries of waiters already granted: a deleted waiter's entry stays in the
-- index until VACUUM removes it, and without the bound every hand-off stepped over all of
-- them (1.6 ms per call after 30,000 hand-offs between two autovacuum runs; longer while a
-- long transaction anywhere in the database holds VACUUM back). Rows written before it get
-- 0, a valid bound.
--
-- Indexes that a lookup by lease or by seq cannot mistake for its own. The functions' plans
-- are cached while the tables are small (VACUUM leaves them empty), and then the planner
-- prices every index that leads with `name` alike; a lookup of one lease or of the queue
-- head through the expiry index walked every dead entry of its semaphore (2,000 pages per
-- call while a long transaction held VACUUM back). So the expiry indexes are partial
-- (`expires_at IS NOT NULL`, every row: only the purge's `expires_at <= now` and `min()`
-- imply it), and the waiters' unique key leads with the lease id, so `name = …` alone
-- leaves the queue head only the primary key (name, seq).
--
-- `local_client` (the client id of the process that called the step, or NULL) and
-- `local_grants` (the wake-up payloads of the grants to that client's waiters): see
-- `tessera__hand_off` and `tessera_release`.
--
-- Idempotent, like migration 4. The functions are created again after this file.
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS head_seq bigint NOT NULL DEFAULT 0;
DO $$
DECLARE
    a record;
BEGIN
    FOR a IN SELECT * FROM (VALUES ('head_seq', 'bigint'), ('local_client', 'text'),
                                   ('local_grants', 'text[]')) AS t(name, type)
    LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = 'tessera_step'::regclass AND attname = a.name AND NOT attisdropped
        ) THEN
            EXECUTE format('ALTER TYPE tessera_step ADD ATTRIBUTE %I %s', a.name, a.type);
        END IF;
    END LOOP;
END $$;
DROP INDEX IF EXISTS tessera_holders_expiry;
CREATE INDEX IF NOT EXISTS tessera_holders_by_expiry ON tessera_holders (name, expires_at)
    WHERE expires_at IS NOT NULL;
DROP INDEX IF EXISTS tessera_waiters_expiry;
CREATE INDEX IF NOT EXISTS tessera_waiters_by_expiry ON tessera_waiters (name, expires_at)
    WHERE expires_at IS NOT NULL;
ALTER TABLE tessera_waiters DROP CONSTRAINT IF EXISTS tessera_waiters_name_lease_id_key;
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_constraint
        WHERE conrelid = 'tessera_waiters'::regclass AND conname = 'tessera_waiters_lease_key'
    ) THEN
        ALTER TABLE tessera_waiters ADD CONSTRAINT tessera_waiters_lease_key UNIQUE (lease_id, name);
    END IF;
END $$;
