#!/usr/bin/env bash
# How many SQL statements each PostgreSQL step runs inside tessera's functions: calls the
# functions of a migrated schema directly (acquires, an enqueue, a try, a heartbeat, releases
# that hand off, admissions) and counts the statements nested in each call with
# pg_stat_statements (`track = all`; PL/pgSQL's simple expressions are not statements and are
# not counted). Without a tenant the counts must equal the previous step revision's (fair
# shares add no statement without tenants, docs/fair-shares.md); with TENANT set, a tenant's
# request pays for its tag's row.
#
# The server must load the extension: `shared_preload_libraries = pg_stat_statements` and
# `pg_stat_statements.track = all` (`CREATE EXTENSION pg_stat_statements` in `public` is run
# here); the schema must have been migrated by a tessera process (`tessera --store
# 'postgres://…?schema=SCHEMA' run --name x --permits 1 -- true`). A throwaway server only:
# the statistics are reset before every call.
#
#   scripts/pg-statements-per-step.sh HOST PORT SCHEMA [TENANT]
#   scripts/pg-statements-per-step.sh 127.0.0.1 55433 tessera
#   scripts/pg-statements-per-step.sh 127.0.0.1 55433 tessera billing
set -euo pipefail
host=${1:?HOST}
port=${2:?PORT}
schema=${3:?SCHEMA}
tenant=${4:-}
psql=(psql -X -q -t -A -v ON_ERROR_STOP=1 -h "$host" -p "$port" -U "${PGUSER:-postgres}")
"${psql[@]}" -c "SET client_min_messages = warning" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements SCHEMA public" >/dev/null
t=""
if [[ -n $tenant ]]; then
  t=", '$tenant', 1"
fi
run=$RANDOM
lease() { printf '%032x' "$1"; }
step() {
  local label=$1 sql=$2 out
  out=$("${psql[@]}" <<SQL
SET search_path TO $schema, public;
SELECT pg_stat_statements_reset();
$sql;
SELECT 'COUNT ' || coalesce(sum(calls), 0) FROM pg_stat_statements
WHERE NOT toplevel AND query NOT LIKE '%pg_stat_statements%';
SQL
)
  printf '%-44s %3s   (%s)\n' "$label" "$(grep '^COUNT' <<<"$out" | cut -d' ' -f2)" "$(sed -n 2p <<<"$out")"
}
ttl=60000000
acq() { echo "SELECT outcome FROM tessera_acquire('s$run', 1, '$(lease "$1")', 1, $ttl, 'h', 'c', $2, 100$t)"; }
rel() { echo "SELECT held FROM tessera_release('$1$run', '$(lease "$2")', 'c')"; }
limits="'exact|100/s', '{100}', '{1000000}', '{10000}', 0, 1, false, false"
adm() { echo "SELECT outcome FROM tessera_admit('a$run', 1, '$(lease "$1")', 1, $ttl, 'h', 'c', $ttl, 100, $limits$t)"; }
step "acquire of an idle semaphore (granted)" "$(acq 1 $ttl)"
step "acquire, enqueued behind the holder" "$(acq 2 $ttl)"
step "acquire, second waiter" "$(acq 3 $ttl)"
step "try-acquire, refused" "$(acq 9 NULL)"
step "heartbeat of a waiter" "SELECT outcome FROM tessera_heartbeat('s$run', '$(lease 3)', $ttl)"
step "release that hands off" "$(rel s 1)"
step "release that hands off" "$(rel s 2)"
step "release of the last holder" "$(rel s 3)"
step "admission of an idle semaphore (granted)" "$(adm 1)"
step "admission, queued behind the holder" "$(adm 2)"
step "release that wakes the admission" "$(rel a 1)"
step "admission asking again (granted)" "$(adm 2)"
step "release of the last holder" "$(rel a 2)"
