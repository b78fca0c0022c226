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

local function clock()
  if rcall == nil then
    rcall, string, math, table, tonumber, ipairs, pairs, unpack, error = globals()
  end
  local time = rcall('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
  now_s = nil
end

-- Small integers (counters, weights, seats, capacities up to SMALL) and their text, both
-- ways: formatting (%d) and parsing (strtod) cost more than the table lookups. A function
-- library keeps them between calls (bounded: SMALL entries each); a script rebuilds them.
local SMALL = 1024
local TEXT_OF, NUM_OF = {}, {}

local function int(x)
  if x >= 0 and x < SMALL then
    local s = TEXT_OF[x]
    if s == nil then
      s = string.format('%d', x)
      TEXT_OF[x] = s
    end
    return s
  end
  return string.format('%d', x)
end

-- now as text (int(now)), formatted at most once per call.
local function now_text()
  if now_s == nil then
    now_s = int(now)
  end
  return now_s
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
  -- Only the canonical text of a small integer is kept, so the table stays bounded.
  if n >= 0 and n < SMALL and int(n) == s then
    NUM_OF[s] = n
  end
  return n
end
