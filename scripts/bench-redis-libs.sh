#!/usr/bin/env bash
# `tessera bench`'s workloads beside the Node library redis-semaphore (npm) on the same Redis,
# in one run:
# - W1 (1 client, acquire + release): a semaphore of capacity 10 beside its `Semaphore`, then
#   a lock (capacity 1) beside its `Mutex`; with the server's CPU per pair (INFO cpu deltas
#   around each program; for tessera also its loop alone, as `bench` reports it) and its
#   commands per pair (INFO commandstats);
# - W2 (8 clients on a lock, hold 0) beside its `Mutex`, and W3 (32 clients, capacity 4)
#   beside its `Semaphore`: every client on a connection of its own, doing what `bench` does
#   around each grant (an INCR and a DECR of an independent holder count, the over-grant
#   check); grants/s, hand-offs/s (grants to another client than the one before), the wait of
#   each acquire (p50, p99, max), grants per client, over-grants, and Redis CPU per grant (the
#   whole program). redis-semaphore runs with its defaults: a waiting acquire polls every 10
#   ms. A client still waiting when SECONDS_MAX (default 60) seconds have passed stops, and
#   its program reports what was done by then.
# redis-semaphore and ioredis are installed into a temporary folder at each run; nothing
# third-party is kept.
#
#   scripts/bench-redis-libs.sh PORT [PAIRS] [TESSERA_BIN...]
#   WORKLOADS="w2 w3" scripts/bench-redis-libs.sh PORT 20000      # only some (default w1 w2 w3)
#
# PORT: a Redis no one else uses (the script runs FLUSHALL and CONFIG RESETSTAT between runs).
# PAIRS: acquire+release pairs (grants) per run (default 20000). TESSERA_BIN: the tessera
# binaries to run (default target/release/tessera); several compare builds in the same run.
set -euo pipefail
port=${1:?usage: bench-redis-libs.sh PORT [PAIRS] [TESSERA_BIN...]}
pairs=${2:-20000}
shift $(( $# >= 2 ? 2 : 1 ))
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/tessera)
r=(redis-cli -p "$port")
workloads=${WORKLOADS:-w1 w2 w3}
seconds=${SECONDS_MAX:-60}

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
(cd "$dir" && npm install --silent --no-audit --no-fund redis-semaphore ioredis >/dev/null)
cat > "$dir/w1.js" <<'JS'
const Redis = require('ioredis');
const { Semaphore, Mutex } = require('redis-semaphore');
const [port, pairs, kind] = [Number(process.argv[2]), Number(process.argv[3]), process.argv[4]];
(async () => {
  const client = new Redis({ port, host: '127.0.0.1' });
  const t0 = process.hrtime.bigint();
  const opts = { lockTimeout: 30000, acquireTimeout: 10000 };
  for (let i = 0; i < pairs; i++) {
    const s = kind === 'mutex' ? new Mutex(client, 'bench-w1', opts)
      : new Semaphore(client, 'bench-w1', 10, opts);
    await s.acquire();
    await s.release();
  }
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ pairs, seconds: secs, pairs_per_sec: pairs / secs }));
  client.disconnect();
})().catch((e) => { console.error(e); process.exit(1); });
JS
cat > "$dir/contend.js" <<'JS'
// CLIENTS clients, each on its own connection, share CAPACITY permits (capacity 1: a Mutex),
// OPS grants in all, with `bench`'s INCR/DECR holder count around each grant.
const Redis = require('ioredis');
const { Semaphore, Mutex } = require('redis-semaphore');
const [port, clients, capacity, ops, seconds] = process.argv.slice(2).map(Number);
const key = 'bench-contended', check = 'bench-contended-holders';
const opts = { lockTimeout: 30000, acquireTimeout: seconds * 1000 };
let claimed = 0, last = -1, handoffs = 0, over = 0;
const waits = [], grants = new Array(clients).fill(0);
(async () => {
  const conns = [...Array(clients)].map(() => new Redis({ port, host: '127.0.0.1' }));
  await Promise.all(conns.map((c) => c.ping()));
  const t0 = process.hrtime.bigint();
  const deadline = Date.now() + seconds * 1000;
  await Promise.all(conns.map(async (conn, id) => {
    while (claimed < ops && Date.now() < deadline) {
      claimed++;
      const lock = capacity === 1 ? new Mutex(conn, key, opts) : new Semaphore(conn, key, capacity, opts);
      const a = process.hrtime.bigint();
      try { await lock.acquire(); } catch (e) { break; } // acquireTimeout: the deadline passed
      waits.push(Number(process.hrtime.bigint() - a) / 1e6);
      grants[id]++;
      if (last !== -1 && last !== id) handoffs++;
      last = id;
      if (await conn.incr(check) > capacity) over++;
      await conn.decr(check);
      await lock.release();
    }
  }));
  const secs = Number(process.hrtime.bigint() - t0) / 1e9;
  waits.sort((x, y) => x - y);
  const q = (p) => waits[Math.min(waits.length - 1, Math.floor(p * waits.length))];
  console.log(JSON.stringify({ ops: waits.length, completed: waits.length >= ops, seconds: secs,
    ops_per_sec: waits.length / secs, handoffs_per_sec: handoffs / secs, p50_ms: q(0.5),
    p99_ms: q(0.99), max_ms: waits[waits.length - 1], grants_per_client_min: Math.min(...grants),
    grants_per_client_max: Math.max(...grants), over_grants: over }));
  conns.forEach((c) => c.disconnect());
})().catch((e) => { console.error(e); process.exit(1); });
JS

