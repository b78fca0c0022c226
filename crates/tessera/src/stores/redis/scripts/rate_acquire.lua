-- rate_acquire: the limiter's decision (charge() in rate_prelude.lua).
-- KEYS: see rate_prelude.lua.
-- ARGV: [1] canonical limits, [2] N,L,T per limit (flat), [3] burst (0: exact mode),
--       [4] cost k, [5] max wait in µs (-1: try, admit only now), [6] update (1: replace
--       differing stored limits)
-- Reply: {'admitted', at, now, reservation} | {'limited', retry_at, now} |
--        {'mismatch', stored limits}

return charge(ARGV[1], ARGV[2], num(ARGV[3], 'burst'), num(ARGV[4], 'cost'),
  num(ARGV[5], 'max wait'), ARGV[6] == '1')
