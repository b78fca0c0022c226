#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets/*.rs) for a bounded time: scripts/fuzz.sh [SECONDS]
# (default 60 per target), or scripts/fuzz.sh SECONDS TARGET... for some of them.
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); RUSTC_BOOTSTRAP=1 lets it use the stable
# toolchain's nightly-only sanitizer flags. Each target starts from its committed seeds
# (fuzz/corpus/<target>/, read only) and grows a working corpus in fuzz/work/<target>/ (not
# committed). A failure stops the script, leaves the input in fuzz/artifacts/<target>/ and
# prints how to reproduce it; add that input to fuzz/corpus/<target>/ with the fix.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${1:-60}"
shift || true
if [ $# -gt 0 ]; then
    targets=("$@")
else
    targets=()
    for f in fuzz_targets/*.rs; do
        targets+=("$(basename "$f" .rs)")
    done
fi
export RUSTC_BOOTSTRAP=1
for t in "${targets[@]}"; do
    mkdir -p "work/$t" "corpus/$t"
    echo "== $t: ${seconds}s"
    cargo fuzz run "$t" "work/$t" "corpus/$t" -- -max_total_time="$seconds" -print_final_stats=1
done
