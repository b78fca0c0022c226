#!/usr/bin/env bash
# What one PostgreSQL step costs the server beside the plainest SQL that does the same bookkeeping
# (docs/sql-queue.md, "The floor"): one pgbench client, prepared statements, on a throwaway
# server started here (synchronous_commit off, so the disk is not measured), rounds alternating:
#   idle    tessera_acquire + tessera_release on an idle semaphore (its rows created and deleted);
#   kept    the same pair beside a standing holder (the rows stay);
#   plain   the same bookkeeping in two plain statements: an UPDATE of a counter row that
#           inserts a holder row in the same statement, and the DELETE that gives it back;
#   lock    pg_advisory_lock + pg_advisory_unlock (no row, nothing durable);
#   trip    two SELECT 1 (the round trips alone).
# Prints, per pair: the mean latency (pgbench), and the machine's busy CPU per pair minus
# pgbench's own (the server's work, with the kernel's share of the round trips). Medians of
# the rounds. Run as root (the server runs as `postgres` through runuser).
#
#   scripts/pg-step-floor.sh [TESSERA_BIN] [ROUNDS] [SECONDS]
#   scripts/pg-step-floor.sh target/release/tessera 3 6
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/tessera}
rounds=${2:-3}
secs=${3:-6}
dir=$(mktemp -d /tmp/pg-step-floor.XXXX)
chmod 755 "$dir"
source scripts/sql-servers.sh
trap sql_servers_cleanup EXIT
pgbench=$pg_bin/pgbench
port=$(free_port)
pg_start "$port" "-c synchronous_commit=off"
url="postgres://postgres@127.0.0.1:$port/postgres"
"$bin" --store "$url" run --name floor-setup --permits 1 -- true
q=(psql -X -q -t -A -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$port" -U postgres)
"${q[@]}" <<'SQL'
SET search_path = tessera;
SELECT outcome FROM tessera_acquire('kept', 10, md5('standing'), 1, 86400000000, 'h', 'abc', NULL, NULL);
CREATE TABLE public.floor_sem (name text PRIMARY KEY, capacity int NOT NULL, used int NOT NULL);
CREATE TABLE public.floor_holders (name text, lease text, expires_at bigint, PRIMARY KEY (name, lease));
INSERT INTO public.floor_sem VALUES ('plain', 10, 0);
SQL
cat > "$dir/idle.sql" <<'SQL'
\set r random(1, 1000000000)
SELECT outcome FROM tessera_acquire('idle', 10, md5(:r::text), 1, 30000000, 'h', 'abc', NULL, NULL);
SELECT held FROM tessera_release('idle', md5(:r::text), 'abc');
SQL
sed 's/(.idle., /(\x27kept\x27, /' "$dir/idle.sql" > "$dir/kept.sql"
cat > "$dir/plain.sql" <<'SQL'
\set r random(1, 1000000000)
WITH s AS (UPDATE floor_sem SET used = used + 1 WHERE name = 'plain' AND used < capacity RETURNING name) INSERT INTO floor_holders SELECT name, md5(:r::text), 0 FROM s;
WITH d AS (DELETE FROM floor_holders WHERE name = 'plain' AND lease = md5(:r::text) RETURNING name) UPDATE floor_sem s SET used = used - 1 FROM d WHERE s.name = d.name;
SQL
printf 'SELECT pg_advisory_lock(7);\nSELECT pg_advisory_unlock(7);\n' > "$dir/lock.sql"
printf 'SELECT 1;\nSELECT 1;\n' > "$dir/trip.sql"
export PGOPTIONS="-c search_path=tessera,public"
cpu() { awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat; }
for r in $(seq "$rounds"); do
  for v in idle kept plain lock trip; do
    b=$(cpu)
    /usr/bin/time -f '%U %S' -o "$dir/time" "$pgbench" -n -M prepared -T "$secs" -f "$dir/$v.sql" \
      -h 127.0.0.1 -p "$port" -U postgres postgres > "$dir/out" 2>&1 || { cat "$dir/out"; exit 1; }
    a=$(cpu)
    lat=$(awk '/latency average/{print $4}' "$dir/out")
    n=$(awk '/number of transactions actually processed/{print $NF}' "$dir/out")
    echo "$v $lat $n $((a - b)) $(cat "$dir/time")" >> "$dir/results"
  done
done
echo "PostgreSQL $("${q[@]}" -c 'SHOW server_version'), $(date -u +%FT%TZ), load $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$dir/results" "$(getconf CLK_TCK)" <<'PY'
import collections, statistics, sys
tck = int(sys.argv[2])
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    v, lat, n, busy, u, s = line.split()
    n = int(n)
    server = (int(busy) / tck - float(u) - float(s)) / n * 1e6
    rows[v].append((float(lat) * 1000, server))
print(f"{'pair':<6} {'latency us':>11} {'server CPU us':>14}  (medians of {len(rows['idle'])} rounds)")
for v in ("idle", "kept", "plain", "lock", "trip"):
    lat = statistics.median(x[0] for x in rows[v]); cpu = statistics.median(x[1] for x in rows[v])
    print(f"{v:<6} {lat:>11.0f} {cpu:>14.0f}")
PY
