-- limits: the tenants' ceilings, floors and window ceilings kept for a name (see
-- set_limits.lua).
-- KEYS: see prelude.lua.
-- ARGV: none of its own
-- Reply: {tenant, '<ceiling>,<floor>[,<window ceiling>[,<window-capped until>]]', ...}
--   (ceiling empty for none; see parse_limits in prelude.lua)

return rcall('HGETALL', K_LIMITS)
