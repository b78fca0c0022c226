-- tessera prelude: shared by every semaphore script (in front of each one, after common.lua,
-- which defines now, clock, int, corrupt and num). Every operation starts with begin().
--
-- KEYS: KEYS[1] = "{<prefix>:<name>}:meta", alone, and the step derives the other keys from
-- it (see begin()); on a Redis Cluster every key below, in this order, so that Redis refuses
-- the call whole (TRYAGAIN, ASK) while the slot migrates with some keys moved, instead of a
-- step failing half-way at a key already gone. All share the hash tag, hence one slot.
-- (Each key an FCALL names costs Redis about 1,000 instructions per call, callgrind; derived
-- keys cost nothing while a library keeps them.)
--   meta     hash:  cap, used, fence (last fence issued), seq (next queue seq), seat_high,
--                   qlen (queue length), purge_at (µs, a lower bound of every holder and
--                   waiter expiry), deadline (ms since the epoch: every key expires then),
--                   lid, lrec, lexp (the inline lease: its id, encoded record and expiry
--                   in µs; lid is '' when there is none); vt, fd, nt (fair shares, see
--                   below: the virtual time, the finish tag of requests without a tenant,
--                   and how many named tenants' tags the tags hash holds; absent is 0)
--   holders  zset:  lease id, scored by lease expiry (µs), for every lease but the inline one
--   leases   hash:  lease id -> encoded lease (see encode_lease), the same leases
--   queue    zset:  lease id, scored by its key (start tag, arrival seq), see queue_key
--   waiters  hash:  lease id -> encoded waiter (see encode_waiter)
--   wexp     zset:  lease id, scored by waiter heartbeat expiry (µs)
--   seats    zset:  free seats below seat_high, scored by seat number
--   fence    string: last fence issued, kept for a while after the state is deleted
--   tags     hash:  named tenant -> its latest finish tag (only while tenants are in play)
--   limits   hash:  named tenant -> '<ceiling>,<floor>' (ceiling empty for none): tenants'
--                   ceilings and floors, an administrator's setting kept for the name (no
--                   expiry, not dropped with an idle state; delete removes it). See the
--                   section on limits below for how a step knows a name has some. A tenant
--                   with a window ceiling: '<ceiling>,<floor>,<percent>[,<until>]' (see
--                   parse_limits and admission.lua).
-- ARGV (shared):
--   ARGV[1] wake channel base: "<prefix>:wake:"; a wake-up is PUBLISH <base><client> <lease id>
--           (with the grant for clients that take it, see GRANT_PUSH). On a Redis Cluster the
--           base is "{<prefix>:<name>}:wake:", in this semaphore's slot, and the wake-up is an
--           SPUBLISH (sharded pub/sub: it reaches the clients of this shard only, where a
--           plain PUBLISH would be broadcast over the cluster bus)
-- Every script's own ARGV start at ARGV[2].
--
-- One step is: load -> purge -> hand off -> decide -> hand off -> finish (store and expire
-- the state, or leave it idle; publish wake-ups).
--
-- The inline lease and the idle state spare an uncontended acquire and release every key but
-- meta:
-- - An acquire granted at once, while no other lease is inline, keeps its lease in meta's
--   lid, lrec and lexp, written with the counters in one HSET. Every other lease (a second
--   holder, a hand-off) goes to holders and leases. Every step that reads a lease looks at the
--   inline one first, and at the sets only when they hold some (used above the inline weight).
--   Hand-offs never go inline, so a waiter of a client from before the inline lease (which
--   reads only the sets) is never granted one it cannot see; such a client sees the inline
--   lease's permits as used, never free, and a step of this version purges it at its expiry
--   (lexp is checked besides purge_at, which an older step computes from the sets alone).
-- - A state left with nobody holding or waiting stays as meta alone, idle (used and qlen 0,
--   seat_high 0, no inline lease), for at least FENCE_KEEP_MS: it keeps the fence, as the
--   fence key did for a deleted state, and the next acquire finds it instead of creating the
--   state again. Every reader takes an idle state for no state at all (status, list, delete,
--   and the capacity rule of an idle semaphore). The other keys are gone by then (Redis
--   deletes an emptied hash or set; finish() deletes what the step left in them).
--
-- Most steps touch little, and each redis.call costs about a microsecond, so the counters in
-- meta spare the calls that would only confirm nothing is to be done:
-- - `used` (sum of holder weights) says whether holders exist, `qlen` whether waiters do;
-- - `seat_high - used` is the number of free seats in the seats set (held and free seats
--   partition 0..seat_high-1), so an empty set is never queried;
-- - `purge_at` <= every expiry in the state: while now < purge_at nothing can be purged;
-- - `deadline`: every key lives until then (set with PEXPIRE). A step extends it (by a slack, so a
--   stream of grants rarely does) only when it writes an expiry that the deadline minus the
--   grace period does not cover, and otherwise sets it only on the keys it created (Redis
--   deletes an emptied hash or set, so a key that reappears has no TTL).
-- Time comes only from TIME. Numbers stay below 2^53 (µs since the epoch), so Lua doubles hold
-- them exactly; they are formatted with %d (by int, which keeps recent texts), never with
-- tostring or `..` (which would print 1.7e+15), and never passed to redis.call as Lua numbers
-- (Redis formats those as floating point, several times the cost of %d). Parsing and
-- formatting are a large part of a step's own cost, so a step parses the counters it uses
-- (the fence and the deadline only when it needs them), writes back only the meta fields it
-- changed, and passes on strings it read (the fence to the fence key) as they are.
--
-- The common steps, in commands (TIME and the HMGET of the counters included):
-- - acquire of a free permit with nobody waiting, the semaphore idle: 3 (the HSET of the
--   counters carries the inline lease; a PEXPIRE of meta at most once a minute); with the state
--   deleted (never used, or idle for FENCE_KEEP_MS): 6 (DEL of leftovers, GET of the fence, the
--   HSET, PEXPIRE of meta); beside another holder: 6 (HSET and ZADD of the lease);
-- - release of the inline lease, nobody else holding or waiting: 3 (the HSET leaves the state
--   idle); of another lease: 5 or more (HGET, HDEL and ZREM of the lease);
-- - release that hands the permit to the head of the queue: 13, plus the PUBLISH of the
--   wake-up; an acquire that joins the queue: 7 to 8 (9 to 11 when the queue was empty).
-- A step reads the earliest holder and waiter expiry (ZRANGE 0 0) only once purge_at has
-- passed, and scans for expired entries only when that earliest one has expired.

-- The call's keys and wake channel base, set by begin(). The keys other than meta are
-- derived from it, and kept while the calls name the same meta key (a library keeps them
-- between calls; Lua strings are interned, so the comparison costs nothing).
local K_META, K_HOLDERS, K_LEASES, K_QUEUE, K_WAITERS, K_WEXP, K_SEATS, K_FENCE, K_TAGS
local K_LIMITS
local WAKE_BASE

-- How long an idle state (or the fence key of a deleted one) keeps the fence, and how long
-- the state outlives its last expiry. An idle state's expiry is pushed back by a minute at
-- a time, so a stream of acquires and releases moves it once a minute.
local FENCE_KEEP_MS = 600000
local IDLE_SLACK_MS = 60000
local STATE_GRACE_MS = 10000

