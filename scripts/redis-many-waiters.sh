#!/usr/bin/env bash
# What one process keeping N waiters queued costs a Redis server and itself: a `tessera run`
# holds the only permit, a `tessera-worker` queues N waiters behind it (waiter TTL 3 s, so
# each heartbeats once a second), and once the queue is full the script measures, over 10 s,
# the server's CPU (`INFO cpu`), its `FCALL`s and the time inside them (`INFO commandstats`),
# and the worker's CPU (`/proc/PID/stat`). Point it at a server no one else uses: the
# figures are the whole server's.
#
#   scripts/redis-many-waiters.sh redis://127.0.0.1:6379 [N] [TARGET_DIR]
#
# TARGET_DIR holds release builds of `tessera` and `tessera-worker` (default: built here).
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:?redis URL}
n=${2:-10000}
dir=${3:-}
if [[ -z $dir ]]; then
  cargo build -q --release -p tessera-cli -p tessera-testkit --bin tessera --bin tessera-worker
  dir=${CARGO_TARGET_DIR:-target}
fi
host_port=${url#redis://}
host_port=${host_port%%/*}
host_port=${host_port%%\?*}
cli=(redis-cli -h "${host_port%:*}" -p "${host_port##*:}")
prefix="waiters$RANDOM"
store="$url?prefix=$prefix"
[[ $url == *\?* ]] && store="$url&prefix=$prefix"
log=$(mktemp)
trap 'rm -f "$log"; kill -9 "${worker:-0}" "${holder:-0}" 2>/dev/null || true' EXIT

"$dir/release/tessera" --store "$store" run --name many --permits 1 --ttl 60s -- sleep 60 &
holder=$!
until "$dir/release/tessera" --store "$store" status many >/dev/null 2>&1; do sleep 0.05; done
"$dir/release/tessera-worker" --store "$store" --name many --permits 1 --ops 0 --log "$log" \
  --worker w --waiters "$n" --waiter-ttl-ms 3000 --ttl-ms 30000 --duration-ms 50000 >/dev/null &
worker=$!
queued() { "${cli[@]}" zcard "{$prefix:many}:queue"; }
for _ in $(seq 1 300); do
  [[ $(queued) -ge $n ]] && break
  sleep 0.1
done
sleep 2
cpu() { "${cli[@]}" info cpu | tr -d '\r' | awk -F: '/used_cpu_(sys|user):/ {s += $2} END {print s}'; }
fcall() { "${cli[@]}" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_fcall:calls=\([0-9]*\),usec=\([0-9]*\),.*/\1 \2/p'; }
ticks() { awk '{print $14 + $15}' "/proc/$worker/stat"; }
q0=$(queued) c0=$(cpu) f0=$(fcall) t0=$(ticks)
sleep 10
q1=$(queued) c1=$(cpu) f1=$(fcall) t1=$(ticks)
read -r calls0 usec0 <<<"${f0:-0 0}"
read -r calls1 usec1 <<<"${f1:-0 0}"
hz=$(getconf CLK_TCK)
echo "queued $q0 -> $q1 of $n"
awk -v a="$c0" -v b="$c1" 'BEGIN {printf "Redis CPU %.1f%% of a core\n", (b - a) * 10}'
echo "FCALL $(( (calls1 - calls0) / 10 ))/s, Redis time inside them $(( (usec1 - usec0) / 10000 )) ms/s"
awk -v a="$t0" -v b="$t1" -v hz="$hz" 'BEGIN {printf "waiting process CPU %.1f%% of a core\n", (b - a) * 10 / hz}'
