#!/usr/bin/env bash
# The seed case end to end: business systems sharing one messaging API that allows 50 calls/s,
# 1,000 calls/min and 4 in flight, each call taken as an admission from one of two
# `tessera serve` on one MariaDB, one of them killed (-9) midway and started again.
#
#   bash scripts/seed-case.sh                     # DURATION=90 MESSAGES=1800 by default
#   DURATION=60 SEED_STORE=mysql://root@127.0.0.1:3306/tessera_seed bash scripts/seed-case.sh
#
# Starts a fake provider (scripts/fake-provider.py: 429 past 50 per sliding second or 1,000
# per sliding minute of the calls it accepted), servers A and B on free loopback ports, and
# the senders: examples/python/send_sms.py (2 on A, 1 on B), examples/node/send_sms.mjs (1 on
# A, 1 on B) and a curl loop on B (below), MESSAGES messages in all. At DURATION/2 it kills B
# with SIGKILL and starts it again on the same port 2 s later. It stops whatever still runs
# at DURATION, then prints the provider's report, what each sender did, and the verdict:
# max 1s <= 50 and max 60s <= 1000 and refused == 0 and max in flight <= 4 (exit 1 if not).
#
# Needs python3, node (20 or newer), curl and bash 5; the mariadb client to create the
# database (else it must exist: tessera creates its tables in it). TESSERA_BIN (default
# /work/bin/tessera) is waited for up to BIN_WAIT seconds (default 900). KEEP_LOGS=1 keeps the
# logs (each sender's output, the servers', the provider's report and calls) and says where.
# Every sender takes the default margin, 20 ms; the provider measures each call's delay from
# its admission (admitted_at_us, on the store's clock: this host's when the store is local).
set -euo pipefail
set -m # every background job in a process group of its own: stopped whole, children included

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${TESSERA_BIN:-/work/bin/tessera}
store=${SEED_STORE:-mysql://root@127.0.0.1:3306/tessera_seed}
duration=${DURATION:-90}
messages=${MESSAGES:-1800}
bin_wait=${BIN_WAIT:-900}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-seed.XXXXXX")
pids=() # process groups to stop at the end
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 50); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    if [[ -n ${KEEP_LOGS:-} ]]; then
        say "logs kept in $tmp"
    else
        rm -rf "$tmp"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say() { printf '%s %s\n' "$(date +%T)" "$*" >&2; }
die() { say "seed-case: $*"; exit 1; }

for tool in python3 node curl; do command -v "$tool" >/dev/null || die "$tool is not installed"; done
node_major=$(node -p 'process.versions.node.split(".")[0]')
((node_major >= 20)) || die "node $(node --version) is too old: 20 or newer"
[[ -n ${EPOCHREALTIME:-} ]] || die "bash 5 or newer is needed (EPOCHREALTIME)"

# --- the binary, the database -------------------------------------------------------------
waited=0
until [[ -x $bin ]]; do
    ((waited < bin_wait)) || die "no tessera binary at $bin after ${bin_wait}s (set TESSERA_BIN)"
    ((waited % 30 == 0)) && say "waiting for $bin to exist"
    sleep 5
    waited=$((waited + 5))
done
re='^(mysql|mariadb)://([^:@/]+)(:([^@/]*))?@([^:/?]+)(:([0-9]+))?/([A-Za-z0-9_]+)'
if [[ $store =~ $re ]] && command -v mariadb >/dev/null; then
    mariadb -u"${BASH_REMATCH[2]}" ${BASH_REMATCH[4]:+-p"${BASH_REMATCH[4]}"} \
        -h"${BASH_REMATCH[5]}" -P"${BASH_REMATCH[7]:-3306}" \
        -e "CREATE DATABASE IF NOT EXISTS \`${BASH_REMATCH[8]}\`"
fi

