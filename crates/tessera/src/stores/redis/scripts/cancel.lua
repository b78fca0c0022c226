-- cancel: gives up a wait; releases the lease if the grant already happened.
-- KEYS: see prelude.lua.
-- ARGV[2] lease id
-- Reply: {'dequeued'} | {'released'} | {'notfound'}

local lease_id = ARGV[2]

if load() == nil then
  return {'notfound'}
end
purge_and_hand_off()

local reply
if remove_waiter(lease_id) then
  reply = {'dequeued'}
elseif remove_holder(lease_id, true) then
  reply = {'released'}
else
  reply = {'notfound'}
end
-- Removing the head of the queue, or freeing permits, may let the next in.
if reply[1] ~= 'notfound' then
  hand_off()
end
finish()
return out(reply)
