-- tessera SQLite schema, version 3 to 4: tenants' ceilings and floors (docs/fair-shares.md,
-- "Ceilings and floors"). Run by migrate.rs inside the connect's BEGIN IMMEDIATE transaction
-- on a file of version 3 (after schema_3.sql on one of an earlier version), once schema.sql
-- has created the limits table (tessera_tenant_limits, empty). Rows already there keep their
-- order and tenants. A build of version 3 refuses the file afterwards, so no process grants
-- while ignoring limits another process set.
UPDATE tessera_meta SET value = 4 WHERE key = 'schema_version';
