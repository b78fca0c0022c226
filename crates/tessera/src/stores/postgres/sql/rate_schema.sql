-- tessera PostgreSQL store, migration 2: the rate-limiter tables (see rate.rs and
-- rate/engine.rs; the step runs on the server, as the functions of migration 3,
-- rate_common.sql and rate_*.sql; before migration 3 it was the SQL stores' shared
-- client-side step, stores/sql/rate.rs, over these same tables).
--
-- Runs once per schema inside the migration transaction, like migration 1, and is
-- idempotent besides (`IF NOT EXISTS`): a schema that has the tables already still migrates.

-- One row per rate limiter with state that still matters:
--   config      canonical limits, e.g. 'exact|50/s,1000/min'
--   seq, tail   ids of admissions; tail = the latest admission that can still be returned
--   last        latest admit time (µs, server clock; reservations included), prev_last the
--               one before it
--   p, base     running total of admitted cost, and the total before the oldest kept entry
--   tat         smooth mode: one GCRA theoretical arrival time per limit, comma separated
--   expires_at  when the state stops mattering; rows past it are deleted by later steps. A
--               placeholder row (created to be locked, see rate_common.sql) has 0: no state.
CREATE TABLE IF NOT EXISTS tessera_rate_limiters (
    name       text   PRIMARY KEY,
    config     text   NOT NULL,
    seq        bigint NOT NULL,
    tail       bigint NOT NULL,
    last       bigint NOT NULL,
    prev_last  bigint NOT NULL,
    p          bigint NOT NULL,
    base       bigint NOT NULL,
    tat        text   NOT NULL,
    prev_tat   text   NOT NULL,
    expires_at bigint NOT NULL
);

CREATE INDEX IF NOT EXISTS tessera_rate_limiters_by_expiry
    ON tessera_rate_limiters (expires_at);

-- The admission log (exact mode): admit time t and running total p (unique, increasing
-- with t). Looked up by p (the binding entry) and by t (pruning, usage).
CREATE TABLE IF NOT EXISTS tessera_rate_log (
    name text   NOT NULL,
    p    bigint NOT NULL,
    t    bigint NOT NULL,
    PRIMARY KEY (name, p)
);

CREATE INDEX IF NOT EXISTS tessera_rate_log_by_time ON tessera_rate_log (name, t);
