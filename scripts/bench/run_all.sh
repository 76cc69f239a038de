#!/usr/bin/env bash
# The benchmark suite (a benchmark, not a test): sana-train against PyTorch references on
# this machine, as a markdown table and JSON in build/bench/ (the README's "Performance"
# table comes from it). --quick: shorter runs. See scripts/bench/run_all.py.
#   bash scripts/bench/run_all.sh [--quick] [--out DIR] [--only compute,e2e,scripts] [--runs N]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
cmake --build "${SANA_BUILD_DIR:-$root/build}" --target sana-train bench_decode bench_gloo_allreduce bench_ddp > /dev/null
exec "$SANA_PYTHON" "$root/scripts/bench/run_all.py" "$@"
