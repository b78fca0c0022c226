-- release: gives a lease back and hands the permits to the queue. Idempotent.
-- KEYS: see prelude.lua.
-- ARGV[2] lease id
-- Reply: 1 if the lease was held, 0 otherwise

local lease_id = ARGV[2]

if load() == nil then
  return 0
end
purge_and_hand_off()

local held = remove_holder(lease_id, true) ~= nil
hand_off()
finish()
if held then
  return out(1)
end
return out(0)
