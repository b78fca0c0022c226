-- tessera PostgreSQL store, migration 8: fair shares between tenants (docs/fair-shares.md,
-- "The SQL stores"), the same rows as the SQLite and MySQL stores.
--
-- A waiter's start tag `tag`: the queue is ordered by (tag, seq), with the partial index
-- tessera_waiters_by_tag. On the semaphore's row (and in the step's state), the virtual time
-- `vtime`, the finish tag `finish` of requests that name no tenant and the number `tenants`
-- of its rows in tessera_tenants, which holds each named tenant's latest finish tag. Every
-- column starts at 0: waiters queued before keep their order (tag 0, by seq) and later
-- arrivals queue behind them.
--
-- tessera_acquire and tessera_admit take the tenant and its share as two more arguments with
-- defaults (NULL, 1): CREATE OR REPLACE cannot add arguments, so the old ones are dropped
-- here and created again after this file, with step revision 7 (the step, the rate functions
-- and the admission's). A process of an older build that is already connected calls them
-- with its old arguments, which resolve to the new functions (no tenant: FIFO as before);
-- an older build that starts later is refused, as after any migration, so old and new steps
-- never order one queue two ways.
--
-- Idempotent, like migrations 4 to 7.
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS vtime bigint NOT NULL DEFAULT 0;
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS finish bigint NOT NULL DEFAULT 0;
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS tenants bigint NOT NULL DEFAULT 0;
ALTER TABLE tessera_waiters ADD COLUMN IF NOT EXISTS tag bigint NOT NULL DEFAULT 0;
-- Partial, as the expiry indexes (migration 5): `tag IS NOT NULL` holds for every row, but
-- only a lookup that bounds the tag (the head's and the positions', `tag >= vtime`) implies
-- it, so a cached generic plan of a lookup by lease never walks this index's entries of a
-- semaphore's dead rows.
CREATE INDEX IF NOT EXISTS tessera_waiters_by_tag ON tessera_waiters (name, tag, seq)
    WHERE tag IS NOT NULL;
CREATE TABLE IF NOT EXISTS tessera_tenants (
    name   text NOT NULL,
    tenant text NOT NULL,
    finish bigint NOT NULL,
    PRIMARY KEY (name, tenant)
);
DO $$
DECLARE
    a text;
BEGIN
    FOREACH a IN ARRAY ARRAY['vtime', 'finish', 'tenants'] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = 'tessera_step'::regclass AND attname = a AND NOT attisdropped
        ) THEN
            EXECUTE format('ALTER TYPE tessera_step ADD ATTRIBUTE %I bigint', a);
        END IF;
    END LOOP;
END $$;
DROP FUNCTION IF EXISTS tessera_acquire(text, bigint, text, bigint, bigint, text, text, bigint, bigint);
DROP FUNCTION IF EXISTS tessera_admit(text, bigint, text, bigint, bigint, text, text, bigint,
    bigint, text, bigint[], bigint[], bigint[], bigint, bigint, boolean, boolean);
