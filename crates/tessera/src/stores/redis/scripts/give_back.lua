-- give_back: an admission given back unused (docs/admission.md): releases the lease and
-- returns its windows' charge while it is the limiter's latest, in one step; the charge on
-- the lease's tenant's own limiter too, under a window ceiling (see admission.lua). The
-- reference is MemoryBackend::give_back.
-- KEYS: as admit.lua (see admission.lua).
-- ARGV[2] lease id   ARGV[3] reservation   ARGV[4] its admit time (µs)
-- ARGV[5] '1' if it was past its use-by instant: counted in the limiter's state (field
--         `expired`) if this step released the lease, whether or not its charge came back
-- Reply: 1 if the lease was held, 0 otherwise

local lease_id = ARGV[2]
local id = num(ARGV[3], 'reservation')
local at = num(ARGV[4], 'reservation time')
rate_undo(id, at, true)

if load() == nil then
  return 0
end
purge_and_hand_off()

local encoded = remove_holder(lease_id, true)
local held = encoded ~= nil
if held and ARGV[5] == '1' then
  rate_count_expired()
end
-- The lease's tenant, read from the record this step released: under a window ceiling its
-- own limiter gets the charge back too (see admission.lua), after the semaphore's step is
-- finished.
local own = held and window_tenant(encoded)
hand_off()
finish()
if own then
  use_tenant_rate(own)
  rate_undo(id, at, true)
  use_shared_rate()
end
if held then
  return out(1)
end
return out(0)
