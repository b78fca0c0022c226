#!/usr/bin/env bash
# Hand-offs between separate `tessera run` processes, as shell users run them: N processes
# start at once on a lock (capacity 1), each holds it for 50 ms and exits. Prints the wall
# time for all N (ideal: N × 50 ms, plus start-up), and, on a MySQL/MariaDB URL, the
# server's connections while N processes hold permits of a 100-permit semaphore (a process
# that never waits opens no doorbell).
#
#   scripts/cli-handoffs.sh URL [N] [TESSERA_BIN]
#   scripts/cli-handoffs.sh mysql://root@127.0.0.1:3306/test 20
set -euo pipefail
cd "$(dirname "$0")/.."
url=${1:?store URL}
n=${2:-20}
bin=${3:-}
if [[ -z $bin ]]; then
  cargo build -q --release -p tessera-cli
  bin=${CARGO_TARGET_DIR:-target}/release/tessera
fi
name="handoff-$RANDOM"
start=$(date +%s.%N)
for _ in $(seq "$n"); do
  "$bin" --store "$url" run --name "$name" --permits 1 --ttl 30s --wait 120s -- sleep 0.05 &
done
wait
end=$(date +%s.%N)
echo "$n processes on one lock, 50 ms each: $(echo "$end - $start" | bc) s (ideal $(echo "$n * 0.05" | bc) s)"

if [[ $url == mysql://* || $url == mariadb://* ]] && command -v mariadb >/dev/null; then
  # Host, port and user of the URL, for the `mariadb` client (no password in the URL).
  rest=${url#*://}
  user=${rest%%@*}
  hostport=${rest#*@}
  hostport=${hostport%%/*}
  host=${hostport%%:*}
  port=${hostport#*:}
  [[ $port == "$hostport" ]] && port=3306
  connected() {
    mariadb -h "$host" -P "$port" -u "$user" -N -e "SHOW STATUS LIKE 'Threads_connected'" | awk '{print $2}'
  }
  before=$(connected)
  for _ in $(seq "$n"); do
    "$bin" --store "$url" run --name "$name-hold" --permits 100 --ttl 30s -- sleep 6 &
  done
  sleep 4
  during=$(connected)
  wait
  echo "$n holders: $((during - before)) server connections"
fi
