#!/usr/bin/env bash
# A waiting `tessera run` killed outright (SIGKILL) while another holds the lock, then the
# holder's release: how long until the next run gets the lock. The release hands the permit
# to the killed waiter (its queue entry still lives); the figure is how long that grant
# keeps the permit. Lease TTL 30 s, waiter TTL 5 s (the defaults).
#
#   scripts/killed-waiter.sh URL [TESSERA_BIN]
#   scripts/killed-waiter.sh sqlite:///tmp/kw.db
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:?store URL}
bin=${2:-}
if [[ -z $bin ]]; then
  cargo build -q --release -p tessera-cli
  bin=${CARGO_TARGET_DIR:-target}/release/tessera
fi
name="killed-waiter-$RANDOM"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
args=(--store "$url" run --name "$name" --permits 1 --ttl 30s --wait 120s)

"$bin" "${args[@]}" -- sh -c "while [ ! -e $dir/go ]; do sleep 0.02; done" &
holder=$!
until "$bin" --store "$url" status "$name" >/dev/null 2>&1; do sleep 0.05; done
# The tessera process itself (not a subshell), so that SIGKILL reaches it.
"$bin" "${args[@]}" -- true &
waiter=$!
# Until the store has the waiter queued.
until "$bin" --store "$url" status "$name" --json | grep -q '"queue":\[{'; do sleep 0.05; done
kill -KILL "$waiter"
wait "$waiter" 2>/dev/null || true
touch "$dir/go"
wait "$holder"
start=$(date +%s.%N)
"$bin" "${args[@]}" -- true
end=$(date +%s.%N)
echo "next run got the lock $(echo "$end - $start" | bc) s after the release (lease TTL 30 s, waiter TTL 5 s)"
