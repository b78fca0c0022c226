-- Read-only heartbeat probe (see `MysqlBackend::probe_heartbeat`): one statement, so one
-- consistent read of the latest committed rows, no row lock, no transaction.
-- Parameters, in order: name, name, name (the expiry and queue-head checks), then name and
-- lease id (the waiter's own row).
-- One row: the server's clock (µs, as `now_us!` in ops.rs); the waiter's heartbeat expiry
-- and doorbell (NULL if the lease is not queued); whether any holder (1) or waiter (2) of
-- the semaphore has expired; whether the queue head does not fit (3; NULL without a head).
SELECT
    c.now_us,
    w.expires_at,
    w.doorbell,
    EXISTS (SELECT 1 FROM tessera_holders h WHERE h.name = ? AND h.expires_at <= c.now_us),
    EXISTS (SELECT 1 FROM tessera_waiters x WHERE x.name = ? AND x.expires_at <= c.now_us),
    (SELECT s.used + hd.weight > s.capacity
       FROM tessera_semaphores s JOIN tessera_waiters hd ON hd.name = s.name
      WHERE s.name = ?
      ORDER BY hd.seq
      LIMIT 1)
FROM (SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', SYSDATE(6)) AS now_us) c
LEFT JOIN tessera_waiters w ON w.name = ? AND w.lease_id = ?
