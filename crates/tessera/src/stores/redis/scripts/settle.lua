-- settle: an admission's cost settled (docs/admission.md, invariant 6): releases the lease
-- as release.lua does (the hand-off to the queue included), then settles the charge on the
-- limiter of the same name (rate_settle in admission.lua: an excess charged whether or not
-- the lease was held, a smaller cost given back only if this step released it), in one step;
-- and, under a window ceiling, the lease's tenant's own limiter alike (see admission.lua).
-- The reference is MemoryBackend::settle.
-- KEYS: as admit.lua (see admission.lua).
-- ARGV[2] lease id   ARGV[3] reservation   ARGV[4] its admit time (µs)
-- ARGV[5] the cost charged   ARGV[6] the actual cost
-- Reply: 1 if the lease was held, 0 otherwise

local lease_id = ARGV[2]
local id = num(ARGV[3], 'reservation')
local at = num(ARGV[4], 'reservation time')
local charged = num(ARGV[5], 'charged cost')
local actual = num(ARGV[6], 'actual cost')

if load() == nil then
  rate_settle(id, at, charged, actual, false)
  return 0
end
purge_and_hand_off()

local encoded = remove_holder(lease_id, true)
local held = encoded ~= nil
-- The lease's tenant, read from the record this step released: under a window ceiling its
-- own limiter is settled too (see admission.lua).
local own = held and window_tenant(encoded)
hand_off()
finish()
rate_settle(id, at, charged, actual, held)
if own then
  use_tenant_rate(own)
  rate_settle(id, at, charged, actual, held)
  use_shared_rate()
end
if held then
  return out(1)
end
return out(0)
