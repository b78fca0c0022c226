#!/usr/bin/env bash
# The Redis cost guard: what W1, W2 and W3 of `tessera bench` cost the server per grant,
# against the committed baseline (bench/baseline.json), so that a change that makes every
# call costlier cannot go unnoticed again.
#
#   scripts/cost-check.sh             measure, compare, exit 1 if a figure is > 25% worse
#   scripts/cost-check.sh --update    measure and write bench/baseline.json (only on purpose,
#                                     in a commit of its own that says why)
#
# Figures, per grant (a W1 pair counts as one), from the server's own `INFO commandstats`
# after `CONFIG RESETSTAT`, on a throwaway redis-server of this script's own (free loopback
# port, temporary folder, no persistence):
#   calls     FCALLs (or EVALSHAs) per grant
#   commands  every command tessera made Redis run, per grant: the calls and the commands
#             inside them (the benchmark's own over-grant check, PINGs and INFOs are left out)
#   us        Redis time inside those calls, per grant (µs)
#   ratio     us divided by the time of one plain EVALSHA of a 3-command script (TIME, HGET,
#             HSET), measured by redis-benchmark on the same server in the same run: a machine
#             that is slower today is slower for both, so the ratio holds where µs do not.
# Each workload runs RUNS times (default 3), and the medians are compared. `commands` and
# `calls` are counts, the steadiest signal; `ratio` catches a call that does the same commands
# with more work around them (a bigger prelude, more parsing, more arguments).
#
# Environment: TESSERA_BIN (default target/release/tessera, built first), RUNS (3),
# TOLERANCE (0.25). Takes about 30 s on 2 cores once the binary is built.
set -euo pipefail
cd "$(dirname "$0")/.."

update=false
[[ ${1:-} == --update ]] && update=true
bin=${TESSERA_BIN:-target/release/tessera}
runs=${RUNS:-3}
tolerance=${TOLERANCE:-0.25}
baseline=bench/baseline.json
# Grants per run: enough to dwarf the warm-up pairs each client takes before the clock starts.
declare -A OPS=([w1]=4000 [w2]=2000 [w3]=4000)

for prog in redis-server redis-cli redis-benchmark python3; do
  command -v "$prog" >/dev/null || { echo "cost-check: $prog not found (apt-get install redis-server redis-tools python3)" >&2; exit 1; }
done
# Without TESSERA_BIN, the working tree's build (cargo does nothing when it is up to date), so
# a change is never judged by a stale binary.
if [[ -z ${TESSERA_BIN:-} ]]; then
  cargo build --release -p tessera-cli --locked --quiet >&2
fi
[[ -x $bin ]] || { echo "cost-check: no $bin" >&2; exit 1; }

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dir=$(mktemp -d)
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
  --logfile "$dir/redis.log" --daemonize no >/dev/null 2>&1 &
server=$!
trap 'redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || kill "$server" 2>/dev/null; wait "$server" 2>/dev/null; rm -rf "$dir"' EXIT
r=(redis-cli -p "$port")
for _ in $(seq 100); do "${r[@]}" PING >/dev/null 2>&1 && break; sleep 0.1; done
"${r[@]}" PING >/dev/null || { echo "cost-check: redis-server did not start" >&2; exit 1; }

# The reference: one plain EVALSHA of a 3-command script, one connection.
sha=$("${r[@]}" SCRIPT LOAD "redis.call('TIME'); redis.call('HGET', KEYS[1], 'a'); redis.call('HSET', KEYS[1], 'a', '1'); return 1")
reference() {
  "${r[@]}" CONFIG RESETSTAT >/dev/null
  redis-benchmark -p "$port" -c 1 -n 20000 -q EVALSHA "$sha" 1 cost-check-ref >/dev/null 2>&1
  "${r[@]}" INFO commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p'
  "${r[@]}" DEL cost-check-ref >/dev/null
}

results=$dir/results
: >"$results"
echo "reference $(reference)" >>"$results"
for ((i = 1; i <= runs; i++)); do
  for w in w1 w2 w3; do
    "${r[@]}" CONFIG RESETSTAT >/dev/null
    report=$("$bin" --store "redis://127.0.0.1:$port/?prefix=cost-check" bench --workload "$w" \
      --ops "${OPS[$w]}" --duration 20s --rtt-time 0s --json 2>/dev/null) ||
      { echo "cost-check: tessera bench --workload $w failed" >&2; exit 1; }
    stats=$("${r[@]}" INFO commandstats | tr -d '\r' | tr '\n' ' ')
    echo "$w $(printf '%s' "$report" | tr -d '\n') ||| $stats" >>"$results"
  done
  echo "reference $(reference)" >>"$results"
