-- rate_delete: drops the limiter's state and log (admin): its limits, history and every
-- reservation, due or not; and its tenants' own limiters (window ceilings).
-- KEYS: see rate_prelude.lua.
-- ARGV: none
-- Reply: 1 if the limiter had state (not yet expired), 0 otherwise (nothing changed)

-- The own limiters of the name's tenants (window ceilings, admission.lua) go with it: those
-- of the tenants in the semaphore's limits hash ('{<prefix>:<name>}:limits'; a tenant's
-- limiter whose limits were removed before expires as any state does).
local limits = rcall('HGETALL', string.sub(K_STATE, 1, -5) .. 'limits')
for i = 1, #limits, 2 do
  rcall('DEL', tenant_keys(K_STATE, limits[i]))
end

-- load() drops the keys of an expired state itself and answers nil.
if load() == nil then
  return 0
end
rcall('DEL', K_STATE, K_LOG)
return 1
