#!/usr/bin/env bash
# What an epoch plan leaves out is said before training starts (issue 17), through the
# real binary: data with no training step (every bucket smaller than the global batch
# under data.tail drop) and data with no readable image exit 2 with the bucket histogram
# and what to change; buckets that no epoch trains are named with their samples by
# training, plan and check-data, and refused above data.max_untrained_fraction; with
# data.tail pad the log says how many samples an epoch repeats.
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
TINY=$ROOT/configs/sana_tiny_cpu.yaml
photos=(/usr/share/backgrounds/mate/nature/*.jpg)
W=$SCRATCH/$TOKEN
mkdir -p "$W"
common=(--config "$TINY" --train.visualize=false --train.max_steps=1 --train.save_model_epochs=0 --dist.timeout_s=60)
sana() {  # NAME ARGS...: runs the binary, output in $W/NAME.log, returns its exit code
  local name=$1; shift
  timeout 120 "$BIN" "$@" > "$W/$name.log" 2>&1
}

# 1. Five photos, global batch 8, tail drop: no step. Training and plan exit 2 with the histogram.
for ((i = 0; i < 5; i++)); do printf '{"path": "%s", "width": 64, "height": 40}\n' "${photos[$i]}"; done > "$W/five.jsonl"
sana few_train "${common[@]}" --data.data_dir="[$W/five.jsonl]" --work_dir="$W/few"
assert_code $? 2 "training on 5 samples with global batch 8 and tail drop"
assert_contains "$W/few_train.log" "no training step: every bucket holds fewer samples than its global batch" "says why"
assert_contains "$W/few_train.log" "32: 0.6 -> 24x40         5       8       0" "shows the histogram (samples, batch, steps)"
assert_contains "$W/few_train.log" "Use data.tail: pad" "says what to change"
[ -f "$W/few/model.safetensors" ] && fail "untrained weights were written" || pass "no weights written"
sana few_plan plan "${common[@]}" --data.data_dir="[$W/five.jsonl]" --work_dir="$W/few"
assert_code $? 2 "plan of the same"
sana few_pad "${common[@]}" --data.data_dir="[$W/five.jsonl]" --work_dir="$W/fewpad" --data.tail=pad
assert_code $? 0 "the same with data.tail pad trains"
assert_contains "$W/few_pad.log" "data.tail pad repeats 3 samples per epoch" "says what padding repeats"

# 2. Only unreadable files: no usable sample.
for ((i = 0; i < 4; i++)); do echo "not an image" > "$W/broken$i.jpg"; printf '{"path": "%s/broken%d.jpg"}\n' "$W" $i; done > "$W/broken.jsonl"
sana broken "${common[@]}" --data.data_dir="[$W/broken.jsonl]" --work_dir="$W/broken"
assert_code $? 2 "training on unreadable files only"
assert_contains "$W/broken.log" "no usable sample: none of the 4 files" "says no file is usable"

# 3. The 30 wallpapers at global batch 8: the square bucket (1 photo) never trains.
sana rare "${common[@]}" --data.data_dir="[/usr/share/backgrounds/mate]" --work_dir="$W/rare"
assert_code $? 0 "1 untrained sample of 30 is below data.max_untrained_fraction 0.05"
assert_contains "$W/rare.log" "1 bucket never trains: 32: 1.0 -> 32x32 (1 sample); 1 of 30 samples (3.3%) that no epoch will see" \
  "training names the untrained bucket"
sana rare_plan plan "${common[@]}" --data.data_dir="[/usr/share/backgrounds/mate]" --work_dir="$W/rare"
assert_contains "$W/rare_plan.log" "1 bucket never trains: 32: 1.0 -> 32x32" "plan names it"
sana rare_check check-data "${common[@]}" --data.data_dir="[/usr/share/backgrounds/mate]" --work_dir="$W/rare" --limit 2
assert_code $? 0 "check-data still checks the data"
assert_contains "$W/rare_check.log" "1 bucket never trains: 32: 1.0 -> 32x32" "check-data names it"
sana strict "${common[@]}" --data.data_dir="[/usr/share/backgrounds/mate]" --work_dir="$W/strict" \
  --data.max_untrained_fraction=0.01
assert_code $? 2 "above data.max_untrained_fraction 0.01"
assert_contains "$W/strict.log" "more than data.max_untrained_fraction 0.01" "names the key"
assert_contains "$W/strict.log" "32: 1.0 -> 32x32         1       8       0" "shows the histogram"
[ -f "$W/strict/model.safetensors" ] && fail "weights written" || pass "nothing trained"
finish
