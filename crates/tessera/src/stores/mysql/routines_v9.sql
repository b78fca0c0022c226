-- tessera MySQL / MariaDB routines, version 9: the acquire, release, keep-alive and gathered
-- heartbeats of versions 8 and 7 for the tables of schema version 10 (tails.sql,
-- docs/sql-queue.md), where a semaphore's queue tail (next_seq, enqueued, finish) is a row of
-- its own in tessera_tails and the semaphore row counts the waiters removed (dequeued); the
-- queue holds enqueued - dequeued waiters.
--
-- The lock order is the semaphore row, then the tail row. The acquire's locked step takes
-- both (so a try, or a newcomer that may lead, compares itself with every committed waiter
-- and none is in flight). A plain waiter that cannot lead (every permit in use) is enqueued
-- without the semaphore row's lock: the tail row's lock, a plain re-read of the semaphore row,
-- the waiter's INSERT, the commit; if that re-read showed room for the head, the answer is
-- 'queued_step' and the client runs the locked step at once. The release reads the tail's
-- count without its lock, and takes the tail's lock only when it ends with free permits, then
-- leaves any waiter it did not hand off to the full step; one that ends with every permit in
-- use never waits for an enqueue. The keep-alive and the gathered heartbeats grant nothing
-- and read the tail's count without its lock. docs/sql-queue.md, "Why it is right", argues
-- no over-grant, no lost wake-up and FIFO for this. Otherwise as versions 8 and 7 (see
-- routines_v8.sql and routines_v7.sql, whose headers hold here). A build with schema version
-- 10 calls these and no others; a build of before it refuses schema version 10. Installed
-- after version 8 and recorded apart; statements are separated by a line holding only ';';
-- `CREATE PROCEDURE IF NOT EXISTS` makes each one idempotent.

