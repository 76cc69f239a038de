#!/usr/bin/env bash
# Peak resident memory of each rank, measured from outside (/usr/bin/time's maximum RSS),
# of a 2-process run at train.zero_stage 0 to 3, beside what `sana-train model
# --world-size 2` predicts each stage saves (stage 3: with the gathered parameters' bound).
# A benchmark: it prints figures, asserts nothing.
#   bash scripts/bench/zero_memory.sh [PRESET] [OPTIMIZER]   (default SanaMS_100M_P2_D12 AdamW)
# Each rank is started by hand with torchrun's variables, under /usr/bin/time; two steps on
# the example photos' test copies at 32 px (tiny activations: the state dominates), EMA on.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
bin=${SANA_TRAIN_BIN:-$root/build/apps/sana-train}
preset=${1:-SanaMS_100M_P2_D12}
optimizer=${2:-AdamW}
photos=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
args=(--config "$root/configs/sana_tiny_cpu.yaml" "--data.data_dir=[$photos]" --model.model="$preset"
      --train.max_steps=2 --train.visualize=false --train.ema_update=true --train.optimizer.type="$optimizer"
      --train.save_model_steps=0 --train.save_model_epochs=0 --ckpt.async_save=false --dist.timeout_s=300)
mib() { awk -v b="$1" 'BEGIN { printf "%.0f", b / 1048576 }'; }
printf "%s, %s, EMA, 2 processes: peak RSS per rank from outside, and the state predicted per rank\n" "$preset" "$optimizer"
printf "%-6s %-22s %-22s %-24s %s\n" stage "peak RSS r0/r1 (MiB)" "fall from stage 0" "predicted state (MiB)" "predicted fall"
base0=; base1=; pred0=
for stage in 0 1 2 3; do
  port=$((20000 + RANDOM % 20000))
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
      timeout 1200 /usr/bin/time -f "%M" -o "$work/rss$r" "$bin" "${args[@]}" --train.zero_stage=$stage \
      "--work_dir=$work/s$stage" > "$work/s$stage.r$r.log" 2>&1 &
  done
  wait
  kb0=$(tail -1 "$work/rss0"); kb1=$(tail -1 "$work/rss1")
  "$bin" model "${args[@]}" --train.zero_stage=$stage --json --world-size 2 "--work_dir=$work/m" 2> /dev/null > "$work/m$stage.json"
  pred=$("$SANA_PYTHON" -c 'import json,sys; m=json.load(open(sys.argv[1]))["memory_per_process"]; print(max(r["weights"]+r["gradients"]+r["optimizer"]+r["ema"]+r["gathered"] for r in m["ranks"]))' "$work/m$stage.json")
  if [ $stage = 0 ]; then base0=$kb0; base1=$kb1; pred0=$pred; fi
  printf "%-6s %-22s %-22s %-24s %s\n" "$stage" "$((kb0 / 1024)) / $((kb1 / 1024))" \
    "$(((base0 - kb0) / 1024)) / $(((base1 - kb1) / 1024))" "$(mib "$pred")" "$(mib "$(awk -v a="$pred0" -v b="$pred" 'BEGIN { print a - b }')")"
done
