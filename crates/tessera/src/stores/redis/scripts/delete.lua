-- delete: removes the semaphore with its holders and waiters (admin), waking all of them.
-- Nothing is purged first: every lease and waiter still recorded is woken. The fence key
-- stays, so fences never repeat.
-- KEYS: see prelude.lua.
-- ARGV: none of its own
-- Reply: 1 if the semaphore existed, 0 otherwise (an idle state does not count, and stays)

if load() == nil or is_empty() then
  return 0
end

local leases = lease_all()
for i = 1, #leases, 2 do
  wake(decode_lease(leases[i + 1]).client, leases[i])
end
local waiters = rcall('HGETALL', K_WAITERS)
for i = 1, #waiters, 2 do
  wake(decode_waiter(waiters[i + 1]).client, waiters[i])
end
delete_state()
rcall('SET', K_FENCE, int(fence()), 'PX', FENCE_KEEP_MS)
S = nil
finish()
return out(1)
