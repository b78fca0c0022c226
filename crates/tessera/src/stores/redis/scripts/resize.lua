-- resize: changes the capacity; growing hands the new permits to the queue at once,
-- shrinking never revokes.
-- KEYS: see prelude.lua.
-- ARGV[2] new capacity
-- Reply: {'resized', old capacity} | {'notfound'}

local capacity = num(ARGV[2], 'capacity argument')

if load() == nil then
  return {'notfound'}
end
purge_and_hand_off()

local reply = {'notfound'}
if not is_empty() then
  reply = {'resized', S.cap}
  S.cap = capacity
  dirty = true
  hand_off()
end
finish()
return out(reply)
