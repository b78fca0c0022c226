-- Read-only heartbeat probe. ?1 name, ?2 lease id, ?3 now (µs).
-- One row if the lease is queued: its heartbeat expiry; whether any holder (1) or waiter (2)
-- of the semaphore has expired; whether the queue head does not fit (3). NULL if unknown.
SELECT
    w.expires_at,
    EXISTS (SELECT 1 FROM tessera_holders h WHERE h.name = ?1 AND h.expires_at <= ?3),
    EXISTS (SELECT 1 FROM tessera_waiters x WHERE x.name = ?1 AND x.expires_at <= ?3),
    (SELECT s.used + hd.weight > s.capacity
       FROM tessera_semaphores s JOIN tessera_waiters hd ON hd.name = s.name
      WHERE s.name = ?1
      ORDER BY hd.tag, hd.seq
      LIMIT 1)
FROM tessera_waiters w
WHERE w.name = ?1 AND w.lease_id = ?2
