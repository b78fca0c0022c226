#!/usr/bin/env bash
# The W1 loop (1 client, acquire + release) of `tessera bench` beside the Node library
# redis-semaphore (npm) on the same Redis, in one run: a semaphore of capacity 10 beside its
# `Semaphore`, then a lock (capacity 1) beside its `Mutex`; with the server's CPU per pair
# (INFO cpu deltas around each program; for tessera also its loop alone, as `bench` reports
# it) and its commands per pair (INFO commandstats). redis-semaphore and ioredis
# are installed into a temporary folder at each run; nothing third-party is kept.
#
#   scripts/bench-redis-libs.sh PORT [PAIRS] [TESSERA_BIN...]
#
# PORT: a Redis no one else uses (the script runs FLUSHALL and CONFIG RESETSTAT between runs).
# PAIRS: acquire+release pairs per run (default 20000). TESSERA_BIN: the tessera binaries to
# run (default target/release/tessera); several compare builds in the same run.
set -euo pipefail
port=${1:?usage: bench-redis-libs.sh PORT [PAIRS] [TESSERA_BIN...]}
pairs=${2:-20000}
shift $(( $# >= 2 ? 2 : 1 ))
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(target/release/tessera)
r=(redis-cli -p "$port")

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
for cap in 10 1; do
  [[ $cap == 1 ]] && kind=mutex label="lock (capacity 1)" || kind=semaphore label="semaphore (capacity 10)"
  echo "== $label"
  for bin in "${bins[@]}"; do
    run "tessera ($(basename "$bin"))" "$bin" --store "redis://127.0.0.1:$port" bench --workload w1 \
      --capacity "$cap" --ops "$pairs" --json
  done
  run "redis-semaphore $kind (node)" node "$dir/w1.js" "$port" "$pairs" "$kind"
done
