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
jobs=${SANA_TEST_JOBS:-2}
# ctest runs `jobs` tests at once: each gets its share of the cores as LibTorch threads (sana-train
# and the test binaries read OMP_NUM_THREADS), since LibTorch's OpenMP pool, oversubscribed,
# waits at every parallel region for a descheduled thread (a tiny training run beside a float64
# check: 220 s together at 2 threads each on 2 cores, 19 s at 1).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / jobs > 0 ? $(nproc) / jobs : 1 ))}
# The last line counts the outcomes (from ctest's JUnit report): passed, failed, skipped
# (a test that cannot run here exits 77: ctest's SKIP_RETURN_CODE).
junit=$PWD/Testing/outcomes.xml
rm -f "$junit"
rc=0
ctest --output-on-failure -j "$jobs" --timeout 900 --output-junit "$junit" "${tier[@]}" "$@" || rc=$?
if [ -f "$junit" ]; then
  # An attribute of the <testsuite> element, which comes first.
  count() { grep -m1 -oE "[[:space:]]$1=\"[0-9]+\"" "$junit" | grep -oE '[0-9]+' || echo 0; }
  total=$(count tests) failed=$(count failures) skipped=$(count skipped)
  echo "tests: $((total - failed - skipped)) passed, $failed failed, $skipped skipped, of $total"
fi
exit "$rc"
