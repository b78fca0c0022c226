-- tessera MySQL / MariaDB routines, version 5: the heartbeats of many waiters of one semaphore
-- in one call (heartbeats.rs). Installed after version 4 (routines.sql) and recorded apart, so
-- a server that refuses this file (JSON_TABLE needs MariaDB 10.6 or MySQL 8.0.4) still runs
-- version 4's procedures; a client then sends each heartbeat alone. Statements are separated
-- by a line holding only ';'; `CREATE PROCEDURE IF NOT EXISTS` makes each one idempotent.
--
-- One process with 10,000 waiters on one semaphore (3 s waiter TTL) heartbeats 10,000 times a
-- second. One statement or CALL each, through the process's few connections, did not keep up:
-- waiters expired, queued again, and the queue never filled (`tessera-chaos --store mariadb
-- --scenario s10-reclaim`).

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
CREATE PROCEDURE IF NOT EXISTS tessera_v5_heartbeat_many(
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
             ORDER BY hd.seq
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
    SELECT capacity, used, queued,
           TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6))
      INTO v_capacity, v_used, v_queued, v_now
      FROM tessera_semaphores WHERE name = p_name FOR UPDATE;
    -- Then, in a statement of its own (see routines.sql), the earliest expiries.
    SELECT (SELECT MIN(expires_at) FROM tessera_holders WHERE name = p_name),
           (SELECT MIN(expires_at) FROM tessera_waiters WHERE name = p_name)
      INTO v_holders_expire, v_waiters_expire;
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
        UPDATE tessera_semaphores SET queued = queued - v_purged WHERE name = p_name;
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
