#!/usr/bin/env bash
# The test suite: install dependencies, build with tests, run everything with ctest.
# Every test has its own timeout, so a hang fails a test instead of the run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install_deps.sh
SANA_BUILD_DIR=${SANA_BUILD_DIR:-$root/build} bash scripts/build.sh -DSANA_BUILD_TESTS=ON
cd "${SANA_BUILD_DIR:-$root/build}"
ctest --output-on-failure -j "${SANA_TEST_JOBS:-2}" --timeout 900 "$@"
