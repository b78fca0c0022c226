-- tessera rate prelude: shared by the rate_*.lua scripts (in front of each one, after
-- common.lua). Every operation starts with begin(). The decision follows
-- crates/tessera/src/rate/engine.rs line by line.
--
-- KEYS (one order for every rate script; both share the hash tag {<prefix>:<name>}):
--   KEYS[1] state  hash: cfg (canonical limits), lim (N,L,T per limit, flat, µs), burst (0 in
--                  exact mode), seq, tail, last, prev_last, p, base, tat, prev_tat (comma
--                  lists), exp (when the state stops mattering, µs)
--   KEYS[2] log    zset: one member '<t>:<P>' per admission, scored by the running total P
-- Every script's own ARGV start at ARGV[1].
--
-- Times are µs since the epoch from TIME; running totals and times stay below 2^53, so Lua
-- doubles hold them exactly; they are formatted with %d, never with tostring.

-- The call's keys, set by begin().
local K_STATE, K_LOG

-- Starts a call: reads the clock and takes the keys (a function library keeps these locals
-- between calls).
local function begin(keys)
  clock()
  K_STATE, K_LOG = keys[1], keys[2]
end
-- How long the keys outlive the moment their state stops mattering.
local GRACE_MS = 1000

local function nums(s, what)
  local out = {}
  if s == nil then corrupt(what) end
  for v in string.gmatch(s, '[^,]+') do
    out[#out + 1] = num(v, what)
  end
  return out
end

local function join(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = int(v) end
  return table.concat(out, ',')
end

-- {n, l, t} per limit from the flat list N,L,T,N,L,T...
local function limits(s)
  local flat, out = nums(s, 'rate limits'), {}
  if #flat == 0 or #flat % 3 ~= 0 then corrupt('rate limits') end
  for i = 1, #flat, 3 do
    out[#out + 1] = {n = flat[i], l = flat[i + 1], t = flat[i + 2]}
  end
  return out
end

local function horizon(lim)
  local h = 0
  for _, l in ipairs(lim) do h = math.max(h, l.l) end
  return h
end

local function entry(e)
  local t, p = string.match(e, '^(%d+):(%d+)$')
  if t == nil then corrupt('rate log entry') end
  return tonumber(t), tonumber(p)
end

-- The state, or nil if there is none (or it has expired: then its keys are dropped).
local function load()
  local m = rcall('HMGET', K_STATE, 'cfg', 'lim', 'burst', 'seq', 'tail', 'last',
    'prev_last', 'p', 'base', 'tat', 'prev_tat', 'exp')
  if not m[1] then
    rcall('DEL', K_LOG)
    return nil
  end
  if num(m[12], 'rate expiry') <= now then
    rcall('DEL', K_STATE, K_LOG)
    return nil
  end
  local S = {cfg = m[1], lim = limits(m[2]), burst = num(m[3], 'rate burst'),
    seq = num(m[4], 'rate seq'), tail = num(m[5], 'rate tail'), last = num(m[6], 'rate last'),
    prev_last = num(m[7], 'rate prev_last'), p = num(m[8], 'rate total'),
    base = num(m[9], 'rate base'), tat = nums(m[10], 'rate tat'),
    prev_tat = nums(m[11], 'rate prev_tat')}
  if #S.tat ~= #S.lim or #S.prev_tat ~= #S.lim then corrupt('rate pacing values') end
  return S
end

-- Drops log entries at or before now - (longest period); base follows the last dropped.
-- Looks at the head alone first (most steps drop nothing), then in batches. Returns whether
-- anything was dropped.
local function prune(S)
  if S.burst ~= 0 then return false end
  local cutoff = now - horizon(S.lim)
  local pruned, batch = false, 1
  while true do
    local head = rcall('ZRANGE', K_LOG, 0, batch - 1)
    local removed = 0
    for _, e in ipairs(head) do
      local t, p = entry(e)
      if t > cutoff then break end
      S.base = p
      removed = removed + 1
    end
    if removed > 0 then
      rcall('ZREMRANGEBYRANK', K_LOG, 0, removed - 1)
      pruned = true
    end
    if removed < batch then return pruned end
    batch = 64
  end
end

-- Stores the state and sets both keys to expire after the state stops mattering.
local function save(S)
  local exp
  if S.burst == 0 then
    exp = S.last + horizon(S.lim)
  else
    exp = S.last
    for _, tat in ipairs(S.tat) do exp = math.max(exp, tat) end
  end
  rcall('HSET', K_STATE, 'cfg', S.cfg, 'lim', S.lim_text, 'burst', int(S.burst),
    'seq', int(S.seq), 'tail', int(S.tail), 'last', int(S.last),
    'prev_last', int(S.prev_last), 'p', int(S.p), 'base', int(S.base),
    'tat', join(S.tat), 'prev_tat', join(S.prev_tat), 'exp', int(exp))
  local ttl_ms = math.floor(math.max(exp - now, 0) / 1000) + GRACE_MS
  rcall('PEXPIRE', K_STATE, ttl_ms)
  -- The log holds entries exactly when the running total is above base.
  if S.burst == 0 and S.p > S.base then
    rcall('PEXPIRE', K_LOG, ttl_ms)
  end
end

local function lim_text(lim)
  local flat = {}
  for _, l in ipairs(lim) do
    flat[#flat + 1] = l.n
    flat[#flat + 1] = l.l
    flat[#flat + 1] = l.t
  end
  return join(flat)
end
