-- tessera PostgreSQL store, migration 4: the lean step (see common.sql, "Cost").
--
-- Adds `purge_at` to the semaphore row and to the step's state: a lower bound of every
-- holder's and waiter's expiry, so a step skips the purge while nothing can have expired.
-- Rows written before it get 0, a valid bound (their next step purges and sets it). Drops
-- the helpers the lean step no longer calls. Idempotent: the migration may run again over a
-- schema that already has it. The functions are created again after this file, from the
-- same files as migration 1.
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS purge_at bigint NOT NULL DEFAULT 0;
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_attribute
        WHERE attrelid = 'tessera_step'::regclass AND attname = 'purge_at' AND NOT attisdropped
    ) THEN
        ALTER TYPE tessera_step ADD ATTRIBUTE purge_at bigint;
    END IF;
END $$;
DROP FUNCTION IF EXISTS tessera__purge_and_hand_off(tessera_step);
DROP FUNCTION IF EXISTS tessera__wake_grant(text, text, bigint, bigint, bigint, int4[], text);
