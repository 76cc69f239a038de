#!/usr/bin/env bash
# Two processes iterate three epochs of a very uneven multi-scale plan through the real
# loader, with an all-reduce per step: they finish together, without hanging.
. "$(dirname "$0")/lib.sh"
program=${PLAN_ALLREDUCE_BIN:?}
meta=$SCRATCH/uneven.jsonl
# Real photos with declared sizes that make very uneven buckets at two base sizes:
# 150 square, 40 at 16:9, 9 panoramas, 3 towers, 30 large squares (base 64).
photos=(${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}/nature/*.jpg)
row() { printf '{"path": "%s", "caption": "c%d", "width": %d, "height": %d}\n' "${photos[$(( $1 % ${#photos[@]} ))]}" "$1" "$2" "$3"; }
{
  for ((i = 0; i < 150; i++)); do row $i 40 40; done
  for ((i = 150; i < 190; i++)); do row $i 56 32; done
  for ((i = 190; i < 199; i++)); do row $i 128 32; done
  for ((i = 199; i < 202; i++)); do row $i 32 128; done
  for ((i = 202; i < 232; i++)); do row $i 200 200; done
} > "$meta"
out=$SCRATCH/out.log
timeout 300 "$BIN" launch --nproc-per-node 2 -- "$program" "$meta" "$SCRATCH/$TOKEN" > "$out" 2>&1
code=$?
assert_code "$code" 0 "two ranks through three uneven epochs"
for r in 0 1; do
  assert_contains "$out" "[rank $r] rank $r: 3 epochs," "rank $r finished all epochs"
done
s0=$(grep -o '\[rank 0\] rank 0: 3 epochs, [0-9]* steps' "$out" | grep -o '[0-9]* steps')
s1=$(grep -o '\[rank 1\] rank 1: 3 epochs, [0-9]* steps' "$out" | grep -o '[0-9]* steps')
if [ -n "$s0" ] && [ "$s0" = "$s1" ]; then pass "both ranks took $s0"; else fail "step counts differ: '$s0' vs '$s1'"; cat "$out"; fi
assert_no_leftovers

# A third of the samples unreadable and data.max_bad_fraction 0.05: both ranks stop at the
# same step with the same message instead of one rank waiting for the other.
bad=$SCRATCH/bad.jsonl
{ cat "$meta"; for ((i = 0; i < 120; i++)); do printf '{"path": "%s/missing%d.jpg", "width": 40, "height": 40}\n' "$SCRATCH" $i; done; } > "$bad"
out=$SCRATCH/bad.log
timeout 300 "$BIN" launch --nproc-per-node 2 -- "$program" "$bad" "$SCRATCH/$TOKEN" 0.05 > "$out" 2>&1
assert_code $? 1 "too many bad samples"
for r in 0 1; do
  assert_contains "$out" "[rank $r] stopped: " "rank $r stops"
done
m0=$(grep -o '\[rank 0\] stopped: .*' "$out" | cut -d' ' -f3-)
m1=$(grep -o '\[rank 1\] stopped: .*' "$out" | cut -d' ' -f3-)
if [ -n "$m0" ] && [ "$m0" = "$m1" ]; then pass "both ranks stop at the same totals: $m0"; else fail "ranks disagree: '$m0' vs '$m1'"; fi
assert_no_leftovers
finish
