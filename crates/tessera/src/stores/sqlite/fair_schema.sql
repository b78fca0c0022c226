-- Fair shares between tenants (docs/fair-shares.md), schema version 2: run after the columns
-- of version 2 exist (schema.sql for a new file, migrate.rs for a file of version 1); every
-- statement is idempotent.

-- The queue's order.
CREATE INDEX IF NOT EXISTS tessera_waiters_by_tag ON tessera_waiters (name, tag, seq);

-- Each named tenant's latest finish tag, per semaphore. A tenant without a row starts at the
-- semaphore's vtime; rows at or below vtime are deleted now and then, and all of them with
-- the semaphore's row.
CREATE TABLE IF NOT EXISTS tessera_tenants (
    name   TEXT    NOT NULL,
    tenant TEXT    NOT NULL,
    finish INTEGER NOT NULL,
    PRIMARY KEY (name, tenant)
) STRICT, WITHOUT ROWID;
