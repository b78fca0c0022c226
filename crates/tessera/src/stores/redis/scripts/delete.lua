-- delete: removes the semaphore with its holders and waiters (admin), waking all of them.
-- Nothing is purged first: every lease and waiter still recorded is woken. The fence key
-- stays, so fences never repeat.
-- KEYS: see prelude.lua.
-- ARGV: none of its own
-- Reply: 1 if the semaphore existed or kept tenants' limits, 0 otherwise (an idle state
-- does not count, and stays; its limits go)

if load() == nil then
  return 0
end
if is_empty() then
  -- An idle state stays; the limits it keeps go (see prelude.lua).
  if not S.lim then
    return 0
  end
  rcall('DEL', K_LIMITS)
  S.lim = false
  lim_moved = true
  dirty = true
  finish()
  return out(1)
end

local leases = lease_all()
for i = 1, #leases, 2 do
  wake(decode_lease(leases[i + 1]).client, leases[i])
end
local waiters = rcall('HGETALL', K_WAITERS)
for i = 1, #waiters, 2 do
  wake(decode_waiter(waiters[i + 1]).client, waiters[i])
end
-- Every key of the state (as delete_state), and the tenants' limits with it.
rcall('DEL', K_META, K_HOLDERS, K_LEASES, K_QUEUE, K_WAITERS, K_WEXP, K_SEATS, K_TAGS, K_LIMITS)
rcall('SET', K_FENCE, int(fence()), 'PX', FENCE_KEEP_MS)
S = nil
finish()
return out(1)
