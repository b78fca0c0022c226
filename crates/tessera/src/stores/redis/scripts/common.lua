-- tessera common: the store's clock and the value helpers every script uses, in front of
-- prelude.lua (semaphore scripts) and rate_prelude.lua (rate scripts); see ops.rs for how the
-- files become one EVAL script per operation and one Redis Functions library.
--   now          the server's time in µs since the epoch (TIME: the store's clock, never the
--                client's), read by clock() at the start of every call
--   int(x)       a number formatted as an integer (%d, never tostring's exponent form)
--   corrupt(w)   fails the script with 'TESSERA_CORRUPT <w>' (the client maps it to
--                Error::Corrupt)
--   num(s, w)    tonumber(s), or corrupt(w) if s is not a number

local now = 0

local function clock()
  local time = redis.call('TIME')
  now = tonumber(time[1]) * 1000000 + tonumber(time[2])
end

local function int(x)
  return string.format('%d', x)
end

local function corrupt(what)
  return error({err = 'TESSERA_CORRUPT ' .. what})
end

local function num(s, what)
  local n = tonumber(s)
  if n == nil then corrupt(what) end
  return n
end
