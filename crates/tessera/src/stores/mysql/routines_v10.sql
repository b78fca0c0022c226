-- tessera MySQL / MariaDB routines, version 10: version 9's release, which now rings the
-- doorbell of the waiter it hands the permit to itself (stores/mysql/notify.rs,
-- docs/sql-queue.md, "The ring"). After its commit the release looks the doorbell up in
-- PROCESSLIST and, when it is parked with its token, ends its wait with KILL QUERY. Before,
-- the client did the same with two more round trips between the commit and the waiter's
-- wake-up. The result row gains a fourteenth column, `rung`:
--   1     rung;
--   0     connected but not parked with that token, or the ring failed (a KILL refused):
--         the client looks again, as it did before;
--   -1    no such connection: nobody to ring;
--   NULL  not tried: no hand-off, a waiter without a doorbell, or one of the calling
--         process's own doorbells (listed in p_local), whose waiters the caller wakes itself.
-- The ring never fails the release, which has committed. Everything else is version 9's
-- release, statement for statement (routines_v9.sql, whose header holds here); the acquire,
-- keep-alive and gathered heartbeats stay version 9's. Installed after version 9 and
-- recorded apart; statements are separated by a line holding only ';'; `CREATE PROCEDURE IF
-- NOT EXISTS` makes each one idempotent.

-- Rings the doorbell at p_doorbell (`<connection id>:<token>`); p_rung as above.
CREATE PROCEDURE IF NOT EXISTS tessera_v10_ring(
    IN p_doorbell VARCHAR(80) CHARACTER SET ascii,
    OUT p_rung INT)
READS SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_id BIGINT UNSIGNED;
    DECLARE v_token VARCHAR(80) CHARACTER SET ascii;
    DECLARE v_parked INT DEFAULT NULL;
    DECLARE v_none INT DEFAULT 0;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION SET p_rung = 0;
    SET p_rung = 0;
    IF p_doorbell IS NULL OR p_doorbell NOT REGEXP '^[0-9]{1,20}:[0-9a-f]{1,32}$' THEN
        LEAVE body;
    END IF;
    SET v_id = CAST(SUBSTRING_INDEX(p_doorbell, ':', 1) AS UNSIGNED);
    SET v_token = SUBSTRING_INDEX(p_doorbell, ':', -1);
    -- Only a connection that is still that doorbell, parked, is rung: a connection id reused
    -- by someone else must not have its query ended.
    SELECT INFO LIKE CONCAT('%tessera doorbell ', v_token, '%') INTO v_parked
      FROM information_schema.PROCESSLIST WHERE ID = v_id;
    IF v_none = 1 THEN
        SET p_rung = -1;
    ELSEIF v_parked = 1 THEN
        KILL QUERY v_id;
        SET p_rung = 1;
    END IF;
END
;
-- Releases lease p_lease of semaphore p_name as tessera_v9_release does, then rings the
-- doorbell of the waiter it handed the permit to, unless p_local (doorbell addresses,
-- separated by commas) names it.
CREATE PROCEDURE IF NOT EXISTS tessera_v10_release(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_lease VARCHAR(32) CHARACTER SET ascii,
    IN p_local MEDIUMTEXT CHARACTER SET ascii)
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
    DECLARE v_rung INT DEFAULT NULL;
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
        SELECT 'not_held', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight IS NULL THEN
        -- Not held. Unless a head fits already (after a resize), nothing changes.
        IF v_queued > 0 AND v_used < v_capacity THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        COMMIT;
        SELECT 'not_held', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight <> 1 OR v_seats IS NULL OR v_seats NOT REGEXP '^(0|[1-9][0-9]{0,6})$'
       OR v_used < 1 THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    SET v_seat = CAST(v_seats AS UNSIGNED);
    IF v_seat >= v_seat_high THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        IF g_weight <= v_capacity - v_used THEN
            IF g_weight <> 1 OR (v_capacity - v_used >= 2 AND v_queued >= 2)
               OR g_lease IS NULL OR g_lease NOT REGEXP '^[0-9a-f]{32}$'
               OR g_ttl IS NULL OR g_ttl < 0 OR g_holder IS NULL OR g_doorbell IS NULL
               OR g_expires IS NULL OR g_expires <= v_now
               OR g_tag IS NULL OR g_tag < 0 OR g_tag > 9000000000000000000 THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
    IF v_grant = 1 AND g_doorbell <> '' AND FIND_IN_SET(g_doorbell, COALESCE(p_local, '')) = 0 THEN
        -- After the commit: the woken client reads the grant.
        CALL tessera_v10_ring(g_doorbell, v_rung);
    END IF;
    IF v_grant = 1 THEN
        SELECT 'released', v_now, NULL, NULL, g_lease, CAST(1 AS SIGNED), CAST(g_seat AS CHAR), v_fence,
               g_holder, v_now, v_now + g_ttl, g_doorbell, g_tenant, CAST(v_rung AS SIGNED);
    ELSE
        SELECT 'released', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
    END IF;
END
;
