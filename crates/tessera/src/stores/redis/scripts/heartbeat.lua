-- heartbeat: waiters renew their queue entries, or learn the hand-off granted them; one step
-- for any number of waiters (the client gathers the heartbeats of one semaphore that arrive
-- while its previous call runs, at most 1,024, so the work stays bounded).
-- KEYS: see prelude.lua.
-- ARGV[2k] lease id    ARGV[2k+1] its waiter ttl (µs), for k = 1, 2, …
-- Reply: one per lease, in order: {'granted', now, lease record} | {'waiting', now, purge_at}
--      | {'gone'}
-- (purge_at, a lower bound of every expiry of the state, tells the waiter when an expiry may
-- free permits: it asks again then, see Backend::next_expiry.)

if #ARGV < 3 or #ARGV % 2 ~= 1 then
  corrupt('heartbeat arguments: lease id and waiter ttl pairs')
end
local ttls = {}
for i = 3, #ARGV, 2 do
  ttls[i] = num(ARGV[i], 'waiter ttl argument')
end

local replies = {}
if load() == nil then
  for i = 2, #ARGV, 2 do
    replies[#replies + 1] = {'gone'}
  end
  return replies
end
purge_and_hand_off()

for i = 2, #ARGV, 2 do
  local lease_id = ARGV[i]
  local held = lease_get(lease_id)
  if held then
    replies[#replies + 1] = {'granted', now, held}
  elseif refresh_waiter(lease_id, now + ttls[i + 1]) then
    replies[#replies + 1] = {'waiting', now_text(), int(S.purge_at)}
  else
    replies[#replies + 1] = {'gone'}
  end
end
finish()
return out(replies)
