#!/usr/bin/env bash
# The README's memory table: `sana-train model --json --world-size W` for upstream's 600M,
# 1.6B and SANA-1.5 4.8B configs at 512 and 1024 px, each train.zero_stage, AdamW and CAME8bit, at
# 1, 8 and 64 processes, and our 1.6B LoRA config (configs/Sana_1600M_img1024_lora.yaml): the state per GPU of the rank that keeps the most (stage 3: with the
# gathered parameters' bound), plus the activations of the config's micro-batch (fp32 upper
# bound, with its grad_checkpointing), and the smallest of 24/48/80 GB GPUs it fits (`fits_gpus_gb`:
# 2 GiB for the CUDA context and allocator slack; the VAE and text encoder not counted).
# Prints Markdown.
#   bash scripts/bench/memory_table.sh   (Markdown on stdout)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
bin=${SANA_TRAIN_BIN:-$root/build/apps/sana-train}
up=$root/tests/configs/upstream
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configs=("600M 512:$up/512ms/Sana_600M_img512.yaml" "600M 1024:$up/1024ms/Sana_600M_img1024.yaml"
         "1.6B 512:$up/512ms/Sana_1600M_img512.yaml" "1.6B 1024:$up/1024ms/Sana_1600M_img1024.yaml"
         "4.8B 1024:$up/sana1-5_1024ms/Sana_4800M_1024px_came8bit_grow_constant_allqknorm_bf16_lr2e5.yaml")
# cell CONFIG ACTIVATIONS ARGS...: one table cell, the state per GPU of `sana-train model
# --no-activations ARGS` plus the config's activations.
cell() {
  local config=$1 act=$2
  shift 2
  "$bin" model --config "$config" "$@" --json --no-activations "--work_dir=$work/w" > "$work/m.json" 2> /dev/null
  "$SANA_PYTHON" - "$work/m.json" "$act" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["memory_per_process"]
gib = (m["weights"] + m["gradients"] + m["optimizer"] + m["ema"] + m["gathered"]) / 2**30
act = float(sys.argv[2]) / 2**30  # the config's activations (its grad_checkpointing)
fits = [g for g in (24, 48, 80) if (gib + act + 2) * 2**30 <= g * 1e9]  # as sana-train model's fits_gpus_gb
print(f"{gib:.1f} + {act:.1f} GiB ({'fits ' + str(fits[0]) + ' GB' if fits else 'over 80 GB'})")
PY
}
# The activations once per config (they depend on neither the stage nor the optimizer).
activations() {
  "$bin" model --config "$1" --json "--work_dir=$work/w" > "$work/a.json" 2> /dev/null
  "$SANA_PYTHON" -c 'import json,sys; m=json.load(open(sys.argv[1]))["memory_per_process"]; print(m["total_for_config"]-m["weights"]-m["gradients"]-m["optimizer"]-m["ema"])' "$work/a.json"
}
echo "| model, px | optimizer | stage | W=1 | W=8 | W=64 |"
echo "| --- | --- | --- | --- | --- | --- |"
for entry in "${configs[@]}"; do
  what=${entry%%:*} config=${entry#*:}
  act=$(activations "$config")
  for optimizer in AdamW CAME8bit; do
    [ $optimizer = AdamW ] && hyper=("--train.optimizer.betas=[0.9,0.999]" "--train.optimizer.eps=[1e-8]") ||
      hyper=("--train.optimizer.betas=[0.9,0.999,0.9999]" "--train.optimizer.eps=[1e-30,1e-16]")
    one=$(cell "$config" "$act" --train.optimizer.type=$optimizer "${hyper[@]}" --world-size 1)  # no stage splits one process
    for stage in 0 1 2 3; do
      row="| $what | $optimizer | $stage | $one |"
      for w in 8 64; do
        row+=" $(cell "$config" "$act" --train.optimizer.type=$optimizer "${hyper[@]}" --train.zero_stage=$stage --world-size $w) |"
      done
      echo "$row"
    done
  done
done
# LoRA: configs/Sana_1600M_img1024_lora.yaml (rank 16 on attention and the 1x1 convolutions,
# AdamW, the base frozen): the base whole on every GPU, the adapters' state split by the stage.
lora=$root/configs/Sana_1600M_img1024_lora.yaml
act=$(activations "$lora")
one=$(cell "$lora" "$act" --world-size 1)
for stage in 0 3; do
  row="| 1.6B 1024, LoRA r16 | AdamW | $stage | $one |"
  for w in 8 64; do row+=" $(cell "$lora" "$act" --train.zero_stage=$stage --world-size $w) |"; done
  echo "$row"
done
