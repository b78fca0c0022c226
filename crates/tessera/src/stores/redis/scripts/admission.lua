-- tessera admission prelude: after prelude.lua, in front of admit.lua and give_back.lua,
-- which act on a semaphore and the limiter of the same name in one step (see
-- docs/admission.md). The rate helpers of rate_prelude.lua are kept inside a function of
-- their own here (the two preludes share names), and these scripts reach them as
-- rate_charge (charge) and rate_undo (undo), on the clock that begin() read for the step.
--
-- KEYS: the semaphore's keys as prelude.lua takes them (meta alone; every key on a
-- cluster), then the limiter's state and log, all under the hash tag {<prefix>:<name>}.

local rate_keys, rate_charge, rate_undo = (function()
@RATE_PRELUDE@
return use_keys, charge, undo
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
