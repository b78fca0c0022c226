#!/usr/bin/env bash
# Instructions per acquire + release on the memory store, next to tokio::sync::Semaphore,
# counted by callgrind (repeatable whatever the machine is doing): one task uncontended, and
# 32 tasks on 4 permits (the cases of benches/hot_path.rs). Each count is the difference
# between a run of PAIRS and a run of PAIRS/2, over the PAIRS/2 more pairs, so the start-up
# cost drops out. For the memory store it also prints the share of its own steps: the store's
# calls (the model's lock, clock reads and step, and the delivery of wake-ups) and, inside
# them, the model's step alone (`Model::acquire` and `Model::release`, inclusive).
#
#   bash scripts/callgrind.sh [PAIRS]      (default 20000; valgrind from Debian)
set -euo pipefail
cd "$(dirname "$0")/.."
pairs=${1:-20000}
command -v valgrind >/dev/null || { echo "install valgrind: sudo apt-get install -y valgrind" >&2; exit 1; }
bin=$(cargo bench -p tessera-locks --bench hot_path --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*hot_path[^"]*\)".*/\1/p' | tail -1)
[[ -x $bin ]] || { echo "hot_path bench did not build" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
profile() { # case pairs → profile file
  valgrind --tool=callgrind --callgrind-out-file="$dir/$1.$2" "$bin" "$1" "$2" >/dev/null 2>&1
  echo "$dir/$1.$2"
}
total() { sed -n 's/^summary: //p' "$1"; }
# Inclusive instructions of the functions whose names match the pattern, summed.
inclusive() {
  callgrind_annotate --inclusive=yes --threshold=100 "$1" 2>/dev/null |
    awk -v pat="$2" '$0 ~ pat { gsub(",", "", $1); s += $1 } END { print s + 0 }'
}
MODEL='ops::Model::(acquire|release) [[]'
STEPS='MemoryBackend as tessera::seam::Backend>::(acquire_now|release_now) [[]'
half=$((pairs / 2)); more=$((pairs - half))
for case in tokio memory tokio-contended memory-contended; do
  full=$(profile "$case" "$pairs"); part=$(profile "$case" "$half")
  line="$case: $(( ($(total "$full") - $(total "$part")) / more )) instructions per acquire+release"
  if [[ $case == memory* ]]; then
    steps=$(( ($(inclusive "$full" "$STEPS") - $(inclusive "$part" "$STEPS")) / more ))
    model=$(( ($(inclusive "$full" "$MODEL") - $(inclusive "$part" "$MODEL")) / more ))
    line+=" (the store's calls $steps, of which the model's step $model)"
  fi
  echo "$line"
done
