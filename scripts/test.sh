#!/usr/bin/env bash
# The test suite: install dependencies, build sana-train with its tests, run ctest.
#   bash scripts/test.sh [CTEST ARGS...]        the fast tier (ctest label "fast"): every unit,
#                                               torch, reference, config-error and apps test,
#                                               the layout check, training and resume on other
#                                               process counts, one trial of each fault
#   bash scripts/test.sh --all [CTEST ARGS...]  everything, with 10 trials per fault (CI: 5,
#                                               SANA_FAULT_TRIALS)
# Every test has its own timeout, so a hang fails a test instead of the run. Tiers, contents
# and times: docs/testing.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tier=(-L fast)
if [ "${1:-}" = --all ]; then
  shift
  tier=()
else
  export SANA_FAULT_TRIALS=${SANA_FAULT_TRIALS:-1}
fi
bash scripts/install_deps.sh
SANA_BUILD_DIR=${SANA_BUILD_DIR:-$root/build} bash scripts/build.sh -DSANA_BUILD_TESTS=ON
cd "${SANA_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${SANA_TEST_JOBS:-2}" --timeout 900 "${tier[@]}" "$@"
