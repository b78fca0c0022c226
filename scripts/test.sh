#!/usr/bin/env bash
# The whole test suite, as CI runs it: formatting, lints, then every test of the workspace
# (unit, conformance suite per store, multi-process and CLI tests, doc tests).
#
# Servers the tests need are started by the tests themselves on free loopback ports; this
# script only makes sure their programs are installed. As root it installs missing Debian
# packages with apt-get; otherwise it prints the exact install line and fails. Nothing is
# ever skipped for a missing server.
set -euo pipefail
cd "$(dirname "$0")/.."

# program → Debian package, for every server or tool a test starts.
declare -A NEED=(
  [redis-server]=redis-server
  [openssl]=openssl
  [faketime]=faketime
  [initdb]=postgresql
  [pgbouncer]=pgbouncer
  [etcd]=etcd-server
  [etcdctl]=etcd-client
  [redis-sentinel]=redis-sentinel
  [curl]=curl
  [script]=bsdutils
  [python3]=python3
  [pip3]=python3-pip
  [chromium]=chromium
  [wrk]=wrk
  [mariadbd]=mariadb-server
  [mariadb-install-db]=mariadb-server
  [mariadb]=mariadb-client
  [node]=nodejs
  [npm]=npm
)

missing=()
for prog in "${!NEED[@]}"; do
  command -v "$prog" >/dev/null 2>&1 && continue
  # Debian puts PostgreSQL's server programs in /usr/lib/postgresql/<version>/bin, off PATH.
  [[ $prog == initdb ]] && compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && continue
  [[ $prog == pgbouncer && -x /usr/sbin/pgbouncer ]] && continue
  missing+=("${NEED[$prog]}")
done
if ((${#missing[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
    echo "test.sh: installing ${missing[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "test.sh: missing programs; install them with:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
fi

# tessera serve's API is fuzzed from its OpenAPI document with schemathesis (PyPI).
if ! command -v schemathesis >/dev/null 2>&1; then
  echo "test.sh: installing schemathesis with pip" >&2
  pip3 install --quiet schemathesis || python3 -m pip install --quiet --break-system-packages schemathesis
fi

command -v cargo >/dev/null || { echo "test.sh: cargo not found; install Rust from rustup" >&2; exit 1; }
# The Node client needs Node 20.3 or newer (AbortSignal.any); Debian 12's own nodejs is 18.
if ! node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a > 20 || (a === 20 && b >= 3) ? 0 : 1)'; then
  echo "test.sh: the Node client's tests need Node 20.3 or newer; found $(node --version)." >&2
  echo "  install one (e.g. from https://deb.nodesource.com, or 'apt-get install nodejs' on Debian 13)" >&2
  exit 1
fi

export CARGO_TERM_COLOR=${CARGO_TERM_COLOR:-never}
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --all-features --locked -- -D warnings
# Each store feature alone, none, and all together: code that only some stores use (the
# rate engine's Rust steps, say) must be gated on them, or a user's build with one store
# warns. The clippy run above cannot see this: `--all-features` builds every store, and test
# builds always have every store anyway (tessera-testkit, a dev-dependency, enables them
# all). So these runs lint the library alone (`-p tessera-locks`, no `--all-targets`), which also
# keeps them cheap.
for features in memory sqlite redis postgres mysql etcd "" memory,sqlite,redis,postgres,mysql,etcd; do
  echo "== cargo clippy -p tessera-locks --no-default-features --features '$features' -- -D warnings"
  cargo clippy -p tessera-locks --no-default-features --features "$features" --locked -- -D warnings
done
# What `cargo install tessera-cli` and `cargo add tessera-locks` will get: every published
# crate packs with its metadata, README and licence files, and tessera-cli resolves the
# library under its published name. (No build: the steps below build the same sources.)
echo "== cargo publish --workspace --dry-run"
cargo publish --workspace --dry-run --no-verify --locked --allow-dirty
# What `pip install` of the tool's wheel gets (scripts/wheel.sh builds and tries it; a release
# build, so not here): its pyproject names maturin's binary bindings and the crate's version.
echo "== scripts/wheel.sh --check-config"
bash scripts/wheel.sh --check-config
echo "== cargo doc (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --all-features --no-deps --locked
if cargo nextest --version >/dev/null 2>&1; then
  echo "== cargo nextest run"
  cargo nextest run --workspace --all-features --locked --no-fail-fast
  echo "== doc tests"
  cargo test --workspace --all-features --locked --doc
else
  echo "== cargo test"
  cargo test --workspace --all-features --locked --no-fail-fast
fi

# The clients of `tessera serve`, each against servers of its own started from this build.
cargo build --workspace --all-features --locked --bin tessera
export TESSERA_BIN=$PWD/target/debug/tessera
echo "== clients/node"
bash clients/node/test.sh
echo "== clients/python"
bash clients/python/test.sh
