-- rate_acquire: prune -> check the limits -> earliest admissible time -> admit, reserve or
-- answer limited (all limits charged, or none).
-- KEYS: see rate_prelude.lua.
-- ARGV: [1] canonical limits, [2] N,L,T per limit (flat), [3] burst (0: exact mode),
--       [4] cost k, [5] max wait in µs (-1: try, admit only now), [6] update (1: replace
--       differing stored limits)
-- Reply: {'admitted', at, now, reservation} | {'limited', retry_at, now} |
--        {'mismatch', stored limits}

local cfg, lim_arg, burst = ARGV[1], ARGV[2], num(ARGV[3], 'burst')
local cost, max_wait, update = num(ARGV[4], 'cost'), num(ARGV[5], 'max wait'), ARGV[6] == '1'
local lim = limits(lim_arg)

local S = load()
local replaced = false
if S == nil then
  S = {cfg = cfg, seq = 0, tail = 0, last = 0, prev_last = 0, p = 0, base = 0, tat = {},
    prev_tat = {}}
  for i = 1, #lim do S.tat[i] = 0; S.prev_tat[i] = 0 end
elseif S.cfg ~= cfg then
  if not update then
    return {'mismatch', S.cfg}
  end
  -- Exact history is kept (it is the true admission history); smooth pacing restarts.
  local start = math.max(now, S.last)
  S.cfg, S.tat, S.prev_tat, S.tail = cfg, {}, {}, 0
  replaced = true
  for i = 1, #lim do S.tat[i] = start; S.prev_tat[i] = start end
end
S.lim, S.lim_text, S.burst = lim, lim_arg, burst
local pruned = prune(S)

local t = math.max(now, S.last)
if burst == 0 then
  for _, l in ipairs(lim) do
    -- The first entry with P >= p - N + k binds: admissible from its time + L.
    local x = S.p + cost - l.n
    if x > S.base then
      local e = rcall('ZRANGEBYSCORE', K_LOG, int(x), '+inf', 'LIMIT', 0, 1)[1]
      if e == nil then corrupt('rate log has no entry at or above ' .. int(x)) end
      local at = entry(e)
      t = math.max(t, at + l.l)
    end
  end
else
  local slack = math.max(burst - cost, 0)
  for i, l in ipairs(lim) do
    t = math.max(t, S.tat[i] - slack * l.t)
  end
end

local wait = t - now
local admit
if max_wait < 0 then admit = wait == 0 else admit = wait <= max_wait end
if not admit then
  -- Nothing charged. Entries that no longer change any answer may have been pruned: then
  -- base must follow them (the state exists, or nothing could have been pruned); limits
  -- replaced by update stay replaced, as in the reference model.
  if pruned or replaced then save(S) end
  return {'limited', t, now}
end

S.prev_last = S.last
S.last = t
S.seq = S.seq + 1
S.tail = S.seq
if burst == 0 then
  S.p = S.p + cost
  rcall('ZADD', K_LOG, int(S.p), int(t) .. ':' .. int(S.p))
else
  for i, l in ipairs(lim) do
    S.prev_tat[i] = S.tat[i]
    S.tat[i] = math.max(S.tat[i], t) + cost * l.t
  end
end
save(S)
return {'admitted', t, now, S.seq}