-- Lease: weight, seats (comma separated), fence, acquired_at, expires_at, client, holder, and
-- the tenant the lease was granted to if the request named one (docs/fair-shares.md), tab
-- separated (holder labels and tenants never contain control characters, client ids never a
-- tab). Numbers are written as int writes them. A lease without a tenant is written as by
-- versions before tenants were kept; such a version reads a tenant as part of the holder
-- label (and keeps it there through a renewal), which only its status shows.
local LEASE_PAT = '^(%d+)\t([%d,]*)\t(%d+)\t(%d+)\t(%d+)\t([^\t]*)\t([^\t]*)\t?(.*)$'
-- The weight and seats of a lease record (what removing it needs), checking its shape.
local LEASE_HEAD = '^(%d+)\t([%d,]*)\t%d+\t%d+\t%d+\t'

-- Seats as written in a lease record (comma separated, each with %d).
local function seats_text(seats)
  if #seats == 1 then
    return int(seats[1])
  end
  local out = {}
  for i, seat in ipairs(seats) do
    out[i] = int(seat)
  end
  return table.concat(out, ',')
end

-- A lease record from its fields, joined from text in one concatenation: string.format costs
-- a sprintf per number, and the numbers' text is mostly cached (see int; a grant's fence and
-- start are usually now).
local function lease_text(weight, seats, fence, acquired_at, expires_at, client, holder, tenant)
  local s = int(weight) .. '\t' .. seats_text(seats) .. '\t' .. int(fence) .. '\t' ..
    int(acquired_at) .. '\t' .. int(expires_at) .. '\t' .. client .. '\t' .. holder
  if tenant ~= nil then
    return s .. '\t' .. tenant
  end
  return s
end

local function encode_lease(l)
  return lease_text(l.weight, l.seats, l.fence, l.acquired_at, l.expires_at, l.client, l.holder,
    l.tenant)
end

-- Seats as written in a lease record: one number, or a comma-separated list.
local function parse_seats(s)
  local seats = {}
  if s ~= '' and not string.find(s, ',', 1, true) then
    seats[1] = num(s, 'lease seat')
    return seats
  end
  for seat in string.gmatch(s, '%d+') do
    seats[#seats + 1] = num(seat, 'lease seat')
  end
  return seats
end

local function decode_lease(s)
  local weight, seats, fence, acquired_at, expires_at, client, holder, tenant =
    string.match(s, LEASE_PAT)
  if not weight then corrupt('lease record') end
  return {weight = num(weight, 'lease weight'), seats = parse_seats(seats),
    fence = tonumber(fence), acquired_at = tonumber(acquired_at),
    expires_at = tonumber(expires_at), client = client, holder = holder,
    tenant = tenant ~= '' and tenant or nil}
end

-- Waiter: weight, lease ttl (µs), enqueued_at, expires_at, client, holder, and for an
-- admission waiter (admit.lua) its gate: the store instant (µs) from which its windows admit
-- it, 0 while that is unknown (it waits for permits), WOKEN once a hand-off woke it. A plain
-- waiter's record has no gate field (holder labels never contain a tab), so plain waiters
-- are written as by versions before admissions; a version before them reads a gated
-- waiter's gate as part of its holder and would grant it without charging its windows, so
-- every client of a Redis must run a version that knows gates before any of them admits.
-- A waiter of a tenant has one more field, its tenant, after the gate (empty for a plain
-- waiter): a version before tenants were kept cannot read it, so tenants need every client
-- of a Redis on a version that keeps them (as the tags already did).
local WAITER_PAT = '^(%d+)\t(%d+)\t(%d+)\t(%d+)\t([^\t]*)\t([^\t]*)\t?(%d*)\t?([^\t]*)$'

local function encode_waiter(w)
  local s = int(w.weight) .. '\t' .. int(w.ttl) .. '\t' .. int(w.enqueued_at) .. '\t' ..
    int(w.expires_at) .. '\t' .. w.client .. '\t' .. w.holder
  if w.tenant ~= nil then
    return s .. '\t' .. (w.gate ~= nil and int(w.gate) or '') .. '\t' .. w.tenant
  end
  if w.gate ~= nil then
    return s .. '\t' .. int(w.gate)
  end
  return s
end

local function decode_waiter(s)
  local weight, ttl, enqueued_at, expires_at, client, holder, gate, tenant =
    string.match(s, WAITER_PAT)
  if not weight then corrupt('waiter record') end
  return {weight = num(weight, 'waiter weight'), ttl = tonumber(ttl),
    enqueued_at = tonumber(enqueued_at), expires_at = tonumber(expires_at), client = client,
    holder = holder, gate = gate ~= '' and tonumber(gate) or nil,
    tenant = tenant ~= '' and tenant or nil}
end

-- Far in the future (µs), for purge_at when nothing can expire.
local NEVER = 9007199254740991
-- The gate of an admission waiter that a hand-off woke: not woken again until its own step
-- sets its gate anew.
local WOKEN = NEVER

-- The semaphore's counters, or nil if it does not exist. S.fence, S.deadline, S.vt and
-- S.fd are nil until fence(), deadline(), vtime() and finish_default() parse them from M,
-- the meta fields as loaded. The inline lease, if any: S.lid, S.lrec, S.lexp (µs) and S.lw
-- (its weight). S.nt: the named tenants in the tags hash.
local S, M
-- The counters as loaded, to write back only what changed; `full`: write every field (a
-- new state, or one written by a version without qlen, purge_at and deadline);
-- `inline_moved`: the inline lease changed (granted, renewed or removed); `tags_moved`:
-- vt or fd may have changed; `new_tags`: this step created the tags hash.
local L_CAP, L_USED, L_SEQ, L_SEAT_HIGH, L_QLEN, L_PURGE_AT, L_NT, L_LIM
local full, fence_moved, deadline_moved, inline_moved, tags_moved, new_tags
-- Wake-ups to publish at the end: {client, lease id, encoded lease if it is a grant}; nil
-- until the first.
local wakes
-- Wake-ups left to the caller (see out()); nil until the first.
local relays
-- Clients whose id ends with this take the grant with the wake-up: the payload is
-- `<lease id>\t<now>\t<lease record>` instead of `<lease id>` (revocations stay bare).
local GRANT_PUSH = '.g'
-- Clients whose id ends with `.r<N>` (`?wait=N`) trust a grant only once N replicas have the
-- step that made it: finish() publishes nothing to them and hands the wake-up to the caller
-- (see out()), which publishes the grant after its own WAIT counted N replicas, or the bare
-- lease id if it did not (the waiter then asks, and waits for the replicas itself).
local GRANT_RELAY = '%.r(%d+)$'
-- What this step did, for finish(): whether the counters changed, whether it created the
-- state, the latest expiry it wrote (µs), and which keys it may have created: meta, holders
-- with leases, queue with waiters and wexp, seats.
local dirty, fresh, latest
local new_meta, new_holders, new_queue, new_seats
-- Seats returned in this step, not yet in the seats set (see return_seats); pool is nil
-- until a seat comes back.
local pool, pool_n
-- A holder removed by remove_holder(id, true) whose keys finish() still has to clean, and
-- whether the step left leases in the sets of a state it empties (finish() deletes them).
local removed, drop_sets
-- Tenants' ceilings and floors (see the section on limits below): LIMITS[t] = {c = ceiling
-- or nil, f = floor}, read by load() when the name has limits (S.lim), else nil; HELD[t]:
-- the permits each limited tenant holds, counted from the leases when a step first needs
-- them and kept up to date by grant() and remove_holder() for the rest of the step;
-- lim_moved: this step set or cleared S.lim (finish() gives meta its expiry back, or none).
local LIMITS, HELD, lim_moved

