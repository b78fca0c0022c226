-- tessera MySQL / MariaDB schema, version 9: tenants' window ceilings (docs/fair-shares.md, "A
-- ceiling on a share of the windows").
--
-- A tenant's limits row keeps its window ceiling (a percentage of each rate window; NULL:
-- none) and the instant until which the tenant's own limiter refused it (µs, the server's
-- clock; NULL: not capped), which the client-side step reads with the limits to skip the
-- tenant's admission waiters for the head until then. A name with limits runs every
-- operation in the client-side step (routines_v8.sql), so no procedure changes.
--
-- A tenant's own limiter needs no table: it is a limiter of its own in tessera_rate_limiters
-- and tessera_rate_log under the key of the name, U+001F and the tenant (stores/sql/rate.rs,
-- TENANT_KEY_SEPARATOR). No name holds U+001F, so no key is another limiter's, the name's
-- own limiter keeps its rows and statements, and an expired tenant's state is swept as any
-- limiter's. The keys' column is widened for it: 128 bytes of name, the separator, and 64
-- characters of tenant, in the tenants' character set (names are ASCII, so every key stored
-- before reads and compares as before; `_bin` compares bytes, as `ascii_bin` did).
--
-- Idempotent as every migration (a MODIFY to the same column is a no-op). A user who may not
-- ALTER leaves the schema at version 8: that client keeps no window ceilings (setting one
-- answers Unsupported). A build of before this version refuses the schema (a version above
-- its own), so no process admits a tenant past its window ceiling while ignoring it.
ALTER TABLE tessera_tenant_limits ADD COLUMN window_ceiling BIGINT NULL
;
ALTER TABLE tessera_tenant_limits ADD COLUMN window_capped_until BIGINT NULL
;
ALTER TABLE tessera_rate_limiters MODIFY COLUMN name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
;
ALTER TABLE tessera_rate_log MODIFY COLUMN name VARCHAR(200) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
