#!/usr/bin/env bash
# What overlapping gradient all-reduce with backward gains, on 2 local processes (Gloo).
#   bash scripts/bench_ddp.sh [PRESET] [STEPS] [SIDE] [BATCH]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${SANA_BUILD_DIR:-build}
cmake --build "$build" --target sana-train bench_ddp > /dev/null
"$build/apps/sana-train" launch --nproc-per-node 2 -- "$PWD/$build/apps/bench_ddp" "$@"
