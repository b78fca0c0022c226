#!/usr/bin/env bash
# W2 (8 clients on a lock) of several tessera builds on the same throwaway servers, alternating
# build by build for ROUNDS rounds, each run followed by the server's own figures in the same
# `tessera bench` call (one client's INSERT+COMMIT loop, then 8 sessions handing off
# `pg_advisory_lock` / `GET_LOCK`). Servers, started here on free loopback ports in a temp dir:
# PostgreSQL durable and with `synchronous_commit=off`, MariaDB with
# `innodb_flush_log_at_trx_commit=1` and `=2`. Each build keeps its tables in a schema (PostgreSQL)
# or database (MariaDB) of its own, so builds with different migrations share a server. Prints
# every run and then, per server and build, the medians: hand-offs/s, max wait, and the ratios
# to the same call's INSERT+COMMIT rate and database lock. Run as root (PostgreSQL runs as
# `postgres` through runuser). STORES=pg or STORES=my runs one engine.
#
#   scripts/sql-w2-side-by-side.sh ROUNDS OPS BIN...
#   scripts/sql-w2-side-by-side.sh 3 2000 /tmp/tessera-old target/release/tessera
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:?usage: sql-w2-side-by-side.sh ROUNDS OPS BIN...}
ops=${2:?usage: sql-w2-side-by-side.sh ROUNDS OPS BIN...}
shift 2
bins=("$@")
[ ${#bins[@]} -gt 0 ] || { echo "sql-w2-side-by-side.sh: name at least one tessera binary" >&2; exit 2; }
dir=$(mktemp -d /tmp/sql-w2.XXXX)
chmod 755 "$dir"
source scripts/sql-servers.sh
trap sql_servers_cleanup EXIT
results=$dir/results.jsonl
: > "$results"

# One bench call: $1 server label, $2 build index, $3 URL, then bench's baseline option.
run() {
  local label=$1 i=$2 url=$3; shift 3
  local out
  out=$("${bins[$i]}" --store "$url" bench --workload w2 --ops "$ops" --json "$@" 2>&1) || { echo "$out" >&2; return 1; }
  python3 - "$label" "$i" "${bins[$i]}" "$out" >> "$results" <<'PY'
import json, sys
label, i, binary, out = sys.argv[1:]
w2 = base = None
for line in out.splitlines():
    if not line.startswith("{"):
        continue
    d = json.loads(line)
    if d.get("workload") == "w2":
        w2 = d
    elif d.get("workload") == "postgres-baseline":
        base = {"commits": d["insert_commits_per_sec"], "lock": d["advisory_w2_handoffs_per_sec"]}
    elif "baselines" in d:
        b = d["baselines"]
        base = {"commits": b["insert_commit_per_sec"], "lock": b["get_lock_handoffs_per_sec"]}
print(json.dumps({"server": label, "build": int(i), "bin": binary, "handoffs": w2["handoffs_per_sec"],
                  "max_ms": w2["max_ms"], "p99_ms": w2["p99_ms"], "per_client": [w2["grants_per_client_min"], w2["grants_per_client_max"]],
                  "over": w2["over_grants"], "commits": base["commits"], "lock": base["lock"]}))
PY
  tail -1 "$results"
}

pg_server() { # $1 label, $2 server options, $3 URL query
  local port; port=$(free_port)
  pg_start "$port" "$2"
  echo "== PostgreSQL $1 ($2) $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')"
  for r in $(seq "$rounds"); do
    for i in "${!bins[@]}"; do
      local q="?schema=b$i"; [[ -n ${3:-} ]] && q="$q&${3#\?}"
      run "$1" "$i" "postgres://postgres@127.0.0.1:$port/postgres$q" --pg-baseline 3s
    done
  done
  pg_stop
}

my_server() { # $1 label, $2 server options
  local port; port=$(free_port)
  my_start "$port" "$2"
  for i in "${!bins[@]}"; do mariadb -h 127.0.0.1 -P "$port" -u root -e "CREATE DATABASE IF NOT EXISTS b$i"; done
  echo "== MariaDB $1 ($2) $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')"
  for r in $(seq "$rounds"); do
    for i in "${!bins[@]}"; do
      run "$1" "$i" "mysql://root@127.0.0.1:$port/b$i" --baseline-time 3s
    done
  done
  my_stop
}

case ${STORES:-pg,my} in *pg*)
  pg_server "PostgreSQL durable" ""
  pg_server "PostgreSQL synchronous_commit=off" "-c synchronous_commit=off" "?synchronous_commit=off" ;;
esac
case ${STORES:-pg,my} in *my*)
  my_server "MariaDB flush=1" "--innodb-flush-log-at-trx-commit=1"
  my_server "MariaDB flush=2" "--innodb-flush-log-at-trx-commit=2" ;;
esac

echo "== medians over $rounds rounds of $ops grants"
python3 - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = statistics.median
print(f"{'server':36} {'build':28} {'hand-offs/s':>11} {'max ms':>7} {'/ commits':>9} {'/ db lock':>9}  runs (hand-offs/s, ratio to commits)")
for server in dict.fromkeys(r["server"] for r in rows):
    for build in sorted({r["build"] for r in rows if r["server"] == server}):
        rs = [r for r in rows if r["server"] == server and r["build"] == build]
        runs = ", ".join(f"{r['handoffs']:.0f} ({r['handoffs'] / r['commits']:.2f})" for r in rs)
        print(f"{server:36} {rs[0]['bin'][-28:]:28} {med(r['handoffs'] for r in rs):11.0f} "
              f"{med(r['max_ms'] for r in rs):7.1f} {med(r['handoffs'] / r['commits'] for r in rs):9.2f} "
              f"{med(r['handoffs'] / r['lock'] for r in rs):9.3f}  {runs}")
PY
