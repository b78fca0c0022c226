#!/usr/bin/env bash
# The bound of the SQL queue design (docs/sql-queue.md), measured on throwaway servers started
# here on free loopback ports in a temp dir: for PostgreSQL (durable, then
# `synchronous_commit=off`) and MariaDB (durable, then `innodb_flush_log_at_trx_commit=2`), one
# `tessera bench --workload w2` run, which also measures the server's own baselines in the same
# run (one client's INSERT+COMMIT loop, 8 sessions handing off `pg_advisory_lock` / `GET_LOCK`).
# Then a second W2 run without the baselines, bracketed by the server's counters: commits, WAL
# or redo-log flushes, calls and statements per hand-off. On PostgreSQL it also counts the
# statements nested in each step (pg-statements-per-step.sh), the CPU the server spent per
# hand-off (the machine's busy time less the client's: run it on a quiet machine) and, on
# MariaDB, InnoDB's row lock waits. The machine's load average is
# printed before each run: the figures are only comparable within one run. Run as root (the
# PostgreSQL server runs as `postgres` through runuser); STORES=pg or STORES=my runs one engine.
#
#   scripts/sql-queue-bound.sh [TESSERA_BIN] [OPS]
#   scripts/sql-queue-bound.sh target/debug/tessera 2000
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/tessera}
ops=${2:-2000}
dir=$(mktemp -d /tmp/sqlqueue-bound.XXXX)
chmod 755 "$dir"
source scripts/sql-servers.sh
# The machine's busy CPU time so far, in clock ticks (user, nice, system, irq, softirq).
busy() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
trap sql_servers_cleanup EXIT

pg_run() { # $1 label, $2 extra server options, $3 URL query (tessera sets synchronous_commit on
  # its own sessions: `on` unless the URL says `?synchronous_commit=off`)
  local port; port=$(free_port)
  pg_start "$port" "-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.track=all $2"
  local url="postgres://postgres@127.0.0.1:$port/postgres${3:-}"
  echo "== PostgreSQL $1 ($2) $(date -u +%FT%TZ)"
  psql -X -q -t -A -h 127.0.0.1 -p "$port" -U postgres -c "SHOW synchronous_commit" -c "SHOW fsync"
  uptime
  "$bin" --store "$url" bench --workload w2 --ops "$ops" || true
  local q=(psql -X -q -t -A -F ' ' -h 127.0.0.1 -p "$port" -U postgres)
  "${q[@]}" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
  local counters="SELECT (SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'), (SELECT wal_sync FROM pg_stat_wal), (SELECT wal_records FROM pg_stat_wal), (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE toplevel), (SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE NOT toplevel)"
  "${q[@]}" -c "SELECT pg_stat_statements_reset()" >/dev/null
  local before after
  before="$("${q[@]}" -c "$counters") $(busy)"
  /usr/bin/time -f '%U %S' -o "$dir/time" "$bin" --store "$url" bench --workload w2 --ops "$ops" --pg-baseline 0s --json > "$dir/w2.json" || true
  after="$("${q[@]}" -c "$counters") $(busy)"
  python3 - "$before" "$after" "$dir/w2.json" "$(cat "$dir/time")" "$(getconf CLK_TCK)" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]; a = [int(x) for x in sys.argv[2].split()]
r = json.loads(open(sys.argv[3]).read().splitlines()[-1])
h = round(r["handoffs_per_sec"] * r["seconds"])
d = [y - x for x, y in zip(b, a)]
client = sum(float(x) for x in sys.argv[4].split())
server = d[5] / int(sys.argv[5]) - client
print(f"counted W2 run: {h} hand-offs ({r['handoffs_per_sec']:.0f}/s); per hand-off: "
      f"commits {d[0]/h:.2f}, WAL flushes {d[1]/h:.2f}, WAL records {d[2]/h:.1f}, "
      f"top-level calls {d[3]/h:.2f}, nested statements {d[4]/h:.1f}, "
      f"CPU of the server (the machine's busy time less the client's) {server/h*1e6:.0f} us, "
      f"of the client {client/h*1e6:.0f} us")
