-- tessera admission prelude: after prelude.lua, in front of admit.lua, give_back.lua and
-- settle.lua, which act on a semaphore and the limiter of the same name in one step (see
-- docs/admission.md). The rate helpers of rate_prelude.lua are kept inside a function of
-- their own here (the two preludes share names), and these scripts reach them as
-- rate_charge (charge), rate_undo (undo) and rate_settle (settle, defined here beside
-- them), on the clock that begin() read for the step.
--
-- KEYS: the semaphore's keys as prelude.lua takes them (meta alone; every key on a
-- cluster), then the limiter's state and log, all under the hash tag {<prefix>:<name>}.

local rate_keys, rate_charge, rate_undo, rate_settle, rate_count_expired, rate_tenant_keys =
  (function()
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

return use_keys, charge, undo, settle, count_expired, tenant_keys
end)()

-- The semaphore's keys when only meta is named (reused from call to call).
local SEM_KEYS = {}
-- The shared limiter's keys of this step.
local RATE_STATE, RATE_LOG

-- Starts an admission step: begin() with the semaphore's keys, then the limiter's.
local function begin_admission(keys, argv)
  local n = #keys
  if n > 3 then
    begin(keys, argv)
  else
    SEM_KEYS[1] = keys[1]
    begin(SEM_KEYS, argv)
  end
  RATE_STATE, RATE_LOG = keys[n - 1], keys[n]
  rate_keys(RATE_STATE, RATE_LOG)
end

-- Window ceilings (docs/fair-shares.md, "A ceiling on a share of the windows"), step for
-- step as the reference model (stores/memory: Model::admit with RateModel::tenant_refuses
-- and charge_tenant; MemoryBackend::give_back and settle):
-- - A tenant's window ceiling (a percentage) is kept with its limits in the limits hash
--   ('<ceiling>,<floor>,<percent>', see prelude.lua), so a name with one has limits
--   (S.lim) and a step of a name without any runs exactly as before.
-- - The tenant's own limiter is an ordinary limiter (rate_prelude.lua) under the keys
--   tenant_keys() derives beside the shared one, configured as the shared one scaled
--   (scaled(), RateConfig::scaled) and saved with that configuration's text; a changed
--   percentage or shared configuration moves it as an update does (exact history kept).
-- - On its turn, an admission of such a tenant asks its own limiter first, charging nothing
--   (charge with peek). If it refuses, the tenant is window-capped until the instant it
--   would admit: kept as a fourth field of its limits ('<ceiling>,<floor>,<percent>,<until>'),
--   which load_limits() reads with them at no cost, nothing is charged, window_at is the
--   later of that instant and the shared limiter's own, and the hand-off runs, since the
--   head skips the admission waiters of a window-capped tenant (limited_head). If it admits,
--   the shared limiter decides as before, and an admission charges the tenant's limiter the
--   same cost at the same instant under the shared reservation (its seq and tail), and
--   clears the cap. The cap is only a hint for the order: the tenant's limiter is asked at
--   each of its turns, so a stale cap only delays that tenant.
-- - A give-back or settle reads the lease's tenant from the record its release removes (in
--   the same step) and, if that tenant has a window ceiling, gives back or settles the
--   charge on its limiter too; a lease already lost touches the shared limiter only.

-- Switches the rate helpers to tenant t's own limiter, and back to the shared one.
local function use_tenant_rate(t)
  rate_keys(rate_tenant_keys(RATE_STATE, t))
end
local function use_shared_rate()
  rate_keys(RATE_STATE, RATE_LOG)
end

-- max(1, floor(n × pct / 100)).
local function scale(n, pct)
  local s = math.floor(n * pct / 100)
  if s < 1 then return 1 end
  return s
end

-- The shared limiter's configuration scaled to `pct` percent, as RateConfig::scaled: its
-- canonical text (equal to RateConfig::scaled(pct).encode(): each count scaled, a smooth
-- burst likewise, same mode and margin, equal limits once), its N,L,T per limit (each limit
-- kept, an equal one twice deciding as once; T = ceil(L / N) as engine::emission_intervals),
-- its burst (0: exact) and the largest cost it admits (RateConfig::max_cost).
local function scaled(cfg, lim_arg, burst, pct)
  local flat, out, max = {}, {}, nil
  for v in string.gmatch(lim_arg, '[^,]+') do
    flat[#flat + 1] = num(v, 'limits argument')
  end
  for i = 1, #flat - 2, 3 do
    local n, l = scale(flat[i], pct), flat[i + 1]
    local t = math.floor(l / n)
    if t * n < l then t = t + 1 end
    out[#out + 1], out[#out + 2], out[#out + 3] = int(n), int(l), int(t)
    if max == nil or n < max then max = n end
  end
  local mode, specs = string.match(cfg, '^([^|]*)|(.+)$')
  if not specs or max == nil then corrupt('rate config argument') end
  local b = 0
  if burst > 0 then
    b = scale(burst, pct)
    max = b
    local rest = string.match(mode, '^smooth:%d+(.*)$')
    if not rest then corrupt('rate config argument') end
    mode = 'smooth:' .. int(b) .. rest
  end
  local texts, prev = {}, nil
  for spec in string.gmatch(specs, '[^,]+') do
    local c, per = string.match(spec, '^(%d+)(/.+)$')
    if not c then corrupt('rate config argument') end
    local text = int(scale(num(c, 'rate config argument'), pct)) .. per
    if text ~= prev then
      texts[#texts + 1] = text
      prev = text
    end
  end
  return mode .. '|' .. table.concat(texts, ','), table.concat(out, ','), b, max
end

-- Writes tenant t's limits `l` back (its window-capped instant changed).
local function put_window_cap(t, l)
  local s = (l.c and int(l.c) or '') .. ',' .. int(l.f) .. ',' .. int(l.w)
  if l.u ~= nil then
    s = s .. ',' .. int(l.u)
  end
  rcall('HSET', K_LIMITS, t, s)
end

-- The limits of `tenant` if it has a window ceiling (with limits loaded), else nil.
local function window_limits(tenant)
  local l = S.lim and tenant ~= nil and LIMITS[tenant]
  if l and l.w ~= nil then return l end
  return nil
end

-- The tenant of a lease record removed in this step, if it has a window ceiling.
local function window_tenant(encoded)
  if not S.lim then return nil end
  local t = decode_lease(encoded).tenant
  if window_limits(t) then return t end
  return nil
end
