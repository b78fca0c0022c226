-- tessera SQLite schema for rate limiters. Additive to schema.sql (version 1): run at every
-- connect in the same BEGIN IMMEDIATE transaction, every statement idempotent, so files
-- written before rate limiters existed gain these tables and still open, and older builds
-- still open files that have them (they never read them). The rate tables carry their own
-- version in tessera_meta ('rate_schema_version'), checked by this build.

INSERT OR IGNORE INTO tessera_meta (key, value) VALUES ('rate_schema_version', 1);

-- One row per rate limiter with state that still matters (see rate/engine.rs):
--   config      canonical limits, e.g. 'exact|50/s,1000/min'
--   seq, tail   ids of admissions; tail = the latest admission that can still be returned
--   last        latest admit time (µs; reservations included), prev_last the one before it
--   p, base     running total of admitted cost, and the total before the oldest kept entry
--   tat         smooth mode: one GCRA theoretical arrival time per limit, comma separated
--   expires_at  when the state stops mattering; rows past it are deleted by later steps
--   expired     admissions given back past their use-by instant since the state began
--               (files made before it get it at connect, migrate.rs)
CREATE TABLE IF NOT EXISTS tessera_rate_limiters (
    name       TEXT    NOT NULL PRIMARY KEY,
    config     TEXT    NOT NULL,
    seq        INTEGER NOT NULL,
    tail       INTEGER NOT NULL,
    last       INTEGER NOT NULL,
    prev_last  INTEGER NOT NULL,
    p          INTEGER NOT NULL,
    base       INTEGER NOT NULL,
    tat        TEXT    NOT NULL,
    prev_tat   TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    expired    INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS tessera_rate_limiters_by_expiry
    ON tessera_rate_limiters (expires_at);

-- The admission log (exact mode): admit time t and running total p (unique, increasing
-- with t). Looked up by p (the binding entry) and by t (pruning, usage).
CREATE TABLE IF NOT EXISTS tessera_rate_log (
    name TEXT    NOT NULL,
    p    INTEGER NOT NULL,
    t    INTEGER NOT NULL,
    PRIMARY KEY (name, p)
) STRICT, WITHOUT ROWID;

CREATE INDEX IF NOT EXISTS tessera_rate_log_by_time ON tessera_rate_log (name, t);
