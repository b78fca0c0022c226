-- limits: the tenants' ceilings and floors kept for a name (see set_limits.lua).
-- KEYS: see prelude.lua.
-- ARGV: none of its own
-- Reply: {tenant, '<ceiling>,<floor>', ...} (ceiling empty for none)

return rcall('HGETALL', K_LIMITS)
