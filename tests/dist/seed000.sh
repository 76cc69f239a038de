#!/usr/bin/env bash
# Seed 000 (upstream hung at epoch ends with multi-scale buckets): 2 ranks train very
# uneven multi-scale buckets on real photos with previews at every epoch end, 3 epochs with
# previews shared over the ranks, then 2 epochs with previews by rank 0 alone (the others
# wait on its progress; each rank-0 preview there takes longer than dist.timeout_s, which
# must not trip). Both runs finish, with the same number of steps on both ranks.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
meta=$SCRATCH/uneven.jsonl
photos=(${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}/nature/*.jpg)
row() { printf '{"path": "%s", "caption": "c%d", "width": %d, "height": %d}\n' "${photos[$(( $1 % ${#photos[@]} ))]}" "$1" "$2" "$3"; }
{
  for ((i = 0; i < 60; i++)); do row $i 40 40; done
  for ((i = 60; i < 80; i++)); do row $i 56 32; done
  for ((i = 80; i < 85; i++)); do row $i 128 32; done
  for ((i = 85; i < 87; i++)); do row $i 32 128; done
  for ((i = 87; i < 100; i++)); do row $i 200 200; done
} > "$meta"
for mode in shared rank0; do
  out=$SCRATCH/$mode.log
  # rank0: about 11 s of sampling per preview against a timeout of 8 s.
  if [ "$mode" = rank0 ]; then steps=250 epochs=2; else steps=2 epochs=3; fi
  timeout 400 "$BIN" launch --nproc-per-node 2 -- --config "$config" --data.data_dir="[$meta]" \
    --data.multi_scale_sizes='[64]' --data.tail=pad "--train.num_epochs=$epochs" --train.max_steps=0 \
    --train.visualize=true --train.preview_every_epochs=1 --train.eval_sampling_steps=100000 \
    "--train.preview_steps=$steps" --train.preview_images=2 "--train.preview_on=$mode" --train.log_interval=100 \
    --dist.timeout_s=8 "--work_dir=$SCRATCH/$mode-$TOKEN" > "$out" 2>&1
  assert_code $? 0 "$epochs uneven epochs with $mode previews"
  # Rank 1's info lines are in its own log (the terminal shows rank 0's).
  d0=$(grep -o 'r0/2 I\] done: [0-9]* steps' "$out" | grep -o '[0-9]* steps')
  d1=$(grep -o 'r1/2 I\] done: [0-9]* steps' "$SCRATCH/$mode-$TOKEN/train.rank1.log" | grep -o '[0-9]* steps')
  if [ -n "$d0" ] && [ "$d0" = "$d1" ]; then pass "both ranks finished after $d0"; else fail "ranks finished differently: '$d0' vs '$d1'"; cat "$out"; fi
  n=$(ls "$SCRATCH/$mode-$TOKEN/previews" | wc -l)
  # 3 showcase buckets at the end of every epoch but the last and at the end of training.
  want=$((3 * epochs))
  if [ "$n" -eq "$want" ]; then pass "$n preview grids"; else fail "$n preview grids, expected $want"; ls "$SCRATCH/$mode-$TOKEN/previews"; fi
done
assert_no_leftovers
finish
