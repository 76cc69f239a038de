#!/usr/bin/env bash
# A rank fails at start-up (a config error on that rank only). With the launcher, the
# launcher stops the rest; without one, the failed rank posts its failure to the store and
# the others stop at once instead of waiting for dist.timeout_s.
. "$(dirname "$0")/lib.sh"
timeout_s=60

# With sana-train launch: rank 1 gets a bad override.
out=$SCRATCH/launch.log
t0=$(now)
timeout 90 "$BIN" launch --nproc-per-node 3 -- /bin/sh -c \
  "if [ \"\$RANK\" = 1 ]; then bad=--dist.timeout_s=soon; else bad=; fi; exec $BIN check-dist --dist.timeout_s=$timeout_s --seconds 30 \$bad --work_dir=$SCRATCH/$TOKEN" \
  > "$out" 2>&1
code=$?
secs=$(elapsed_since "$t0")
assert_code "$code" 2 "launcher exits with the failed rank's code"
assert_contains "$out" "[rank 1] config error: dist.timeout_s: expected number, got \"soon\"" "rank 1 names the key"
assert_contains "$out" "rank 1 exited with code 2" "the launcher says who failed"
echo "launcher run ended ${secs} s after start"
if awk -v s="$secs" -v t="$timeout_s" 'BEGIN { exit !(s < t / 2) }'; then
  pass "the launcher stopped the others at once (${secs} s; dist.timeout_s=$timeout_s, the soak 30 s)"
else
  fail "the launcher's run took ${secs} s to end after rank 1's config error"
fi
assert_no_leftovers

# Without a launcher, for each failing rank (a client, then the store's host).
for bad in 1 0; do
  port=$(free_port)
  t0=$(now)
  for r in 0 1 2; do
    extra=()
    [ "$r" = "$bad" ] && extra=(--train.seed=-5)
    start_rank "$r" 3 "$port" check-dist --dist.timeout_s=$timeout_s "${extra[@]}"
  done
  for r in 0 1 2; do
    code_of "${PIDS[$r]}" $((timeout_s + 30)); code=$CODE
    if [ "$r" = "$bad" ]; then
      assert_code "$code" 2 "rank $r (the failing one)"
      assert_contains "$SCRATCH/rank$r.log" "train.seed: -5 is out of range" "rank $r names the key"
    else
      assert_code "$code" 3 "rank $r stops because rank $bad failed"
      assert_contains "$SCRATCH/rank$r.log" "rank $bad failed at start-up" "rank $r names rank $bad"
    fi
  done
  secs=$(elapsed_since "$t0")
  echo "rank $bad failing at start-up: all ranks ended after ${secs} s (dist.timeout_s=$timeout_s)"
  if awk -v s="$secs" -v t="$timeout_s" 'BEGIN { exit !(s < t / 2) }'; then
    pass "nobody waited for the timeout"
  else
    fail "ranks took ${secs} s to stop"
  fi
  assert_no_leftovers
done
finish
