-- tessera PostgreSQL store, migration 1: the tables and the step's state type.
--
-- Runs once per schema, inside the migration transaction (`migrate` in mod.rs), with
-- `search_path` set to tessera's schema, after `pg_advisory_xact_lock` on that schema: so
-- several processes starting at once never run it twice.
--
-- Times are microseconds since the Unix epoch on the server's clock (`clock_timestamp()`),
-- lease ids 32 lowercase hex digits, seats ascending `int4[]`. Nothing here is trusted by the
-- functions: every value they read is checked, and a wrong one raises SQLSTATE `TS001`
-- (tessera's `Error::Corrupt`).

-- Store-wide values: `fence_hwm`, the highest fence of every semaphore deleted so far (a new
-- semaphore starts above it, so fences of a name never repeat across deletions).
CREATE TABLE tessera_meta (
    key   text PRIMARY KEY,
    value bigint NOT NULL
);
INSERT INTO tessera_meta (key, value) VALUES ('fence_hwm', 0);

-- One row per semaphore with holders or waiters: the step's running counters.
CREATE TABLE tessera_semaphores (
    name       text PRIMARY KEY,
    capacity   bigint NOT NULL,
    used       bigint NOT NULL,
    queued     bigint NOT NULL,
    last_fence bigint NOT NULL,
    next_seq   bigint NOT NULL,
    seat_high  bigint NOT NULL
);

-- Leases. `client` is the holder's client id: its wake-up channel is `tessera_w<client>`.
CREATE TABLE tessera_holders (
    name        text NOT NULL,
    lease_id    text NOT NULL,
    weight      bigint NOT NULL,
    seats       int4[] NOT NULL,
    fence       bigint NOT NULL,
    holder      text NOT NULL,
    client      text NOT NULL,
    acquired_at bigint NOT NULL,
    expires_at  bigint NOT NULL,
    PRIMARY KEY (name, lease_id)
);
CREATE INDEX tessera_holders_expiry ON tessera_holders (name, expires_at);

-- The FIFO queue, in `seq` order; `ttl` is the lease TTL (µs) to grant with at hand-off.
CREATE TABLE tessera_waiters (
    name        text NOT NULL,
    seq         bigint NOT NULL,
    lease_id    text NOT NULL,
    weight      bigint NOT NULL,
    holder      text NOT NULL,
    client      text NOT NULL,
    ttl         bigint NOT NULL,
    enqueued_at bigint NOT NULL,
    expires_at  bigint NOT NULL,
    PRIMARY KEY (name, seq),
    UNIQUE (name, lease_id)
);
CREATE INDEX tessera_waiters_expiry ON tessera_waiters (name, expires_at);

-- Seats returned below `seat_high` (every seat at or above it is free).
CREATE TABLE tessera_free_seats (
    name text NOT NULL,
    seat bigint NOT NULL,
    PRIMARY KEY (name, seat)
);

-- The state of one step, as `struct Step` in stores/sql/step.rs: the semaphore's counters,
-- the clock read once under the lock, the fence high-water mark, and scratch fields the
-- helpers hand back (PL/pgSQL functions return one value: the whole state).
CREATE TYPE tessera_step AS (
    name       text,
    found      boolean,  -- the semaphore has a row (or an acquire created one)
    dirty      boolean,  -- the counters changed: write the row back
    capacity   bigint,
    used       bigint,
    queued     bigint,
    last_fence bigint,
    next_seq   bigint,
    seat_high  bigint,
    now_us     bigint,   -- clock_timestamp() read once the row lock is held
    hwm        bigint,   -- tessera_meta.fence_hwm
    hit        boolean,  -- the last remove_holder / remove_waiter removed something
    hit_client text,     -- the client of the holder remove_holder removed
    seats      int4[],   -- the seats of the last grant
    fence      bigint,   -- the fence of the last grant
    sync       text      -- the session's synchronous_commit, restored for durable steps
);
