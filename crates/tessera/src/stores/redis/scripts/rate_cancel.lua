-- rate_cancel: returns the latest admission if it is the one named and not yet due.
-- KEYS: see rate_prelude.lua.
-- ARGV: [1] reservation id, [2] its admit time (µs): ids restart with a fresh state, but a
--       stale id's time has passed by then, so the pair never names a new reservation
-- Reply: 1 if returned, 0 if not (nothing changed)

local id, at = num(ARGV[1], 'reservation'), num(ARGV[2], 'reservation time')
local S = load()
if S == nil or id == 0 or S.tail ~= id or S.last ~= at or at <= now then
  return 0
end
S.lim_text = lim_text(S.lim)
S.last = S.prev_last
S.tail = 0
if S.burst == 0 then
  rcall('ZREMRANGEBYSCORE', K_LOG, int(S.p), int(S.p))
  local tail = rcall('ZRANGE', K_LOG, -1, -1)[1]
  if tail == nil then
    S.p = S.base
  else
    local _, p = entry(tail)
    S.p = p
  end
else
  S.tat = S.prev_tat
end
save(S)
return 1
