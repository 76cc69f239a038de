#!/usr/bin/env bash
# Does LoRA on a base stored in less (train.frozen_base_dtype) train like LoRA on the fp32
# base, and NF4 / fp8 like bf16? The small preset (SanaMS_small_P2_D8) trained for STEPS
# steps on the example photos at 32 px is the base (exported to upstream's .pth); then LoRA
# r8 on it, one process, the same steps: fp32 and bf16 bases with seeds 1 and 2 (seed 2 is
# the yardstick of run-to-run noise: another data order and other noise draws), int8, fp8,
# nf4 and nf4 with double quantisation with seed 1. Prints the loss over windows of 30
# steps, twice (scripts/bench/loss_curves.py): each stored base's mean gap to the fp32 base
# and its ratio to fp32's seed noise, then fp8's and NF4's gap to the bf16 base and its
# ratio to bf16's seed noise, with a text plot.
#   scripts/bench/frozen_base_curve.sh [STEPS=300]
# RUNS="bf16 bf16_seed2 nf4" runs those alone (and compares what it can): about 4 minutes a
# run on 2 cores.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
steps=${1:-300}
build=${SANA_BUILD_DIR:-$root/build}
cmake --build "$build" --target sana-train > /dev/null
work=$(mktemp -d /tmp/sana-frozen-curve-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$root"
bash scripts/prepare_example_data.sh > /dev/null  # data/example, as configs/sana_tiny_cpu.yaml reads
common=(--config configs/sana_tiny_cpu.yaml --model.model=SanaMS_small_P2_D8 --train.num_epochs=1000
        --train.log_interval=1 --train.visualize=false --train.save_model_steps=1000000 --data.cache=memory
        --train.num_workers=1 --train.max_steps="$steps")
# The base: the preset trained on the same photos, so LoRA adapts a base that has learnt something.
timeout 3000 "$build/apps/sana-train" "${common[@]}" --work_dir="$work/base" --train.optimizer.lr=3e-4 \
  > "$work/base.log" 2>&1 || { tail -20 "$work/base.log"; exit 1; }
timeout 300 "$build/apps/sana-train" export "${common[@]}" --from "$work/base/model.safetensors" --format upstream --out "$work/base.pth" \
  > "$work/export.log" 2>&1 || { tail -20 "$work/export.log"; exit 1; }
run() {  # NAME DTYPE SEED [MORE ARGUMENTS]
  if [ -n "${RUNS:-}" ] && [[ " $RUNS " != *" $1 "* ]]; then return 0; fi
  timeout 3000 "$build/apps/sana-train" "${common[@]}" --work_dir="$work/$1" --model.load_from="$work/base.pth" \
    --train.lora.rank=8 "--train.lora.target_modules=[to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]" \
    --train.optimizer.lr=1e-3 --train.frozen_base_dtype="$2" --train.seed="$3" "${@:4}" > "$work/$1.log" 2>&1 ||
    { tail -20 "$work/$1.log"; exit 1; }
  echo "$1: $(grep -c '"loss"' "$work/$1/metrics.jsonl") steps logged"
}
run fp32 fp32 1
run fp32_seed2 fp32 2
run bf16 bf16 1
run bf16_seed2 bf16 2
run int8 int8 1
run fp8 fp8 1
run nf4 nf4 1
run nf4_dq nf4 1 --train.frozen_base_double_quant=true
# Each comparison with the runs it has.
compare() {  # REFERENCE:LABEL YARDSTICK:LABEL OTHER:LABEL...
  local have=()
  for r in "$@"; do [ -f "$work/${r%%:*}/metrics.jsonl" ] && have+=("$r"); done
  [ ${#have[@]} -ge 3 ] && "$SANA_PYTHON" "$root/scripts/bench/loss_curves.py" "$work" 30 "${have[@]}"
  return 0
}
compare fp32:"fp32 base" fp32_seed2:"fp32 seed 2" bf16:"bf16 base" int8:"int8 base" fp8:"fp8 base" nf4:"nf4 base" \
  nf4_dq:"nf4-dq base"
compare bf16:"bf16 base" bf16_seed2:"bf16 seed 2" fp8:"fp8 base" nf4:"nf4 base" nf4_dq:"nf4-dq base"