cpu() { "${r[@]}" INFO cpu | tr -d '\r' | awk -F: '/used_cpu_sys:|used_cpu_user:/{s+=$2} END{printf "%.6f", s}'; }
# Commands the server ran per pair (inside scripts included), without the benchmark's PINGs
# and this script's own INFO/CONFIG.
commands() {
  "${r[@]}" INFO commandstats | tr -d '\r' \
    | awk -F'[:,=]' '/^cmdstat_/ && $1 !~ /ping|info|config|flushall|function|script|hello|subscribe|client|select/ {s+=$3} END{print s+0}'
}
run() { # label, command...
  local label=$1; shift
  "${r[@]}" FLUSHALL >/dev/null
  "${r[@]}" CONFIG RESETSTAT >/dev/null
  local c0; c0=$(cpu)
  local out; out=$("$@")
  local c1; c1=$(cpu)
  local rate; rate=$(echo "$out" | tail -1 | sed -E 's/.*"(ops_per_sec|pairs_per_sec)":([0-9.]+).*/\2/')
  # Per pair: the whole process's Redis CPU, and, where the program measures it itself
  # (tessera: the loop alone, without its connects, warm-up and round-trip PINGs), that.
  local whole; whole=$(echo "($c1 - $c0) * 1000000 / $pairs" | bc -l)
  local own; own=$(echo "$out" | tail -1 | sed -nE 's/.*"server_cpu_us_per_grant":([0-9.]+).*/\1/p')
  [[ -n $own ]] && own=$(printf '%.1f µs' "$own")
  printf '%-28s %8.0f pairs/s  %6.1f µs Redis CPU/pair (loop alone: %s)  %5.1f commands/pair\n' \
    "$label" "$rate" "$whole" "${own:--}" "$(echo "$(commands) / $pairs" | bc -l)"
}
# One contended run: label, command... (prints a row from the program's JSON line).
run_contended() {
  local label=$1; shift
  "${r[@]}" FLUSHALL >/dev/null
  "${r[@]}" CONFIG RESETSTAT >/dev/null
  local c0; c0=$(cpu)
  local out; out=$("$@" | tail -1)
  local c1; c1=$(cpu)
  python3 - "$label" "$out" "$c0" "$c1" <<'PY'
import json, sys
label, out, c0, c1 = sys.argv[1], json.loads(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
grants = max(round(out["ops_per_sec"] * out["seconds"]), 1)
print(f"{label:<34} {out['ops_per_sec']:8.0f} grants/s {out['handoffs_per_sec']:8.0f} hand-offs/s"
      f"  wait p50 {out['p50_ms']:7.2f}  p99 {out['p99_ms']:7.2f}  max {out['max_ms']:8.2f} ms"
      f"  per client {out['grants_per_client_min']}-{out['grants_per_client_max']}"
      f"  over {out['over_grants']}  {(c1 - c0) * 1e6 / grants:6.1f} µs Redis CPU/grant"
      + ("" if out.get("completed", True) else "  (did not finish)"))
PY
}
for w in $workloads; do
  case $w in
  w1)
    for cap in 10 1; do
      [[ $cap == 1 ]] && kind=mutex label="W1 lock (capacity 1)" || kind=semaphore label="W1 semaphore (capacity 10)"
      echo "== $label"
      for bin in "${bins[@]}"; do
        run "tessera ($(basename "$bin"))" "$bin" --store "redis://127.0.0.1:$port" bench --workload w1 \
          --capacity "$cap" --ops "$pairs" --json
      done
      run "redis-semaphore $kind (node)" node "$dir/w1.js" "$port" "$pairs" "$kind"
    done ;;
  w2|w3)
    [[ $w == w2 ]] && set -- 8 1 "W2: 8 clients on a lock" Mutex || set -- 32 4 "W3: 32 clients, capacity 4" Semaphore
    echo "== $3"
    for bin in "${bins[@]}"; do
      run_contended "tessera ($(basename "$bin"))" "$bin" --store "redis://127.0.0.1:$port" bench \
        --workload "$w" --ops "$pairs" --duration "${seconds}s" --json
    done
    run_contended "redis-semaphore $4 (node)" node "$dir/contend.js" "$port" "$1" "$2" "$pairs" "$seconds" ;;
  *) echo "unknown workload $w (w1, w2, w3)" >&2; exit 2 ;;
  esac
done
