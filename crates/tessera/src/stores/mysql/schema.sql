-- tessera MySQL / MariaDB schema, version 1: the semaphore tables. Run by migrate.rs at
-- every connect, statement by statement (each DDL commits by itself), under a GET_LOCK so
-- that processes starting together take turns; every statement is idempotent, so a server
-- without GET_LOCK (Galera) runs them concurrently and still ends with one schema.
--
-- Times are microseconds since the Unix epoch on the server's clock (SYSDATE(6) in UTC,
-- never NOW(), which a client can set). Names and lease ids are ASCII compared byte for byte
-- (ascii_bin): 'A' and 'a' are two semaphores, as on every other store. Holder labels are
-- utf8mb4. Statements are separated by a line holding only ';'.

-- Store-wide values: 'schema_version' (the last migration applied), 'fence_hwm' (the highest
-- fence ever issued, for any semaphore; it outlives deleted semaphores so fences never repeat).
CREATE TABLE IF NOT EXISTS tessera_meta (
    meta_key   VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    meta_value BIGINT NOT NULL
) ENGINE=InnoDB
;
INSERT IGNORE INTO tessera_meta (meta_key, meta_value) VALUES ('fence_hwm', 0)
;
-- One row per semaphore that has holders or waiters; deleted when it has neither. The step
-- locks it (SELECT … FOR UPDATE) before it reads anything else of the semaphore.
--   used       running sum of the holders' weights (never summed per operation)
--   queued     running count of waiters
--   next_seq   next queue sequence number (FIFO order)
--   seat_high  every seat >= seat_high is free; free seats below it are in tessera_free_seats
CREATE TABLE IF NOT EXISTS tessera_semaphores (
    name       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    capacity   BIGINT NOT NULL,
    used       BIGINT NOT NULL,
    queued     BIGINT NOT NULL,
    last_fence BIGINT NOT NULL,
    next_seq   BIGINT NOT NULL,
    seat_high  BIGINT NOT NULL,
    vtime      BIGINT NOT NULL DEFAULT 0,
    finish     BIGINT NOT NULL DEFAULT 0,
    tenants    BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB
;
-- Granted leases. seats is a compact ascending list of ranges, e.g. '0-3,7'. doorbell: where to
-- ring the holder's client when a revoke or delete removes it (see notify.rs; '' for none);
-- added to existing tables by version 3 (holders_doorbell.sql), made here with the table so
-- that a user who may CREATE but not ALTER sets up a new database whole. tenant: the tenant
-- the request named (NULL: none; version 7, tenant_rows.sql).
CREATE TABLE IF NOT EXISTS tessera_holders (
    name        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    lease_id    CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    weight      BIGINT NOT NULL CHECK (weight >= 1),
    seats       MEDIUMTEXT CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    fence       BIGINT NOT NULL,
    holder      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    acquired_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    doorbell    VARCHAR(80) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    tenant      VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (name, lease_id),
    KEY tessera_holders_by_expiry (name, expires_at)
) ENGINE=InnoDB
;
-- The wait queue: service order is seq; ttl is the lease TTL (µs) granted at hand-off;
-- expires_at is the waiter's heartbeat expiry; doorbell is where to ring its client when it
-- is granted (see notify.rs; '' for none); gate marks an admission waiter (waiters_gate.sql);
-- tag is the start tag of fair shares, the queue's order being (tag, seq) (fair_shares.sql);
-- tenant is the tenant the request named (NULL: none; tenant_rows.sql).
CREATE TABLE IF NOT EXISTS tessera_waiters (
    name        VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq         BIGINT NOT NULL,
    lease_id    CHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    weight      BIGINT NOT NULL CHECK (weight >= 1),
    holder      VARCHAR(256) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    ttl         BIGINT NOT NULL,
    enqueued_at BIGINT NOT NULL,
    expires_at  BIGINT NOT NULL,
    doorbell    VARCHAR(80) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    gate        BIGINT NULL,
    tag         BIGINT NOT NULL DEFAULT 0,
    tenant      VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    PRIMARY KEY (name, seq),
    UNIQUE KEY tessera_waiters_by_lease (name, lease_id),
    KEY tessera_waiters_by_expiry (name, expires_at),
    KEY tessera_waiters_by_tag (name, tag, seq)
) ENGINE=InnoDB
;
-- Seats returned below a semaphore's seat_high, free to hand out again (lowest first).
CREATE TABLE IF NOT EXISTS tessera_free_seats (
    name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seat BIGINT NOT NULL,
    PRIMARY KEY (name, seat)
) ENGINE=InnoDB
