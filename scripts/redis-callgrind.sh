#!/usr/bin/env bash
# Instructions the Redis server spends per pair (W1) or grant (W2, W3) of `tessera bench`, and
# per FCALL, counted by callgrind on a throwaway redis-server (repeatable whatever else the
# machine is doing, unlike INFO cpu or commandstats). Several binaries compare builds.
#
#   scripts/redis-callgrind.sh WORKLOAD OPS TESSERA_BIN...     (e.g. w1 2000 target/release/tessera)
#
# Needs valgrind and redis-server (Debian). The server's start-up and the benchmark's PINGs
# are in the total, not in the per-FCALL figure (fcallCommand, inclusive).
set -euo pipefail
workload=${1:?usage: redis-callgrind.sh WORKLOAD OPS TESSERA_BIN...}
ops=${2:?usage: redis-callgrind.sh WORKLOAD OPS TESSERA_BIN...}
shift 2
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
for bin in "$@"; do
  dir=$(mktemp -d)
  valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" redis-server --port "$port" \
    --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" >"$dir/valgrind.log" 2>&1 &
  server=$!
  for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.2; done
  # (A benchmark that fails, e.g. W3's 32 clients timing out against the slowed server, still
  # lets the server be shut down; its figures are then marked.)
  status=0
  "$bin" --store "redis://127.0.0.1:$port" bench --workload "$workload" --ops "$ops" --json \
    >/dev/null 2>&1 || status=$?
  fcalls=$(redis-cli -p "$port" INFO commandstats | tr -d '\r' |
    sed -n 's/^cmdstat_fcall:calls=\([0-9]*\),.*/\1/p')
  redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
  wait "$server" || true
  total=$(callgrind_annotate "$dir/cg.out" 2>/dev/null | awk '/PROGRAM TOTALS/{gsub(",","",$1); print $1}')
  infcall=$(callgrind_annotate --inclusive=yes "$dir/cg.out" 2>/dev/null |
    awk '/:fcallCommand /{gsub(",","",$1); print $1}')
  printf '%-40s %s: %d instructions per op, %d per FCALL (%d FCALLs)%s\n' "$bin" "$workload" \
    $((total / ops)) $((infcall / fcalls)) "$fcalls" \
    "$( ((status == 0)) || echo " (bench exited $status: not comparable)")"
  rm -rf "$dir"
done
