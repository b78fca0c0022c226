-- rate_cancel: returns the latest admission if it is the one named and not yet due, or with
-- ARGV[3] = 1 due or not (undo() in rate_prelude.lua).
-- KEYS: see rate_prelude.lua.
-- ARGV: [1] reservation id, [2] its admit time (µs), [3] 1: due or not (optional)
-- Reply: 1 if returned, 0 if not (nothing changed)

return undo(num(ARGV[1], 'reservation'), num(ARGV[2], 'reservation time'), ARGV[3] == '1')
