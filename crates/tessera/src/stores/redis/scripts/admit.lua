-- admit: permits and rate windows in one step (docs/admission.md): grant and charge every
-- window, join the queue as an admission waiter, or refuse; all or nothing. The reference
-- model is Model::admit (stores/memory/ops.rs); the SQL stores' is decide_admit
-- (stores/sql/step.rs).
-- KEYS: see admission.lua: the semaphore's (meta alone, or every key on a cluster), then the
--       limiter's state and log (see rate_prelude.lua); all under one hash tag.
-- ARGV[2..9] as acquire.lua (capacity, lease id, weight, lease ttl, holder, client id,
--       waiter ttl or 0 for a try, queue cap)
-- ARGV[10] canonical limits   ARGV[11] N,L,T per limit (flat)   ARGV[12] burst (0: exact)
-- ARGV[13] cost               ARGV[14] update (1)               ARGV[15] at head (1)
-- ARGV[16] tenant, absent or '' for none   ARGV[17] its share (docs/fair-shares.md); the
--       window cost is the cost its tags count
-- Reply: {'granted', now, lease record, reservation}
--      | {'queued', position, now, purge_at, window_at}
--      | {'nopermit', available, queued, now, window_at}
--      | {'mismatch', stored capacity} | {'ratemismatch', stored limits} | {'queuefull'}
-- window_at (µs): when the windows admit the cost, if the permits fit and only the windows
-- refused; 0 otherwise.

local capacity = num(ARGV[2], 'capacity argument')
local lease_id = ARGV[3]
local weight = num(ARGV[4], 'weight argument')
local ttl = num(ARGV[5], 'ttl argument')
local holder = ARGV[6]
local client = ARGV[7]
local waiter_ttl = num(ARGV[8], 'waiter ttl argument')
local queue_cap = num(ARGV[9], 'queue cap argument')
local cost = num(ARGV[13], 'cost argument')
local at_head = ARGV[15] == '1'
local wait = waiter_ttl > 0
local tenant, share = ARGV[16], 1
if tenant == '' then
  tenant = nil
elseif tenant ~= nil then
  share = num(ARGV[17], 'share argument')
end

if load(true) == nil then
  create(capacity)
end
-- A tenant with a window ceiling (see admission.lua): its own limiter is asked now, before
-- the step writes anything, charging nothing; the answer serves its turn below (nothing
-- else touches that limiter in between). own_at: the instant it admits `cost` (now: at
-- once).
local own = window_limits(tenant)
local own_cfg, own_lim, own_burst, own_max, own_at
if own then
  own_cfg, own_lim, own_burst, own_max = scaled(ARGV[10], ARGV[11],
    num(ARGV[12], 'burst argument'), own.w)
  if cost <= own_max then
    use_tenant_rate(tenant)
    own_at = rate_charge(own_cfg, own_lim, own_burst, cost, -1, true, true)[2]
    use_shared_rate()
  end
end
purge_and_hand_off()