-- Starts a call: reads the clock and resets every per-call value. A function library keeps
-- these locals between calls, so each operation begins with begin(KEYS, ARGV).
local function begin(keys, argv)
  clock()
  local meta = keys[1]
  if keys[2] then
    K_META, K_HOLDERS, K_LEASES, K_QUEUE = meta, keys[2], keys[3], keys[4]
    K_WAITERS, K_WEXP, K_SEATS, K_FENCE = keys[5], keys[6], keys[7], keys[8]
    K_TAGS, K_LIMITS = keys[9], keys[10]
  elseif meta ~= K_META then
    if string.sub(meta, -5) ~= ':meta' then
      corrupt('keys: the meta key first')
    end
    -- '{<prefix>:<name>}:meta' without 'meta'.
    local base = string.sub(meta, 1, -5)
    K_META = meta
    K_HOLDERS, K_LEASES, K_QUEUE = base .. 'holders', base .. 'leases', base .. 'queue'
    K_WAITERS, K_WEXP, K_SEATS = base .. 'waiters', base .. 'wexp', base .. 'seats'
    K_FENCE = base .. 'fence'
    K_TAGS, K_LIMITS = base .. 'tags', base .. 'limits'
  end
  WAKE_BASE = argv[1]
  S, M = nil, nil
  full, fence_moved, deadline_moved, inline_moved = false, false, false, false
  tags_moved, new_tags = false, false
  wakes, relays = nil, nil
  dirty, fresh, latest = false, false, 0
  new_meta, new_holders, new_queue, new_seats = false, false, false, false
  pool, pool_n = nil, 0
  removed, drop_sets = nil, false
  LIMITS, HELD, lim_moved = nil, nil, false
end

-- Queues a wake-up for finish().
local function wake(client, id, lease)
  if wakes == nil then
    wakes = {}
  end
  wakes[#wakes + 1] = {client, id, lease}
end

-- The fields of a tenant's limits as kept in the limits hash: '<ceiling>,<floor>' (as
-- written before window ceilings), or with its window ceiling and, once its own limiter
-- refused an admission, the instant until which it is window-capped (µs):
-- '<ceiling>,<floor>,<window ceiling>[,<until>]' (see the section on window ceilings in
-- admission.lua).
local LIMITS_PAT = '^(%d*),(%d+)$'
local WINDOW_LIMITS_PAT = '^(%d*),(%d+),(%d+),?(%d*)$'

-- A tenant's limits from their text: {c = ceiling or nil, f = floor, w = window ceiling
-- (a percentage) or nil, u = window-capped until (µs) or nil}.
local function parse_limits(s)
  local c, f = string.match(s, LIMITS_PAT)
  if f then
    return {c = tonumber(c), f = tonumber(f)}
  end
  local w, u
  c, f, w, u = string.match(s, WINDOW_LIMITS_PAT)
  if not f then corrupt('tenant limits') end
  return {c = tonumber(c), f = tonumber(f), w = tonumber(w), u = tonumber(u)}
end

-- Reads the tenants' limits into LIMITS (every step of a name that has some).
local function load_limits()
  local all = rcall('HGETALL', K_LIMITS)
  LIMITS = {}
  for i = 1, #all, 2 do
    LIMITS[all[i]] = parse_limits(all[i + 1])
  end
end

-- Loads the counters; `tags`: the tags' fields too (vt, fd), for an acquire or admission.
local function load(tags)
  local m
  if tags then
    m = rcall('HMGET', K_META, 'cap', 'used', 'fence', 'seq', 'seat_high', 'qlen',
      'purge_at', 'deadline', 'lid', 'lrec', 'lexp', 'nt', 'vt', 'fd')
  else
    m = rcall('HMGET', K_META, 'cap', 'used', 'fence', 'seq', 'seat_high', 'qlen',
      'purge_at', 'deadline', 'lid', 'lrec', 'lexp', 'nt')
  end
  if not m[1] then
    return nil
  end
  M = m
  -- A capacity written with a trailing 'L': the name has tenants' limits (see below).
  local cap, lim = NUM_OF[m[1]], false
  if cap == nil then
    if string.byte(m[1], -1) == 76 then -- 76: 'L'
      cap, lim = num(string.sub(m[1], 1, -2), 'capacity'), true
    else
      cap = num(m[1], 'capacity')
    end
  end
  -- Every field a step may set is named here, the unknown ones as nil: a table constructor
  -- sizes the table for the fields it names, so the step never grows (rehashes) it.
  S = {cap = cap, used = num(m[2], 'used'), seq = num(m[4], 'seq'),
    seat_high = num(m[5], 'seat_high'), qlen = nil, purge_at = nil, fence = nil,
    deadline = nil, lid = nil, lrec = nil, lexp = nil, lw = nil, vt = nil, vt_text = nil,
    fd = nil, nt = m[12] and num(m[12], 'nt') or 0, lim = lim}
  if lim then
    load_limits()
    -- With limits a grant may pass queued waiters (the floor first, capped tenants
    -- skipped), so V no longer is the least queued start tag: every step reads it to keep
    -- it as max(V, start), as the reference model does.
    if not tags then
      local t = rcall('HMGET', K_META, 'vt', 'fd')
      m[13], m[14] = t[1], t[2]
    end
  end
  if not m[3] then corrupt('fence') end
  if m[9] and m[9] ~= '' then
    local lw = m[10] and string.match(m[10], LEASE_HEAD)
    -- (An expiry never repeats: parsed without num's cache.)
    local lexp = m[11] and tonumber(m[11])
    if not lw or not lexp then corrupt('inline lease') end
    S.lid, S.lrec, S.lexp, S.lw = m[9], m[10], lexp, num(lw, 'lease weight')
  end
  if m[6] and m[7] and m[8] then
    S.qlen = num(m[6], 'qlen')
    S.purge_at = num(m[7], 'purge_at')
  else
    -- Written by a version without these counters: derive them once.
    S.qlen = rcall('ZCARD', K_QUEUE)
    S.purge_at = 0
    S.deadline = 0
    full = true
    local h = rcall('ZRANGE', K_HOLDERS, -1, -1, 'WITHSCORES')
    if h[2] then latest = math.max(latest, num(h[2], 'holder expiry')) end
    local w = rcall('ZRANGE', K_WEXP, -1, -1, 'WITHSCORES')
    if w[2] then latest = math.max(latest, num(w[2], 'waiter expiry')) end
    dirty = true
  end
  L_CAP, L_USED, L_SEQ, L_SEAT_HIGH = S.cap, S.used, S.seq, S.seat_high
  L_QLEN, L_PURGE_AT, L_NT, L_LIM = S.qlen, S.purge_at, S.nt, S.lim
  return S
end

-- The last fence issued.
local function fence()
  if S.fence == nil then
    S.fence = num(M[3], 'fence')
  end
  return S.fence
end

-- When every key expires (ms since the epoch, 0 if unknown).
local function deadline()
  if S.deadline == nil then
    S.deadline = num(M[8], 'deadline')
  end
  return S.deadline
end

-- Deletes every key of the state (not the fence key).
local function delete_state()
  rcall('DEL', K_META, K_HOLDERS, K_LEASES, K_QUEUE, K_WAITERS, K_WEXP, K_SEATS, K_TAGS)
end

-- A new, empty semaphore. Leftovers of a partly evicted state are dropped first so the
-- counters match the sets; the fence continues from the fence key (or the time floor).
local function create(cap)
  delete_state()
  local fence = tonumber(rcall('GET', K_FENCE)) or 0
  S = {cap = cap, used = 0, fence = fence, seq = 0, seat_high = 0, qlen = 0, purge_at = NEVER,
    deadline = 0, lid = nil, lrec = nil, lexp = nil, lw = nil, vt = 0, vt_text = nil, fd = 0,
    nt = 0, lim = false}
  dirty = true
  fresh = true
  full = true
  new_meta = true
  return S
end

-- Fair shares (docs/fair-shares.md): start-time fair queueing in the one queue, step for
-- step as the reference model (stores/memory/ops.rs). A request of tenant t with share w
-- and cost c gets the start tag S = max(V, F[t]) and sets F[t] = S + c * TAG_UNIT / w when
-- it is granted at once or queued; the queue is ordered by (S, arrival seq); a grant sets V
-- to the granted request's S. V and the finish tag of requests without a tenant (the tenant
-- '' with share 1) live in meta (vt, fd); named tenants' finish tags in the tags hash, and
-- nt is 1 once one has a tag. A tenant whose F[t] <= V is the same as an absent one, so
-- they are dropped now and then; everything restarts at 0 when the semaphore is idle.
--
-- Without tenants the tags grow with arrival (F only grows, and V <= F), so the order is
-- FIFO, and the tags cost no command: vt and fd ride on meta's HMGET and HSET (only an
-- acquire or admission reads them), and while no named tenant has had a tag (nt = 0):
-- - a newcomer without one never leads a non-empty queue (every queued S is at most its
--   own), so its place is the end, found without reading the head;
-- - its start tag is F[''] (V never passes it), so V is not parsed, only written;
-- - vt holds V as a queue score (V * QUEUE_LOW, or the granted head's score as ZRANGE gave
--   it), so a hand-off writes the score it read, with nothing to parse or format.
--
-- A queue score is S * QUEUE_LOW + QUEUE_SEQ + seq % QUEUE_SEQ: the arrival seq in the low
-- bits, kept above QUEUE_SEQ so that a waiter re-joining in front of the head (the head's
-- score less one, admit.lua) keeps the head's S. Scores are exact integers below 2^53, so
-- for S below 2^33 (8.6 million grants of cost 1 at share 1 in one busy period); above, and
-- for requests of equal S more than QUEUE_SEQ arrivals apart, the low bits may no longer
-- order requests of equal S (of different tenants, or of cost 0); S itself stays ordered.
local TAG_UNIT, QUEUE_LOW, QUEUE_SEQ = 1000, 1048576, 524288

