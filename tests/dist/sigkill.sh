#!/usr/bin/env bash
# A rank is killed with SIGKILL during `check-dist --seconds 60`. Without a launcher the
# survivors learn it from the store or the backend and exit with code 3 within
# dist.timeout_s plus a few seconds; with the launcher, the launcher stops everyone and
# exits 137. Prints the time from the SIGKILL to the last survivor's exit.
# A survivor that writes to the dead rank's socket must get EPIPE, not die of SIGPIPE
# (exit 141, found by CI): every rank is checked to ignore SIGPIPE before the kill.
. "$(dirname "$0")/lib.sh"

# True when process PID ignores SIGPIPE (signal 13: bit 12 of SigIgn in /proc/PID/status).
ignores_sigpipe() {
  local mask
  mask=$(awk '/^SigIgn:/ { print $2 }' "/proc/$1/status" 2>/dev/null) || return 1
  [ -n "$mask" ] && (( (16#$mask >> 12) & 1 ))
}
timeout_s=20
soak=(check-dist --seconds 60 --dist.timeout_s=$timeout_s --dist.heartbeat_timeout_s=5)

for victim in 1 0; do
  rm -f "$SCRATCH"/rank*.log  # no line of the previous round may satisfy a wait
  port=$(free_port)
  for r in 0 1 2; do start_rank "$r" 3 "$port" "${soak[@]}"; done
  if ! wait_for_line "$SCRATCH/rank0.log" "soak: all-reducing" 60; then
    fail "the soak did not start"; cat "$SCRATCH"/rank*.log; finish
  fi
  for r in 0 1 2; do
    ignores_sigpipe "${PIDS[$r]}" || fail "rank $r does not ignore SIGPIPE: a write to a dead peer would kill it"
  done
  kill -KILL "${PIDS[$victim]}"
  t0=$(now)
  for r in 0 1 2; do
    [ "$r" = "$victim" ] && continue
    wait_for_exit "${PIDS[$r]}" $((timeout_s + 10)) || fail "rank $r still runs $((timeout_s + 10)) s after the SIGKILL"
  done
  secs=$(elapsed_since "$t0")
  echo "SIGKILL of rank $victim -> last survivor exited after ${secs} s (dist.timeout_s=$timeout_s)"
  for r in 0 1 2; do
    [ "$r" = "$victim" ] && continue
    code_of "${PIDS[$r]}" 5; assert_code "$CODE" 3 "survivor rank $r"
  done
  if awk -v s="$secs" -v t="$timeout_s" 'BEGIN { exit !(s < t + 5) }'; then
    pass "survivors stopped within dist.timeout_s + 5 s"
  else
    fail "survivors took ${secs} s"
  fi
  assert_no_leftovers
done

# With the launcher: it notices the death, stops the others and reports the code.
out=$SCRATCH/launch.log
timeout 200 "$BIN" launch --nproc-per-node 3 -- "${soak[@]}" --work_dir="$SCRATCH/$TOKEN" > "$out" 2>&1 &
launcher=$!
wait_for_line "$out" "soak: all-reducing" 60 || fail "the soak did not start under the launcher"
victim=$(pid_of_rank 1)
kill -KILL "$victim"
t0=$(now)
code_of "$launcher" $((timeout_s + 10))
echo "SIGKILL of rank 1 under the launcher -> launcher exited after $(elapsed_since "$t0") s"
assert_code "$CODE" 137 "launcher exit code is the killed rank's"
assert_contains "$out" "rank 1 exited with code 137" "the launcher names rank 1"
assert_no_leftovers
finish
