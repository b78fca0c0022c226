#!/usr/bin/env bash
# What idle clients cost a PostgreSQL server: N `tessera run` processes each hold a permit of
# a semaphore of their own and sleep; after they settle, the server's CPU time over 10 s (its
# postmaster and every backend, from /proc) and its backend count are printed. The server must
# be local (its data directory gives the postmaster's pid) and accept N × 2 + a few
# connections (`max_connections`).
#
#   scripts/pg-idle-clients.sh PGDATA URL [N] [TESSERA_BIN]
#   scripts/pg-idle-clients.sh /tmp/pg/data 'postgres://postgres@127.0.0.1:5499/postgres?schema=idle' 120
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:?PGDATA}
url=${2:?store URL}
n=${3:-100}
bin=${4:-}
if [[ -z $bin ]]; then
  cargo build -q --release -p tessera-cli
  bin=${CARGO_TARGET_DIR:-target}/release/tessera
fi
pm=$(head -1 "$data/postmaster.pid")
ticks() {
  local t=0 a b p
  for p in "$pm" $(pgrep -P "$pm"); do
    if read -r a b < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null); then
      t=$((t + a + b))
    fi
  done
  echo "$t"
}
pids=()
for i in $(seq 1 "$n"); do
  "$bin" --store "$url" run --name "idle-$i" --permits 1 -- sleep 25 &
  pids+=($!)
done
sleep 8
t0=$(ticks)
sleep 10
t1=$(ticks)
hz=$(getconf CLK_TCK)
echo "$n idle clients: server CPU $(((t1 - t0) * 1000 / hz)) ms in 10 s, $(pgrep -P "$pm" | wc -l) server processes"
wait "${pids[@]}"
