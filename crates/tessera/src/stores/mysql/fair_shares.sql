-- tessera MySQL / MariaDB schema, version 6: fair shares between tenants (docs/fair-shares.md,
-- "The SQL stores").
--
-- A waiter's start tag `tag`: the queue is ordered by (tag, seq), with an index. On the
-- semaphore's row, the virtual time `vtime`, the finish tag `finish` of requests that name no
-- tenant and the number `tenants` of its rows in tessera_tenants, which holds each named
-- tenant's latest finish tag. Every column starts at 0: waiters queued before keep their
-- order (tag 0, by seq) and later arrivals queue behind them. The procedures of routine
-- version 6 (routines_v6.sql) keep the tags; a client of this version calls no procedure of an
-- earlier version for what orders the queue.
--
-- Idempotent as every migration (see holders_doorbell.sql; tables created since carry the
-- columns, see schema.sql). A user who may not ALTER leaves the schema at version 5: that
-- client has no fair shares (a request naming a tenant answers Unsupported).
ALTER TABLE tessera_semaphores ADD COLUMN vtime BIGINT NOT NULL DEFAULT 0
;
ALTER TABLE tessera_semaphores ADD COLUMN finish BIGINT NOT NULL DEFAULT 0
;
ALTER TABLE tessera_semaphores ADD COLUMN tenants BIGINT NOT NULL DEFAULT 0
;
ALTER TABLE tessera_waiters ADD COLUMN tag BIGINT NOT NULL DEFAULT 0,
    ADD KEY tessera_waiters_by_tag (name, tag, seq)
;
CREATE TABLE IF NOT EXISTS tessera_tenants (
    name   VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    tenant VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    finish BIGINT NOT NULL,
    PRIMARY KEY (name, tenant)
) ENGINE=InnoDB
