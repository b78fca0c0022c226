#!/usr/bin/env bash
# Contention across processes: P `tessera-worker` processes share a semaphore of C permits on
# one store, each doing K acquire+release pairs with a hold of about zero, then the grant
# logs are summarised: grants/s, acquire wait p50/p99/max, grants per process.
#
#   scripts/contend.sh [STORE_URL] [PROCESSES] [PERMITS] [OPS_PER_PROCESS]
#   scripts/contend.sh                      # sqlite in a temp dir, 8 processes, 2 permits, 300 ops
#   TESSERA_WORKER=/path/to/tessera-worker scripts/contend.sh   # another build, side by side
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
store=${1:-sqlite://$dir/contend.db}
procs=${2:-8}
permits=${3:-2}
ops=${4:-300}
worker=${TESSERA_WORKER:-}
if [[ -z $worker ]]; then
  cargo build -q --release -p tessera-testkit --bin tessera-worker
  worker=target/release/tessera-worker
fi
for i in $(seq 1 "$procs"); do
  "$worker" --store "$store" --name contend --permits "$permits" --ops "$ops" \
    --hold-ms-max 0 --try-ratio 0 --timeout-ratio 0 --ttl-ms 10000 --seed "$i" \
    --log "$dir/w$i.jsonl" --worker "w$i" &
done
wait
python3 - "$dir" "$procs" "$permits" <<'PY'
import glob, json, sys, collections
d, procs, permits = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
inv, waits, per, first, last = {}, [], collections.Counter(), None, None
for f in glob.glob(d + "/*.jsonl"):
    for line in open(f):
        try: e = json.loads(line)
        except ValueError: continue
        t, ev = e["t_ns"], e["event"]
        first = t if first is None else min(first, t); last = t if last is None else max(last, t)
        if ev == "acquire_invoked": inv[(e["worker"], e["op"])] = t
        if ev == "acquire_returned" and e["outcome"]["result"] == "granted":
            waits.append(t - inv[(e["worker"], e["op"])]); per[e["worker"]] += 1
waits.sort()
q = lambda p: waits[min(len(waits) - 1, int(p * len(waits)))] / 1e6
secs = (last - first) / 1e9
print(f"{procs} processes, {permits} permits: {len(waits)} grants in {secs:.2f} s = {len(waits)/secs:.0f} grants/s; "
      f"wait p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, max {waits[-1]/1e6:.2f} ms; "
      f"grants per process {min(per.values())}..{max(per.values())}")
PY
