-- revoke: removes another holder's lease (admin) and tells its holder through a wake-up.
-- KEYS: see prelude.lua.
-- ARGV[2] lease id
-- Reply: 1 if the lease was held, 0 otherwise

local lease_id = ARGV[2]

if load() == nil then
  return 0
end
purge_and_hand_off()

local lease = remove_holder(lease_id, true)
if lease then
  wake(decode_lease(lease).client, lease_id)
  hand_off()
end
finish()
if lease then
  return out(1)
end
return out(0)
