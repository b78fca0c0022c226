-- tessera_heartbeat_many: the heartbeats of several waiters of one semaphore in one call; for
-- each lease exactly what tessera_heartbeat answers for it alone (step revision 2).
--
-- p_name        the semaphore
-- p_leases      the waiters' lease ids (a lease may appear more than once)
-- p_ttls        for each, its queue entry is renewed until now + p_ttls[i] (µs)
--
-- One row per element of p_leases, in their order: lease_id, then the columns of
-- tessera_heartbeat ('granted' with the lease's fields and tenant, 'waiting' or 'gone';
-- now_us).
--
-- Why: every waiter heartbeats once per third of its waiter TTL, and one process may hold
-- thousands of waiters on one semaphore. One call per heartbeat locks the semaphore's row
-- once per waiter (10,000 waiters with a 3 s waiter TTL: 10,000 calls a second, each
-- queued on that one row); the client gathers the heartbeats that arrive while the previous
-- batch of that semaphore runs (postgres/heartbeats.rs) and sends them as one call, which
-- locks the row once, renews every queue entry in one UPDATE and reads the holders in one
-- join. Bounded by the client: at most 1,024 leases per call.
CREATE OR REPLACE FUNCTION tessera_heartbeat_many(p_name text, p_leases text[], p_ttls bigint[])
RETURNS TABLE (
    lease_id text, outcome text, now_us bigint, weight bigint, seats int4[], fence bigint,
    holder text, acquired_at bigint, expires_at bigint, tenant text
)
LANGUAGE plpgsql AS $$
DECLARE
    st tessera_step;
BEGIN
    IF cardinality(p_leases) IS DISTINCT FROM cardinality(p_ttls) THEN
        RAISE EXCEPTION 'tessera_heartbeat_many: % leases and % ttls',
            cardinality(p_leases), cardinality(p_ttls);
    END IF;
    st := tessera__load(p_name, NULL);
    -- A holder is answered 'granted' and its queue entry (there is none once granted) left
    -- alone; a waiter's entry is renewed; anything else is 'gone'.
    RETURN QUERY
    WITH req AS (
        SELECT u.lease, u.ttl, u.i FROM unnest(p_leases, p_ttls) WITH ORDINALITY AS u(lease, ttl, i)
    ), held AS (
        SELECT h.lease_id AS lease, h.weight, h.seats, h.fence, h.holder, h.acquired_at,
               h.expires_at, h.tenant
        FROM tessera_holders h
        WHERE st.found AND st.used > 0 AND h.name = p_name
          AND h.lease_id IN (SELECT r.lease FROM req r)
    ), renewed AS (
        UPDATE tessera_waiters w SET expires_at = greatest(w.expires_at, st.now_us + r.ttl)
        FROM (SELECT q.lease, max(q.ttl) AS ttl FROM req q GROUP BY q.lease) r
        WHERE st.found AND w.name = p_name AND w.lease_id = r.lease
          AND NOT EXISTS (SELECT 1 FROM held x WHERE x.lease = r.lease)
        RETURNING w.lease_id AS lease
    )
    SELECT r.lease,
           CASE WHEN h.lease IS NOT NULL THEN 'granted'
                WHEN n.lease IS NOT NULL THEN 'waiting'
                ELSE 'gone' END,
           st.now_us, h.weight, h.seats, h.fence, h.holder, h.acquired_at,
           CASE WHEN h.lease IS NULL AND n.lease IS NOT NULL THEN st.purge_at
                ELSE h.expires_at END,
           h.tenant
    FROM req r
    LEFT JOIN held h ON h.lease = r.lease
    LEFT JOIN (SELECT DISTINCT m.lease FROM renewed m) n ON n.lease = r.lease
    ORDER BY r.i;
    PERFORM tessera__finish(st);
END $$;
