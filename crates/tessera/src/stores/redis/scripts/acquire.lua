-- acquire: grant at once, join the queue (when ARGV[8] > 0), or refuse.
-- KEYS: see prelude.lua.
-- ARGV[2] capacity declared by the client    ARGV[3] lease id
-- ARGV[4] weight                             ARGV[5] lease ttl (µs)
-- ARGV[6] holder label                       ARGV[7] client id (wake channel suffix)
-- ARGV[8] waiter ttl (µs), 0 for a try       ARGV[9] queue cap the client accepts
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

if load() == nil then
  create(capacity)
end
purge_and_hand_off()

-- The decision, in a block left with `break` at the first outcome (a nested function
-- would cost a closure per call).
local reply
repeat
  -- Every lease and waiter expired: the semaphore is idle, as if it did not exist, and takes
  -- the capacity this client declares (as in the reference model).
  if is_empty() and S.cap ~= capacity then
    S.cap = capacity
    dirty = true
  end
  if S.cap ~= capacity then
    reply = {'mismatch', S.cap}
    break
  end
  -- A retry of an acquire whose reply was lost: report what it already has. (A semaphore
  -- created by this step holds nothing yet.)
  if not fresh then
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
  -- Only a request that finds nobody waiting may take free permits: neither a try nor a
  -- newcomer jumps the queue.
  local queued = S.qlen
  if queued == 0 and S.used + weight <= S.cap then
    reply = {'granted', now, grant(lease_id, weight, ttl, holder, client, true)}
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
  local seq = S.seq
  S.seq = seq + 1
  local waiter = {weight = weight, ttl = ttl, enqueued_at = now, expires_at = now + waiter_ttl,
    client = client, holder = holder}
  if queued == 0 then
    new_queue = true
  end
  rcall('HSET', K_WAITERS, lease_id, encode_waiter(waiter))
  rcall('ZADD', K_QUEUE, int(seq), lease_id)
  rcall('ZADD', K_WEXP, int(waiter.expires_at), lease_id)
  S.qlen = queued + 1
  wrote_expiry(waiter.expires_at)
  reply = {'queued', queued, now_text(), int(S.purge_at)}
until true
finish()
return out(reply)
