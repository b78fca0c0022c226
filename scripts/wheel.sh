#!/usr/bin/env bash
# The `tessera` binary as a Python wheel (maturin's `bin` bindings, configured in
# crates/tessera-cli/pyproject.toml), checked the way a new user gets it: installed with pip
# into a fresh virtualenv and run with nothing else on PATH (no cargo, no TESSERA_* variables,
# an empty home) — `tessera --version`, the README's first `tessera run` on the embedded SQLite
# store, and a `tessera serve` that answers, takes and gives back a lease, and stops on SIGTERM.
#
#   bash scripts/wheel.sh                   # release build (many minutes), install, checks
#   bash scripts/wheel.sh --check-config    # only the pyproject against Cargo (seconds)
#
# The wheel lands in target/wheels/ (CARGO_TARGET_DIR/wheels), tagged with the lowest manylinux
# tag the binary satisfies (maturin's auditwheel check; plain `linux` if none). It needs
# python3 (3.11+, for tomllib) with venv and pip, curl, and the Rust toolchain; maturin is
# installed with pip when missing. The release build keeps it out of scripts/test.sh, which
# runs only `--check-config`.
set -euo pipefail
cd "$(dirname "$0")/.."
trap 'echo "wheel.sh: FAILED at line $LINENO: $BASH_COMMAND" >&2' ERR

die() {
  echo "wheel.sh: FAILED: $*" >&2
  exit 1
}

pyproject=crates/tessera-cli/pyproject.toml

# The pyproject against the Cargo package it builds: maturin's `bin` bindings, the wheel's
# name, and the version (dynamic, so maturin takes the crate's; or else equal to it), and a
# `tessera` binary target in the crate. Prints the version.
check_config() {
  python3 -c 'import tomllib' 2>/dev/null ||
    die "python3 $(python3 -c 'import sys; print(sys.version.split()[0])') has no tomllib (3.11 or newer needed)"
  local code
  code=$(
    cat <<'PY'
import json, sys, tomllib

path = sys.argv[1]
crate = next(p for p in json.load(sys.stdin)["packages"] if p["name"] == "tessera-cli")
with open(path, "rb") as f:
    py = tomllib.load(f)
project = py.get("project", {})
maturin = py.get("tool", {}).get("maturin", {})
problems = []
if py.get("build-system", {}).get("build-backend") != "maturin":
    problems.append("build-system.build-backend is not maturin")
if maturin.get("bindings") != "bin":
    problems.append('tool.maturin.bindings is not "bin"')
if project.get("name") != "tessera-server":
    problems.append(f'project.name is {project.get("name")!r}, not "tessera-server"')
if "version" in project:
    if project["version"] != crate["version"]:
        problems.append(f'project.version {project["version"]} is not the crate version {crate["version"]}')
elif "version" not in project.get("dynamic", []):
    problems.append('project has neither a version nor "version" in dynamic')
if not any(t["name"] == "tessera" and "bin" in t["kind"] for t in crate["targets"]):
    problems.append("crate tessera-cli has no binary target named tessera")
for p in problems:
    print(f"wheel.sh: FAILED: {path}: {p}", file=sys.stderr)
if problems:
    sys.exit(1)
print(crate["version"])
PY
  )
  cargo metadata --no-deps --format-version 1 --locked | python3 -c "$code" "$pyproject"
}

version=$(check_config)
if [[ ${1:-} == --check-config ]]; then
  echo "wheel.sh: $pyproject: bindings bin, tessera-server $version (the crate's version)"
  exit 0
