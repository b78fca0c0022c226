#!/usr/bin/env bash
# A rolling upgrade on Redis, tried for real: clients of two builds (OLD and NEW, each a
# directory holding `tessera` and `tessera-worker`) on the same semaphores of one throwaway
# `redis-server`. Each build calls its own function library (named by a hash of its code),
# so what must hold is the data: neither build may over-grant, lose a permit or strand a
# waiter because the other wrote the state.
#
#   scripts/redis-mixed-versions.sh OLD_DIR NEW_DIR [PROCESSES_PER_BUILD] [OPS]
#
# 1. Contention: PROCESSES_PER_BUILD workers of each build (default 4) share 2 permits, OPS
#    acquires each (default 300, holds of 0–5 ms); the grant logs must never show more than 2
#    holders at once (a holder counts from the return of its grant to the call of its release,
#    which is inside its lease).
# 2. A holder of one build takes a lock (TTL 2 s) and is SIGKILLed; the other build's acquire
#    must get it back once the TTL has passed. A NEW holder's inline lease is purged only by a
#    step of NEW (known, see the Redis store's docs): the OLD acquire must be granted once a
#    NEW `tessera status` runs, 4 s after the kill.
# 3. For each order: a waiter of one build waits behind a holder of the other, which then
#    exits; the waiter must be granted at once, not at its next heartbeat.
#
# Prints one line per check and exits 1 if any failed.
set -euo pipefail
old=${1:?usage: redis-mixed-versions.sh OLD_DIR NEW_DIR [PROCESSES_PER_BUILD] [OPS]}
new=${2:?usage: redis-mixed-versions.sh OLD_DIR NEW_DIR [PROCESSES_PER_BUILD] [OPS]}
procs=${3:-4}
ops=${4:-300}
for b in "$old" "$new"; do
  for p in tessera tessera-worker; do
    [[ -x $b/$p ]] || { echo "no $b/$p (build it: cargo build --release -p tessera-cli -p tessera-testkit)" >&2; exit 2; }
  done
done

dir=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log"
trap 'kill "$(cat "$dir/redis.pid")" 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done
url=redis://127.0.0.1:$port
failed=0
check() { # label, ok(0/1), detail
  if [[ $2 == 0 ]]; then echo "ok    $1: $3"; else echo "FAIL  $1: $3"; failed=1; fi
}

# 1. Contention.
mkdir "$dir/logs"
for i in $(seq 1 "$procs"); do
  for b in old new; do
    bin=$old; [[ $b == new ]] && bin=$new
    "$bin/tessera-worker" --store "$url" --name mixed --permits 2 --ops "$ops" \
      --hold-ms-max 5 --try-ratio 0.2 --timeout-ratio 0.2 --timeout-ms 20 --ttl-ms 5000 \
      --seed "$i" --log "$dir/logs/$b$i.jsonl" --worker "$b$i" >/dev/null &
  done
done
wait
summary=$(python3 - "$dir/logs" 2 <<'PY'
import glob, json, sys
d, cap = sys.argv[1], int(sys.argv[2])
edges, grants, per = [], 0, {}
open_at = {}
for f in glob.glob(d + "/*.jsonl"):
    for line in open(f):
        e = json.loads(line)
        ev = e["event"]
        if ev == "acquire_returned" and e["outcome"]["result"] == "granted":
            o = e["outcome"]
            open_at[o["lease_id"]] = (e["t_ns"], o["weight"])
            grants += 1
            w = e["worker"][:3]
            per[w] = per.get(w, 0) + 1
        elif ev == "release_invoked" and e["lease_id"] in open_at:
            t0, w = open_at.pop(e["lease_id"])
            edges += [(t0, w), (e["t_ns"], -w)]
# Releases first at equal instants: a hand-off is not an overlap.
edges.sort(key=lambda x: (x[0], x[1]))
held = peak = 0
for _, d in edges:
    held += d
    peak = max(peak, held)
print(f"{grants} grants ({per.get('old', 0)} old, {per.get('new', 0)} new), at most {peak} held at once, capacity {cap}, {len(open_at)} never released")
sys.exit(0 if peak <= cap and not open_at and per.get('old') and per.get('new') else 1)
PY
) && ok=0 || ok=1
check "contention, $procs + $procs workers on 2 permits" "$ok" "$summary"

ms() { date +%s%3N; }

# 2. A killed holder of one build; the other build takes the lock back after the TTL.
kill_holder() { # build dir, name: a holder of the lock NAME (TTL 2 s), SIGKILLed once it holds
  "$1/tessera" --store "$url" run --name "$2" --permits 1 --ttl 2s -- sleep 60 &
  local holder=$!
  for _ in $(seq 100); do
    [[ $(redis-cli -p "$port" EXISTS "{tessera:$2}:meta") == 1 ]] && break
    sleep 0.05
  done
  sleep 0.3
  kill -9 "$holder"; wait "$holder" 2>/dev/null || true
}
kill_holder "$old" killed-old
t0=$(ms)
if "$new/tessera" --store "$url" run --name killed-old --permits 1 --wait 8s -- true; then
  check "a killed old holder, then a new acquire" 0 "granted $(( $(ms) - t0 )) ms after the kill (TTL 2000 ms)"
else
  check "a killed old holder, then a new acquire" 1 "not granted within 8 s of the kill (TTL 2000 ms)"
fi
# A new holder's lease may be inline (in the meta hash), which an old build's steps never
# purge: an old acquire alone waits for it until a step of the new build runs on the
# semaphore (here a new `tessera status`, 4 s after the kill). See the Redis store's docs.
kill_holder "$new" killed-new
t0=$(ms)
"$old/tessera" --store "$url" run --name killed-new --permits 1 --wait 10s -- \
  sh -c "date +%s%3N > '$dir/granted-killed-new'" &
waiter=$!
sleep 4
stepped=$(ms)
"$new/tessera" --store "$url" status killed-new >/dev/null 2>&1 || true
if wait "$waiter"; then
  at=$(cat "$dir/granted-killed-new")
  if (( at < stepped )); then
    check "a killed new holder, then an old acquire" 0 "granted $(( at - t0 )) ms after the kill"
  else
    echo "known: a killed new holder's inline lease waited for a step of the new build (old steps do not purge it)"
    check "a killed new holder, an old acquire, then a new status" 0 "granted $(( at - stepped )) ms after the new build's status ($(( at - t0 )) ms after the kill)"
  fi
else
  check "a killed new holder, an old acquire, then a new status" 1 "not granted within 10 s of the kill"
fi

# 3. A waiter of one build behind a holder of the other.
for order in "old new" "new old"; do
  set -- $order
  holder_bin=$old; [[ $1 == new ]] && holder_bin=$new
  waiter_bin=$old; [[ $2 == new ]] && waiter_bin=$new
  name=handoff-$1
  "$holder_bin/tessera" --store "$url" run --name "$name" --permits 1 --ttl 10s -- sleep 1.5 &
  holder=$!
  sleep 0.5
  "$waiter_bin/tessera" --store "$url" run --name "$name" --permits 1 --wait 8s -- \
    sh -c "date +%s%3N > '$dir/granted-$name'" &
  waiter=$!
  wait "$holder"
  released=$(ms)
  if wait "$waiter"; then
    lag=$(( $(cat "$dir/granted-$name") - released ))
    [[ $lag -lt 500 ]] && ok=0 || ok=1
    check "a $2 waiter behind a $1 holder" "$ok" "its command ran ${lag} ms after the holder exited"
  else
    check "a $2 waiter behind a $1 holder" 1 "not granted within 8 s"
  fi
done
exit "$failed"
