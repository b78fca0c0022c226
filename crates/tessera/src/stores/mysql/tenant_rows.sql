-- tessera MySQL / MariaDB schema, version 7: the tenant on every holder and waiter row
-- (docs/fair-shares.md), so that status shows each tenant's holders and waiters.
--
-- `tenant` is the tenant the request named (NULL: none); a waiter's is carried to the holder
-- row it becomes. Rows from before name none. The procedures of routine version 7
-- (routines_v7.sql) write and answer it; a client of this version calls no procedure of an
-- earlier version, and a build of before it refuses the schema (a version above its own), so
-- no process grants a waiter without carrying its tenant.
--
-- Idempotent as every migration (see holders_doorbell.sql; tables created since carry the
-- columns, see schema.sql). A user who may not ALTER leaves the schema at version 6: that
-- client keeps no tenant on the rows (status shows none).
ALTER TABLE tessera_holders ADD COLUMN tenant VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
;
ALTER TABLE tessera_waiters ADD COLUMN tenant VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
