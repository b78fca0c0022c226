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
-- A tenant's own limiter under a window ceiling (admission.lua) is an ordinary limiter whose
-- keys sit beside these, in the same slot (see tenant_keys).
--
-- Times are µs since the epoch from TIME; running totals and times stay below 2^53, so Lua
-- doubles hold them exactly; they are formatted with %d, never with tostring.

-- The call's keys, set by begin() (or, inside an admission's step, by use_keys()).
local K_STATE, K_LOG

local function use_keys(state, log)
  K_STATE, K_LOG = state, log
end

-- The keys of tenant t's own limiter under a window ceiling (docs/fair-shares.md, "A
-- ceiling on a share of the windows"; admission.lua), beside the shared limiter's state key
-- `state` ('{<prefix>:<name>}:rate'): '<state>:tenant:<t>' and '<state>:tenant-log:<t>'.
-- Neither can be the shared log's ('<state>:log') whatever the tenant's name. They are
-- derived inside the step, never named in KEYS (the tenant of a give-back or settle is read
-- from its lease in the step). On a Redis Cluster they share the slot of the keys named, so
-- only a migration of that slot can find them gone (Redis then fails the step at them):
-- admit.lua reads them before it writes anything, and give_back.lua and settle.lua touch
-- them after the semaphore's step is finished, so such a failure leaves the tenant charged
-- (never admitted more), and every other key as a step leaves it.
local function tenant_keys(state, t)
  return state .. ':tenant:' .. t, state .. ':tenant-log:' .. t
end

-- Starts a call: reads the clock and takes the keys (a function library keeps these locals
-- between calls).
local function begin(keys)
  clock()
  use_keys(keys[1], keys[2])
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
    prev_tat = nums(m[11], 'rate prev_tat'), exp = num(m[12], 'rate expiry')}
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

-- Stores the state and sets both keys to expire after the state stops mattering, never
-- before the expiry it was loaded with (RateState::kept_until: a count of expired admissions
-- keeps it, admission.lua).
local function save(S)
  local exp = S.exp or 0
  if S.burst == 0 then
    exp = math.max(exp, S.last + horizon(S.lim))
  else
    exp = math.max(exp, S.last)
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

-- The decision of rate_acquire.lua (and of an admission's windows, admit.lua): prune ->
-- check the limits -> earliest admissible time -> admit, reserve or answer limited (all
-- limits charged, or none). `max_wait` in µs, -1 for a try (admit only now).
-- Returns {'admitted', at, now, reservation} | {'limited', retry_at, now} |
-- {'mismatch', stored limits}.
-- For a tenant's own limiter under a window ceiling (admission.lua): with `peek`, nothing is
-- charged even if admitted (the answer says whether it would be; limits replaced by update
-- and pruned entries are saved, as a limited request saves them; reservation 0); with
-- `id`, an admission takes that id (the shared charge's) as its seq and tail.
local function charge(cfg, lim_arg, burst, cost, max_wait, update, peek, id)
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
  if not admit or peek then
    -- Nothing charged. Entries that no longer change any answer may have been pruned: then
    -- base must follow them (the state exists, or nothing could have been pruned); limits
    -- replaced by update stay replaced, as in the reference model.
    if pruned or replaced then save(S) end
    if admit then return {'admitted', t, now, 0} end
    return {'limited', t, now}
  end

  S.prev_last = S.last
  S.last = t
  S.seq = id or S.seq + 1
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
end

-- Returns the latest admission if it is the one named (`id`, admitted at `at`; ids restart
-- with a fresh state, but a stale id's time has passed by then, so the pair never names a
-- new reservation) and not yet due, or, with `due_too`, due or not (an admission given back
-- unused: a state expires only a horizon after its latest admission, and a give-back comes a
-- margin after its own, so a restarted id cannot match either). 1 if returned, 0 if not
-- (nothing changed).
local function undo(id, at, due_too)
  local S = load()
  if S == nil or id == 0 or S.tail ~= id or S.last ~= at or (at <= now and not due_too) then
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
end
