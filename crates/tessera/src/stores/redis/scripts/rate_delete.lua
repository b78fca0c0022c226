-- rate_delete: drops the limiter's state and log (admin): its limits, history and every
-- reservation, due or not.
-- KEYS: see rate_prelude.lua.
-- ARGV: none
-- Reply: 1 if the limiter had state (not yet expired), 0 otherwise (nothing changed)

-- load() drops the keys of an expired state itself and answers nil.
if load() == nil then
  return 0
end
rcall('DEL', K_STATE, K_LOG)
return 1
