# Throwaway PostgreSQL and MariaDB servers on free loopback ports, for the measuring scripts
# (sourced by sql-queue-bound.sh and sql-w2-side-by-side.sh; run as root: PostgreSQL runs as
# `postgres` through runuser). The caller sets `dir` (a temp dir, mode 755) first; the servers
# live in $dir/pg and $dir/my, and `sql_servers_cleanup` (an EXIT trap) stops them and removes
# $dir.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pg_bin=$(dirname "$(readlink -f /usr/lib/postgresql/*/bin/postgres)")

sql_servers_cleanup() {
  [[ -f $dir/pg/postmaster.pid ]] && runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg" -m immediate stop >/dev/null 2>&1 || true
  [[ -f $dir/my.pid ]] && kill "$(cat "$dir/my.pid")" 2>/dev/null || true
  rm -rf "$dir"
}

# pg_start PORT SERVER_OPTIONS: a fresh cluster in $dir/pg.
pg_start() {
  rm -rf "$dir/pg"; mkdir "$dir/pg"; chown postgres "$dir/pg"; chmod 700 "$dir/pg"
  runuser -u postgres -- "$pg_bin/initdb" -D "$dir/pg" -U postgres --auth=trust >/dev/null
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg" -w -l "$dir/pg/log" -o "-p $1 -k $dir/pg -c listen_addresses=127.0.0.1 $2" start >/dev/null
}

pg_stop() { runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg" -m fast stop >/dev/null; }

# my_start PORT SERVER_OPTIONS: a fresh MariaDB in $dir/my, waited for.
my_start() {
  rm -rf "$dir/my"; mkdir -p "$dir/my"
  mariadb-install-db --no-defaults --user=root --datadir="$dir/my/data" --auth-root-authentication-method=normal --skip-test-db >/dev/null 2>&1
  # shellcheck disable=SC2086
  mariadbd --no-defaults --user=root --datadir="$dir/my/data" --socket="$dir/my/s" --port="$1" --bind-address=127.0.0.1 --pid-file="$dir/my.pid" $2 >"$dir/my.log" 2>&1 &
  for _ in $(seq 100); do mariadb -h 127.0.0.1 -P "$1" -u root -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.1; done
}

my_stop() { kill "$(cat "$dir/my.pid")"; while [[ -e $dir/my.pid ]] && kill -0 "$(cat "$dir/my.pid")" 2>/dev/null; do sleep 0.1; done; }