PY
  "${q[@]}" -c "SELECT calls, round(mean_exec_time::numeric * 1000) AS mean_us, left(regexp_replace(query, '\\s+', ' ', 'g'), 50) FROM pg_stat_statements WHERE toplevel ORDER BY calls DESC LIMIT 2"
  if [[ $1 == durable ]]; then
    "$bin" --store "$url?schema=tessera" run --name x --permits 1 -- true
    scripts/pg-statements-per-step.sh 127.0.0.1 "$port" tessera || true
  fi
  pg_stop
}

my_run() { # $1 label, $2 extra server options
  local port; port=$(free_port)
  my_start "$port" "$2"
  mariadb -h 127.0.0.1 -P "$port" -u root -e 'CREATE DATABASE IF NOT EXISTS bench'
  echo "== MariaDB $1 ($2) $(date -u +%FT%TZ)"
  mariadb -h 127.0.0.1 -P "$port" -u root -N -e "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, @@version"
  uptime
  "$bin" --store "mysql://root@127.0.0.1:$port/bench" bench --workload w2 --ops "$ops" || true
  local names="'COM_COMMIT', 'HANDLER_COMMIT', 'INNODB_DATA_FSYNCS', 'COM_CALL_PROCEDURE', 'QUESTIONS', 'QUERIES', 'INNODB_ROW_LOCK_WAITS'"
  local counters="SELECT GROUP_CONCAT(VARIABLE_VALUE ORDER BY FIELD(VARIABLE_NAME, $names) SEPARATOR ' ') FROM information_schema.GLOBAL_STATUS WHERE VARIABLE_NAME IN ($names)"
  local before after
  before="$(mariadb -h 127.0.0.1 -P "$port" -u root -N -e "$counters") $(busy)"
  /usr/bin/time -f '%U %S' -o "$dir/time" "$bin" --store "mysql://root@127.0.0.1:$port/bench" bench --workload w2 --ops "$ops" --baseline-time 0s --json > "$dir/w2.json" || true
  after="$(mariadb -h 127.0.0.1 -P "$port" -u root -N -e "$counters") $(busy)"
  python3 - "$before" "$after" "$dir/w2.json" "$(cat "$dir/time")" "$(getconf CLK_TCK)" <<'PY'
import json, sys
b = [int(x) for x in sys.argv[1].split()]; a = [int(x) for x in sys.argv[2].split()]
r = json.loads(open(sys.argv[3]).read().splitlines()[-1])
h = round(r["handoffs_per_sec"] * r["seconds"])
d = [y - x for x, y in zip(b, a)]
client = sum(float(x) for x in sys.argv[4].split())
server = d[7] / int(sys.argv[5]) - client
print(f"counted W2 run: {h} hand-offs ({r['handoffs_per_sec']:.0f}/s); per hand-off: "
      f"COMMIT statements {d[0]/h:.2f}, handler commits {d[1]/h:.2f}, InnoDB fsyncs {d[2]/h:.2f}, "
      f"CALLs {d[3]/h:.2f}, client statements {d[4]/h:.2f}, statements with those in routines {d[5]/h:.1f}, "
      f"row lock waits {d[6]/h:.2f}, CPU of the server (the machine's busy time less the client's) "
      f"{server/h*1e6:.0f} us, of the client {client/h*1e6:.0f} us")
PY
  my_stop
}

case ${STORES:-pg,my} in *pg*)
  pg_run durable ""
  pg_run sync-off "-c synchronous_commit=off" "?synchronous_commit=off" ;;
esac
case ${STORES:-pg,my} in *my*)
  my_run durable "--innodb-flush-log-at-trx-commit=1"
  my_run flush2 "--innodb-flush-log-at-trx-commit=2" ;;
esac
