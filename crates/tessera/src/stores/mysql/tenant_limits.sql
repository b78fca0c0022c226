-- tessera MySQL / MariaDB schema, version 8: tenants' ceilings and floors (docs/fair-shares.md,
-- "Ceilings and floors"), kept for the name in a table of their own: an administrator's
-- setting, not dropped with an idle semaphore's row, only by set_tenant_limits or delete.
--
-- Every client-side step reads how many tenants have limits on its name in the statement that
-- already locks and reads the semaphore's row (a subquery), so a name without limits costs
-- no statement more; the procedures of routine version 8 (routines_v8.sql) read the same
-- count and leave a name with limits to the client-side step. A build of before this version
-- refuses the schema (a version above its own), so no process grants while ignoring limits.
--
-- Idempotent as every migration. A user who may not CREATE leaves the schema at version 7:
-- that client keeps no limits (setting them answers Unsupported).
CREATE TABLE IF NOT EXISTS tessera_tenant_limits (
    name    VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant  VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    ceiling BIGINT NULL,
    floor   BIGINT NOT NULL,
    PRIMARY KEY (name, tenant)
) ENGINE=InnoDB
