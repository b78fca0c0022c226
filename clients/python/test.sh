#!/usr/bin/env bash
# Runs the Python client's tests against a real `tessera serve`: each test module starts its
# own on SQLite in a temporary folder. Standard library only, nothing to install.
#
#   bash clients/python/test.sh                         # target/debug/tessera of this repository
#   TESSERA_BIN=/path/to/tessera bash clients/python/test.sh
#   bash clients/python/test.sh -k lost                 # more arguments go to unittest
set -euo pipefail
cd "$(dirname "$0")"
repo=$(cd ../.. && pwd)
export TESSERA_BIN=${TESSERA_BIN:-$repo/target/debug/tessera}
if [[ ! -x $TESSERA_BIN ]]; then
    echo "clients/python/test.sh: no tessera binary at $TESSERA_BIN;" \
        "build it (cargo build -p tessera-cli) or set TESSERA_BIN" >&2
    exit 1
fi
exec python3 -m unittest discover -s tests -v "$@"
