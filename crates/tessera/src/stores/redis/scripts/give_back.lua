-- give_back: an admission given back unused (docs/admission.md): releases the lease and
-- returns its windows' charge while it is the limiter's latest, in one step.
-- KEYS: as admit.lua (see admission.lua).
-- ARGV[2] lease id   ARGV[3] reservation   ARGV[4] its admit time (µs)
-- ARGV[5] '1' if it was past its use-by instant: counted in the limiter's state (field
--         `expired`) if this step released the lease, whether or not its charge came back
-- Reply: 1 if the lease was held, 0 otherwise

local lease_id = ARGV[2]
rate_undo(num(ARGV[3], 'reservation'), num(ARGV[4], 'reservation time'), true)

if load() == nil then
  return 0
end
purge_and_hand_off()

local held = remove_holder(lease_id, true) ~= nil
if held and ARGV[5] == '1' then
  rate_count_expired()
end
hand_off()
finish()
if held then
  return out(1)
end
return out(0)