-- A waiter's queue score from its start tag and arrival seq.
local function queue_key(start, seq)
  return start * QUEUE_LOW + QUEUE_SEQ + seq % QUEUE_SEQ
end

-- The start tag of a queue score (as ZRANGE WITHSCORES gives it).
local function start_of(score)
  local x = tonumber(score)
  if x == nil then corrupt('queue score') end
  return math.floor(x / QUEUE_LOW)
end

-- A tag as text, without int()'s cache of the last large number (which keeps an expiry's).
local function tag_text(x)
  if x < SMALL then
    return int(x)
  end
  return string.format('%d', x)
end

-- The virtual time V (tags in milli-units of cost; absent is 0), from vt as a step set it
-- or as load(true) read it: only an acquire or admission asks.
local function vtime()
  if S.vt == nil then
    local t = S.vt_text or M[13]
    S.vt = t and start_of(t) or 0
  end
  return S.vt
end

local function set_vtime(v)
  S.vt, S.vt_text = v, nil
  tags_moved = true
end

-- The finish tag of the requests without a tenant (load(true) read it).
local function finish_default()
  if S.fd == nil then
    S.fd = M[14] and tonumber(M[14]) or 0
    if S.fd == nil then corrupt('fd') end
  end
  return S.fd
end

-- Tags restart at 0: the semaphore was idle (no holder, no waiter) when this step decided.
local function reset_tags()
  S.vt, S.vt_text, S.fd = 0, nil, 0
  tags_moved = true
  if S.nt > 0 then
    rcall('DEL', K_TAGS)
    S.nt = 0
    dirty = true
  end
end

-- The start and finish tags a request of `tenant` (nil: none), `share` and `cost` would
-- get; nothing changes until take_tags().
local function tags(tenant, share, cost)
  local start
  if tenant == nil then
    start = finish_default()
    if S.nt > 0 and vtime() > start then start = S.vt end
  else
    start = vtime()
    if S.nt > 0 then
      local f = rcall('HGET', K_TAGS, tenant)
      if f then
        f = tonumber(f)
        if f == nil then corrupt('tenant tag') end
        if f > start then start = f end
      end
    end
  end
  return start, start + math.floor(cost * TAG_UNIT / share)
end

