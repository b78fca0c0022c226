-- tessera PostgreSQL store, migration 7: each limiter's count of admissions given back past
-- their use-by instant (docs/admission.md, "Use-by"), shown by `status`.
--
-- `expired` on a limiter's row: added to by tessera_give_back when the admission was past its
-- use-by instant (its new argument `p_expired`), read by tessera_rate_status (its new column
-- `st_expired`); no other function names it. A row deleted when its state expires takes its
-- count with it: the count is the state's.
--
-- Both functions change their signature, which CREATE OR REPLACE cannot do: the old ones are
-- dropped here, and the step, the rate functions and the admission's are created again after
-- this file with step revision 6. tessera_give_back's new argument has a default, so a call
-- with the old five arguments still resolves to it.
--
-- Idempotent, like migrations 4 to 6.
ALTER TABLE tessera_rate_limiters ADD COLUMN IF NOT EXISTS expired bigint NOT NULL DEFAULT 0;
DROP FUNCTION IF EXISTS tessera_give_back(text, text, bigint, bigint, text);
DROP FUNCTION IF EXISTS tessera_rate_status(text);
