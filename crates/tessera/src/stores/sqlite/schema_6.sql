-- tessera SQLite schema, version 5 to 6: the semaphore's row split in two (docs/sql-queue.md).
-- Run by migrate.rs inside the connect's BEGIN IMMEDIATE transaction on a file of version 5
-- (after the earlier migrations on one of an earlier version), once schema.sql has created
-- tessera_tails (empty) and migrate.rs has added tessera_semaphores.dequeued (0) where
-- missing. Each semaphore's next_seq, finish and queue count move to its tail row (enqueued
-- = queued, dequeued = 0, so the queue keeps its length, order and tags), then the old columns
-- are dropped: a build of version 5 refuses the file at its next open, and one already open
-- fails on the dropped columns (a store error, nothing written) instead of keeping a second
-- queue bookkeeping beside this one.
INSERT INTO tessera_tails (name, next_seq, enqueued, finish)
    SELECT name, next_seq, queued, finish FROM tessera_semaphores WHERE true
    ON CONFLICT (name) DO UPDATE SET next_seq = excluded.next_seq,
        enqueued = excluded.enqueued, finish = excluded.finish;
ALTER TABLE tessera_semaphores DROP COLUMN queued;
ALTER TABLE tessera_semaphores DROP COLUMN next_seq;
ALTER TABLE tessera_semaphores DROP COLUMN finish;
UPDATE tessera_meta SET value = 6 WHERE key = 'schema_version';
