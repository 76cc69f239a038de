#!/usr/bin/env bash
# The gradient engine on 2 and 3 processes, with and without gradient accumulation: the
# synced gradient equals one process's gradient over the whole global batch (<= 1e-6
# relative), and a parameter without gradient is zero-filled on every rank.
. "$(dirname "$0")/lib.sh"
program=${DDP_CHECK_BIN:?}
for n in 2 3; do
  for acc in 1 2; do
    out=$SCRATCH/ddp_${n}_${acc}.log
    timeout 120 "$BIN" launch --nproc-per-node "$n" -- "$program" "$acc" "$TOKEN" > "$out" 2>&1
    assert_code $? 0 "$n processes, accumulation $acc"
    for ((r = 0; r < n; r++)); do
      line=$(grep -o "\[rank $r\] rank $r: world $n, accumulation $acc.*" "$out")
      if [ -n "$line" ]; then pass "$line"; else fail "rank $r reported nothing"; cat "$out"; fi
    done
    assert_contains "$out" "never_used.weight" "the unused parameter is named in a warning"
  done
done
assert_no_leftovers
finish
