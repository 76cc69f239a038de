#!/usr/bin/env bash
# The main job: install dependencies, build, prepare the example data, and train the tiny
# SanaMS on the example photos with 2 processes through sana-train's own launcher
# (metrics, previews, weights and plots land in output/sana_tiny_cpu/). Extra arguments
# are config overrides, e.g. scripts/quickstart.sh --train.max_steps=200
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install_deps.sh
bash scripts/build.sh
bash scripts/prepare_example_data.sh
exec "${SANA_BUILD_DIR:-$root/build}/apps/sana-train" launch --nproc-per-node "${SANA_NPROC:-2}" -- \
  --config configs/sana_tiny_cpu.yaml "$@"
