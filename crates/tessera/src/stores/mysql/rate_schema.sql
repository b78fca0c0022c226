-- tessera MySQL / MariaDB schema, version 2: the rate-limiter tables (see rate.rs and
-- rate/engine.rs). Applied by migrate.rs after version 1, like it statement by statement,
-- idempotent. Statements are separated by a line holding only ';'.

-- One row per rate limiter with state that still matters:
--   config      canonical limits, e.g. 'exact|50/s,1000/min'
--   seq, tail   ids of admissions; tail = the latest admission that can still be returned
--   last        latest admit time (µs; reservations included), prev_last the one before it
--   p, base     running total of admitted cost, and the total before the oldest kept entry
--   tat         smooth mode: one GCRA theoretical arrival time per limit, comma separated
--   expires_at  when the state stops mattering; rows past it are deleted by later steps
--   expired     admissions given back past their use-by instant since the state began
--               (schema version 5, rate_expired.sql; tables created since carry it)
CREATE TABLE IF NOT EXISTS tessera_rate_limiters (
    name       VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    config     VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    seq        BIGINT NOT NULL,
    tail       BIGINT NOT NULL,
    last       BIGINT NOT NULL,
    prev_last  BIGINT NOT NULL,
    p          BIGINT NOT NULL,
    base       BIGINT NOT NULL,
    tat        VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    prev_tat   VARCHAR(1024) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    expires_at BIGINT NOT NULL,
    expired    BIGINT NOT NULL DEFAULT 0,
    KEY tessera_rate_limiters_by_expiry (expires_at)
) ENGINE=InnoDB
;
-- The admission log (exact mode): admit time t and running total p (unique, increasing
-- with t). Looked up by p (the binding entry) and by t (pruning, usage).
CREATE TABLE IF NOT EXISTS tessera_rate_log (
    name VARCHAR(128) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    p    BIGINT NOT NULL,
    t    BIGINT NOT NULL,
    PRIMARY KEY (name, p),
    KEY tessera_rate_log_by_time (name, t)
) ENGINE=InnoDB
