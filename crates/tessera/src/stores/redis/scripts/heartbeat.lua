-- heartbeat: a waiter renews its queue entry, or learns the hand-off granted it.
-- KEYS: see prelude.lua.
-- ARGV[2] lease id    ARGV[3] waiter ttl (µs)
-- Reply: {'granted', now, lease record} | {'waiting'} | {'gone'}

local lease_id = ARGV[2]
local waiter_ttl = num(ARGV[3], 'waiter ttl argument')

if load() == nil then
  return {'gone'}
end
purge_and_hand_off()

local reply
local held = S.used > 0 and rcall('HGET', K_LEASES, lease_id)
if held then
  reply = {'granted', now, held}
elseif refresh_waiter(lease_id, now + waiter_ttl) then
  reply = {'waiting'}
else
  reply = {'gone'}
end
finish()
return out(reply)
