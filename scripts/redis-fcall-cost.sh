#!/usr/bin/env bash
# Where a W1 pair's Redis time goes: tessera's uncontended acquire + release run inside
# Redis, beside the bare commands they issue and an empty function, each timed by the
# server itself (INFO commandstats, µs per FCALL):
#
#   pair, loop        the acquire and release function bodies, called N times in one FCALL:
#                     the scripts' own cost with everything hot in the caches
#   commands, loop    the pair's 6 commands (TIME, HMGET, HSET twice), N times in one FCALL
#   pair, 1 per call  one acquire + release per FCALL (redis-benchmark, 1 connection)
#   commands, 1 per call: the pair's 6 commands, one FCALL each time
#   call, 1 per call  one acquire's 3 commands (TIME, HMGET, HSET) and nothing else: twice
#                     this is the least a W1 pair (two FCALLs, an acquire and a release) can
#                     cost the server with tessera's commands
#   empty, 1 per call an FCALL of a function that only returns
#
#   scripts/redis-fcall-cost.sh PORT [N]      (N: iterations per loop, default 20000)
#
# PORT: a Redis 7 no one else uses (a throwaway `redis-server --port PORT --save ''`). The
# script loads tessera's library there by running `tessera status` (TESSERA_BIN, default
# target/release/tessera), copies it as a library of its own with the two bodies callable
# from a loop, measures, and deletes that copy and its keys.
set -euo pipefail
cd "$(dirname "$0")/.."
port=${1:?usage: redis-fcall-cost.sh PORT [N]}
n=${2:-20000}
bin=${TESSERA_BIN:-target/release/tessera}
r=(redis-cli -p "$port")
[[ -x $bin ]] || { echo "no $bin: cargo build --release -p tessera-cli, or set TESSERA_BIN" >&2; exit 1; }
command -v redis-benchmark >/dev/null || { echo "install redis-tools (redis-benchmark)" >&2; exit 1; }

"$bin" status fcall-cost-probe --store "redis://127.0.0.1:$port" >/dev/null 2>&1 || true
dir=$(mktemp -d)
trap '"${r[@]}" FUNCTION DELETE tcost >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
"${r[@]}" --raw FUNCTION LIST LIBRARYNAME 'tessera_*' WITHCODE > "$dir/list"

python3 - "$dir/list" "$dir/cost.lua" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
# The first library listed: its code runs from the line after `library_code` to the next
# library's `library_name`, if any.
code = text[text.index('library_code\n') + len('library_code\n'):]
code = code.split('\nlibrary_name\n')[0].rstrip('\n') + '\n'
lib = re.match(r'#!lua name=(tessera_[0-9a-f]+)', code).group(1)
# A library of its own: its own name, its functions renamed (function names are global).
code = code.replace('#!lua name=' + lib, '#!lua name=tcost\nlocal ACQ, REL', 1)
code = code.replace("'" + lib + '_', "'tcost_")
for op, var in (('acquire', 'ACQ'), ('release', 'REL')):
    m = re.search(r"redis\.register_function\{function_name = ('tcost_%s'), flags = (\{[^}]*\}), "
                  r"callback = function\(KEYS, ARGV\)\n" % op, code)
    end = code.index('\nend}\n', m.end())
    code = (code[:m.start()] + var + ' = function(KEYS, ARGV)\n' + code[m.end():end] +
            '\nend\nredis.register_function{function_name = %s, flags = %s, callback = %s}\n'
            % (m.group(1), m.group(2), var) + code[end + len('\nend}\n'):])
code += r'''
-- ARGV: wake channel base, iterations. The acquire's arguments are a W1 client's: capacity
-- 10, weight 1, a 30 s lease, a 10 s waiter heartbeat (it would wait), no queue cap.
local LEASE = 'fcall-cost-0000000000000000000'
redis.register_function('tcost_pair', function(KEYS, ARGV)
  local a = {ARGV[1], '10', LEASE, '1', '30000000', 'fcall-cost', 'client-1.g', '10000000',
    '4294967295'}
  local r = {ARGV[1], LEASE}
  for _ = 1, 0 + ARGV[2] do
    ACQ(KEYS, a)
    REL(KEYS, r)
  end
  return 1
end)
-- The pair's commands alone, with the fields an acquire and a release write.
local REC = '1\t0\t1764000000000000\t1764000000000000\t1764000030000000\tclient-1.g\tfcall-cost'
redis.register_function('tcost_commands', function(KEYS, ARGV)
  local call, meta = redis.call, KEYS[1]
  for _ = 1, 0 + ARGV[2] do
    call('TIME')
    call('HMGET', meta, 'cap', 'used', 'fence', 'seq', 'seat_high', 'qlen', 'purge_at',
      'deadline', 'lid', 'lrec', 'lexp')
    call('HSET', meta, 'used', '1', 'fence', '1764000000000000', 'seat_high', '1',
      'purge_at', '1764000030000000', 'lid', LEASE, 'lrec', REC, 'lexp', '1764000030000000')
    call('TIME')
    call('HMGET', meta, 'cap', 'used', 'fence', 'seq', 'seat_high', 'qlen', 'purge_at',
      'deadline', 'lid', 'lrec', 'lexp')
    call('HSET', meta, 'used', '0', 'seat_high', '0', 'purge_at', '9007199254740991',
      'lid', '', 'lrec', '', 'lexp', '')
  end
  return 1
end)
-- An acquire's commands alone, one call: what a call of a W1 pair costs without any logic.
redis.register_function('tcost_call', function(KEYS)
  redis.call('TIME')
  redis.call('HMGET', KEYS[1], 'cap', 'used', 'fence', 'seq', 'seat_high', 'qlen', 'purge_at',
    'deadline', 'lid', 'lrec', 'lexp')
  redis.call('HSET', KEYS[1], 'used', '1', 'fence', '1764000000000000', 'seat_high', '1',
    'purge_at', '1764000030000000', 'lid', LEASE, 'lrec', REC, 'lexp', '1764000030000000')
  return 1
end)
redis.register_function('tcost_empty', function() return 1 end)
'''
open(sys.argv[2], 'w').write(code)
PY
"${r[@]}" -x FUNCTION LOAD REPLACE < "$dir/cost.lua" >/dev/null

keys="{fc}:meta {fc}:holders {fc}:leases {fc}:queue {fc}:waiters {fc}:wexp {fc}:seats {fc}:fence"
per_call() { # label, divisor, FCALL arguments... → µs per FCALL / divisor
  local label=$1 div=$2; shift 2
  "${r[@]}" DEL $keys >/dev/null
  "${r[@]}" CONFIG RESETSTAT >/dev/null
  "$@" >/dev/null
  "${r[@]}" INFO commandstats | tr -d '\r' |
    awk -F'[=,]' -v l="$label" -v d="$div" '/^cmdstat_fcall:/ {printf "%-26s %7.2f µs\n", l, $4 / $2 / d}'
}
echo "Redis time per FCALL, per pair in the loops (INFO commandstats), N=$n:"
per_call "pair, loop" "$n" "${r[@]}" FCALL tcost_pair 1 "{fc}:meta" "{fc}:wake:" "$n"
per_call "commands, loop" "$n" "${r[@]}" FCALL tcost_commands 1 "{fc}:meta" "{fc}:wake:" "$n"
for f in pair commands call empty; do
  per_call "$f, 1 per call" 1 redis-benchmark -p "$port" -c 1 -n "$n" -q \
    FCALL "tcost_$f" 1 "{fc}:meta" "{fc}:wake:" 1
done
"${r[@]}" DEL $keys >/dev/null
