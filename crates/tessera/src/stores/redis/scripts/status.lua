-- status: a snapshot (after purge and hand-off, like every step).
-- KEYS: see prelude.lua.
-- ARGV: none of its own
-- Reply: {'none'} | {'status', capacity, used, now, {id, lease record, ...},
--                   {id, waiter record, ...} in queue order}

if load() == nil then
  return {'none'}
end
purge_and_hand_off()

local reply
if is_empty() then
  reply = {'none'}
else
  local leases = lease_all()
  local queue = rcall('ZRANGE', K_QUEUE, 0, -1)
  local waiters = {}
  for i, id in ipairs(queue) do
    waiters[2 * i - 1] = id
    waiters[2 * i] = rcall('HGET', K_WAITERS, id) or corrupt('queued lease without a waiter record')
  end
  reply = {'status', S.cap, S.used, now, leases, waiters}
end
finish()
return out(reply)
