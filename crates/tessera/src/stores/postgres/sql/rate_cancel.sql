-- tessera_rate_cancel: returns the latest admission if it is the one named and not yet due;
-- RateBackend::rate_cancel in one call, following rate/engine.rs `cancel` as
-- stores/redis/scripts/rate_cancel.lua does: tessera__rate_undo (rate_common.sql, shared
-- with tessera_give_back) with `p_due_too` false. See rate_common.sql for the invariants.
--
-- p_name         the limiter
-- p_reservation  the admission's id (RateReply::Admitted's reservation)
-- p_at           its admit time, µs: ids restart with a fresh state, but a stale id's time
--                has passed by then, so the pair never names a new reservation
--
-- Returns true if it was returned (last, and in exact mode the running total, roll back; in
-- smooth mode the pacing values), false if not (nothing changed but the sweep, or an expired
-- state dropped). Commits with the session's `synchronous_commit`.
CREATE OR REPLACE FUNCTION tessera_rate_cancel(p_name text, p_reservation bigint, p_at bigint)
RETURNS boolean
LANGUAGE sql AS $$ SELECT tessera__rate_undo(p_name, p_reservation, p_at, false) $$;