# --- the provider, the servers ------------------------------------------------------------
# The first line of $2 names the address; $1 is the process.
address_of() {
    local pid=$1 out=$2 line
    for _ in $(seq 300); do
        line=$(head -n1 "$out" 2>/dev/null || true)
        if [[ $line =~ listening\ on\ (http://[0-9.:]+) ]]; then
            echo "${BASH_REMATCH[1]}"
            return
        fi
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    die "$out: no address ($(cat "$tmp"/*.err 2>/dev/null | tail -n3))"
}

python3 "$repo/scripts/fake-provider.py" --report "$tmp/provider.json" \
    >"$tmp/provider.out" 2>"$tmp/provider.err" &
provider_pid=$!
pids+=("$provider_pid")
provider=$(address_of "$provider_pid" "$tmp/provider.out")

serve() { # name listen-address
    "$bin" --store "$store" serve --listen "$2" >"$tmp/$1.out" 2>>"$tmp/$1.err" &
    server_pid=$!
    pids+=("$server_pid")
}
serve A 127.0.0.1:0
a_pid=$server_pid
serve B 127.0.0.1:0
b_pid=$server_pid
A=$(address_of "$a_pid" "$tmp/A.out")
B=$(address_of "$b_pid" "$tmp/B.out")
say "provider $provider, A $A, B $B, store $store, $("$bin" --version)"

# A clean start: the name's holders, queue and window history of an earlier run go.
curl -fsS -o /dev/null -X DELETE "$A/v1/semaphores/sms-api" 2>/dev/null || true
curl -fsS -o /dev/null -X DELETE "$A/v1/rates/sms-api" 2>/dev/null || true

# --- the curl loop (one process per request, as the users had) -----------------------------
# Takes an admission, checks its use-by, makes the call, releases the lease; a late admission
# is given back and asked for again. The use-by counts from the answer's arrival, taken as
# the instant before curl started plus curl's time to the first byte: never later than the
# true arrival, and early by curl's own start, about what the provider call's curl will take
# to start after the check.
curl_sender() { # server count
    local url=$1 count=$2 i=0 given_back=0 tries=0 out code tst t0 late_ms
    local lease fence reservation at use_by start refused me=$BASHPID
    local ask="{\"capacity\": 4, \"limits\": [\"50/s\", \"1000/min\"], \"wait\": \"60s\", \"ttl\": \"10s\", \"holder\": \"curl:$me\"}"
    local json='Content-Type: application/json'
    trap 'echo "$given_back admission(s) arrived late, given back" >&2; exit 143' TERM
    while ((i < count)); do
        t0=${EPOCHREALTIME/./}
        if ! out=$(curl -sS -m 75 -H "$json" -d "$ask" -w '\n%{http_code} %{time_starttransfer}' \
            "$url/v1/admissions/sms-api/acquire" 2>&1); then
            out=${out%$'\n'*}
            ((++tries < 5)) || { echo "message $i: ${out//$'\n'/ }" >&2; return 1; }
            echo "message $i: ${out//$'\n'/ }; again in 1 s" >&2
            sleep 1
            continue
        fi
        late_ms=$(((10#${EPOCHREALTIME/./} - 10#$t0) / 1000))
        read -r code tst <<<"${out##*$'\n'}"
        out=${out%$'\n'*}
        case $code in
            200) ;;
            408) continue ;; # not admitted within the wait: ask again
            429 | 503) sleep 1; continue ;; # queue full, store down, server stopping
            *) echo "message $i: tessera answered $code: $out" >&2; return 1 ;;
        esac
        tries=0
        tst=${tst/./}
        late_ms=$((late_ms - 10#$tst / 1000))
        [[ $out =~ \"lease_id\":\"([0-9a-f]+)\" ]] && lease=${BASH_REMATCH[1]}
        [[ $out =~ \"fence\":([0-9]+) ]] && fence=${BASH_REMATCH[1]}
        [[ $out =~ \"reservation\":([0-9]+) ]] && reservation=${BASH_REMATCH[1]}
        [[ $out =~ \"admitted_at_us\":([0-9]+) ]] && at=${BASH_REMATCH[1]}
        use_by=1000000 # none with a margin of 0
        [[ $out =~ \"use_by_ms\":([0-9]+) ]] && use_by=${BASH_REMATCH[1]}
        if ((late_ms >= use_by)); then # too late to call: the windows may not count it
            curl -s -o /dev/null -H "$json" -d "{\"reservation\": $reservation, \"admitted_at_us\": $at}" \
                "$url/v1/admissions/sms-api/leases/$lease/give-back" || true
            given_back=$((given_back + 1))
            continue
        fi
        start=$EPOCHREALTIME refused=""
        code=$(curl -s -o /dev/null -w '%{http_code}' -H "$json" \
            -d "{\"sender\": \"curl:$me\", \"message\": $i, \"fence\": $fence, \"admitted_at_us\": $at}" \
            "$SMS_PROVIDER_URL") || true
        [[ $code == 200 ]] || refused=" refused $code"
        echo "$start pid $me message $i fence $fence$refused"
        curl -s -o /dev/null -X DELETE "$url/v1/semaphores/sms-api/leases/$lease" ||
            echo "message $i: release failed" >&2
        i=$((i + 1))
    done
    echo "$given_back admission(s) arrived late, given back" >&2
}

# --- the senders ---------------------------------------------------------------------------
export SMS_PROVIDER_URL=$provider
per=$((messages / 6))
senders=(py1 py2 node1 py3 node2 curl)
declare -A server_of=([py1]=A [py2]=A [node1]=A [py3]=B [node2]=B [curl]=B)
declare -A pid_of
start_s=$SECONDS
for s in "${senders[@]}"; do
    [[ ${server_of[$s]} == A ]] && export TESSERA_URL=$A || export TESSERA_URL=$B
    case $s in
        py*) python3 "$repo/examples/python/send_sms.py" "$per" ;;
        node*) node "$repo/examples/node/send_sms.mjs" "$per" ;;
        curl) curl_sender "$TESSERA_URL" "$per" ;;
    esac >"$tmp/$s.out" 2>"$tmp/$s.err" &
    pid_of[$s]=$!
    pids+=("$!")
done
say "6 senders, $per messages each: py1 py2 node1 on A; py3 node2 curl on B"

running() {
    local s
    for s in "${senders[@]}"; do kill -0 "${pid_of[$s]}" 2>/dev/null && return 0; done
    return 1
}

# --- midway: B is killed and comes back -----------------------------------------------------
while ((SECONDS - start_s < duration / 2)) && running; do sleep 0.2; done
if running; then
    curl -fsS "$B/metrics" 2>/dev/null | awk '/^tessera_admissions_expired_total/ {n += $NF} END {print n + 0}' \
        >"$tmp/B1.expired" || echo "?" >"$tmp/B1.expired"
    kill -KILL "$b_pid"
    { wait "$b_pid"; } 2>/dev/null || true
    say "B killed (-9) at $((SECONDS - start_s)) s"
    sleep 2
    serve B "${B#http://}"
    b_pid=$server_pid
    address_of "$b_pid" "$tmp/B.out" >/dev/null
    say "B listening again at $((SECONDS - start_s)) s"
fi

while ((SECONDS - start_s < duration)) && running; do sleep 0.2; done
declare -A status_of
{
    for s in "${senders[@]}"; do
        if kill -0 "${pid_of[$s]}" 2>/dev/null; then
            kill -TERM -- "-${pid_of[$s]}" 2>/dev/null || true
            status_of[$s]="stopped at ${duration} s"
        fi
    done
    for s in "${senders[@]}"; do
        rc=0
        wait "${pid_of[$s]}" || rc=$?
        [[ -n ${status_of[$s]:-} ]] || status_of[$s]="exit $rc"
    done
} 2>/dev/null # no job notices
elapsed=$((SECONDS - start_s))
# What the windows counted (charges of given-back admissions that were not the limiter's
# latest stay counted), beside what the provider received.
curl -fsS "$A/v1/rates/sms-api" >"$tmp/rate.json" 2>/dev/null || echo '{}' >"$tmp/rate.json"

# --- the figures -----------------------------------------------------------------------------
curl -fsS "$provider/report" >"$tmp/provider.json"
curl -fsS "$provider/calls" >"$tmp/calls.json"
for srv in A B; do
    url=$A
    [[ $srv == B ]] && url=$B
    curl -fsS "$url/metrics" 2>/dev/null |
        awk '/^tessera_admissions_expired_total/ {n += $NF} END {print n + 0}' >"$tmp/$srv.expired" || echo "?" >"$tmp/$srv.expired"
done
for s in "${senders[@]}"; do echo "${status_of[$s]}" >"$tmp/$s.status"; done

python3 - "$tmp" "$elapsed" "${senders[@]}" <<'EOF'
import json, os, re, sys
MARGIN_MS = 20  # the default margin, which every sender here takes
tmp, elapsed, senders = sys.argv[1], sys.argv[2], sys.argv[3:]
r = json.load(open(f"{tmp}/provider.json"))
print(f"provider after {elapsed} s: {r['calls']} calls, {r['accepted']} accepted, {r['refused']} refused; "
      f"max {r['max_1s']} in 1 s (at {r['max_1s_at_s']} s), max {r['max_60s']} in 60 s, "
      f"max {r['max_in_flight']} in flight; {r['duplicate_fences']} fence(s) used twice")
d = r.get("delay_ms")
if d:
    print(f"delay from admission to the provider (same host clock): p50 {d['p50']} ms, p99 {d['p99']} ms, "
          f"max {d['max']} ms; {d['over_20ms']} of {d['calls']} calls over 20 ms")
used = {l["limit"]: l["used"] for l in json.load(open(f"{tmp}/rate.json")).get("limits", [])}
print(f"the windows at the end: {used.get('50/s', '?')} used in 50/s, {used.get('1000/min', '?')} in 1000/min; "
      f"the provider accepted {r['accepted_last_60s']} in the last 60 s")
# Where a call's delay from admission to the provider came from: before its sender started
# it (the sender's log: the instant before the call) or after.
started = {}
for s in senders:
    for line in open(f"{tmp}/{s}.out"):
        f = line.split()
        if len(f) > 6 and f[3] == "message":
            started[int(f[6])] = float(f[0]) / (1000 if float(f[0]) > 1e11 else 1)
late = [c for c in json.load(open(f"{tmp}/calls.json")) if c.get("delay_ms", 0) > MARGIN_MS and c.get("fence") in started]
if late:
    before = [(started[c["fence"]] - c["admitted_at_us"] / 1e6) * 1000 for c in late]
    after = [c["delay_ms"] - b for c, b in zip(late, before)]
    print(f"  {len(late)} calls came more than {MARGIN_MS} ms after their admission: {sum(b > MARGIN_MS for b in before)} "
          f"of them started more than {MARGIN_MS} ms after it (at most {max(before):.1f} ms); from their start to "
          f"the provider they took at most {max(after):.1f} ms")
busy = [c for c in r["max_1s_calls"] if c.get("delay_ms", 0) > MARGIN_MS]
if r["max_1s"] > 50 or busy:
    print(f"  in the busiest second, {len(busy)} of {r['max_1s']} calls came more than {MARGIN_MS} ms after their admission: "
          + ", ".join(f"{c['sender']} {c['delay_ms']:.1f} ms" for c in busy[:12]))
for f in r["first_refused"]:
    print(f"  refused at {f['at_s']:.3f} s: {f['sender']} fence {f['fence']}")
server = {"py1": "A", "py2": "A", "node1": "A", "py3": "B", "node2": "B", "curl": "B"}
print(f"{'sender':7} {'server':6} {'sent':>5} {'refused':>7} {'given back':>10} {'retries':>7} "
      f"{'delay p50/p99/max ms':>20} {'>20ms':>5}  end")
by_pid = {key.split(":")[-1]: d for key, d in r.get("delay_ms_by_sender", {}).items()}
for s in senders:
    out = open(f"{tmp}/{s}.out").read().splitlines()
    err = open(f"{tmp}/{s}.err").read().splitlines()
    sent = sum(" message " in line for line in out)
    refused = sum(" refused " in line for line in out)
    back = next((m.group(1) for line in err if (m := re.match(r"(\d+) admission\(s\) arrived late", line))), "?")
    retries = sum("again in 1 s" in line for line in err)
    end = open(f"{tmp}/{s}.status").read().strip()
    d = by_pid.get(out[0].split()[2] if out else "", {})
    delay = f"{d.get('p50', '-')}/{d.get('p99', '-')}/{d.get('max', '-')}"
    print(f"{s:7} {server[s]:6} {sent:>5} {refused:>7} {back:>10} {retries:>7} {delay:>20} {d.get('over_20ms', '-'):>5}  {end}")
    retried = [line for line in err if "again in 1 s" in line]
    other = [line for line in err if "again in 1 s" not in line and "arrived late" not in line]
    for line in (retried[:1] + retried[-1:])[: len(retried)] + other[-3:]:
        print(f"          {line[:160]}")
expired = {s: open(f"{tmp}/{s}.expired").read().strip() for s in ("A", "B1", "B") if os.path.exists(f"{tmp}/{s}.expired")}
print(f"given back by the servers before answering (tessera_admissions_expired_total): A {expired.get('A')}, "
      f"B {expired.get('B1', '-')} before the kill, {expired.get('B')} after")
ok = r["max_1s"] <= 50 and r["max_60s"] <= 1000 and r["refused"] == 0 and r["max_in_flight"] <= 4
print(f"verdict: {'PASS' if ok else 'FAIL'}: max 1s {r['max_1s']} <= 50 and max 60s {r['max_60s']} <= 1000 "
      f"and refused {r['refused']} == 0 and max in flight {r['max_in_flight']} <= 4")
sys.exit(0 if ok else 1)
EOF
