-- tessera SQLite schema, version 6 (version 1 had no fair shares, version 2 no tenant on the
-- holders and waiters, version 3 no tenants' limits, version 4 no window ceilings, version 5 no tail rows: migrate.rs
-- adds them to a file of an earlier version, then runs fair_schema.sql). Run once per connect inside one BEGIN
-- IMMEDIATE transaction; every statement is idempotent. Times are microseconds on the host's boot clock
-- (CLOCK_BOOTTIME) of the boot recorded in tessera_meta; fences have a wall-clock floor.
-- Lease ids are 32 lowercase hex digits. STRICT tables refuse values of the wrong type, so a
-- stray write by another program fails instead of planting garbage.

-- Store-wide values: 'schema_version', 'fence_hwm' (the highest fence ever issued, for
-- any semaphore; it outlives deleted semaphores and reboots so fences never repeat), and
-- 'boot_id_hi'/'boot_id_lo' (the boot the times belong to, written at connect).
CREATE TABLE IF NOT EXISTS tessera_meta (
    key   TEXT    NOT NULL PRIMARY KEY,
    value INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

INSERT OR IGNORE INTO tessera_meta (key, value) VALUES ('schema_version', 6), ('fence_hwm', 0);

-- Tenants' ceilings and floors (docs/fair-shares.md, "Ceilings and floors"), kept for the
-- name: an administrator's setting, not dropped with an idle semaphore's row (nor at a new
-- boot), only by set_tenant_limits or delete. The step reads how many a name has in the
-- statement that loads its row (a subquery), so a name without any costs no statement more.
-- Schema version 4 (schema_4.sql records it on a file of version 3). From version 5
-- (schema_5.sql), a window ceiling (docs/fair-shares.md, "A ceiling on a share of the
-- windows": a percentage of each rate window, NULL: none) and the instant until which the
-- tenant's own limiter refused it (store time; NULL: not capped), which the step reads with
-- the limits to skip the tenant's admission waiters for the head until then.
CREATE TABLE IF NOT EXISTS tessera_tenant_limits (
    name    TEXT    NOT NULL,
    tenant  TEXT    NOT NULL,
    ceiling INTEGER CHECK (ceiling IS NULL OR ceiling BETWEEN 1 AND 1000000),
    floor   INTEGER NOT NULL CHECK (floor BETWEEN 0 AND 1000000),
    window_ceiling      INTEGER CHECK (window_ceiling IS NULL OR window_ceiling BETWEEN 1 AND 100),
    window_capped_until INTEGER,
    PRIMARY KEY (name, tenant)
) STRICT, WITHOUT ROWID;

-- One row per semaphore that has holders or waiters; deleted when it has neither, with its
-- tail row (docs/sql-queue.md; schema version 6).
--   used       running sum of the holders' weights (never summed per operation)
--   dequeued   running count of waiters removed (granted, purged, cancelled); the queue holds
--              tessera_tails.enqueued - dequeued waiters
--   seat_high  every seat >= seat_high is free; free seats below it are in tessera_free_seats
--   vtime      fair shares' virtual time (docs/fair-shares.md): the start tag of the latest grant
--   tenants    how many rows the semaphore has in tessera_tenants
CREATE TABLE IF NOT EXISTS tessera_semaphores (
    name       TEXT    NOT NULL PRIMARY KEY,
    capacity   INTEGER NOT NULL,
    used       INTEGER NOT NULL,
    last_fence INTEGER NOT NULL,
    seat_high  INTEGER NOT NULL,
    vtime      INTEGER NOT NULL DEFAULT 0,
    tenants    INTEGER NOT NULL DEFAULT 0,
    dequeued   INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- The queue's tail (docs/sql-queue.md), one row per semaphore row, written and deleted with
-- it (schema version 6; schema_6.sql moves the columns of a file of version 5 here).
--   next_seq   next queue sequence number (FIFO order)
--   enqueued   running count of waiters inserted
--   finish     the finish tag of the latest request that named no tenant
CREATE TABLE IF NOT EXISTS tessera_tails (
    name     TEXT    NOT NULL PRIMARY KEY,
    next_seq INTEGER NOT NULL,
    enqueued INTEGER NOT NULL,
    finish   INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- Granted leases. seats is a compact ascending list of ranges, e.g. '0-3,7'. tenant is the
-- tenant the request named (docs/fair-shares.md; NULL: none), kept from its waiter row.
CREATE TABLE IF NOT EXISTS tessera_holders (
    name        TEXT    NOT NULL,
    lease_id    TEXT    NOT NULL,
    weight      INTEGER NOT NULL CHECK (weight >= 1),
    seats       TEXT    NOT NULL,
    fence       INTEGER NOT NULL,
    holder      TEXT    NOT NULL,
    acquired_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    tenant      TEXT,
    PRIMARY KEY (name, lease_id)
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS tessera_holders_by_expiry ON tessera_holders (name, expires_at);

-- The wait queue: service order is (tag, seq), tag being the start tag of fair shares
-- (docs/fair-shares.md; without tenants the tags grow with seq); ttl is the lease TTL (µs) granted at hand-off;
-- expires_at is the waiter's heartbeat expiry; wake is the waiting process's socket in the
-- wake-up folder (NULL: unknown, every process is told of its grant); gate is NULL for a
-- plain waiter and set for an admission waiter (permits and rate windows in one step), which
-- the hand-off never grants: it wakes it once it fits and the time is at least gate; tenant
-- is the tenant the request named (NULL: none), which its holder row keeps. Files made before
-- the wake and gate columns get them at connect (ALTER TABLE in migrate.rs).
CREATE TABLE IF NOT EXISTS tessera_waiters (
    name        TEXT    NOT NULL,
    seq         INTEGER NOT NULL,
    lease_id    TEXT    NOT NULL,
    weight      INTEGER NOT NULL CHECK (weight >= 1),
    holder      TEXT    NOT NULL,
    ttl         INTEGER NOT NULL,
    enqueued_at INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL,
    wake        TEXT,
    gate        INTEGER,
    tag         INTEGER NOT NULL DEFAULT 0,
    tenant      TEXT,
    PRIMARY KEY (name, seq)
) STRICT, WITHOUT ROWID;

CREATE UNIQUE INDEX IF NOT EXISTS tessera_waiters_by_lease ON tessera_waiters (name, lease_id);
CREATE INDEX IF NOT EXISTS tessera_waiters_by_expiry ON tessera_waiters (name, expires_at);

-- Seats returned below a semaphore's seat_high, free to hand out again (lowest first).
CREATE TABLE IF NOT EXISTS tessera_free_seats (
    name TEXT    NOT NULL,
    seat INTEGER NOT NULL,
    PRIMARY KEY (name, seat)
) STRICT, WITHOUT ROWID;
