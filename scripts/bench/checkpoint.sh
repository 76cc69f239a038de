#!/usr/bin/env bash
# Checkpoint costs for a model (default SanaMS_100M_P2_D12; also try SanaMS_tiny_P2_D4):
# a checkpoint every step for a few steps on 2 processes, asynchronous (default) and
# synchronous; prints the time the loop waited per save, the background write time, the
# checkpoint size, and the time to resume from it.
#   bash scripts/bench/checkpoint.sh [PRESET] [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${SANA_BUILD_DIR:-build}
preset=${1:-SanaMS_100M_P2_D12}
steps=${2:-4}
work=$(mktemp -d /tmp/sana-bench-ckpt-XXXXXX)
trap 'rm -rf "$work"' EXIT
cmake --build "$build" --target sana-train > /dev/null
data=${SANA_BENCH_DATA:-data/example}
[ -d "$data" ] || data=/usr/share/backgrounds/mate
common=(--config configs/sana_tiny_cpu.yaml "--data.data_dir=[$data]" "--model.model=$preset" --train.visualize=false
        --train.save_model_steps=1 --train.log_interval=1000 --ckpt.keep_last_n=2 --dist.timeout_s=600)
for mode in true false; do
  "$build/apps/sana-train" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$work/$mode" \
    "--train.max_steps=$steps" "--ckpt.async_save=$mode" > "$work/$mode.log" 2>&1 ||
    { echo "the run with ckpt.async_save=$mode failed:"; tail -20 "$work/$mode.log"; exit 1; }
  waits=$(grep -o 'the loop waited [0-9.]* s' "$work/$mode.log" | grep -o '[0-9.]*' | sort -n)
  median=$(echo "$waits" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
  if [ "$mode" = true ]; then
    writes=$(grep -o 'previous write took [0-9.]* s' "$work/$mode.log" | grep -o '[0-9.]*' | tail -n +2 | sort -n)
    wmedian=$(echo "$writes" | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
    echo "$preset async: the loop waited a median ${median} s per checkpoint; the background write took ${wmedian} s"
  else
    echo "$preset sync:  the loop waited a median ${median} s per checkpoint"
  fi
done
size=$(du -sh "$work/true/checkpoints/$(cat "$work/true/checkpoints/latest")" | cut -f1)
"$build/apps/sana-train" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$work/true" \
  "--train.max_steps=$steps" --resume_from=latest > "$work/resume.log" 2>&1 ||
  { echo "the resume failed:"; tail -20 "$work/resume.log"; exit 1; }
resume=$(grep -o 'resumed from .* in [0-9.]* s' "$work/resume.log" | head -1 | grep -o '[0-9.]* s$')
echo "$preset checkpoint size $size; resume (read, verify, load) took $resume"
# The disk's own rate for the same bytes (dd with fsync), next to the background write's.
mb=$(du -sm "$work/true/checkpoints/$(cat "$work/true/checkpoints/latest")" | cut -f1)
dd_rate=$(dd if=/dev/zero of="$work/dd.bin" bs=1M count="$mb" conv=fsync 2>&1 | grep -o '[0-9.,]* [MG]B/s' | tail -1)
awk -v mb="$mb" -v s="$wmedian" -v dd="$dd_rate" 'BEGIN { printf "checkpoint write: %d MB in %.2f s = %.0f MB/s in the background; dd: %s\n", mb, s, mb / s, dd }' 