done

python3 - "$results" "$baseline" "$update" "$tolerance" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'PY'
import json, re, statistics, sys

path, baseline_path, update, tolerance, commit = sys.argv[1:]
update, tolerance = update == "true", float(tolerance)
# Commands of the benchmark itself, not of tessera: its over-grant check, PINGs, INFO and
# CONFIG, and the connection set-up of its clients.
NOT_TESSERA = re.compile(r"^(incr|decr|ping|info|config\|.*|client\|.*|hello|select|script\|.*)$")
CALLS = ("fcall", "evalsha", "fcall_ro", "evalsha_ro")

refs, runs = [], {}
for line in open(path):
    head, _, rest = line.partition(" ")
    if head == "reference":
        refs.append(float(rest))
        continue
    report, _, stats = rest.partition(" ||| ")
    report = json.loads(report)
    report = report[0] if isinstance(report, list) else report
    if not report.get("completed") or report.get("errors"):
        sys.exit(f"cost-check: {head} did not finish cleanly: {report}")
    # Operations done (W1: pairs), as the report counts them.
    grants = round(report["ops_per_sec"] * report["seconds"])
    if report.get("over_grants"):
        sys.exit(f"cost-check: {head} saw {report['over_grants']} over-grants")
    calls = commands = usec = 0
    for name, n, us in re.findall(r"cmdstat_([^:]+):calls=(\d+),usec=(\d+)", stats):
        if NOT_TESSERA.match(name):
            continue
        commands += int(n)
        if name in CALLS:
            calls += int(n)
            usec += int(us)
    runs.setdefault(head, []).append({"calls": calls / grants, "commands": commands / grants,
                                      "us": usec / grants})

ref = statistics.median(refs)
now = {}
for w, rs in runs.items():
    m = {k: statistics.median(r[k] for r in rs) for k in ("calls", "commands", "us")}
    m["ratio"] = m["us"] / ref
    now[w] = {k: round(v, 2) for k, v in m.items()}

if update:
    with open(baseline_path, "w") as f:
        json.dump({"commit": commit, "reference_us": round(ref, 2),
                   "note": "scripts/cost-check.sh --update; per grant (a W1 pair is one): "
                           "calls = FCALLs, commands = every command tessera made Redis run, "
                           "us = Redis time inside the calls, ratio = us / one plain EVALSHA "
                           "of a 3-command script in the same run",
                   "workloads": now}, f, indent=2)
        f.write("\n")
    print(f"cost-check: wrote {baseline_path} (reference EVALSHA {ref:.2f} µs)")
    for w, m in sorted(now.items()):
        print(f"  {w}: {m['calls']} calls, {m['commands']} commands, {m['us']} µs, ratio {m['ratio']}")
    sys.exit(0)

base = json.load(open(baseline_path))
print(f"reference EVALSHA (3 commands): {ref:.2f} µs now, {base['reference_us']} µs at the "
      f"baseline ({base['commit']}); {len(refs)} samples, {min(refs):.2f}-{max(refs):.2f}")
print(f"{'':4}{'figure per grant':<18}{'now':>10}{'baseline':>10}{'change':>9}")
failed = []
for w in sorted(now):
    for k in ("calls", "commands", "us", "ratio"):
        v, b = now[w][k], base["workloads"][w][k]
        change = v / b - 1 if b else 0.0
        # µs alone follows the machine's speed: shown, judged only through the ratio.
        judged = k != "us"
        bad = judged and change > tolerance
        mark = "  WORSE" if bad else ("" if judged else "  (not judged)")
        print(f"{w:<4}{k:<18}{v:>10.2f}{b:>10.2f}{change:>+9.0%}{mark}")
        if bad:
            failed.append(f"{w} {k}")
if failed:
    print(f"cost-check: FAILED, more than {tolerance:.0%} worse than {baseline_path}: "
          + ", ".join(failed))
    sys.exit(1)
print(f"cost-check: ok (every judged figure within {tolerance:.0%} of {baseline_path})")
PY
