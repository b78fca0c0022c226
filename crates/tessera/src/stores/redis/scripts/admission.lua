-- tessera admission prelude: after prelude.lua, in front of admit.lua, give_back.lua and
-- settle.lua, which act on a semaphore and the limiter of the same name in one step (see
-- docs/admission.md). The rate helpers of rate_prelude.lua are kept inside a function of
-- their own here (the two preludes share names), and these scripts reach them as
-- rate_charge (charge), rate_undo (undo) and rate_settle (settle, defined here beside
-- them), on the clock that begin() read for the step.
--
-- KEYS: the semaphore's keys as prelude.lua takes them (meta alone; every key on a
-- cluster), then the limiter's state and log, all under the hash tag {<prefix>:<name>}.

local rate_keys, rate_charge, rate_undo, rate_settle, rate_count_expired = (function()
@RATE_PRELUDE@

-- The entries of a log block and after it, for settle(): walking back from the log's end
-- (the latest first), the entries after `at` and then the block at the latest time t* <= at.
-- Returns t* (nil: no entry at or before `at`), the block's last running total, the running
-- total before the block (base when the log starts with it), and every entry after the
-- block as {t, P} (ascending).
local function settle_block(S, at)
  local after, n, batch = {}, 0, 16
  local t_star, last
  while true do
    local page = rcall('ZRANGE', K_LOG, -(n + batch), -(n + 1))
    for i = #page, 1, -1 do
      local t, p = entry(page[i])
      if t_star == nil then
        if t <= at then
          t_star, last = t, p
        else
          after[#after + 1] = {t, p}
        end
      elseif t < t_star then
        return t_star, last, p, after
      end
    end
    n = n + #page
    if #page < batch then
      return t_star, last, S.base, after
    end
    batch = 64
  end
end

-- settle: an admission's cost settled (engine::settle line by line; docs/admission.md,
-- invariant 6): `charged` was charged at `at` under the reservation `id`, the call cost
-- `actual`, and `held` says whether this step released the lease. Nothing when the limiter
-- has no state (or it expired: no window that can still decide holds `at`); a state is
-- never created. Times are TIME's µs, the lease's own, so the block's slack is 0.
local function settle(id, at, charged, actual, held)
  local S = load()
  if S == nil then return end
  S.lim_text = lim_text(S.lim)
  if actual > charged then
    -- The excess, charged at once as a forced admission at max(now, last).
    local e = actual - charged
    local t = math.max(now, S.last)
    S.last = t
    S.tail = 0
    if S.burst == 0 then
      S.p = S.p + e
      rcall('ZADD', K_LOG, int(S.p), int(t) .. ':' .. int(S.p))
    else
      for i, l in ipairs(S.lim) do
        S.tat[i] = math.max(S.tat[i], t) + e * l.t
      end
    end
    save(S)
    return
  end
  if actual == charged or not held then return end
  if S.burst == 0 then
    -- The block at the latest admit time t* <= at, lowered by d unless it is at or before
    -- the pruning cutoff (in no window that can still decide).
    local t_star, last, before, after = settle_block(S, at)
    if t_star == nil or last <= before or t_star <= now - horizon(S.lim) then return end
    local d = math.min(charged - actual, last - before)
    -- The entries after t* are those with P > last; with the block, those above before.
    rcall('ZREMRANGEBYSCORE', K_LOG, '(' .. int(before), '+inf')
    local args, k = {}, 0
    local function add(t, p)
      args[k + 1], args[k + 2] = int(p), int(t) .. ':' .. int(p)
      k = k + 2
      if k >= 256 then
        rcall('ZADD', K_LOG, unpack(args, 1, k))
        k = 0
      end
    end
    if last - d > before then add(t_star, last - d) end
    for i = #after, 1, -1 do
      add(after[i][1], after[i][2] - d)
    end
    if k > 0 then rcall('ZADD', K_LOG, unpack(args, 1, k)) end
    S.p = S.p - math.min(d, S.p)
    S.tail = 0
  else
    -- Smooth: only while the admission is the latest; a later one's tat cannot be unwound.
    if id == 0 or S.tail ~= id or S.last ~= at then return end
    for i, l in ipairs(S.lim) do
      S.tat[i] = math.max(S.prev_tat[i], at) + actual * l.t
    end
    S.tail = 0
  end
  save(S)
end

-- count_expired: one more admission given back past its use-by instant, in the state that
-- undo() left: an expired state was dropped there (no key, nothing counted); a give-back of
-- the only admission leaves one that would expire at once, which is kept here, with its log,
-- at least one horizon from now so that the count outlives it. save() writes the other
-- fields only, so the count lives as long as the state.
local function count_expired()
  local m = rcall('HMGET', K_STATE, 'lim', 'exp', 'burst', 'p', 'base')
  if not m[1] then return end
  rcall('HINCRBY', K_STATE, 'expired', 1)
  local exp = math.max(num(m[2], 'rate expiry'), now + horizon(limits(m[1])))
  rcall('HSET', K_STATE, 'exp', int(exp))
  local ttl_ms = math.floor(math.max(exp - now, 0) / 1000) + GRACE_MS
  rcall('PEXPIRE', K_STATE, ttl_ms)
  if num(m[3], 'rate burst') == 0 and num(m[4], 'rate total') > num(m[5], 'rate base') then
    rcall('PEXPIRE', K_LOG, ttl_ms)
  end
end

return use_keys, charge, undo, settle, count_expired
end)()

-- The semaphore's keys when only meta is named (reused from call to call).
local SEM_KEYS = {}

-- Starts an admission step: begin() with the semaphore's keys, then the limiter's.
local function begin_admission(keys, argv)
  local n = #keys
  if n > 3 then
    begin(keys, argv)
  else
    SEM_KEYS[1] = keys[1]
    begin(SEM_KEYS, argv)
  end
  rate_keys(keys[n - 1], keys[n])
end
