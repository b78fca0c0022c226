#!/usr/bin/env bash
# Runs the Node client's tests against a real `tessera serve` (each test file starts its own
# on SQLite in a temp dir). The server binary: $TESSERA_BIN, else the debug build of the
# repository (cargo build -p tessera-cli).
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
export TESSERA_BIN=${TESSERA_BIN:-$repo/target/debug/tessera}
if [[ ! -x $TESSERA_BIN ]]; then
  echo "clients/node/test.sh: no tessera binary at $TESSERA_BIN" >&2
  echo "  build it with 'cargo build -p tessera-cli', or set TESSERA_BIN" >&2
  exit 1
fi
node --version >/dev/null 2>&1 || { echo "clients/node/test.sh: node (20.3 or newer) is not installed" >&2; exit 1; }
exec node --test test/
