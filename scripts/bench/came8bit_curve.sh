#!/usr/bin/env bash
# Does upstream's 8-bit CAME (train.optimizer.type CAME8bit) train like fp32 CAME? Three runs
# of the small preset on the example photos (configs/sana_tiny_cpu.yaml at 32 px, one
# process, the same steps): CAME with seed 1, CAME8bit with seed 1, and CAME with seed 2 as
# the yardstick of run-to-run noise (another data order and other noise draws). Prints the
# loss averaged over windows of 30 steps for each run, the mean absolute gap of CAME8bit to
# CAME and of CAME's two seeds to each other, and a text plot.
#   scripts/bench/came8bit_curve.sh [STEPS=300]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
steps=${1:-300}
build=${SANA_BUILD_DIR:-$root/build}
cmake --build "$build" --target sana-train > /dev/null
work=$(mktemp -d /tmp/sana-came8bit-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$root"
run() {  # NAME TYPE SEED
  timeout 3000 "$build/apps/sana-train" --config configs/sana_tiny_cpu.yaml --work_dir="$work/$1" \
    --model.model=SanaMS_small_P2_D8 --train.optimizer.type="$2" --train.optimizer.lr=3e-4 \
    --train.optimizer.weight_decay=0.0 --train.seed="$3" --train.max_steps="$steps" --train.num_epochs=1000 \
    --train.log_interval=1 --train.visualize=false --train.save_model_steps=1000000 --data.cache=memory \
    --train.num_workers=1 > "$work/$1.log" 2>&1 || { tail -20 "$work/$1.log"; exit 1; }
  echo "$1: $(grep -c '"loss"' "$work/$1/metrics.jsonl") steps logged"
}
run came CAME 1
run came8bit CAME8bit 1
run came_seed2 CAME 2
"$SANA_PYTHON" "$root/scripts/bench/loss_curves.py" "$work" 30 came:CAME came_seed2:"CAME seed 2" came8bit:CAME8bit
