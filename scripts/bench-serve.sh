#!/usr/bin/env bash
# Benchmarks tessera serve over HTTP with wrk (Debian package `wrk`): not a test, figures.
#
#   scripts/bench-serve.sh [SECONDS]       # default 10 s per run
#
# 1. rate `try` decisions over HTTP, 8 keep-alive connections (2 wrk threads), memory store;
# 2. the same on a local Redis (a throwaway redis-server), next to the library's own
#    decisions/s on the same server (`tessera bench --workload rate`, 8 clients);
# 3. semaphore acquire+release pairs over HTTP on Redis, 1 connection, next to the library's
#    W1 pairs/s (`tessera bench --workload w1`) on the same server.
# Targets (docs/performance.md): 1. >= 20,000/s with p99 <= 5 ms; 2. >= 60% of the library;
# 3. >= 50% of the library's W1. Uses the release build (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
for p in wrk redis-server redis-cli; do
  command -v "$p" >/dev/null || { echo "bench-serve.sh: $p is missing (apt-get install wrk redis-server redis-tools)" >&2; exit 1; }
done
cargo build --release -q -p tessera-cli
bin=target/release/tessera
tmp=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_serve() { # start_serve STORE TAG: a server in the background; url_of TAG gives its URL
  "$bin" --store "$1" serve --listen 127.0.0.1:0 >"$tmp/serve.$2" 2>&1 &
  pids+=($!)
}
url_of() {
  for _ in $(seq 100); do
    url=$(grep -o 'http://[0-9.:]*' "$tmp/serve.$1" 2>/dev/null || true)
    [[ -n $url ]] && { echo "$url"; return; }
    sleep 0.05
  done
  echo "bench-serve.sh: tessera serve did not start: $(cat "$tmp/serve.$1")" >&2; exit 1
}

json() { grep '^JSON ' | sed 's/^JSON //'; }

echo "== 1. rate try over HTTP, memory store, 8 connections, ${secs}s"
start_serve memory:// mem
mem=$(url_of mem)
wrk -t2 -c8 -d"${secs}s" --latency -s scripts/bench-serve/rate_try.lua "$mem" | json

rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" >/dev/null &
pids+=($!)
for _ in $(seq 100); do redis-cli -p "$rport" ping >/dev/null 2>&1 && break; sleep 0.05; done
redis="redis://127.0.0.1:$rport"

echo "== 2. rate try over HTTP, Redis, 8 connections, ${secs}s"
start_serve "$redis" redis
red=$(url_of redis)
wrk -t2 -c8 -d"${secs}s" --latency -s scripts/bench-serve/rate_try.lua "$red" | json
echo "== 2. the library's own decisions/s on the same Redis (8 clients)"
"$bin" --store "$redis" bench --workload rate --rate-mode decisions --clients 8 \
  --rates 50/s,1000/min --rate-run "${secs}s" --duration "$((secs + 20))s" --json

echo "== 3. acquire+release over HTTP, Redis, 1 connection, ${secs}s"
wrk -t1 -c1 -d"${secs}s" --latency -s scripts/bench-serve/acquire_release.lua "$red" | json
echo "== 3. the library's W1 on the same Redis"
"$bin" --store "$redis" bench --workload w1 --ops 20000 --duration "$((secs + 20))s" --json
