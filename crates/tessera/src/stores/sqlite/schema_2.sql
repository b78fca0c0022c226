-- tessera SQLite schema, version 1 to 2: fair shares between tenants (docs/fair-shares.md).
-- Run by migrate.rs inside the connect's BEGIN IMMEDIATE transaction on a file of version 1,
-- after its wake and gate columns exist; fair_schema.sql follows. The new columns start at
-- 0: waiters queued before keep their order (tag 0, by seq) and later arrivals queue behind
-- them. A build of version 1 refuses the file afterwards, so no process orders one queue
-- by seq alone while another orders it by tag.
ALTER TABLE tessera_semaphores ADD COLUMN vtime INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tessera_semaphores ADD COLUMN finish INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tessera_semaphores ADD COLUMN tenants INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tessera_waiters ADD COLUMN tag INTEGER NOT NULL DEFAULT 0;
UPDATE tessera_meta SET value = 2 WHERE key = 'schema_version';
