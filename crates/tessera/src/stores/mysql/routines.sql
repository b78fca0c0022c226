-- tessera MySQL / MariaDB routines, version 4: the hot path of the step (stores/sql/step.rs)
-- as stored procedures, so an acquire of one permit, a release, also one that hands the permit
-- to the queue head, a renewal and a waiter's heartbeat are one round trip each, with the
-- semaphore's row locked only while the server runs the procedure (client-side steps hold it
-- across two or three round trips). Run by migrate.rs (routines.rs calls them); statements are
-- separated by a line holding only ';'. `CREATE PROCEDURE IF NOT EXISTS` (MariaDB 10.1.3,
-- MySQL 8.0.29) makes every statement idempotent, and a procedure of one version is never
-- changed: a later version adds procedures under new names. A client whose version's
-- procedures are missing runs the client-side step instead.
--
-- Version 2: the procedures run with the caller's rights (SQL SECURITY INVOKER), so an
-- application user's call is refused on a read-only server whoever created them, and they
-- keep working after their creator's account is dropped; and a hand-off grant expires with
-- the waiter's queue entry until it is renewed (step.rs). Version 3 added a holder's renewal
-- and a waiter's heartbeat.
--
-- Version 4 reads the other tables in a statement after the one that locks the row. Versions
-- 1 to 3 read them in subqueries of the locking statement itself, and InnoDB evaluates those
-- in the read view the statement opened when it started, before it waited for the lock: a
-- procedure queued behind another step read that step's holders and waiters as they were
-- before it committed. A renewal queued behind a revoke renewed the revoked lease; a
-- heartbeat or a retried acquire queued behind the release that handed it the permit
-- answered 'gone' or 'queued', and the waiter joined the queue again under a new lease id
-- (which then failed with a capacity mismatch after a resize); a release queued behind a
-- revoke freed the lease's seat a second time (refused by the free-seat key, but reported as
-- an error). Under READ COMMITTED each statement opens its own read view, so one that starts
-- once the row lock is held sees every step committed before it. Version 4 therefore drops
-- the procedures of versions 1 to 3: a client of those versions then runs its client-side
-- step, which reads each table in a statement of its own (the drops are at the end of this
-- file, after version 4's procedures are created).
--
-- Each procedure runs its own transaction (START TRANSACTION … COMMIT, in the session's
-- READ COMMITTED), locks the semaphore's row first (SELECT … FOR UPDATE) and reads the
-- server's clock once after that lock (SYSDATE(6), never NOW()), exactly as the client-side
-- step, and reads every other row in statements after that one. An error rolls the
-- transaction back and reaches the client unchanged (a deadlock or a lock wait timeout is
-- retried there, as for client-side steps).
--
-- The procedures cover the common case only and answer 'fallback' (after a ROLLBACK, so
-- nothing changed) whenever the step would do more, or whenever a value read is not what a
-- step writes: an expired holder or waiter to purge, a queue head that fits without a
-- release (after a resize), a holder or head of weight other than 1, more than one hand-off
-- due, a row out of range or unreadable. The client then runs the full client-side step,
-- which purges, hands off, or reports the damaged row as Error::Corrupt. Work per call is
-- bounded: a few single-row statements, plus, when a released seat lowers seat_high, one
-- probe per free seat it lowers over (at most the capacity).
--
-- Result: one row, always the same columns:
--   outcome   'granted' (a new grant), 'held' (the lease already held: a retried acquire),
--             'queued', 'no_permit', 'mismatch', 'queue_full' (acquire); 'released',
--             'not_held' (release); 'renewed', 'granted', 'waiting', 'gone' (keep-alive);
--             'fallback' (any)
--   now_us    the clock read after the lock (NULL for 'fallback' and a release without row)
--   n1, n2    'queued': position; 'no_permit': available, queued; 'mismatch': stored
--             capacity; 'queue_full': nothing; 'renewed': the lease's expiry
--   then the lease granted or held ('granted', 'held', and 'released' when the release
--   handed the permit to the queue head; a keep-alive's 'granted'): lease_id, weight, seats,
--   fence, holder, acquired_at, expires_at, and the granted waiter's doorbell ('released'
--   only).

-- Acquires one permit of semaphore p_name (stores/sql/step.rs `acquire` with weight 1).
--   p_name        the semaphore          p_capacity  the capacity the client declares
--   p_lease       the lease id           p_ttl       lease TTL, µs
--   p_holder      the holder label       p_wait      1: queue if needed; 0: try only
--   p_waiter_ttl  heartbeat TTL, µs      p_queue_cap longest queue the client joins
--   p_doorbell    this client's doorbell address, written into its waiter row
CREATE PROCEDURE IF NOT EXISTS tessera_v4_acquire_one(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_capacity BIGINT,
    IN p_lease VARCHAR(32) CHARACTER SET ascii,
    IN p_ttl BIGINT,
    IN p_holder VARCHAR(256) CHARACTER SET utf8mb4,
    IN p_wait INT,
    IN p_waiter_ttl BIGINT,
    IN p_queue_cap BIGINT,
    IN p_doorbell VARCHAR(80) CHARACTER SET ascii)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_last_fence, v_next_seq, v_seat_high BIGINT;
    DECLARE v_hwm, v_now, v_seat, v_fence, v_seq, v_head_weight BIGINT;
    DECLARE v_holders_expire, v_waiters_expire, v_held BIGINT;
    DECLARE v_tries INT DEFAULT 0;
    DECLARE h_weight, h_fence, h_acquired, h_expires BIGINT;
    DECLARE h_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE h_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- Locks the row and reads it and the clock, which the server reads when it produces the
    -- row, once the lock is held. A missing row is created (a placeholder: nothing used,
    -- fences from the high-water mark), locked and read again.
    lock_row: LOOP
        SET v_none = 0;
        SELECT capacity, used, queued, last_fence, next_seq, seat_high,
               TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
          INTO v_capacity, v_used, v_queued, v_last_fence, v_next_seq, v_seat_high, v_now
          FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
        IF v_none = 0 OR v_tries > 0 THEN
            LEAVE lock_row;
        END IF;
        SET v_tries = 1;
        INSERT INTO tessera_semaphores (name, capacity, used, queued, last_fence, next_seq, seat_high)
        SELECT p_name, p_capacity, 0, 0, meta_value, 0, 0 FROM tessera_meta WHERE meta_key = 'fence_hwm'
        ON DUPLICATE KEY UPDATE name = name;
    END LOOP;
    -- Then, in a statement of its own (see the header), what the step reads first: the
    -- high-water mark, the earliest holder and waiter expiries, the queue head's weight, and
    -- this lease's holder row and waiter entry.
    IF v_none = 0 THEN
        SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
               (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
               (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
               (SELECT weight FROM tessera_waiters WHERE name = p_name ORDER BY seq LIMIT 1),
               (SELECT seq FROM tessera_waiters WHERE name = p_name AND lease_id = p_lease),
               (SELECT COUNT(*) FROM tessera_holders WHERE name = p_name AND lease_id = p_lease)
          INTO v_hwm, v_holders_expire, v_waiters_expire, v_head_weight, v_seq, v_held;
    END IF;
    IF v_none = 1 OR v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_next_seq IS NULL OR v_next_seq < 0 OR v_seat_high IS NULL
       OR v_seat_high < 0 OR v_seat_high > 4294967295
       OR v_last_fence > 9000000000000000000 OR v_hwm > 9000000000000000000
       -- Anything to purge: the full step.
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR (v_queued > 0 AND v_waiters_expire <= v_now)
       -- A head that fits before anything is released (after a resize): the full step.
       OR (v_queued > 0 AND v_used < v_capacity
           AND (v_head_weight IS NULL OR v_head_weight <= v_capacity - v_used)) THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- Every lease and waiter gone: the semaphore is idle and takes the declared capacity.
    IF v_used = 0 AND v_queued = 0 THEN
        SET v_capacity = p_capacity;
    END IF;
    IF v_capacity <> p_capacity THEN
        ROLLBACK;
        SELECT 'mismatch', v_now, v_capacity, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- A retry of an acquire whose reply was lost: what it already holds.
    IF v_held > 0 THEN
        SET v_none = 0;
        SELECT weight, seats, fence, holder, acquired_at, expires_at
          INTO h_weight, h_seats, h_fence, h_holder, h_acquired, h_expires
          FROM tessera_holders WHERE name = p_name AND lease_id = p_lease;
        IF v_none = 0 THEN
            COMMIT;
            SELECT 'held', v_now, NULL, NULL, p_lease, h_weight, h_seats, h_fence, h_holder,
                   h_acquired, h_expires, NULL;
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
                   (SELECT COUNT(*) FROM tessera_waiters WHERE name = p_name AND seq < v_seq),
                   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END;
    END IF;
    -- Free and nobody waiting: grant. The lowest returned seat below the capacity, else the
    -- next one from seat_high up.
    IF v_queued = 0 AND v_used + 1 <= v_capacity THEN
        SET v_seat = NULL;
        IF v_seat_high > 0 THEN
            SELECT MIN(seat) INTO v_seat FROM tessera_free_seats
             WHERE name = p_name AND seat < v_capacity;
        END IF;
        IF v_seat IS NOT NULL THEN
            IF v_seat < 0 THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            DELETE FROM tessera_free_seats WHERE name = p_name AND seat = v_seat;
        ELSE
            IF v_seat_high + 1 > v_capacity THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET v_seat = v_seat_high;
            SET v_seat_high = v_seat_high + 1;
        END IF;
        SET v_fence = GREATEST(v_last_fence + 1, v_now, v_hwm + 1);
        INSERT INTO tessera_holders
            (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at)
        VALUES (p_name, p_lease, 1, CAST(v_seat AS CHAR), v_fence, p_holder, v_now, v_now + p_ttl);
        UPDATE tessera_semaphores
           SET capacity = v_capacity, used = v_used + 1, last_fence = v_fence,
               seat_high = v_seat_high
         WHERE name = p_name;
        UPDATE tessera_meta SET meta_value = GREATEST(meta_value, v_fence)
         WHERE meta_key = 'fence_hwm';
        COMMIT;
        SELECT 'granted', v_now, NULL, NULL, p_lease, CAST(1 AS SIGNED), CAST(v_seat AS CHAR), v_fence, p_holder,
               v_now, v_now + p_ttl, NULL;
        LEAVE body;
    END IF;
    IF p_wait <> 1 THEN
        COMMIT;
        SELECT 'no_permit', v_now, GREATEST(v_capacity - v_used, 0), v_queued,
               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_queued >= p_queue_cap THEN
        COMMIT;
        SELECT 'queue_full', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    INSERT INTO tessera_waiters
        (name, seq, lease_id, weight, holder, ttl, enqueued_at, expires_at, doorbell)
    VALUES (p_name, v_next_seq, p_lease, 1, p_holder, p_ttl, v_now, v_now + p_waiter_ttl,
            p_doorbell);
    UPDATE tessera_semaphores SET queued = v_queued + 1, next_seq = v_next_seq + 1
     WHERE name = p_name;
    COMMIT;
    SELECT 'queued', v_now, v_queued, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
END
;
-- Releases lease p_lease of semaphore p_name (stores/sql/step.rs `release`), handing the
-- permit to the queue head when it fits, in the same transaction.
CREATE PROCEDURE IF NOT EXISTS tessera_v4_release(
    IN p_name VARCHAR(128) CHARACTER SET ascii,
    IN p_lease VARCHAR(32) CHARACTER SET ascii)
MODIFIES SQL DATA
SQL SECURITY INVOKER
body: BEGIN
    DECLARE v_none INT DEFAULT 0;
    DECLARE v_capacity BIGINT DEFAULT NULL;
    DECLARE v_used, v_queued, v_last_fence, v_next_seq, v_seat_high BIGINT;
    DECLARE v_hwm, v_now, v_seat, v_high, v_fence, v_weight BIGINT;
    DECLARE v_holders_expire, v_waiters_expire BIGINT;
    DECLARE v_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE v_grant INT DEFAULT 0;
    DECLARE g_seq, g_weight, g_ttl, g_seat, g_expires BIGINT;
    DECLARE g_lease VARCHAR(64) CHARACTER SET ascii;
    DECLARE g_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE g_doorbell VARCHAR(80) CHARACTER SET ascii;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- Locks the row and reads it and the clock (read when the row is produced, once the
    -- lock is held).
    SELECT capacity, used, queued, last_fence, next_seq, seat_high,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
      INTO v_capacity, v_used, v_queued, v_last_fence, v_next_seq, v_seat_high, v_now
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    IF v_none = 1 THEN
        -- No row: nothing held, nothing to change.
        COMMIT;
        SELECT 'not_held', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- Then, in a statement of its own (see the header), the high-water mark, the earliest
    -- holder and waiter expiries, and this lease's holder row.
    SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
           (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
           (SELECT weight FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
           (SELECT seats FROM tessera_holders WHERE name = p_name AND lease_id = p_lease)
      INTO v_hwm, v_holders_expire, v_waiters_expire, v_weight, v_seats;
    IF v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_next_seq IS NULL OR v_next_seq < 0 OR v_seat_high IS NULL
       OR v_seat_high < 0 OR v_seat_high > 4294967295
       OR v_last_fence > 9000000000000000000 OR v_hwm > 9000000000000000000
       OR (v_used = 0 AND v_queued = 0)
       -- Anything to purge: the full step.
       OR (v_used > 0 AND v_holders_expire <= v_now)
       OR (v_queued > 0 AND v_waiters_expire <= v_now) THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight IS NULL THEN
        -- Not held. Unless a head fits already (after a resize), nothing changes.
        IF v_queued > 0 AND v_used < v_capacity THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        COMMIT;
        SELECT 'not_held', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_weight <> 1 OR v_seats IS NULL OR v_seats NOT REGEXP '^(0|[1-9][0-9]{0,6})$'
       OR v_used < 1 THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    SET v_seat = CAST(v_seats AS UNSIGNED);
    IF v_seat >= v_seat_high THEN
        ROLLBACK;
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    SET v_used = v_used - 1;
    -- The hand-off, decided before anything is written: one head of weight 1 that fits,
    -- and no second hand-off due (else the full step).
    IF v_queued > 0 AND v_used < v_capacity THEN
        SET v_none = 0;
        SELECT seq, lease_id, weight, holder, ttl, doorbell, expires_at
          INTO g_seq, g_lease, g_weight, g_holder, g_ttl, g_doorbell, g_expires
          FROM tessera_waiters WHERE name = p_name ORDER BY seq LIMIT 1;
        IF v_none = 1 OR g_weight IS NULL OR g_weight < 1 THEN
            ROLLBACK;
            SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
            LEAVE body;
        END IF;
        IF g_weight <= v_capacity - v_used THEN
            IF g_weight <> 1 OR (v_capacity - v_used >= 2 AND v_queued >= 2)
               OR g_lease IS NULL OR g_lease NOT REGEXP '^[0-9a-f]{32}$'
               OR g_ttl IS NULL OR g_ttl < 0 OR g_holder IS NULL OR g_doorbell IS NULL
               OR g_expires IS NULL OR g_expires <= v_now THEN
                ROLLBACK;
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET v_grant = 1;
            -- Provisional until renewed: no longer than the waiter's entry would have lived.
            SET g_ttl = LEAST(g_ttl, g_expires - v_now);
        END IF;
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
                SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
                LEAVE body;
            END IF;
            SET g_seat = v_seat_high;
            SET v_seat_high = v_seat_high + 1;
        END IF;
        SET v_fence = GREATEST(v_last_fence + 1, v_now, v_hwm + 1);
        SET v_last_fence = v_fence;
        INSERT INTO tessera_holders
            (name, lease_id, weight, seats, fence, holder, acquired_at, expires_at)
        VALUES (p_name, g_lease, 1, CAST(g_seat AS CHAR), v_fence, g_holder, v_now, v_now + g_ttl);
        SET v_used = v_used + 1;
        UPDATE tessera_meta SET meta_value = GREATEST(meta_value, v_fence)
         WHERE meta_key = 'fence_hwm';
    END IF;
    IF v_used = 0 AND v_queued = 0 THEN
        DELETE FROM tessera_semaphores WHERE name = p_name;
        IF v_seat_high <> 0 THEN
            DELETE FROM tessera_free_seats WHERE name = p_name;
        END IF;
    ELSE
        UPDATE tessera_semaphores
           SET used = v_used, queued = v_queued, last_fence = v_last_fence,
               seat_high = v_seat_high
         WHERE name = p_name;
    END IF;
    COMMIT;
    IF v_grant = 1 THEN
        SELECT 'released', v_now, NULL, NULL, g_lease, CAST(1 AS SIGNED), CAST(g_seat AS CHAR), v_fence,
               g_holder, v_now, v_now + g_ttl, g_doorbell;
    ELSE
        SELECT 'released', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
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
CREATE PROCEDURE IF NOT EXISTS tessera_v4_keep_alive(
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
    DECLARE v_hwm, v_now, v_held, v_waiting BIGINT;
    DECLARE v_holders_expire, v_waiters_expire BIGINT;
    DECLARE h_weight, h_fence, h_acquired BIGINT;
    DECLARE h_seats MEDIUMTEXT CHARACTER SET ascii;
    DECLARE h_holder VARCHAR(256) CHARACTER SET utf8mb4;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_none = 1;
    DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END;

    START TRANSACTION;
    -- Locks the row and reads it and the clock (read when the row is produced, once the
    -- lock is held).
    SELECT capacity, used, queued, last_fence, next_seq, seat_high,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
      INTO v_capacity, v_used, v_queued, v_last_fence, v_next_seq, v_seat_high, v_now
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    IF v_none = 1 THEN
        -- No row: neither held nor queued, nothing to change.
        COMMIT;
        SELECT 'gone', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    -- Then, in a statement of its own (see the header), the high-water mark, the earliest
    -- holder and waiter expiries, and this lease's holder and waiter expiries.
    SELECT (SELECT meta_value FROM tessera_meta WHERE meta_key = 'fence_hwm'),
           (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name),
           (SELECT expires_at FROM tessera_holders WHERE name = p_name AND lease_id = p_lease),
           (SELECT expires_at FROM tessera_waiters WHERE name = p_name AND lease_id = p_lease)
      INTO v_hwm, v_holders_expire, v_waiters_expire, v_held, v_waiting;
    IF v_capacity IS NULL OR v_hwm IS NULL OR v_hwm < 0 OR v_now IS NULL OR v_now < 0
       OR v_capacity < 1 OR v_capacity > 1000000 OR v_used IS NULL OR v_used < 0
       OR v_used > 4294967295 OR v_queued IS NULL OR v_queued < 0 OR v_last_fence IS NULL
       OR v_last_fence < 0 OR v_next_seq IS NULL OR v_next_seq < 0 OR v_seat_high IS NULL
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
        SELECT 'fallback', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF v_held IS NOT NULL THEN
        IF p_waiter = 1 THEN
            -- Held already (granted by a release while it waited): its grant.
            SELECT weight, seats, fence, holder, acquired_at
              INTO h_weight, h_seats, h_fence, h_holder, h_acquired
              FROM tessera_holders WHERE name = p_name AND lease_id = p_lease;
            COMMIT;
            SELECT 'granted', v_now, NULL, NULL, p_lease, h_weight, h_seats, h_fence, h_holder,
                   h_acquired, v_held, NULL;
            LEAVE body;
        END IF;
        IF v_held < v_now + p_ttl THEN
            SET v_held = v_now + p_ttl;
            UPDATE tessera_holders SET expires_at = v_held
             WHERE name = p_name AND lease_id = p_lease;
        END IF;
        COMMIT;
        SELECT 'renewed', v_now, v_held, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    IF p_waiter = 0 OR v_queued = 0 OR v_waiting IS NULL THEN
        COMMIT;
        SELECT 'gone', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
        LEAVE body;
    END IF;
    UPDATE tessera_waiters
       SET expires_at = GREATEST(expires_at, v_now + p_ttl), doorbell = p_doorbell
     WHERE name = p_name AND lease_id = p_lease;
    COMMIT;
    SELECT 'waiting', v_now, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL;
END
;
-- Versions 1 to 3 (see the header).
DROP PROCEDURE IF EXISTS tessera_v1_acquire_one
;
DROP PROCEDURE IF EXISTS tessera_v1_release
;
DROP PROCEDURE IF EXISTS tessera_v2_acquire_one
;
DROP PROCEDURE IF EXISTS tessera_v2_release
;
DROP PROCEDURE IF EXISTS tessera_v3_keep_alive
