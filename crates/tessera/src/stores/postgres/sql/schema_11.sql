-- tessera PostgreSQL store, migration 11: tenants' window ceilings (docs/fair-shares.md, "A
-- ceiling on a share of the windows"); the reference model is the memory store
-- (stores/memory/ops.rs `admit`, `head_key`; stores/memory/rate.rs).
--
-- tessera_limits keeps, beside a tenant's ceiling and floor, its `window_ceiling` (a
-- percentage, 1 to 100; NULL: none) and `capped_until`, the instant until which its own
-- limiter refused its last admission (NULL: not capped; meaningful only while it has a
-- window ceiling: setting none clears it). A tenant with only a window ceiling has a row
-- (no ceiling, floor 0), so the name counts limits and its steps read them: a name without
-- any limits runs the statements it ran before, and one whose tenants have no window
-- ceiling runs the statements it ran with migration 10.
--
-- The tenant's own limiter (the shared configuration scaled, tessera__rate_scaled) is an
-- ordinary limiter's row of tessera_rate_limiters and log of tessera_rate_log under the key
-- name || '#' || tenant (tessera__rate_tenant_key, rate_common.sql): no name has a '#', so
-- the key is (name, tenant) without a column more, and every rate function (the decision,
-- the undo, the settle, the sweep) serves it as it is, statement for statement the same for
-- the shared limiter. Locked after the shared limiter's row of the same name, in every step
-- that takes both (tessera_admit, tessera_give_back, tessera_settle, tessera_rate_delete).
--
-- The step's state gains `lim_window` and `lim_capped` (read with the other limits) and
-- `hit_tenant` (the tenant of the holder tessera__remove_holder removed: a give-back or a
-- settle reads the lease's tenant in the same step, before releasing it).
--
-- Two functions change their arguments, which CREATE OR REPLACE cannot do: they are dropped
-- here and created again after this file, with step revision 10, in the same transaction.
-- tessera__rate_step takes `p_peek` and `p_now` (defaults: as before), called only by the
-- schema's own functions; tessera_set_tenant_limits takes `p_window` last, with a default
-- (NULL: none), so a process of the previous build that is already connected still calls it
-- with its five arguments, and its call then removes a window ceiling set meanwhile (that
-- build has none to keep). An older build that starts later is refused, as after any
-- migration.
--
-- Idempotent, like migrations 4 to 10.
ALTER TABLE tessera_limits ADD COLUMN IF NOT EXISTS window_ceiling bigint;
ALTER TABLE tessera_limits ADD COLUMN IF NOT EXISTS capped_until bigint;
DROP FUNCTION IF EXISTS tessera__rate_step(text, text, bigint[], bigint[], bigint[], bigint,
    bigint, bigint, boolean);
DROP FUNCTION IF EXISTS tessera_set_tenant_limits(text, text, bigint, bigint, text);
DO $$
DECLARE
    a text[];
BEGIN
    FOREACH a SLICE 1 IN ARRAY ARRAY[
        ['lim_window', 'bigint[]'], ['lim_capped', 'bigint[]'], ['hit_tenant', 'text']
    ] LOOP
        IF NOT EXISTS (
            SELECT 1 FROM pg_attribute
            WHERE attrelid = 'tessera_step'::regclass AND attname = a[1] AND NOT attisdropped
        ) THEN
            EXECUTE format('ALTER TYPE tessera_step ADD ATTRIBUTE %I %s', a[1], a[2]);
        END IF;
    END LOOP;
END $$;
