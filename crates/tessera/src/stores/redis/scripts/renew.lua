-- renew: extends a held lease to max(its expiry, now + ttl).
-- KEYS: see prelude.lua.
-- ARGV[2] lease id    ARGV[3] lease ttl (µs)
-- Reply: {'renewed', expires_at, now} | {'gone'}

local lease_id = ARGV[2]
local ttl = num(ARGV[3], 'ttl argument')

if load() == nil then
  return {'gone'}
end
purge_and_hand_off()

local reply = {'gone'}
local encoded = lease_get(lease_id)
if encoded then
  local lease = decode_lease(encoded)
  if now + ttl > lease.expires_at then
    lease.expires_at = now + ttl
    lease_put(lease_id, encode_lease(lease), lease.expires_at)
    wrote_expiry(lease.expires_at)
  end
  reply = {'renewed', lease.expires_at, now}
end
finish()
return out(reply)
