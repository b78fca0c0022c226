-- tessera MySQL / MariaDB schema, version 10: the semaphore's row split in two
-- (docs/sql-queue.md). A tail row per semaphore (tessera_tails: next_seq, enqueued, finish),
-- written by enqueues under its own row lock; the semaphore row keeps the permit state and
-- gains dequeued (waiters removed: granted, purged, cancelled); a semaphore's queue holds
-- enqueued - dequeued waiters. Run by migrate.rs: the column and the table first (a user who
-- may not ALTER stops here, at version 9, with nothing moved); then, under LOCK TABLES, so
-- that no step of an older build runs between them, every row's next_seq, queued and finish
-- are copied to its tail row and the old columns dropped. An older build's routines and
-- client-side steps then fail on the dropped columns (a store error, nothing written)
-- instead of keeping a second queue bookkeeping beside this one. migrate.rs skips the part
-- under the lock when the old columns are gone already (a migration interrupted after the
-- ALTER), so the tails are never copied twice.

ALTER TABLE tessera_semaphores ADD COLUMN dequeued BIGINT NOT NULL DEFAULT 0
;
CREATE TABLE IF NOT EXISTS tessera_tails (
    name     VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    next_seq BIGINT NOT NULL,
    enqueued BIGINT NOT NULL,
    finish   BIGINT NOT NULL DEFAULT 0
) ENGINE=InnoDB
;
LOCK TABLES tessera_semaphores WRITE, tessera_tails WRITE
;
DELETE FROM tessera_tails
;
INSERT INTO tessera_tails (name, next_seq, enqueued, finish)
SELECT name, next_seq, queued, finish FROM tessera_semaphores
;
UPDATE tessera_semaphores SET dequeued = 0
;
ALTER TABLE tessera_semaphores DROP COLUMN queued, DROP COLUMN next_seq, DROP COLUMN finish
;
UNLOCK TABLES
