#!/usr/bin/env bash
# The main job: install dependencies, build, prepare the example data, and train the tiny
# SanaMS on the example photos with 2 processes through sana-train's own launcher
# (metrics, previews, weights and plots land in output/sana_tiny_cpu/). Builds only the
# sana-train binary. Extra arguments are config overrides (they win over the two below),
# e.g. scripts/quickstart.sh --train.max_steps=200
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install_deps.sh
# Only what it runs: the sana-train binary (the tests are scripts/test.sh's).
SANA_BUILD_TARGET=sana-train bash scripts/build.sh
bash scripts/prepare_example_data.sh
# data.tail pad: every photo trains (with the config's drop, the one square photo's bucket,
# smaller than the global batch, never would: a warning). data.cache memory: after the first
# epoch every photo comes decoded from the cache, so the data wait drops to ~0%.
exec "${SANA_BUILD_DIR:-$root/build}/apps/sana-train" launch --nproc-per-node "${SANA_NPROC:-2}" -- \
  --config configs/sana_tiny_cpu.yaml --data.tail=pad --data.cache=memory "$@"