local reply
repeat
  -- An idle semaphore takes the capacity this client declares, its tags restarting at 0
  -- (as acquire.lua).
  if is_empty() then
    reset_tags()
    if S.cap ~= capacity then
      S.cap = capacity
      dirty = true
    end
  end
  if S.cap ~= capacity then
    reply = {'mismatch', S.cap}
    break
  end
  -- A retry whose reply was lost: the grant stands (its charge id is not kept, so a
  -- give-back of it releases the permits and leaves the windows charged).
  local w
  if not fresh then
    local held = lease_get(lease_id)
    if held then
      reply = {'granted', now, held, 0}
      break
    end
    if wait and S.qlen > 0 then
      local encoded = rcall('HGET', K_WAITERS, lease_id)
      if encoded then
        w = decode_waiter(encoded)
      end
    end
  end
  local fits = S.used + weight <= S.cap
  if S.lim then
    -- With limits (see prelude.lua): they decide, with a tenant below its floor first.
    fits = may_grant(tenant, weight)
  end
  -- A queued waiter's place; where its permits fit, the head is read first (its score is
  -- the start tag a grant moves V to), and its rank only if it is not the head.
  local position, score = 0, nil
  if w and S.lim then
    -- Its turn: it is the head (the first waiter not at its ceiling) or below its floor.
    local head = fits and limited_head()
    if head == lease_id or (fits and below_floor(tenant, weight)) then
      score = rcall('ZSCORE', K_QUEUE, lease_id)
    end
    position = rcall('ZRANK', K_QUEUE, lease_id)
  elseif w then
    if fits then
      local head = rcall('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
      if head[1] == lease_id then
        score = head[2]
      end
    end
    if score == nil then
      position = rcall('ZRANK', K_QUEUE, lease_id)
    end
  end
  -- A newcomer's tags (with tenants in play at once, as its place depends on them).
  local fair = tenant ~= nil or S.nt > 0 or S.lim
  local start, finish, lead
  if not w and fair then
    start, finish = tags(tenant, share, cost)
  end
  -- A waiter's turn is at the head; a newcomer's when it would lead the queue (without
  -- tenants: nobody waits), or first of all for one that gave back an admission it could
  -- not use in time.
  local turn
  if w and S.lim then
    turn = score ~= nil
  elseif w then
    turn = fits and position == 0
  elseif S.lim then
    lead = limited_lead(start)
    turn = fits and (lead or at_head or below_floor(tenant, weight))
  else
    lead = S.qlen == 0 or (fair and would_lead(start))
    turn = fits and (lead or at_head)
  end
  local window_at = 0
  if turn and own and cost > own_max then
    -- Above the tenant's share of the smallest window (or its scaled burst).
    reply = {'cost', own_max}
    break
  end
  local r
  if turn and own and own_at > now then
    -- Its own limiter refuses: window-capped until it would admit, nothing charged.
    own.u = own_at
    put_window_cap(tenant, own)
    r = rate_charge(ARGV[10], ARGV[11], num(ARGV[12], 'burst argument'), cost, -1,
      ARGV[14] == '1', true)
    if r[1] == 'mismatch' then
      reply = {'ratemismatch', r[2]}
      break
    end
    window_at = own_at
    if r[1] == 'limited' and r[2] > window_at then
      window_at = r[2]
    end
    -- The waiters behind a tenant now window-capped may be handed what fits.
    hand_off()
  elseif turn then
    r = rate_charge(ARGV[10], ARGV[11], num(ARGV[12], 'burst argument'), cost, -1,
      ARGV[14] == '1')
    if r[1] == 'admitted' then
      if own then
        -- The tenant's own limiter: the same cost at the same instant, under the shared
        -- charge's id.
        if own.u ~= nil then
          own.u = nil
          put_window_cap(tenant, own)
        end
        use_tenant_rate(tenant)
        rate_charge(own_cfg, own_lim, own_burst, cost, -1, true, false, r[4])
        use_shared_rate()
      end
      if w then
        local s = start_of(score)
        if s > vtime() then
          set_vtime(s)
        end
        unqueue(lease_id)
      else
        -- At the head by a give-back, V stays where the head is.
        if start == nil then
          start, finish = tags(nil, 1, cost)
        end
        take_tags(tenant, start, finish, lead)
      end
      reply = {'granted', now, grant(lease_id, weight, ttl, holder, client, true, tenant), r[4]}
      -- The waiters behind a head that was an admission get what still fits.
      hand_off()
      break
    elseif r[1] == 'mismatch' then
      reply = {'ratemismatch', r[2]}
      break
    end
    window_at = r[2]
  end
  if w then
    -- Queued: the entry lives on, and the gate says when a hand-off may wake it.
    local until_us = now + waiter_ttl
    if until_us > w.expires_at then
      w.expires_at = until_us
      rcall('ZADD', K_WEXP, int(until_us), lease_id)
      wrote_expiry(until_us)
    end
    w.gate = window_at
    rcall('HSET', K_WAITERS, lease_id, encode_waiter(w))
    reply = {'queued', position, now_text(), int(S.purge_at), int(window_at)}
    break
  end
  if not wait then
    reply = {'nopermit', math.max(S.cap - S.used, 0), S.qlen, now_text(), int(window_at)}
    break
  end
  if S.qlen >= queue_cap then
    reply = {'queuefull'}
    break
  end
  if start == nil then
    start, finish = tags(nil, 1, cost)
  end
  take_tags(tenant, start, finish, false)
  local seq
  local first = at_head and S.qlen > 0
  if first then
    local head = rcall('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
    seq = num(head[2] or corrupt('queue length without a queue'), 'queue seq') - 1
  else
    seq = queue_key(start, S.seq)
    S.seq = S.seq + 1
  end
  w = {weight = weight, ttl = ttl, enqueued_at = now, expires_at = now + waiter_ttl,
    client = client, holder = holder, gate = window_at, tenant = tenant}
  if S.qlen == 0 then
    new_queue = true
  end
  rcall('HSET', K_WAITERS, lease_id, encode_waiter(w))
  rcall('ZADD', K_QUEUE, int(seq), lease_id)
  rcall('ZADD', K_WEXP, int(w.expires_at), lease_id)
  if first then
    position = 0
  elseif fair then
    position = rcall('ZRANK', K_QUEUE, lease_id)
  else
    position = S.qlen
  end
  S.qlen = S.qlen + 1
  wrote_expiry(w.expires_at)
  reply = {'queued', position, now_text(), int(S.purge_at), int(window_at)}
until true
finish()
return out(reply)
