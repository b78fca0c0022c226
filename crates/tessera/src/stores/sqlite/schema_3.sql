-- tessera SQLite schema, version 2 to 3: the tenant on every holder and waiter row
-- (docs/fair-shares.md). Run by migrate.rs inside the connect's BEGIN IMMEDIATE transaction on
-- a file of version 2 (after schema_2.sql on one of version 1). Rows from before name no
-- tenant (NULL, as a request that names none). A build of version 2 refuses the file
-- afterwards, so no process grants a waiter without carrying its tenant to the holder row.
ALTER TABLE tessera_holders ADD COLUMN tenant TEXT;
ALTER TABLE tessera_waiters ADD COLUMN tenant TEXT;
UPDATE tessera_meta SET value = 3 WHERE key = 'schema_version';