-- Acquires one permit of semaphore p_name (stores/sql/step.rs `acquire` with weight 1).
--   p_name        the semaphore          p_capacity  the capacity the client declares
--   p_lease       the lease id           p_ttl       lease TTL, µs
--   p_holder      the holder label       p_wait      1: queue if needed; 0: try only
--   p_waiter_ttl  heartbeat TTL, µs      p_queue_cap longest queue the client joins
--   p_doorbell    this client's doorbell address, written into its waiter row
--   p_tenant      the tenant (NULL: none), written into its holder or waiter row
--   p_share       the tenant's share
CREATE PROCEDURE IF NOT EXISTS tessera_v9_acquire_one(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_capacity BIGINT,
    IN p_lease VARCHAR(32) CHARACTER SET ascii,
    IN p_ttl BIGINT,
    IN p_holder VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_wait INT,
    IN p_waiter_ttl BIGINT,
    IN p_queue_cap BIGINT,
    IN p_doorbell VARCHAR(80) CHARACTER SET ascii,
    IN p_tenant VARCHAR(64) CHARACTER SET utf8mb4,
    IN p_share BIGINT)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_last_fence, v_next_seq, v_seat_high BIGINT;
    DECLARE v_enqueued, v_dequeued BIGINT;
    DECLARE v_hwm, v_now, v_seat, v_fence, v_seq, v_head_weight BIGINT;
    DECLARE v_holders_expire, v_waiters_expire, v_held BIGINT;
    DECLARE v_limits BIGINT DEFAULT NULL;
    DECLARE v_vtime, v_finish, v_tenants, v_start, v_last, v_cost, v_wtag BIGINT;
    DECLARE v_htag, v_hseq, v_position BIGINT;
    DECLARE v_stored, v_lead INT DEFAULT 0;
    DECLARE v_tries INT DEFAULT 0;
    DECLARE h_weight, h_fence, h_acquired, h_expires BIGINT;
    DECLARE h_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE h_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE h_tenant VARCHAR(64) CHARACTER SET utf8mb4;
    DECLARE v_fast, v_dup INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    -- The enqueue without the semaphore row's lock (docs/sql-queue.md, "The operations", 3):
    -- for a plain waiter (no tenant) on a name without tenants' rows or limits, whose
    -- permits are all in use and where nothing has expired, that neither holds nor waits
    -- already (a retry of the same lease id takes the locked step). First one plain read, one
    -- statement (one snapshot of the latest commits, READ COMMITTED), outside a transaction.
    IF p_wait = 1 AND p_tenant IS NULL THEN
        SELECT s.capacity, s.used, s.tenants,
               (SELECT COUNT(*) FROM tessera_tenant_limits l WHERE l.name = p_name)
               + EXISTS (SELECT 1 FROM tessera_holders h
                          WHERE h.name = p_name AND h.expires_at <= c.now_us)
               + EXISTS (SELECT 1 FROM tessera_waiters x
                          WHERE x.name = p_name AND x.expires_at <= c.now_us)
               + EXISTS (SELECT 1 FROM tessera_holders h
                          WHERE h.name = p_name AND h.lease_id = p_lease)
               + EXISTS (SELECT 1 FROM tessera_waiters w
                          WHERE w.name = p_name AND w.lease_id = p_lease)
          INTO v_capacity, v_used, v_tenants, v_held
          FROM (SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)) AS now_us) c
          JOIN tessera_semaphores s ON s.name = p_name;
        IF v_none = 0 AND v_capacity = p_capacity AND v_tenants = 0 AND v_held = 0
           AND v_used >= v_capacity THEN
            SET v_fast = 1;
        END IF;
        SET v_none = 0;
    END IF;
    IF v_fast = 1 THEN
        START TRANSACTION;
        -- The tail row's lock, and nothing else's: the enqueue never waits for the semaphore
        -- row (so it cannot wait behind a release's commit), and enqueues take seq in the
        -- order they commit.
        SELECT next_seq, enqueued, finish INTO v_next_seq, v_enqueued, v_finish
          FROM tessera_tails WHERE name = p_name FOR UPDATE;
        IF v_none = 0 THEN
            -- The semaphore row again, without a lock, in a new statement after the tail's
            -- lock: the latest commit. A granting step that ended with free permits and
            -- took the tail first has committed by now, and is seen here.
            SELECT capacity, used, dequeued, vtime, tenants, TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)),
                   (SELECT weight FROM tessera_waiters WHERE name = p_name
                     ORDER BY tag, seq LIMIT 1),
                   (SELECT COUNT(*) FROM tessera_tenant_limits l WHERE l.name = p_name)
              INTO v_capacity, v_used, v_dequeued, v_vtime, v_tenants, v_now, v_head_weight,
                   v_limits
              FROM tessera_semaphores WHERE name = p_name;
        END IF;
        IF v_none = 1 OR v_capacity IS NULL OR v_capacity <> p_capacity OR v_used IS NULL
           OR v_tenants IS NULL OR v_tenants <> 0 OR v_limits IS NULL OR v_limits <> 0
           OR v_now IS NULL OR v_now < 0 OR v_next_seq IS NULL OR v_next_seq < 0
           OR v_enqueued IS NULL OR v_dequeued IS NULL OR v_dequeued < 0
           OR v_enqueued < v_dequeued
           OR v_finish IS NULL OR v_finish < 0 OR v_finish > 9000000000000000000
           OR v_vtime IS NULL OR v_vtime < 0 OR v_vtime > 9000000000000000000
           -- Emptied meanwhile, with a permit free: the newcomer may lead.
           OR (v_enqueued = v_dequeued AND v_used < v_capacity) THEN
            -- The rows are gone or changed meanwhile: the locked step decides.
            ROLLBACK;
            SET v_fast = 0, v_none = 0;
        ELSE
            -- The queue's length: enqueued exact (the tail's lock), dequeued at most as
            -- recent, so never below the truth (the cap is never exceeded).
            SET v_queued = v_enqueued - v_dequeued;
            IF v_queued >= p_queue_cap THEN
                ROLLBACK;
                SELECT 'queue_full', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            -- Without tenants the start tag is the last finish tag (docs/sql-queue.md).
            SET v_start = GREATEST(v_vtime, v_finish);
            BEGIN
                -- The lease queued meanwhile (a retry racing its first attempt): the locked
                -- step.
                DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1;
                INSERT INTO tessera_waiters
                    (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at,
                     doorbell, tag, tenant)
                VALUES (p_name, v_next_seq, p_lease, 1, p_holder, p_ttl, v_now,
                        v_now + p_waiter_ttl, p_doorbell, v_start, NULL);
            END;
            IF v_dup = 1 THEN
                ROLLBACK;
                SET v_fast = 0, v_none = 0;
            ELSE
                UPDATE tessera_tails
                   SET next_seq = v_next_seq + 1, enqueued = v_enqueued + 1,
                       finish = v_start + 1000
                 WHERE name = p_name;
                COMMIT;
                -- Room for the head (this waiter when none was visible): permits were freed
                -- while this enqueue ran, and the client runs the locked step at once.
                SELECT IF(v_used + IFNULL(v_head_weight, 1) <= v_capacity, 'queued_step',
                          'queued'),
                       v_now, v_queued, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
        END IF;
    END IF;
    -- The locked step.
    START TRANSACTION;
    -- Locks the row and reads it and the clock, which the server reads when it produces the
    -- row, once the lock is held. A missing row is created (a placeholder: nothing used,
    -- fences from the high-water mark), locked and read again.
    lock_row: LOOP
        SET v_none = 0;
        SELECT capacity, used, dequeued, last_fence, seat_high,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)),
               vtime, tenants
          INTO v_capacity, v_used, v_dequeued, v_last_fence, v_seat_high, v_now,
               v_vtime, v_tenants
          FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
        IF v_none = 0 OR v_tries > 0 THEN
            LEAVE lock_row;
        END IF;
        SET v_tries = 1;
        INSERT INTO tessera_semaphores (name, capacity, used, dequeued, last_fence, seat_high)
        SELECT p_name, p_capacity, 0, 0, meta_value, 0 FROM tessera_meta WHERE meta_key = 'fence_hwm'
        ON DUPLICATE KEY UPDATE name = name;
    END LOOP;
    IF v_none = 0 THEN
        -- The tail row, locked after the semaphore row (docs/sql-queue.md: semaphore row, then
        -- tail row), so that the queue read below holds every committed enqueue and none is in
        -- flight. A semaphore row without one (none should be) has an empty tail.
        SELECT next_seq, enqueued, finish INTO v_next_seq, v_enqueued, v_finish
          FROM tessera_tails WHERE name = p_name FOR UPDATE;
        IF v_none = 1 THEN
            SET v_none = 0;
            INSERT INTO tessera_tails (name, next_seq, enqueued, finish) VALUES (p_name, 0, 0, 0);
            SET v_next_seq = 0, v_enqueued = 0, v_finish = 0;
        END IF;
        SET v_queued = v_enqueued - v_dequeued;
    END IF;
    -- Then, in a statement of its own (see the header), what the step reads first: the
    -- high-water mark, the earliest holder and waiter expiries, the queue head's weight, and
    -- this lease's holder row and waiter entry.
    IF v_none = 0 THEN
        SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
               (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
               (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
               (SELECT weight FROM tessera_waiters WHERE name = p_name ORDER BY tag, seq LIMIT 1),
               (SELECT seq FROM tessera_waiters WHERE name = p_name AND lease_id = p_lease),
               (SELECT tag FROM tessera_waiters WHERE name = p_name AND lease_id = p_lease),
               (SELECT COUNT(*) FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
               (SELECT COUNT(*) FROM tessera_tenant_limits WHERE name = p_name)
          INTO v_hwm, v_holders_expire, v_waiters_expire, v_head_weight, v_seq, v_wtag, v_held,
               v_limits;
    END IF;
    IF v_none = 1 OR v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_dequeued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_next_seq IS NULL OR v_next_seq < 0 OR v_seat_high IS NULL
       OR v_seat_high < 0 OR v_seat_high > 4294967295
       OR v_last_fence > 9000000000000000000 OR v_hwm > 9000000000000000000
       OR v_vtime IS NULL OR v_vtime < 0 OR v_vtime > 9000000000000000000
       OR v_finish IS NULL OR v_finish < 0 OR v_finish > 9000000000000000000
       OR v_tenants IS NULL OR v_tenants < 0
       OR (p_tenant IS NOT NULL AND (p_share IS NULL OR p_share < 1 OR p_share > 1000))
       -- Tenants' ceilings or floors on the name: the full step, which keeps them.
       OR v_limits IS NULL OR v_limits <> 0
       -- An idle semaphore with tenants' rows to drop: the full step.
       OR (v_used = 0 AND v_queued = 0 AND v_tenants <> 0)
       -- Anything to purge: the full step.
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR (v_queued > 0 AND v_waiters_expire <= v_now)
       -- A head that fits before anything is released (after a resize): the full step.
       OR (v_queued > 0 AND v_used < v_capacity
           AND (v_head_weight IS NULL OR v_head_weight <= v_capacity - v_used)) THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- Every lease and waiter gone: the semaphore is idle and takes the declared capacity.
    IF v_used = 0 AND v_queued = 0 THEN
        SET v_capacity = p_capacity;
        SET v_vtime = 0;
        SET v_finish = 0;
    END IF;
    -- The request's start tag (docs/fair-shares.md): after the virtual time and its tenant's
    -- last finish tag (the semaphore's `finish` for no tenant, else the tenant's row).
    IF p_tenant IS NULL THEN
        SET v_last = v_finish;
        SET v_cost = 1000;
    ELSE
        SET v_none = 0;
        SET v_last = NULL;
        SELECT finish INTO v_last FROM tessera_tenants
         WHERE name = p_name AND tenant = p_tenant;
        IF v_last IS NOT NULL THEN
            SET v_stored = 1;
        END IF;
        IF v_last IS NULL OR v_last < 0 OR v_last > 9000000000000000000 THEN
            IF v_stored = 1 THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET v_last = 0;
        END IF;
        SET v_cost = 1000 DIV p_share;
    END IF;
    SET v_start = GREATEST(v_vtime, v_last);
    -- Whether it would be the head: without tenant rows and without a tenant, only if nobody
    -- waits (the queued tags are all below this one); else by the head's key.
    IF v_queued = 0 THEN
        SET v_lead = 1;
    ELSEIF v_tenants = 0 AND p_tenant IS NULL THEN
        SET v_lead = 0;
    ELSE
        SET v_none = 0;
        SELECT tag, seq INTO v_htag, v_hseq FROM tessera_waiters
         WHERE name = p_name ORDER BY tag, seq LIMIT 1;
        IF v_none = 1 OR v_htag IS NULL THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        SET v_lead = (v_start < v_htag OR (v_start = v_htag AND v_next_seq < v_hseq));
    END IF;
    -- Tenants' rows to prune once this one is recorded (the step's rule): the full step.
    IF v_tenants + IF(p_tenant IS NOT NULL AND v_stored = 0, 1, 0) > 2 * (v_used + v_queued) + 16
    THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_capacity <> p_capacity THEN
        ROLLBACK;
        SELECT 'mismatch', v_now, v_capacity, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- A retry of an acquire whose reply was lost: what it already holds.
    IF v_held > 0 THEN
        SET v_none = 0;
        SELECT weight, seats, fence, holder, acquired_at, expires_at, tenant
          INTO h_weight, h_seats, h_fence, h_holder, h_acquired, h_expires, h_tenant
          FROM tessera_holders WHERE name = p_name AND lease_id = p_lease;
        IF v_none = 0 THEN
            COMMIT;
            SELECT 'held', v_now, NULL, NULL, p_lease, h_weight, h_seats, h_fence, h_holder,
                   h_acquired, h_expires, NULL, h_tenant;
            LEAVE body;
        END IF;
    END IF;
    -- A retry of an enqueue: refresh the entry (and its doorbell), report its position.
    IF p_wait = 1 AND v_seq IS NOT NULL THEN
        BEGIN
            UPDATE tessera_waiters
               SET expires_at = GREATEST(expires_at, v_now + p_waiter_ttl), doorbell = p_doorbell
             WHERE name = p_name AND lease_id = p_lease;
            COMMIT;
            SELECT 'queued', v_now,
                   (SELECT COUNT(*) FROM tessera_waiters WHERE name = p_name
                     AND (tag < v_wtag OR (tag = v_wtag AND seq < v_seq))),
                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END;
    END IF;
    -- Free and at the head: grant. The lowest returned seat below the capacity, else the next
    -- one from seat_high up.
    IF v_lead = 1 AND v_used + 1 <= v_capacity THEN
        SET v_seat = NULL;
        IF v_seat_high > 0 THEN
            SELECT MIN(seat) INTO v_seat FROM tessera_free_seats
             WHERE name = p_name AND seat < v_capacity;
        END IF;
        IF v_seat IS NOT NULL THEN
            IF v_seat < 0 THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            DELETE FROM tessera_free_seats WHERE name = p_name AND seat = v_seat;
        ELSE
            IF v_seat_high + 1 > v_capacity THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET v_seat = v_seat_high;
            SET v_seat_high = v_seat_high + 1;
        END IF;
        SET v_fence = GREATEST(v_last_fence + 1, v_now, v_hwm + 1);
        INSERT INTO tessera_holders
            (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at, tenant)
        VALUES (p_name, p_lease, 1, CAST(v_seat AS CHAR), v_fence, p_holder, v_now, v_now + p_ttl,
                p_tenant);
        UPDATE tessera_semaphores
           SET capacity = v_capacity, used = v_used + 1, last_fence = v_fence,
               seat_high = v_seat_high, vtime = GREATEST(v_vtime, v_start),
               tenants = v_tenants + IF(p_tenant IS NOT NULL AND v_stored = 0, 1, 0)
         WHERE name = p_name;
        UPDATE tessera_tails SET finish = IF(p_tenant IS NULL, v_start + v_cost, v_finish)
         WHERE name = p_name;
        IF p_tenant IS NOT NULL THEN
            INSERT INTO tessera_tenants (name, tenant, finish)
            VALUES (p_name, p_tenant, v_start + v_cost)
            ON DUPLICATE KEY UPDATE finish = v_start + v_cost;
        END IF;
        UPDATE tessera_meta SET meta_value = GREATEST(meta_value, v_fence)
         WHERE meta_key = 'fence_hwm';
        COMMIT;
        SELECT 'granted', v_now, NULL, NULL, p_lease, CAST(1 AS SIGNED), CAST(v_seat AS CHAR), v_fence, p_holder,
               v_now, v_now + p_ttl, NULL, p_tenant;
        LEAVE body;
    END IF;
    IF p_wait <> 1 THEN
        COMMIT;
        SELECT 'no_permit', v_now, GREATEST(v_capacity - v_used, 0), v_queued,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_queued >= p_queue_cap THEN
        COMMIT;
        SELECT 'queue_full', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- Its place: last without tenants, else counted.
    IF v_tenants = 0 AND p_tenant IS NULL THEN
        SET v_position = v_queued;
    ELSE
        SELECT COUNT(*) INTO v_position FROM tessera_waiters WHERE name = p_name
           AND (tag < v_start OR (tag = v_start AND seq < v_next_seq));
    END IF;
    INSERT INTO tessera_waiters
        (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell, tag, tenant)
    VALUES (p_name, v_next_seq, p_lease, 1, p_holder, p_ttl, v_now, v_now + p_waiter_ttl,
            p_doorbell, v_start, p_tenant);
    UPDATE tessera_tails SET enqueued = v_enqueued + 1, next_seq = v_next_seq + 1,
           finish = IF(p_tenant IS NULL, v_start + v_cost, v_finish)
     WHERE name = p_name;
    IF p_tenant IS NOT NULL AND v_stored = 0 THEN
        UPDATE tessera_semaphores SET tenants = v_tenants + 1 WHERE name = p_name;
    END IF;
    IF p_tenant IS NOT NULL THEN
        INSERT INTO tessera_tenants (name, tenant, finish)
        VALUES (p_name, p_tenant, v_start + v_cost)
        ON DUPLICATE KEY UPDATE finish = v_start + v_cost;
    END IF;
    COMMIT;
    SELECT 'queued', v_now, v_position, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
END
;
-- Releases lease p_lease of semaphore p_name (stores/sql/step.rs `release`), handing the
-- permit to the queue head when it fits, in the same transaction.
CREATE PROCEDURE IF NOT EXISTS tessera_v9_release(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_lease VARCHAR(32) CHARACTER SET ascii)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_last_fence, v_next_seq, v_seat_high BIGINT;
    DECLARE v_enqueued, v_dequeued, v_finish BIGINT;
    DECLARE v_hwm, v_now, v_seat, v_high, v_fence, v_weight BIGINT;
    DECLARE v_holders_expire, v_waiters_expire BIGINT;
    DECLARE v_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE v_grant INT DEFAULT 0;
    DECLARE g_seq, g_weight, g_ttl, g_seat, g_expires, g_tag BIGINT;
    DECLARE v_vtime, v_tenants BIGINT;
    DECLARE v_limits BIGINT DEFAULT NULL;
    DECLARE g_lease VARCHAR(64) CHARACTER SET ascii;
    DECLARE g_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE g_tenant VARCHAR(64) CHARACTER SET utf8mb4;
    DECLARE g_doorbell VARCHAR(80) CHARACTER SET ascii;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- Locks the row and reads it and the clock (read when the row is produced, once the
    -- lock is held).
    SELECT capacity, used, dequeued, last_fence, seat_high,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)), vtime, tenants
      INTO v_capacity, v_used, v_dequeued, v_last_fence, v_seat_high, v_now,
           v_vtime, v_tenants
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    IF v_none = 1 THEN
        -- No row: nothing held, nothing to change.
        COMMIT;
        SELECT 'not_held', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;

    -- Then, in a statement of its own (see the header), the high-water mark, the earliest
    -- holder and waiter expiries, this lease's holder row and the tail's count, read without
    -- the tail's lock (docs/sql-queue.md): enqueues in flight are not counted, and are seen
    -- below if this release ends with free permits.
    SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
           (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
           (SELECT weight FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
           (SELECT seats FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
           (SELECT COUNT(*) FROM tessera_tenant_limits WHERE name = p_name),
           (SELECT enqueued FROM tessera_tails WHERE name = p_name)
      INTO v_hwm, v_holders_expire, v_waiters_expire, v_weight, v_seats, v_limits, v_enqueued;
    SET v_queued = v_enqueued - v_dequeued;
    IF v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_dequeued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_seat_high IS NULL
       OR v_seat_high < 0 OR v_seat_high > 4294967295
       OR v_last_fence > 9000000000000000000 OR v_hwm > 9000000000000000000
       OR (v_used = 0 AND v_queued = 0)
       OR v_vtime IS NULL OR v_vtime < 0 OR v_vtime > 9000000000000000000
       OR v_tenants IS NULL OR v_tenants < 0
       -- Tenants' ceilings or floors on the name: the full step, which keeps them.
       OR v_limits IS NULL OR v_limits <> 0
       -- Anything to purge: the full step.
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR (v_queued > 0 AND v_waiters_expire <= v_now) THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight IS NULL THEN
        -- Not held. Unless a head fits already (after a resize), nothing changes.
        IF v_queued > 0 AND v_used < v_capacity THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        COMMIT;
        SELECT 'not_held', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight <> 1 OR v_seats IS NULL OR v_seats NOT REGEXP '^(0|[1-9][0-9]{0,6})$'
       OR v_used < 1 THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    SET v_seat = CAST(v_seats AS UNSIGNED);
    IF v_seat >= v_seat_high THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    SET v_used = v_used - 1;
    -- The hand-off, decided before anything is written: one head of weight 1 that fits,
    -- and no second hand-off due (else the full step).
    IF v_queued > 0 AND v_used < v_capacity THEN
        SET v_none = 0;
        SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at, tag, tenant
          INTO g_seq, g_lease, g_weight, g_holder, g_ttl, g_doorbell, g_expires, g_tag, g_tenant
          FROM tessera_waiters WHERE name = p_name ORDER BY tag, seq LIMIT 1;
        IF v_none = 1 OR g_weight IS NULL OR g_weight < 1 THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        IF g_weight <= v_capacity - v_used THEN
            IF g_weight <> 1 OR (v_capacity - v_used >= 2 AND v_queued >= 2)
               OR g_lease IS NULL OR g_lease NOT REGEXP '^[0-9a-f]{32}$'
               OR g_ttl IS NULL OR g_ttl < 0 OR g_holder IS NULL OR g_doorbell IS NULL
               OR g_expires IS NULL OR g_expires <= v_now
               OR g_tag IS NULL OR g_tag < 0 OR g_tag > 9000000000000000000 THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET v_grant = 1;
            -- Provisional until renewed: no longer than the waiter's entry would have lived.
            SET g_ttl = LEAST(g_ttl, g_expires - v_now);
        END IF;
    END IF;
    -- Ends with free permits (docs/sql-queue.md, "A granting step"): the tail row, locked
    -- after the semaphore row, waits for the enqueues in flight, and counts every committed
    -- waiter; one this release did not hand off is left to the full step (it may fit). FOR
    -- UPDATE rather than LOCK IN SHARE MODE: granting steps serialize on the semaphore row
    -- anyway, and the idle rows' delete below then needs no lock upgrade. A release that ends
    -- with every permit in use never takes it: a waiter enqueued meanwhile waits rightly.
    IF v_used + v_grant < v_capacity THEN
        SET v_none = 0;
        SELECT enqueued INTO v_enqueued FROM tessera_tails WHERE name = p_name FOR UPDATE;
        IF v_none = 1 OR v_enqueued - v_dequeued - v_grant <> 0 THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        SET v_queued = v_enqueued - v_dequeued;
    END IF;
    DELETE FROM tessera_holders WHERE name = p_name AND lease_id = p_lease;
    -- Returns the seat: right below seat_high it lowers seat_high, over any free seats
    -- stored right below; elsewhere it becomes a free-seat row.
    IF v_seat + 1 = v_seat_high THEN
        SET v_high = v_seat;
        SET v_none = 0;
        lower_high: WHILE v_high > 0 DO
            IF NOT EXISTS (SELECT 1 FROM tessera_free_seats
                           WHERE name = p_name AND seat = v_high - 1) THEN
                LEAVE lower_high;
            END IF;
            SET v_high = v_high - 1;
        END WHILE;
        IF v_high < v_seat THEN
            DELETE FROM tessera_free_seats WHERE name = p_name AND seat >= v_high;
        END IF;
        SET v_seat_high = v_high;
    ELSE
        INSERT INTO tessera_free_seats (name, seat) VALUES (p_name, v_seat);
    END IF;
    IF v_grant = 1 THEN
        DELETE FROM tessera_waiters WHERE name = p_name AND seq = g_seq;
        SET v_queued = v_queued - 1;
        SET v_dequeued = v_dequeued + 1;
        SET g_seat = NULL;
        IF v_seat_high > 0 THEN
            SELECT MIN(seat) INTO g_seat FROM tessera_free_seats
             WHERE name = p_name AND seat < v_capacity;
        END IF;
        IF g_seat IS NOT NULL THEN
            DELETE FROM tessera_free_seats WHERE name = p_name AND seat = g_seat;
        ELSE
            IF v_seat_high + 1 > v_capacity THEN
                -- No free seat below the capacity: the full step reports the damage.
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET g_seat = v_seat_high;
            SET v_seat_high = v_seat_high + 1;
        END IF;
        SET v_fence = GREATEST(v_last_fence + 1, v_now, v_hwm + 1);
        SET v_last_fence = v_fence;
        INSERT INTO tessera_holders
            (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at, tenant)
        VALUES (p_name, g_lease, 1, CAST(g_seat AS CHAR), v_fence, g_holder, v_now, v_now + g_ttl,
                g_tenant);
        SET v_used = v_used + 1;
        SET v_vtime = GREATEST(v_vtime, g_tag);
        UPDATE tessera_meta SET meta_value = GREATEST(meta_value, v_fence)
         WHERE meta_key = 'fence_hwm';
    END IF;
    IF v_used = 0 AND v_queued = 0 THEN
        DELETE FROM tessera_semaphores WHERE name = p_name;
        DELETE FROM tessera_tails WHERE name = p_name;
        IF v_seat_high <> 0 THEN
            DELETE FROM tessera_free_seats WHERE name = p_name;
        END IF;
        -- Idle: the tags restart at 0 with the next request.
        IF v_tenants <> 0 THEN
            DELETE FROM tessera_tenants WHERE name = p_name;
        END IF;
    ELSE
        UPDATE tessera_semaphores
           SET used = v_used, dequeued = v_dequeued, last_fence = v_last_fence,
               seat_high = v_seat_high, vtime = v_vtime
         WHERE name = p_name;
    END IF;
    COMMIT;
    IF v_grant = 1 THEN
        SELECT 'released', v_now, NULL, NULL, g_lease, CAST(1 AS SIGNED), CAST(g_seat AS CHAR), v_fence,
               g_holder, v_now, v_now + g_ttl, g_doorbell, g_tenant;
    ELSE
        SELECT 'released', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
    END IF;
END
;
-- Keeps lease p_lease of semaphore p_name alive: a holder's renewal
-- (stores/sql/step.rs `renew`, p_waiter = 0) or a waiter's heartbeat that the read-only probe
-- of mod.rs could not answer (step.rs `heartbeat`, p_waiter = 1). A renewal makes the lease's
-- expiry at least now + p_ttl; a heartbeat answers the grant if p_lease holds permits, else
-- makes the waiter's entry expire no sooner than now + p_ttl and rings p_doorbell from then on.
-- Holders renew every third of their TTL and waiters heartbeat as often; as client-side steps
-- these held the semaphore's row across three round trips, and a process frozen (SIGSTOP, a
-- paused VM) in the middle of one kept every other client of the semaphore waiting until the
-- server ended its idle transaction, 3 s later.
--   p_name      the semaphore         p_lease  the lease id     p_ttl  lease or heartbeat TTL, µs
--   p_waiter    0: renewal; 1: heartbeat             p_doorbell  this client's doorbell address
-- Result: 'renewed' (n1: the lease's expiry), 'granted' (a heartbeat's lease, in the lease
-- columns), 'waiting', 'gone' (neither held nor queued), or 'fallback'.
CREATE PROCEDURE IF NOT EXISTS tessera_v9_keep_alive(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_lease VARCHAR(32) CHARACTER SET ascii,
    IN p_ttl BIGINT,
    IN p_waiter INT,
    IN p_doorbell VARCHAR(80) CHARACTER SET ascii)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_last_fence, v_next_seq, v_seat_high BIGINT;
    DECLARE v_enqueued, v_dequeued, v_finish BIGINT;
    DECLARE v_hwm, v_now, v_held, v_waiting BIGINT;
    DECLARE v_holders_expire, v_waiters_expire BIGINT;
    DECLARE h_weight, h_fence, h_acquired BIGINT;
    DECLARE h_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE h_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE h_tenant VARCHAR(64) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- Locks the row and reads it and the clock (read when the row is produced, once the
    -- lock is held).
    SELECT capacity, used, dequeued, last_fence, seat_high,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
      INTO v_capacity, v_used, v_dequeued, v_last_fence, v_seat_high, v_now
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    IF v_none = 1 THEN
        -- No row: neither held nor queued, nothing to change.
        COMMIT;
        SELECT 'gone', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;

    -- Then, in a statement of its own (see the header), the high-water mark, the earliest
    -- holder and waiter expiries, and this lease's holder and waiter expiries.
    SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
           (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
           (SELECT expires_at FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
           (SELECT expires_at FROM tessera_waiters WHERE name = p_name AND lease_id = p_lease),
           (SELECT enqueued FROM tessera_tails WHERE name = p_name)
      INTO v_hwm, v_holders_expire, v_waiters_expire, v_held, v_waiting, v_enqueued;
    -- The tail's count without its lock, in the statement that reads this lease's waiter
    -- row (one snapshot): the keep-alive grants nothing, and leaves a free permit beside
    -- waiters to the full step.
    SET v_queued = v_enqueued - v_dequeued;
    IF v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_dequeued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_seat_high IS NULL
       OR v_seat_high < 0 OR v_seat_high > 4294967295
       OR v_last_fence > 9000000000000000000 OR v_hwm > 9000000000000000000
       OR p_ttl IS NULL OR p_ttl < 0 OR p_ttl > 9000000000000000000 - v_now
       OR p_waiter IS NULL OR p_waiter NOT IN (0, 1)
       -- An idle row (the step drops it), anything to purge, or a head that fits (after a
       -- resize): the full step.
       OR (v_used = 0 AND v_queued = 0)
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR (v_queued > 0 AND v_waiters_expire <= v_now)
       OR (v_queued > 0 AND v_used < v_capacity) THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_held IS NOT NULL THEN
        IF p_waiter = 1 THEN
            -- Held already (granted by a release while it waited): its grant.
            SELECT weight, seats, fence, holder, acquired_at, tenant
              INTO h_weight, h_seats, h_fence, h_holder, h_acquired, h_tenant
              FROM tessera_holders WHERE name = p_name AND lease_id = p_lease;
            COMMIT;
            SELECT 'granted', v_now, NULL, NULL, p_lease, h_weight, h_seats, h_fence, h_holder,
                   h_acquired, v_held, NULL, h_tenant;
            LEAVE body;
        END IF;
        IF v_held < v_now + p_ttl THEN
            SET v_held = v_now + p_ttl;
            UPDATE tessera_holders SET expires_at = v_held
             WHERE name = p_name AND lease_id = p_lease;
        END IF;
        COMMIT;
        SELECT 'renewed', v_now, v_held, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF p_waiter = 0 OR v_queued = 0 OR v_waiting IS NULL THEN
        COMMIT;
        SELECT 'gone', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    UPDATE tessera_waiters
       SET expires_at = GREATEST(expires_at, v_now + p_ttl), doorbell = p_doorbell
     WHERE name = p_name AND lease_id = p_lease;
    COMMIT;
    SELECT 'waiting', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
END
;
-- The heartbeats of waiters p_leases of semaphore p_name, each answered as a heartbeat alone
-- would be (mod.rs `heartbeat`), or left to that heartbeat alone.
--   p_name      the semaphore
--   p_leases    a JSON array of [lease id, waiter TTL in µs], at most 1024
--   p_doorbell  this client's doorbell address, written into each refreshed waiter row
-- Result: one row per lease, in order: (ord, outcome), outcome 'waiting' (queued, its entry
-- now expires no sooner than now + its TTL, or already had at least half of it to run) or
-- 'alone' (the client runs that heartbeat alone: the lease is not queued, holds its grant, or
-- the step has more to do than refresh waiters).
--
-- First, without a lock or a transaction, one consistent read (one statement, as the probe
-- of mod.rs): if no holder or waiter of the semaphore has expired, the queue head does not
-- fit, and every lease is queued on p_doorbell with at least half of its TTL left, every
-- lease is answered 'waiting' and nothing is written. Otherwise the semaphore's row is locked
-- and the clock read after the lock, as every step; an expired holder, a permit free (a head
-- could fit), an idle or unreadable row answers 'alone' for every lease (after a ROLLBACK:
-- nothing changed); else expired waiters are purged, every queued lease's entry is renewed
-- in one UPDATE, answered, and committed.
CREATE PROCEDURE IF NOT EXISTS tessera_v9_heartbeat_many(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_leases MEDIUMTEXT CHARACTER SET utf8mb4,
    IN p_doorbell VARCHAR(80) CHARACTER SET ascii)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_now, v_stale, v_holders_expired, v_waiters_expired BIGINT;
    DECLARE v_holders_expire, v_waiters_expire, v_blocked, v_purged BIGINT;
    DECLARE v_dequeued, v_enqueued, v_next_seq, v_finish BIGINT;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    SELECT c.now_us,
           (SELECT COUNT(*)
              FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (
                       lease VARCHAR(32) CHARACTER SET ascii PATH '$[0]',
                       ttl BIGINT PATH '$[1]')) j
              LEFT JOIN tessera_waiters w ON w.name = p_name AND w.lease_id = j.lease
             WHERE w.lease_id IS NULL OR j.ttl IS NULL OR w.doorbell <> p_doorbell
                OR w.expires_at < c.now_us + j.ttl DIV 2),
           EXISTS (SELECT 1 FROM tessera_holders h
                    WHERE h.name = p_name AND h.expires_at <= c.now_us),
           EXISTS (SELECT 1 FROM tessera_waiters x
                    WHERE x.name = p_name AND x.expires_at <= c.now_us),
           (SELECT s.used + hd.weight > s.capacity
              FROM tessera_semaphores s JOIN tessera_waiters hd ON hd.name = s.name
             WHERE s.name = p_name
             ORDER BY hd.tag, hd.seq
             LIMIT 1)
      INTO v_now, v_stale, v_holders_expired, v_waiters_expired, v_blocked
      FROM (SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)) AS now_us) c;
    IF v_stale = 0 AND v_holders_expired = 0 AND v_waiters_expired = 0 AND v_blocked = 1 THEN
        SELECT CAST(j.ord AS SIGNED), 'waiting'
          FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (ord FOR ORDINALITY)) j
         ORDER BY j.ord;
        LEAVE body;
    END IF;

    START TRANSACTION;
    -- Locks the row and reads it and the clock (read when the row is produced, once the
    -- lock is held).
    SET v_none = 0;
    SELECT capacity, used, dequeued,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
      INTO v_capacity, v_used, v_dequeued, v_now
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;

    -- Then, in a statement of its own (see routines.sql), the earliest expiries.
    SELECT (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
           (SELECT enqueued FROM tessera_tails WHERE name = p_name)
      INTO v_holders_expire, v_waiters_expire, v_enqueued;
    -- The tail's count without its lock (docs/sql-queue.md): this call grants nothing and
    -- runs only with every permit in use; the purge below raises dequeued only.
    SET v_queued = v_enqueued - v_dequeued;
    IF v_none = 1 OR v_capacity IS NULL OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_queued IS NULL OR v_queued < 1
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR v_used < v_capacity THEN
        ROLLBACK;
        SELECT CAST(j.ord AS SIGNED), 'alone'
          FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (ord FOR ORDINALITY)) j
         ORDER BY j.ord;
        LEAVE body;
    END IF;
    -- Expired waiters are purged as the step does (they hold no seats, and with every permit
    -- in use no hand-off can follow). Leaving them to heartbeats alone sent every heartbeat
    -- alone while any waiter had expired: with 10,000 waiters, the storm this call exists to
    -- avoid, which made more waiters expire.
    IF v_waiters_expire <= v_now THEN
        DELETE FROM tessera_waiters WHERE name = p_name AND expires_at <= v_now;
        SET v_purged = ROW_COUNT();
        IF v_purged > v_queued THEN
            ROLLBACK;
            SELECT CAST(j.ord AS SIGNED), 'alone'
              FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (ord FOR ORDINALITY)) j
             ORDER BY j.ord;
            LEAVE body;
        END IF;
        UPDATE tessera_semaphores SET dequeued = dequeued + v_purged WHERE name = p_name;
    END IF;
    UPDATE tessera_waiters w
      JOIN JSON_TABLE(p_leases, '$[*]' COLUMNS (
               lease VARCHAR(32) CHARACTER SET ascii PATH '$[0]',
               ttl BIGINT PATH '$[1]')) j ON w.lease_id = j.lease
       SET w.expires_at = GREATEST(w.expires_at, v_now + j.ttl), w.doorbell = p_doorbell
     WHERE w.name = p_name AND j.ttl > 0 AND j.ttl <= 9000000000000000000 - v_now;
    SELECT CAST(j.ord AS SIGNED),
           IF(w.lease_id IS NULL OR j.ttl IS NULL OR j.ttl <= 0
              OR j.ttl > 9000000000000000000 - v_now, 'alone', 'waiting')
      FROM JSON_TABLE(p_leases, '$[*]' COLUMNS (
               ord FOR ORDINALITY,
               lease VARCHAR(32) CHARACTER SET ascii PATH '$[0]',
               ttl BIGINT PATH '$[1]')) j
      LEFT JOIN tessera_waiters w ON w.name = p_name AND w.lease_id = j.lease
     ORDER BY j.ord;
    COMMIT;
END
