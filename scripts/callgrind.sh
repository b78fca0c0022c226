#!/usr/bin/env bash
# Instructions per uncontended acquire + release on the memory store, next to
# tokio::sync::Semaphore, counted by callgrind (repeatable whatever the machine is doing).
# The count is the difference between a run of PAIRS and a run of PAIRS/2, halved, so the
# start-up cost drops out.
#
#   bash scripts/callgrind.sh [PAIRS]      (default 20000; valgrind from Debian)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-20000}
command -v valgrind >/dev/null || { echo "install valgrind: sudo apt-get install -y valgrind" >&2; exit 1; }
bin=$(cargo bench -p tessera --bench hot_path --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*hot_path[^"]*\)".*/\1/p' | tail -1)
[[ -x $bin ]] || { echo "hot_path bench did not build" >&2; exit 1; }
count() { # case pairs → total instructions
  local out; out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$bin" "$1" "$2" >/dev/null 2>&1
  sed -n 's/^summary: //p' "$out"; rm -f "$out"
}
for case in tokio memory; do
  full=$(count "$case" "$pairs"); half=$(count "$case" $((pairs / 2)))
  echo "$case: $(( (full - half) / (pairs - pairs / 2) )) instructions per acquire+release"
done
