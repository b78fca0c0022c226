-- tessera PostgreSQL store, migration 9: the tenant a request named, kept on its waiter and on
-- the holder it becomes (docs/fair-shares.md, "Status"), so every lease and waiter the store
-- returns carries it.
--
-- `tenant` on tessera_waiters and tessera_holders: NULL for a request that named none (the
-- tenant ""). tessera_acquire and tessera_admit write it on a new waiter and on a lease
-- granted at once, tessera__hand_off and tessera_admit carry a waiter's to its lease, and
-- every function that returns a lease (tessera_acquire, tessera_heartbeat,
-- tessera_heartbeat_many, tessera_admit) returns it in one more column `tenant`; status's
-- holders and queue show it, and a hand-off's wake-up payload carries it (common.sql).
--
-- Those four functions change their result columns and tessera__grant takes the tenant, which
-- CREATE OR REPLACE cannot do: they are dropped here and created again after this file, with
-- step revision 8 (the step, the rate functions and the admission's), in the same transaction.
-- Their arguments stay as they were, and the new column comes last: a process of the previous
-- build that is already connected calls them with its own arguments and reads the columns it
-- names (its prepared statements are planned again against the new functions), so it keeps
-- working; it reads no grant from a payload that carries a tenant and asks with a heartbeat
-- instead. An older build that starts later is refused, as after any migration.
--
-- Idempotent, like migrations 4 to 8.
ALTER TABLE tessera_waiters ADD COLUMN IF NOT EXISTS tenant text;
ALTER TABLE tessera_holders ADD COLUMN IF NOT EXISTS tenant text;
DROP FUNCTION IF EXISTS tessera__grant(tessera_step, text, bigint, bigint, text, text);
DROP FUNCTION IF EXISTS tessera_acquire(text, bigint, text, bigint, bigint, text, text, bigint,
    bigint, text, bigint);
DROP FUNCTION IF EXISTS tessera_heartbeat(text, text, bigint);
DROP FUNCTION IF EXISTS tessera_heartbeat_many(text, text[], bigint[]);
DROP FUNCTION IF EXISTS tessera_admit(text, bigint, text, bigint, bigint, text, text, bigint,
    bigint, text, bigint[], bigint[], bigint[], bigint, bigint, boolean, boolean, text, bigint);
