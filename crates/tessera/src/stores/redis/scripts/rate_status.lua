-- rate_status: the state after pruning, with the whole log (at most N of the longest limit
-- plus reservations); the snapshot is computed by the client with the shared engine.
-- KEYS: see rate_prelude.lua.
-- ARGV: none
-- Reply: {'none'} | {'state', now, cfg, seq, tail, last, prev_last, p, base, tat, prev_tat,
--                    {entry, ...}, expired}   (expired: admissions given back past their
--                    use-by instant, give_back.lua)

local S = load()
if S == nil then
  return {'none'}
end
S.lim_text = lim_text(S.lim)
prune(S)
save(S)
return {'state', now, S.cfg, S.seq, S.tail, S.last, S.prev_last, S.p, S.base, join(S.tat),
  join(S.prev_tat), rcall('ZRANGE', K_LOG, 0, -1),
  tonumber(rcall('HGET', K_STATE, 'expired') or '0')}
