#!/usr/bin/env bash
# The launcher gets SIGTERM: it forwards it, every worker stops, it exits 143, and no
# process of the run remains. Also: a launcher killed with SIGKILL takes its workers along.
. "$(dirname "$0")/lib.sh"
# Started by start_bounded, not under `timeout`: the signals must reach the launcher itself.
out=$SCRATCH/term.log
start_bounded 120 "$out" "$BIN" launch --nproc-per-node 2 -- check-dist --seconds 60 --dist.timeout_s=20 \
  --work_dir="$SCRATCH/$TOKEN"
launcher=$BG
wait_for_line "$out" "soak: all-reducing" 60 || fail "the soak did not start"
kill -TERM "$launcher"
t0=$(now)
code_of "$launcher" 20
echo "SIGTERM -> launcher exited after $(elapsed_since "$t0") s"
assert_code "$CODE" 143 "launcher after SIGTERM"
assert_contains "$out" "got signal 15; stopping all workers" "the launcher says why it stops"
assert_no_leftovers

# The workers here are grandchildren (sh does not exec): only the lifeline reaches them.
out=$SCRATCH/kill.log
start_bounded 120 "$out" "$BIN" launch --nproc-per-node 2 -- /bin/sh -c "$BIN check-dist --seconds 60 \
  --dist.timeout_s=20 --work_dir=$SCRATCH/$TOKEN; true"
launcher=$BG
wait_for_line "$out" "soak: all-reducing" 60 || fail "the soak did not start"
kill -KILL "$launcher"
code_of "$launcher" 5
wait_until_gone 10 || fail "workers remain 10 s after the launcher's SIGKILL"
assert_no_leftovers

# Restarts: a worker that fails on the first attempt only.
out=$SCRATCH/restart.log
marker=$SCRATCH/failed-once
timeout 90 "$BIN" launch --nproc-per-node 2 --max-restarts 2 -- /bin/sh -c \
  "if [ \"\$RANK\" = 1 ] && [ ! -e $marker ]; then touch $marker; exit 7; fi; echo attempt \$TORCHELASTIC_RESTART_COUNT; exec $BIN check-dist --dist.timeout_s=30 --work_dir=$SCRATCH/$TOKEN" \
  > "$out" 2>&1
assert_code $? 0 "a run that fails once and then succeeds"
assert_contains "$out" "rank 1 exited with code 7" "the first failure is reported"
assert_contains "$out" "restart 1 of 2" "the launcher restarts all workers"
assert_contains "$out" "[rank 0] attempt 1" "workers see the restart counter"
assert_no_leftovers

# A worker stopped between fork and exec (held there 3 s by a test hook) when another
# fails at once: the SIGTERM is that worker's, not the launcher's, so the launcher still
# restarts, and ends with the failure's own code.
out=$SCRATCH/fork_window.log
SANA_TEST_SPAWN_PAUSE_MS=1:3000 timeout 90 "$BIN" launch --nproc-per-node 2 --max-restarts 1 -- /bin/sh -c \
  'if [ "$RANK" = 0 ]; then exit 5; fi; sleep 60' "$TOKEN" > "$out" 2>&1
assert_code $? 5 "a run whose rank 0 fails while rank 1 is between fork and exec"
assert_contains "$out" "restart 1 of 1" "the launcher restarts after the failure"
if grep -qF "got signal" "$out"; then
  fail "the launcher took the worker's SIGTERM for its own"; cat "$out"
else
  pass "the launcher does not take the worker's SIGTERM for its own"
fi
assert_no_leftovers
finish