-- Drops the named tenants whose finish tag V has reached (they start at V either way).
local function forget_tenants()
  local all = rcall('HGETALL', K_TAGS)
  local v = vtime()
  local old = {}
  for i = 1, #all, 2 do
    local f = tonumber(all[i + 1])
    if f == nil or f <= v then old[#old + 1] = all[i] end
  end
  for i = 1, #old, 1000 do
    rcall('HDEL', K_TAGS, unpack(old, i, math.min(i + 999, #old)))
  end
end

-- Records a request's finish tag, and, granted at once, moves V to its start. When a new
-- tenant makes the tags hash larger than the queue and the holders warrant, the tenants V
-- has passed are dropped (so the hash holds about the tenants in play).
local function take_tags(tenant, start, finish, granted)
  if tenant == nil then
    S.fd = finish
    tags_moved = true
  elseif rcall('HSET', K_TAGS, tenant, tag_text(finish)) == 1 then
    S.nt = 1
    local n = rcall('HLEN', K_TAGS)
    if n == 1 then new_tags = true end
    if n > 2 * (S.qlen + S.used) + 16 then forget_tenants() end
  end
  -- (Without named tenants' tags, start >= V: see the top of this section.)
  if granted and (S.nt == 0 and tenant == nil or start > vtime()) then
    set_vtime(start)
  end
  dirty = true
end

-- take_tags() for a request without a tenant while no named tenant has a tag (nt = 0), in
-- fewer Lua calls (each costs about as much as a small redis.call): its start is F[''],
-- which V never passes, and its cost counts whole at share 1. Returns the start.
local function plain_tags(cost, granted)
  local start = S.fd or finish_default()
  S.fd = start + cost * TAG_UNIT
  if granted then
    S.vt, S.vt_text = start, nil
  end
  tags_moved = true
  dirty = true
  return start
end

-- Whether a request with this start tag, arriving now, would be the head.
local function would_lead(start)
  if S.qlen <= 0 then
    return true
  end
  local head = rcall('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
  if not head[2] then corrupt('queue length without a queue') end
  return queue_key(start, S.seq) < tonumber(head[2])
end

-- The weight of the leases in the holders and leases sets (every lease but the inline one):
-- the sets are read only when it is above 0.
local function set_used()
  if S.lid then
    return S.used - S.lw
  end
  return S.used
end

-- A held lease's encoded record, or nil.
local function lease_get(id)
  if S.lid == id then
    return S.lrec
  end
  if set_used() > 0 then
    return rcall('HGET', K_LEASES, id)
  end
  return nil
end

-- Stores a lease's record and expiry where it lives (a renewal).
local function lease_put(id, encoded, expires_at)
  if S.lid == id then
    S.lrec, S.lexp = encoded, expires_at
    inline_moved = true
  else
    rcall('HSET', K_LEASES, id, encoded)
    rcall('ZADD', K_HOLDERS, int(expires_at), id)
  end
end

-- The holders' leases as {id, encoded record, ...}, the inline one last.
local function lease_all()
  local all = {}
  if set_used() > 0 then
    all = rcall('HGETALL', K_LEASES)
  end
  if S.lid then
    all[#all + 1] = S.lid
    all[#all + 1] = S.lrec
  end
  return all
end

-- Records an expiry written in this step.
local function wrote_expiry(at)
  if at > latest then latest = at end
  if at < S.purge_at then S.purge_at = at end
  dirty = true
end

-- Seats given back in this step and not yet in the seats set, as pool[seat] = true (pool_n
-- of them). A hand-off in the same step takes them without touching the set; finish() adds
-- what is left. Free seats below seat_high are those in the set plus those in the pool, so
-- the set holds seat_high - used - pool_n seats (held, set and pool partition
-- 0..seat_high-1; a lease holds one seat per permit). Declared with the per-call values.

-- The number of seats in the seats set, by the counters.
local function set_size()
  return S.seat_high - S.used - pool_n
end

-- Gives seats back: the pool gets them, and the high-water mark shrinks over free seats at
-- its top, keeping the set small. A returned seat at the top is never kept free.
-- (The top seat, seat_high - 1, is never free at the start of a step: every step ends
-- shrunk. So a returned seat below a held top stays below it, and returning in descending
-- order gives the same free seats and mark as adding all and then shrinking.)
local function return_seats(seats)
  -- S.used is already lowered: the set held set_size() - #seats seats before these.
  local in_set = set_size() - #seats
  if pool == nil then
    pool = {}
  end
  for i = #seats, 1, -1 do
    local seat = seats[i]
    if seat == S.seat_high - 1 then
      S.seat_high = seat
      while S.seat_high > 0 do
        local top = S.seat_high - 1
        if pool[top] then
          pool[top] = nil
          pool_n = pool_n - 1
        elseif in_set > 0 and rcall('ZREM', K_SEATS, top) == 1 then
          in_set = in_set - 1
        else
          break
        end
        S.seat_high = top
      end
    else
      pool[seat] = true
      pool_n = pool_n + 1
    end
  end
  dirty = true
end

-- The n lowest free seats below the capacity (from the pool and the set), ascending; there
-- are always enough when used + n <= cap.
local function take_seats(n)
  local seats = {}
  -- Nothing free below the high-water mark (the common case): the next n seats.
  if pool_n == 0 and set_size() <= 0 then
    for i = 1, n do
      seats[i] = S.seat_high + i - 1
    end
    S.seat_high = S.seat_high + n
    return seats
  end
  -- One seat and none in the set (a hand-off of the seat a release just gave back): the
  -- lowest below the capacity in the pool, usually its only one.
  if n == 1 and set_size() <= 0 then
    local low
    for seat in pairs(pool) do
      if seat < S.cap and (low == nil or seat < low) then low = seat end
    end
    if low ~= nil then
      pool[low] = nil
      pool_n = pool_n - 1
      seats[1] = low
      return seats
    end
  end
  local free = {}
  if pool_n > 0 then
    for seat in pairs(pool) do
      if seat < S.cap then free[#free + 1] = seat end
    end
  end
  if set_size() > 0 then
    local low = rcall('ZRANGEBYSCORE', K_SEATS, '-inf', '(' .. int(S.cap), 'LIMIT', 0, n)
    for _, seat in ipairs(low) do
      free[#free + 1] = num(seat, 'free seat')
    end
  end
  table.sort(free)
  local from_set = {}
  for i = 1, math.min(n, #free) do
    local seat = free[i]
    seats[i] = seat
    if pool_n > 0 and pool[seat] then
      pool[seat] = nil
      pool_n = pool_n - 1
    else
      from_set[#from_set + 1] = seat
    end
  end
  for i = 1, #from_set, 1000 do
    rcall('ZREM', K_SEATS, unpack(from_set, i, math.min(i + 999, #from_set)))
  end
  while #seats < n do
    seats[#seats + 1] = S.seat_high
    S.seat_high = S.seat_high + 1
  end
  return seats
end

-- Adds the seats left in the pool to the seats set (before the counters are stored).
local function flush_pool()
  if pool_n == 0 then
    return
  end
  if set_size() == 0 then
    new_seats = true
  end
  local add = {}
  for seat in pairs(pool) do
    add[#add + 1] = seat
    add[#add + 1] = seat
  end
  for i = 1, #add, 1000 do
    rcall('ZADD', K_SEATS, unpack(add, i, math.min(i + 999, #add)))
  end
  pool, pool_n = nil, 0
end

-- Grants a lease to `tenant` (nil: none); returns its encoded record. `inline`: it may be the
-- inline lease (an acquire's own grant, see the top of this file), if no other is.
local function grant(id, weight, ttl, holder, client, inline, tenant)
  local seats = take_seats(weight)
  local f = fence() + 1
  if now > f then f = now end
  S.fence = f
  fence_moved = true
  local expires_at = now + ttl
  local encoded = lease_text(weight, seats, f, now, expires_at, client, holder, tenant)
  if inline and S.lid == nil then
    S.lid, S.lrec, S.lexp, S.lw = id, encoded, expires_at, weight
    inline_moved = true
  else
    if set_used() == 0 and removed == nil then
      new_holders = true
    end
    rcall('HSET', K_LEASES, id, encoded)
    -- (int keeps the text of the last large number: the expiry just written.)
    rcall('ZADD', K_HOLDERS, int(expires_at), id)
  end
  S.used = S.used + weight
  if HELD ~= nil and tenant ~= nil then
    HELD[tenant] = (HELD[tenant] or 0) + weight
  end
  wrote_expiry(expires_at)
  return encoded
end

-- A removed lease's permits no longer count for its tenant (once HELD is counted).
local function unhold(encoded)
  local l = decode_lease(encoded)
  if l.tenant ~= nil and HELD[l.tenant] ~= nil then
    HELD[l.tenant] = HELD[l.tenant] - l.weight
  end
end

-- Removes a holder; its lease record, or nil if it holds nothing. `last`: nothing but
-- hand-offs and finish() follow in this step (release, cancel, revoke), so when it leaves
-- nobody holding or waiting, finish() leaves the state idle (deleting the sets at once) and
-- the lease's own writes and its seats' return are skipped.
local function remove_holder(id, last)
  if S.lid == id then
    local encoded = S.lrec
    if HELD ~= nil then unhold(encoded) end
    S.used = S.used - S.lw
    S.lid = nil
    inline_moved = true
    dirty = true
    -- Left empty, finish() leaves the state idle, seats and all.
    if not (last and S.used <= 0 and S.qlen <= 0) then
      local _, seats = string.match(encoded, LEASE_HEAD)
      return_seats(parse_seats(seats))
    end
    return encoded
  end
  local encoded = set_used() > 0 and rcall('HGET', K_LEASES, id)
  if not encoded then
    return nil
  end
  local weight, seats = string.match(encoded, LEASE_HEAD)
  if not weight then corrupt('lease record') end
  if HELD ~= nil then unhold(encoded) end
  S.used = S.used - num(weight, 'lease weight')
  dirty = true
  if last then
    if S.used <= 0 and S.qlen <= 0 then
      drop_sets = true
      return encoded
    end
    -- Its HDEL and ZREM wait for finish(), after the hand-off: a lease handed on in this
    -- step then finds the keys still there (with their expiry), where removing the last
    -- holder first would have Redis delete them and the grant create them again.
    removed = id
  else
    rcall('HDEL', K_LEASES, id)
    rcall('ZREM', K_HOLDERS, id)
  end
  return_seats(parse_seats(seats))
  return encoded
end

-- Takes a queued waiter's entries out of the queue.
local function unqueue(id)
  rcall('HDEL', K_WAITERS, id)
  rcall('ZREM', K_QUEUE, id)
  rcall('ZREM', K_WEXP, id)
  S.qlen = S.qlen - 1
  dirty = true
end

-- Removes a queued waiter; its record, or nil if it is not queued.
local function remove_waiter(id)
  local encoded = rcall('HGET', K_WAITERS, id)
  if not encoded then
    return nil
  end
  local w = decode_waiter(encoded)
  unqueue(id)
  return w
end

-- Tenants' ceilings and floors (docs/fair-shares.md#ceilings-and-floors), step for step as
-- the reference model (stores/memory/ops.rs: may_grant, below_floor, head_key,
-- hand_off_limited). A name has limits while its limits hash has a field; its meta then
-- says so in `cap`, written with a trailing 'L' (load() sets S.lim and reads LIMITS). A
-- step of a name without limits runs exactly as before: every branch below is behind
-- S.lim, and the flag rides on the HMGET every step runs. The flag is set and cleared by
-- set_limits.lua with the hash; while it is set, meta never expires (finish() leaves it
-- without a TTL, also idle), so no step creates a state that does not know its limits
-- (create() runs only where meta is gone). A client of a build before limits cannot read
-- such a capacity and fails every step on the name as corrupt (TESSERA_CORRUPT capacity):
-- it grants nothing past limits it does not know.
--
-- held(t), the permits tenant t holds, is counted from the leases the first time a step
-- needs it (HGETALL of the leases: O(holders), only with limits) and kept by grant() and
-- remove_holder() for the rest of the step. The head is found by reading the queue in
-- order, a page at a time, up to the first waiter that is not at its ceiling (and, while a
-- limited tenant is below its floor, further, for a waiter of that tenant).

-- Permits tenant t holds (a named tenant; counted from the leases at the first call).
local function held(t)
  if HELD == nil then
    HELD = {}
    local all = lease_all()
    for i = 2, #all, 2 do
      -- (A lease removed in this step may wait in the sets for finish(): see `removed`.)
      local l = all[i - 1] ~= removed and decode_lease(all[i])
      if l and l.tenant ~= nil then
        HELD[l.tenant] = (HELD[l.tenant] or 0) + l.weight
      end
    end
  end
  return HELD[t] or 0
end

-- Whether `tenant` (nil: none) is at its ceiling for `weight` more permits.
local function capped(tenant, weight)
  local l = tenant ~= nil and LIMITS[tenant]
  return l and l.c ~= nil and held(tenant) + weight > l.c or false
end

-- Whether `weight` more permits keep `tenant` within its floor.
local function below_floor(tenant, weight)
  local l = tenant ~= nil and LIMITS[tenant]
  return l and l.f > 0 and held(tenant) + weight <= l.f or false
end

-- Whether some limited tenant holds less than its floor (the floor pass has work).
local function floors_short()
  for t, l in pairs(LIMITS) do
    if l.f > 0 and held(t) < l.f then return true end
  end
  return false
end

-- Whether `tenant` may be granted `weight` permits now: they fit, its ceiling allows them,
-- and they leave what the other tenants' floors keep (each floor less what its tenant
-- holds).
local function may_grant(tenant, weight)
  if capped(tenant, weight) then return false end
  local kept = 0
  for u, l in pairs(LIMITS) do
    if u ~= tenant and l.f > 0 then
      local short = l.f - held(u)
      if short > 0 then kept = kept + short end
    end
  end
  return weight + kept <= S.cap - S.used
end

-- Reads the queue in order, a page at a time, calling visit(id, score, waiter) until it
-- returns true; returns that entry's id, score and waiter, or nil.
local QUEUE_PAGE = 64
local function scan_queue(visit)
  local from = 0
  while from < S.qlen do
    local page = rcall('ZRANGE', K_QUEUE, from, from + QUEUE_PAGE - 1, 'WITHSCORES')
    if page[1] == nil then
      return nil
    end
    local ids = {}
    for i = 1, #page, 2 do
      ids[#ids + 1] = page[i]
    end
    local records = rcall('HMGET', K_WAITERS, unpack(ids))
    for i, id in ipairs(ids) do
      local encoded = records[i]
      if not encoded then corrupt('queued lease without a waiter record') end
      local w = decode_waiter(encoded)
      if visit(id, page[2 * i], w) then
        return id, page[2 * i], w
      end
    end
    from = from + QUEUE_PAGE
  end
  return nil
end

-- Whether `tenant` (nil: none) has a window ceiling whose own limiter refused it until
-- after now (see the section on window ceilings in admission.lua): its admission waiters
-- are skipped for the head, as a tenant at its ceiling is.
local function window_capped(tenant)
  local l = tenant ~= nil and LIMITS[tenant]
  return l and l.w ~= nil and l.u ~= nil and l.u > now or false
end

-- The head with limits: the first waiter whose tenant is not at its ceiling for it and
-- that is not an admission waiter (a gate in its record) of a window-capped tenant; its
-- id, score and waiter, or nil.
local function limited_head()
  return scan_queue(function(_, _, w)
    return not capped(w.tenant, w.weight) and not (w.gate ~= nil and window_capped(w.tenant))
  end)
end

-- Whether a request with this start tag, arriving now, would be the head (with limits).
local function limited_lead(start)
  if S.qlen <= 0 then
    return true
  end
  local _, score = limited_head()
  return score == nil or queue_key(start, S.seq) < tonumber(score)
end

-- Grants a waiter taken out of the queue (its score `score`), and wakes it with the grant.
local function grant_queued(id, score, w)
  unqueue(id)
  local s = start_of(score)
  if s > vtime() then set_vtime(s) end
  -- Provisional until renewed: no longer than the waiter's entry would have lived.
  local ttl = w.expires_at - now
  if ttl > w.ttl then ttl = w.ttl end
  wake(w.client, id, grant(id, w.weight, ttl, w.holder, w.client, false, w.tenant))
end

-- The hand-off with limits: first a waiter whose tenant is below its floor and may be
-- granted, in queue order, ahead of the head (an admission waiter among them is left to its
-- own step); then the head (limited_head) while it may be granted; an admission waiter at
-- the head is woken as without limits.
local function limited_hand_off()
  while S.qlen > 0 do
    local id, score, w
    if floors_short() then
      id, score, w = scan_queue(function(_, _, q)
        return q.gate == nil and below_floor(q.tenant, q.weight) and may_grant(q.tenant, q.weight)
      end)
    end
    if id == nil then
      id, score, w = limited_head()
      if id == nil or not may_grant(w.tenant, w.weight) then
        return
      end
      if w.gate ~= nil then
        if w.gate <= now then
          w.gate = WOKEN
          rcall('HSET', K_WAITERS, id, encode_waiter(w))
          wake(w.client, id)
        end
        return
      end
    end
    grant_queued(id, score, w)
  end
end

-- Strict FIFO: grant the head while it fits; a head that does not fit blocks the rest, and
-- so does an admission waiter (a gate in its record), which only its own step grants, as its
-- windows are charged there: once its permits fit and its gate's instant has come, it is
-- woken (without a grant) to ask. (Every waiter weighs at least 1, so nothing fits while
-- used >= cap.) A grant moves V to the waiter's start tag: every queued start tag is at
-- least V (V only ever takes the start of a request that led the queue), so no max.
local function hand_off()
  if S.lim then
    return limited_hand_off()
  end
  while S.qlen > 0 and S.used < S.cap do
    local first = rcall('ZRANGE', K_QUEUE, 0, 0, 'WITHSCORES')
    local head = first[1]
    if not head then
      corrupt('queue length without a queue')
    end
    local encoded = rcall('HGET', K_WAITERS, head)
    if not encoded then
      corrupt('queued lease without a waiter record')
    end
    local w = decode_waiter(encoded)
    if S.used + w.weight > S.cap then
      return
    end
    if w.gate ~= nil then
      if w.gate <= now then
        w.gate = WOKEN
        rcall('HSET', K_WAITERS, head, encode_waiter(w))
        wake(w.client, head)
      end
      return
    end
    unqueue(head)
    S.vt, S.vt_text = nil, first[2]
    tags_moved = true
    -- Provisional until renewed: no longer than the waiter's entry would have lived.
    local ttl = w.expires_at - now
    if ttl > w.ttl then ttl = w.ttl end
    wake(w.client, head, grant(head, w.weight, ttl, w.holder, w.client, false, w.tenant))
  end
end

-- Removes the queued waiters `ids` at once, a few commands per thousand, without reading
-- their records (a purge needs none).
local function drop_waiters(ids)
  for i = 1, #ids, 1000 do
    local j = math.min(i + 999, #ids)
    S.qlen = S.qlen - rcall('ZREM', K_QUEUE, unpack(ids, i, j))
    rcall('HDEL', K_WAITERS, unpack(ids, i, j))
    rcall('ZREM', K_WEXP, unpack(ids, i, j))
  end
  dirty = true
end

-- The earliest score in a zset (µs), or NEVER if it is empty.
local function earliest(key, what)
  local first = rcall('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    return num(first[2], what)
  end
  return NEVER
end

-- Drops expired holders and waiters, unless none can have expired yet (now < purge_at), and
-- then sets purge_at to the earliest expiry left. It reads each set's earliest expiry first
-- and scans for expired entries only where that one has expired. At most PURGE_HOLDERS
-- holders (each read back for its weight and seats) and PURGE_WAITERS waiters (in bulk) per
-- step, so that one step's work stays bounded (a few milliseconds) when thousands of leases
-- expire or waiters die together (a crashed process); the rest stay counted until the next
-- steps purge them, and purge_at stays at now so that any next step goes on.
local PURGE_HOLDERS, PURGE_WAITERS = 256, 4096

-- The earliest holder expiry (µs), or NEVER.
local function first_holding()
  local first = NEVER
  if S.lid then
    first = S.lexp
  end
  if set_used() > 0 then
    local e = earliest(K_HOLDERS, 'holder expiry')
    if e < first then first = e end
  end
  return first
end

local function purge()
  local inline_due = S.lid ~= nil and S.lexp <= now
  if now < S.purge_at and not inline_due then
    return
  end
  dirty = true
  local more = false
  -- The earliest holder expiry left, or nil where holders were dropped (read again below).
  local first_holder = NEVER
  if S.lid then
    if inline_due then
      remove_holder(S.lid)
      first_holder = nil
    else
      first_holder = S.lexp
    end
  end
  if set_used() > 0 then
    local e = earliest(K_HOLDERS, 'holder expiry')
    if e <= now then
      local expired = rcall('ZRANGEBYSCORE', K_HOLDERS, '-inf', now_text(), 'LIMIT', 0,
        PURGE_HOLDERS)
      for _, id in ipairs(expired) do
        remove_holder(id)
      end
      more = #expired == PURGE_HOLDERS
      first_holder = nil
    elseif first_holder ~= nil and e < first_holder then
      first_holder = e
    end
  end
  local first_waiter = NEVER
  if S.qlen > 0 then
    first_waiter = earliest(K_WEXP, 'waiter expiry')
    if first_waiter <= now then
      local dead = rcall('ZRANGEBYSCORE', K_WEXP, '-inf', now_text(), 'LIMIT', 0, PURGE_WAITERS)
      drop_waiters(dead)
      more = more or #dead == PURGE_WAITERS
      first_waiter = nil
    end
  end
  if more then
    S.purge_at = now
    -- Wake the head of the queue without a grant: its client asks at once (a heartbeat),
    -- and that step purges the next batch and hands off what it frees. (A holder woken so
    -- only renews early.)
    if S.qlen > 0 then
      local head = rcall('ZRANGE', K_QUEUE, 0, 0)[1]
      local encoded = head and rcall('HGET', K_WAITERS, head)
      if encoded then
        wake(decode_waiter(encoded).client, head)
      end
    end
    return
  end
  -- Where entries were dropped, the earliest expiry left is read again.
  first_holder = first_holder or first_holding()
  first_waiter = first_waiter or earliest(K_WEXP, 'waiter expiry')
  S.purge_at = math.min(first_holder, first_waiter)
end

local function purge_and_hand_off()
  purge()
  hand_off()
end

-- Renews a waiter's heartbeat expiry to max(current, until); false if not queued.
local function refresh_waiter(id, until_us)
  if S.qlen <= 0 then
    return false
  end
  local encoded = rcall('HGET', K_WAITERS, id)
  if not encoded then
    return false
  end
  local w = decode_waiter(encoded)
  if until_us > w.expires_at then
    w.expires_at = until_us
    rcall('HSET', K_WAITERS, id, encode_waiter(w))
    rcall('ZADD', K_WEXP, int(until_us), id)
    wrote_expiry(until_us)
  end
  return true
end

local function is_empty()
  return S.used <= 0 and S.qlen <= 0
end

-- The changed meta fields and their values, for one HSET: F[1..FN] (the table is reused
-- from call to call; entries past FN are stale).
local F, FN = {}, 0
local function put_text(field, text)
  F[FN + 1] = field
  F[FN + 2] = text
  FN = FN + 2
end
local function put(field, value)
  put_text(field, int(value))
end

-- Puts the meta fields that changed since load() (all of them when `full`).
local function put_changed()
  FN = 0
  if full or S.cap ~= L_CAP or S.lim ~= L_LIM then
    if S.lim then
      put_text('cap', int(S.cap) .. 'L')
    else
      put('cap', S.cap)
    end
  end
  if full or S.used ~= L_USED then put('used', S.used) end
  if full then
    put('fence', fence())
  elseif fence_moved then
    put('fence', S.fence)
  end
  if full or S.seq ~= L_SEQ then put('seq', S.seq) end
  if full or S.seat_high ~= L_SEAT_HIGH then put('seat_high', S.seat_high) end
  if full or S.qlen ~= L_QLEN then put('qlen', S.qlen) end
  if full or S.purge_at ~= L_PURGE_AT then put('purge_at', S.purge_at) end
  if full or deadline_moved then put('deadline', S.deadline) end
  if full or tags_moved then
    -- What this step set, compared as text: an uncontended loop restarts at the same tags
    -- every time. (vt and fd are in M only for load(true), and only set after it.)
    -- (Formatted inline: an uncontended loop restarts at V = 0 and a small F[''].)
    local t = S.vt_text
    if t == nil and S.vt ~= nil then
      t = S.vt == 0 and '0' or string.format('%d', S.vt * QUEUE_LOW)
    end
    if t ~= nil and (full or t ~= M[13]) then put_text('vt', t) end
    local f = S.fd
    if f ~= nil then
      t = f < SMALL and (TEXT_OF[f] or int(f)) or string.format('%d', f)
      if full or t ~= M[14] then put_text('fd', t) end
    end
  end
  if full or S.nt ~= L_NT then put('nt', S.nt) end
  if full or inline_moved then
    if S.lid then
      put_text('lid', S.lid)
      put_text('lrec', S.lrec)
      put('lexp', S.lexp)
    else
      put_text('lid', '')
      put_text('lrec', '')
      put_text('lexp', '')
    end
  end
  if FN > 0 then
    rcall('HSET', K_META, unpack(F, 1, FN))
  end
end

-- Leaves the state idle (see the top of this file): meta alone, its fence kept for at least
-- FENCE_KEEP_MS after the last step that changed it. (A step that found it idle and left it
-- so, a status or a late release, writes nothing: reads never keep an idle state alive.)
local function leave_idle()
  if not dirty and not lim_moved then
    return
  end
  -- Leases left in the sets by remove_holder(id, true), and free seats in the seats set
  -- (the set held seat_high - used of them when loaded; a new state has none).
  if drop_sets or (not fresh and L_SEAT_HIGH > L_USED) then
    rcall('DEL', K_HOLDERS, K_LEASES, K_SEATS)
  end
  if S.nt > 0 then
    rcall('DEL', K_TAGS)
    S.nt = 0
  end
  pool, pool_n = nil, 0
  S.seat_high = 0
  S.purge_at = NEVER
  local now_ms = math.floor(now / 1000)
  local d = deadline()
  local move = d < now_ms + FENCE_KEEP_MS
  if move then
    S.deadline = now_ms + FENCE_KEEP_MS + IDLE_SLACK_MS
    deadline_moved = true
  end
  put_changed()
  if S.lim then
    -- A name with limits keeps its meta (see the section on limits).
    if lim_moved then rcall('PERSIST', K_META) end
  elseif move or new_meta or lim_moved then
    rcall('PEXPIRE', K_META, int(S.deadline - now_ms))
  end
end

-- Stores the counters and makes every key outlive the latest lease or waiter expiry by at
-- least the grace period, or leaves the state idle if nobody holds or waits; then publishes
-- wake-ups.
local function finish()
  if S ~= nil then
    if is_empty() then
      leave_idle()
    else
      if removed ~= nil then
        rcall('HDEL', K_LEASES, removed)
        rcall('ZREM', K_HOLDERS, removed)
      end
      flush_pool()
      if dirty or lim_moved then
        -- Every live key gets the deadline when it moves; otherwise only the keys this step
        -- created (which have none).
        local all = false
        local need = math.floor(math.max(latest, now) / 1000) + STATE_GRACE_MS
        local d = deadline()
        if d == 0 or need > d then
          S.deadline = need + STATE_GRACE_MS
          deadline_moved = true
          all = true
        end
        put_changed()
        -- PEXPIRE rather than PEXPIREAT: the same instant, and the documented ACL stays.
        local ttl_ms = int(S.deadline - math.floor(now / 1000))
        if S.lim then
          if lim_moved then rcall('PERSIST', K_META) end
        elseif all or new_meta or lim_moved then
          rcall('PEXPIRE', K_META, ttl_ms)
        end
        if set_used() > 0 and (all or new_holders) then
          rcall('PEXPIRE', K_HOLDERS, ttl_ms)
          rcall('PEXPIRE', K_LEASES, ttl_ms)
        end
        if S.qlen > 0 and (all or new_queue) then
          rcall('PEXPIRE', K_QUEUE, ttl_ms)
          rcall('PEXPIRE', K_WAITERS, ttl_ms)
          rcall('PEXPIRE', K_WEXP, ttl_ms)
        end
        if S.seat_high > S.used and (all or new_seats) then
          rcall('PEXPIRE', K_SEATS, ttl_ms)
        end
        if S.nt > 0 and (all or new_tags) then
          rcall('PEXPIRE', K_TAGS, ttl_ms)
        end
      end
    end
  end
  if wakes ~= nil then
    local sharded = string.byte(WAKE_BASE, 1) == 123 -- 123: '{'
    local cmd = sharded and 'SPUBLISH' or 'PUBLISH'
    for _, w in ipairs(wakes) do
      local payload = w[2]
      local need
      if w[3] then
        if string.sub(w[1], -#GRANT_PUSH) == GRANT_PUSH then
          payload = payload .. '\t' .. now_text() .. '\t' .. w[3]
        elseif not sharded then
          need = string.match(w[1], GRANT_RELAY)
        end
      end
      if need then
        -- The caller publishes it, once `need` replicas have this step (see out()).
        if relays == nil then
          relays = {'relay', false}
        end
        local n = #relays
        relays[n + 1] = WAKE_BASE .. w[1]
        relays[n + 2] = payload
        relays[n + 3] = payload .. '\t' .. now_text() .. '\t' .. w[3]
        relays[n + 4] = need
      else
        rcall(cmd, WAKE_BASE .. w[1], payload)
      end
    end
  end
end

-- A step's reply, wrapped when finish() left grants for the caller to relay:
-- {'relay', reply, channel, bare payload, payload with the grant, replicas needed, ...}.
local function out(reply)
  if relays == nil then
    return reply
  end
  relays[2] = reply
  return relays
end

-- Replies carry numbers as integers; a lease travels as its id plus its encoded record.
