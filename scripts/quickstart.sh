#!/usr/bin/env bash
# The main job: install dependencies, build, prepare the example data, and run a short
# real training run with the tiny CPU config. Extra arguments are config overrides,
# e.g. scripts/quickstart.sh --train.max_steps=200
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/install_deps.sh
bash scripts/build.sh
bash scripts/prepare_example_data.sh
exec "${SANA_BUILD_DIR:-$root/build}/apps/sana-train" --config configs/sana_tiny_cpu.yaml "$@"