fi
[[ $# == 0 ]] || die "unknown arguments: $* (usage: scripts/wheel.sh [--check-config])"

command -v curl >/dev/null || die "curl not found (apt-get install curl)"
if ! python3 -m maturin --version >/dev/null 2>&1; then
  echo "wheel.sh: installing maturin with pip" >&2
  python3 -m pip install --quiet maturin || python3 -m pip install --quiet --break-system-packages maturin
fi
echo "== $(python3 -m maturin --version)"

out=${CARGO_TARGET_DIR:-target}/wheels
mkdir -p "$out"
out=$(cd "$out" && pwd)
rm -f "$out"/tessera_server-*.whl
echo "== maturin build --release ($pyproject)"
start=$SECONDS
python3 -m maturin build --release --manifest-path crates/tessera-cli/Cargo.toml --out "$out"
build_secs=$((SECONDS - start))
wheels=("$out"/tessera_server-"$version"-*.whl)
[[ ${#wheels[@]} == 1 && -f ${wheels[0]} ]] || die "expected one tessera_server-$version wheel in $out, found: ${wheels[*]}"
wheel=${wheels[0]}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-wheel.XXXXXX")
server=
cleanup() {
  if [[ -n $server ]] && kill -0 "$server" 2>/dev/null; then
    kill -KILL "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "== pip install into a fresh virtualenv"
python3 -m venv "$tmp/venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
"$tmp/venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "$wheel"
mkdir "$tmp/home"
# A new user's shell: the virtualenv and the system's programs on PATH, nothing else. (A
# command prefix, not a function: `env` execs the program, so `$!` below is the server itself.)
as_user=(env -i HOME="$tmp/home" PATH="$tmp/venv/bin:/usr/bin:/bin" LANG=C.UTF-8)
found=$("${as_user[@]}" sh -c 'command -v tessera') || die "no tessera on the virtualenv's PATH"
[[ $found == "$tmp/venv/bin/tessera" ]] || die "tessera resolves to $found, not the virtualenv's"

echo "== tessera --version"
got=$("${as_user[@]}" tessera --version)
echo "$got"
[[ $got == "tessera $version (stores: "* ]] || die "tessera --version printed '$got', expected 'tessera $version (stores: …)'"

echo "== tessera run (the README's first command, on the embedded SQLite store)"
# shellcheck disable=SC2016 # expanded by the child's shell
got=$("${as_user[@]}" tessera run --name demo --permits 2 -- sh -c 'echo "seat $TESSERA_SEATS, fence $TESSERA_FENCE"')
echo "$got"
[[ $got =~ ^seat\ [0-9,]+,\ fence\ [0-9]+$ ]] || die "tessera run printed '$got', expected 'seat N, fence N'"
db=$tmp/home/.local/state/tessera/tessera.db
[[ -s $db ]] || die "no SQLite store at $db after tessera run"

echo "== tessera serve --listen 127.0.0.1:0"
"${as_user[@]}" tessera serve --listen 127.0.0.1:0 >"$tmp/serve.out" 2>"$tmp/serve.err" &
server=$!
url=
for _ in $(seq 300); do
  url=$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$tmp/serve.out" | head -n 1) || true
  [[ -n $url ]] && break
  kill -0 "$server" 2>/dev/null || die "tessera serve exited before listening: $(cat "$tmp/serve.err")"
  sleep 0.1
done
[[ -n $url ]] || die "tessera serve named no address within 30 s: $(cat "$tmp/serve.out" "$tmp/serve.err")"
head -n 1 "$tmp/serve.out"
health=
for _ in $(seq 100); do
  health=$(curl -fsS --max-time 2 "$url/healthz" 2>/dev/null) && break
  sleep 0.1
done
[[ $health == ok ]] || die "GET $url/healthz answered '$health', expected 'ok'"
echo "GET /healthz: $health"
lease=$(curl -fsS --max-time 10 -H 'Content-Type: application/json' \
  -d '{"capacity": 1, "ttl": "30s", "wait": "5s"}' "$url/v1/semaphores/wheel-check/acquire") ||
  die "POST $url/v1/semaphores/wheel-check/acquire failed"
lease_id=$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["lease_id"])' "$lease") ||
  die "the acquire answered no lease: $lease"
echo "POST /v1/semaphores/wheel-check/acquire: $lease"
released=$(curl -fsS --max-time 10 -X DELETE "$url/v1/semaphores/wheel-check/leases/$lease_id") ||
  die "DELETE of lease $lease_id failed"
[[ $(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["done"])' "$released") == True ]] ||
  die "the release answered $released, expected done: true"
echo "DELETE /v1/semaphores/wheel-check/leases/$lease_id: $released"
kill -TERM "$server"
for _ in $(seq 300); do
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$server" 2>/dev/null && die "tessera serve still running 30 s after SIGTERM"
status=0
wait "$server" || status=$?
server=
[[ $status == 0 ]] || die "tessera serve exited $status on SIGTERM, expected 0: $(cat "$tmp/serve.err")"
echo "SIGTERM: tessera serve stopped, exit 0 ($(tail -n 1 "$tmp/serve.err"))"

size=$(du -h "$wheel" | cut -f1)
tag=${wheel##*-}
tag=${tag%.whl}
echo "== ok: built in ${build_secs} s; installed and checked in a fresh virtualenv"
echo "wheel: $wheel ($size; platform tag $tag)"
echo "install: pip install $wheel"
