-- tessera common: the store's clock and the value helpers every script uses, in front of
-- prelude.lua (semaphore scripts) and rate_prelude.lua (rate scripts); see ops.rs for how the
-- files become one EVAL script per operation and one Redis Functions library.
--   rcall        redis.call (see below for why the globals are upvalues)
--   now          the server's time in µs since the epoch (TIME: the store's clock, never the
--                client's), read by clock() at the start of every call
--   int(x)       a number formatted as an integer (%d, never tostring's exponent form)
--   now_text()   int(now), formatted once per call
--   corrupt(w)   fails the script with 'TESSERA_CORRUPT <w>' (the client maps it to
--                Error::Corrupt)
--   num(s, w)    tonumber(s), or corrupt(w) if s is not a number

-- A function runs with an empty globals table whose __index is the real one, so every use
-- of a global name costs a few failed table lookups. The globals the scripts use are kept as
-- upvalues instead, bound at the first call (a library's load sees only redis.register_function
-- and redis.log); `rcall` is redis.call. (About 7% of a call's time in Redis.)
local function globals()
  return redis.call, string, math, table, tonumber, ipairs, pairs, unpack, error
end
local rcall, string, math, table, tonumber, ipairs, pairs, unpack, error

local now = 0
-- now formatted with %d, once per call (see now_text).
local now_s

-- The seconds of the last TIME reply, as text and in µs: they change once a second, so a
-- call parses only the microseconds (tonumber costs about as much as a redis.call).
local sec_s, sec_us

local function clock()
  if rcall == nil then
    rcall, string, math, table, tonumber, ipairs, pairs, unpack, error = globals()
  end
  local time = rcall('TIME')
  if time[1] ~= sec_s then
    sec_s = time[1]
    sec_us = tonumber(sec_s) * 1000000
  end
  now = sec_us + tonumber(time[2])
  now_s = nil
end

-- now as text (int(now)), formatted at most once per call.
local function now_text()
  if now_s == nil then
    now_s = string.format('%d', now)
  end
  return now_s
end

-- Numbers and their text, both ways: formatting (%d) and parsing (strtod) each cost more
-- than a redis.call, a table lookup a few percent of that. A function library keeps these
-- between calls; a script rebuilds them.
-- - TEXT_OF: the text of small integers (counters, weights, seats, capacities below SMALL);
-- - NUM_OF: the number of every text parsed (TTLs, queue caps and counters repeat from call
--   to call), emptied when it reaches NUM_MAX entries: expiries never repeat, and a small
--   table that is emptied often cost less per call (callgrind) than 256 or 2,048 entries;
-- - big_x, big_s: the last larger number formatted (an expiry is formatted for its record
--   and again as purge_at or as its score).
local SMALL, NUM_MAX = 1024, 64
local TEXT_OF, NUM_OF, num_n = {}, {}, 0
local big_x, big_s

local function int(x)
  if x >= 0 and x < SMALL then
    local s = TEXT_OF[x]
    if s == nil then
      s = string.format('%d', x)
      TEXT_OF[x] = s
    end
    return s
  end
  if x == now then
    return now_text()
  end
  if x ~= big_x then
    big_x, big_s = x, string.format('%d', x)
  end
  return big_s
end

local function corrupt(what)
  return error({err = 'TESSERA_CORRUPT ' .. what})
end

local function num(s, what)
  local n = NUM_OF[s]
  if n ~= nil then
    return n
  end
  n = tonumber(s)
  if n == nil then corrupt(what) end
  if num_n >= NUM_MAX then
    NUM_OF, num_n = {}, 0
  end
  NUM_OF[s] = n
  num_n = num_n + 1
  return n
end
