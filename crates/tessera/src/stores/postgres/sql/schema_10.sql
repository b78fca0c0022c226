-- tessera PostgreSQL store, migration 10: tenants' ceilings and floors (docs/fair-shares.md,
-- "Ceilings and floors"; docs/stores/postgres.md, "Ceilings and floors").
--
-- tessera_limits holds a named tenant's ceiling (NULL: none) and floor per semaphore name. It
-- is an administrator's setting kept for the name: it is not dropped with an idle semaphore's
-- row, only by tessera_set_tenant_limits (no ceiling and floor 0) or tessera_delete.
--
-- On the semaphore's row (and in the step's state), `limits`: how many rows the name has in
-- tessera_limits. A step reads the limits only when it is not 0, so a name without limits
-- runs no statement more than before: the count is read with the fence high-water mark, in
-- the statement a new or idle row already runs once its row lock is held (tessera__load), and
-- tessera_set_tenant_limits keeps it under the same lock. `tag_low` (NULL: `vtime`) is a lower
-- bound of the waiters' start tags below `vtime`: with limits a grant may go past the head (a
-- tenant below its floor, or the head behind tenants at their ceiling) and move `vtime`
-- beyond tags still queued, so every lookup of the queue starts from least(vtime, tag_low).
--
-- The step's state carries the limits of the step (`lim_tenant`, `lim_ceiling`, `lim_floor`,
-- each tenant's permits held `lim_held`, read with the limits), the count and the bound
-- `low`. tessera_waiters_by_tenant finds a tenant's first waiter in queue order (the floor
-- pass of the hand-off); it holds only waiters that name a tenant.
--
-- No function changes its arguments or result: a process of the previous build that is
-- already connected keeps calling them, and its requests get the limits' rules. An older
-- build that starts later is refused, as after any migration.
--
-- Idempotent, like migrations 4 to 9.
CREATE TABLE IF NOT EXISTS tessera_limits (
    name    text NOT NULL,
    tenant  text NOT NULL,
    ceiling bigint,
    floor   bigint NOT NULL,
    PRIMARY KEY (name, tenant)
);
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS limits bigint NOT NULL DEFAULT 0;
ALTER TABLE tessera_semaphores ADD COLUMN IF NOT EXISTS tag_low bigint;
CREATE INDEX IF NOT EXISTS tessera_waiters_by_tenant ON tessera_waiters (name, tenant, tag, seq)
    WHERE tenant IS NOT NULL;
DO $$
DECLARE
    a text[];
BEGIN
    FOREACH a SLICE 1 IN ARRAY ARRAY[
        ['limits', 'bigint'], ['low', 'bigint'], ['lim_tenant', 'text[]'],
        ['lim_ceiling', 'bigint[]'], ['lim_floor', 'bigint[]'], ['lim_held', 'bigint[]']
    ] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = 'tessera_step'::regclass AND attname = a[1] AND NOT attisdropped
        ) THEN
            EXECUTE format('ALTER TYPE tessera_step ADD ATTRIBUTE %I %s', a[1], a[2]);
        END IF;
    END LOOP;
END $$;
