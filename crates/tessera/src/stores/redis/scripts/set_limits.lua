-- set_limits: sets or removes a tenant's ceiling, floor and window ceiling on a name (admin,
-- docs/fair-shares.md#ceilings-and-floors), then hands off what the new limits let in. The
-- limits hash and the flag in meta's `cap` change together (see the section on limits in
-- prelude.lua); a name without a state gets an idle one, which keeps the flag.
-- KEYS: see prelude.lua.
-- ARGV[2] tenant   ARGV[3] ceiling ('' for none)   ARGV[4] floor
--   ARGV[5] window ceiling, a percentage (absent: none; see admission.lua)
--   (ARGV[3] on absent: remove the tenant's limits)
-- A tenant's limits are written as parse_limits (prelude.lua) reads them: without a window
-- ceiling as before window ceilings; with one, a window-capped instant kept before is
-- dropped (the tenant's limiter is asked again at its next turn).
-- Reply: {'set'} | {'floors', sum of the floors, capacity}: the floors would not fit the
--   capacity of the semaphore as it is (held or waited for), and nothing changed

local tenant = ARGV[2]
local clear = ARGV[3] == nil
local floor, value = 0, nil
if not clear then
  floor = num(ARGV[4], 'floor argument')
  if ARGV[3] ~= '' then num(ARGV[3], 'ceiling argument') end
  value = ARGV[3] .. ',' .. int(floor)
  if ARGV[5] ~= nil then
    value = value .. ',' .. int(num(ARGV[5], 'window ceiling argument'))
  end
end

-- The floors with this change.
local floors = floor
local all = rcall('HGETALL', K_LIMITS)
for i = 1, #all, 2 do
  if all[i] ~= tenant then
    floors = floors + parse_limits(all[i + 1]).f
  end
end
-- (As the reference model: checked against the state as stored, before its purge.)
if load() ~= nil and not is_empty() and floors > S.cap then
  return {'floors', int(floors), S.cap}
end

local n
if clear then
  rcall('HDEL', K_LIMITS, tenant)
  n = rcall('HLEN', K_LIMITS)
else
  rcall('HSET', K_LIMITS, tenant, value)
  n = 1
end
local lim = n > 0
if S == nil then
  if not lim then
    return {'set'}
  end
  create(0)
end
if S.lim ~= lim then
  S.lim = lim
  lim_moved = true
  dirty = true
end
if lim then
  load_limits()
else
  LIMITS = nil
end
purge_and_hand_off()
finish()
return out({'set'})
