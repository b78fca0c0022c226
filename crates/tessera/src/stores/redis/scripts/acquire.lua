-- acquire: grant at once, join the queue (when ARGV[8] > 0), or refuse.
-- KEYS: see prelude.lua.
-- ARGV[2] capacity declared by the client    ARGV[3] lease id
-- ARGV[4] weight                             ARGV[5] lease ttl (µs)
-- ARGV[6] holder label                       ARGV[7] client id (wake channel suffix)
-- ARGV[8] waiter ttl (µs), 0 for a try       ARGV[9] queue cap the client accepts
-- ARGV[10] tenant, absent or '' for none      ARGV[11] its share (docs/fair-shares.md)
-- ARGV[12] '1' when the lease id is new: this is the request's first send, over a
--          connection that never sends it again by itself, so nothing can hold the id
-- Reply: {'granted', now, lease record} | {'queued', position, now, purge_at}
--      | {'nopermit', available, queued}
--      | {'mismatch', stored capacity} | {'queuefull'}

local capacity = num(ARGV[2], 'capacity argument')
local lease_id = ARGV[3]
local weight = num(ARGV[4], 'weight argument')
local ttl = num(ARGV[5], 'ttl argument')
local holder = ARGV[6]
local client = ARGV[7]
local waiter_ttl = num(ARGV[8], 'waiter ttl argument')
local queue_cap = num(ARGV[9], 'queue cap argument')
local wait = waiter_ttl > 0
local tenant, share = ARGV[10], 1
if tenant == '' then
  tenant = nil
elseif tenant ~= nil then
  share = num(ARGV[11], 'share argument')
end

if load(true) == nil then
  create(capacity)
end
purge_and_hand_off()

-- The decision, in a block left with `break` at the first outcome (a nested function
-- would cost a closure per call).
local reply
repeat
  -- Every lease and waiter expired: the semaphore is idle, as if it did not exist, and takes
  -- the capacity this client declares, its tags restarting at 0 (as in the reference model).
  if is_empty() then
    if S.nt > 0 then
      reset_tags()
    else
      S.vt, S.vt_text, S.fd = 0, nil, 0
      tags_moved = true
    end
    if S.cap ~= capacity then
      S.cap = capacity
      dirty = true
    end
  end
  if S.cap ~= capacity then
    reply = {'mismatch', S.cap}
    break
  end
  -- A retry of an acquire whose reply was lost: report what it already has. (A semaphore
  -- created by this step holds nothing yet, and nothing holds a new lease id.)
  if not fresh and ARGV[12] ~= '1' then
    local held = lease_get(lease_id)
    if held then
      reply = {'granted', now, held}
      break
    end
    if wait and refresh_waiter(lease_id, now + waiter_ttl) then
      reply = {'queued', rcall('ZRANK', K_QUEUE, lease_id), now_text(), int(S.purge_at)}
      break
    end
  end
  -- Only a request that would be the head may take free permits: without tenants, one that
  -- finds nobody waiting; neither a try nor a newcomer jumps the queue. With tenants in play
  -- (this one's or others' tags), its start tag decides (see would_lead).
  local queued = S.qlen
  local fair = tenant ~= nil or S.nt > 0 or S.lim
  local start, finish
  if fair then
    start, finish = tags(tenant, share, weight)
  end
  local first
  if S.lim then
    -- With limits (see prelude.lua), the head skips tenants at their ceiling, a tenant
    -- below its floor goes ahead of the queue, and the others' floors are kept.
    first = (limited_lead(start) or below_floor(tenant, weight)) and may_grant(tenant, weight)
  else
    first = (queued == 0 or (fair and would_lead(start))) and S.used + weight <= S.cap
  end
  if first then
    if fair then
      take_tags(tenant, start, finish, true)
    else
      plain_tags(weight, true)
    end
    reply = {'granted', now, grant(lease_id, weight, ttl, holder, client, true, tenant)}
    break
  end
  if not wait then
    reply = {'nopermit', math.max(S.cap - S.used, 0), queued}
    break
  end
  if queued >= queue_cap then
    reply = {'queuefull'}
    break
  end
  if fair then
    take_tags(tenant, start, finish, false)
  else
    start = plain_tags(weight, false)
  end
  local seq = S.seq
  S.seq = seq + 1
  local waiter = {weight = weight, ttl = ttl, enqueued_at = now, expires_at = now + waiter_ttl,
    client = client, holder = holder, tenant = tenant}
  if queued == 0 then
    new_queue = true
  end
  rcall('HSET', K_WAITERS, lease_id, encode_waiter(waiter))
  rcall('ZADD', K_QUEUE, int(queue_key(start, seq)), lease_id)
  rcall('ZADD', K_WEXP, int(waiter.expires_at), lease_id)
  S.qlen = queued + 1
  wrote_expiry(waiter.expires_at)
  -- Without tenants in play a newcomer is last; with them, its tag placed it.
  local position = queued
  if fair then
    position = rcall('ZRANK', K_QUEUE, lease_id)
  end
  reply = {'queued', position, now_text(), int(S.purge_at)}
until true
finish()
return out(reply)
