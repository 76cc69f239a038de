#!/usr/bin/env bash
# Host memory per rank at a checkpoint save and a resume, for the README memory table's
# configs (upstream's 600M 512, 1.6B 1024 and SANA-1.5 4.8B 1024; AdamW and CAME8bit), from
# `sana-train model --json` (the state each rank keeps, in bytes: weights, optimizer, EMA):
#  - the checkpoint: every tensor once (weights + optimizer state + EMA at 1 process);
#  - format 2: rank 0 holds the whole checkpoint at every save, and every rank at every
#    resume (plus the part file being parsed);
#  - format 3 at W processes: a save holds this rank's share (its owned parameters' weights,
#    optimizer state and EMA: `model --train.zero_stage 3 --world-size W`'s largest rank);
#    a resume the whole model plus its share of the optimizer and EMA (stages 1-3), or the
#    whole checkpoint (stage 0, where every rank restores everything).
# Prints Markdown.  bash scripts/bench/checkpoint_host_memory.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
bin=${SANA_TRAIN_BIN:-$root/build/apps/sana-train}
up=$root/tests/configs/upstream
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configs=("600M 512:$up/512ms/Sana_600M_img512.yaml" "1.6B 1024:$up/1024ms/Sana_1600M_img1024.yaml"
         "4.8B 1024:$up/sana1-5_1024ms/Sana_4800M_1024px_came8bit_grow_constant_allqknorm_bf16_lr2e5.yaml")
state() {  # CONFIG OPTIMIZER W STAGE -> the JSON of `sana-train model`
  local hyper=("--train.optimizer.betas=[0.9,0.999]" "--train.optimizer.eps=[1e-8]")
  [ "$2" = AdamW ] || hyper=("--train.optimizer.betas=[0.9,0.999,0.9999]" "--train.optimizer.eps=[1e-30,1e-16]")
  "$bin" model --config "$1" "--train.optimizer.type=$2" "${hyper[@]}" --world-size "$3" "--train.zero_stage=$4" --json \
    --no-activations "--work_dir=$work/w" 2> /dev/null
}
echo "| model, px | optimizer | checkpoint | format 2: rank 0 at a save, every rank at a resume | format 3, W=8: save / resume (stages 1-3) | format 3, W=64: save / resume (stages 1-3) |"
echo "| --- | --- | --- | --- | --- | --- |"
for entry in "${configs[@]}"; do
  name=${entry%%:*} config=${entry#*:}
  for opt in AdamW CAME8bit; do
    state "$config" "$opt" 1 0 > "$work/w1.json"
    state "$config" "$opt" 8 3 > "$work/w8.json"
    state "$config" "$opt" 64 3 > "$work/w64.json"
    "$SANA_PYTHON" - "$name" "$opt" "$work/w1.json" "$work/w8.json" "$work/w64.json" <<'PY'
import json, sys
name, opt, one, w8, w64 = sys.argv[1], sys.argv[2], *[json.load(open(p))["memory_per_process"] for p in sys.argv[3:6]]
gib = lambda b: f"{b / 2**30:.1f} GiB"
whole = one["weights"] + one["optimizer"] + one["ema"]
def cells(m):
    share = m["weights"] + m["optimizer"] + m["ema"]  # the rank that keeps the most
    return f"{gib(share)} / {gib(one['weights'] + m['optimizer'] + m['ema'])}"
print(f"| {name} | {opt} | {gib(whole)} | {gib(whole)} | {cells(w8)} | {cells(w64)} |")
PY
  done
done
