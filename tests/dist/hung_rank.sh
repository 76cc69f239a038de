#!/usr/bin/env bash
# A hung rank (SIGSTOP: its sockets stay open, so no backend error comes) and the flight
# record, with ranks started by hand (no launcher to clean up after them) running
# `check-dist --seconds 60`:
#   1. SIGUSR1 makes a rank write work_dir/flight/rank<N>.json and go on running; sent to
#      `sana-train launch`, it reaches every worker and stops nobody.
#   2. A stopped rank 0 (it hosts the store: a read from it never returns) makes the
#      other ranks exit 3 within the heartbeat timeout + 5 s, naming rank 0; each writes
#      its flight record with the store operation still in flight.
#   3. A stopped rank 2: rank 0 notices the missing heartbeats, and every other rank
#      exits 3 naming rank 2; rank 0 says how far its collectives had come.
. "$(dirname "$0")/lib.sh"
hb=5
soak=(check-dist --seconds 60 --dist.timeout_s=30 --dist.heartbeat_timeout_s=$hb)
flight=$SCRATCH/$TOKEN/flight

start_soak() {
  rm -rf "$SCRATCH"/rank*.log "$flight"
  local port r
  port=$(free_port)
  for r in 0 1 2; do start_rank "$r" 3 "$port" "${soak[@]}"; done
  wait_for_line "$SCRATCH/rank0.log" "soak: all-reducing" 60 || { fail "the soak did not start"; cat "$SCRATCH"/rank*.log; finish; }
}

# 1. SIGUSR1
start_soak
kill -USR1 "${PIDS[1]}"
deadline=$(( $(date +%s) + 10 ))
until [ -f "$flight/rank1.json" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.05; done
if "$SANA_PYTHON" - "$flight/rank1.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
ops = j["ops"]
done = [o for o in ops if o["family"] == "collective" and o["state"] == "done"]
print(f"SIGUSR1 record: rank {j['rank']}, reason {j['reason']!r}, {len(ops)} operations, {len(done)} finished collectives")
sys.exit(0 if j["rank"] == 1 and j["reason"] == "SIGUSR1" and done and j["collectives_started"] >= len(done) else 1)
PY
then pass "SIGUSR1 wrote rank 1's flight record"; else fail "no usable flight record after SIGUSR1"; fi
kill -0 "${PIDS[1]}" 2>/dev/null && pass "rank 1 goes on after SIGUSR1" || fail "rank 1 died of SIGUSR1"
for r in 0 1 2; do kill -KILL "${PIDS[$r]}" 2>/dev/null; code_of "${PIDS[$r]}" 10; done

# SIGUSR1 to the launcher reaches every worker, and stops nobody.
out=$SCRATCH/launch.log
rm -rf "$flight"
# Started by start_bounded, not under `timeout`: SIGUSR1 must reach the launcher itself.
start_bounded 120 "$out" "$BIN" launch --nproc-per-node 2 -- check-dist --seconds 60 --work_dir="$SCRATCH/$TOKEN"
launcher=$BG
wait_for_line "$out" "soak: all-reducing" 60 || fail "the soak did not start under the launcher"
kill -USR1 "$launcher"
deadline=$(( $(date +%s) + 10 ))
until [ -f "$flight/rank0.json" ] && [ -f "$flight/rank1.json" ] || [ "$(date +%s)" -ge "$deadline" ]; do sleep 0.05; done
[ -f "$flight/rank0.json" ] && [ -f "$flight/rank1.json" ] && pass "SIGUSR1 to the launcher: both workers wrote their record" \
  || fail "SIGUSR1 to the launcher: records missing"; ls "$flight" 2>&1
kill -0 "$launcher" 2>/dev/null && pass "the launcher goes on after SIGUSR1" || fail "the launcher stopped on SIGUSR1"
kill -TERM "$launcher"; code_of "$launcher" 30

# Stops VICTIM, waits for the others to exit 3 within LIMIT s; prints the time.
stop_and_wait() {  # VICTIM LIMIT
  local victim=$1 limit=$2 r t0
  start_soak
  kill -STOP "${PIDS[$victim]}"
  t0=$(now)
  local others=()
  for r in 0 1 2; do [ "$r" != "$victim" ] && others+=("${PIDS[$r]}"); done
  wait_for_exits "$limit" "${others[@]}" || fail "rank(s) still run $limit s after rank $victim stopped"
  echo "SIGSTOP of rank $victim -> the others exited after $(elapsed_since "$t0") s (heartbeat timeout $hb s)"
  for r in 0 1 2; do
    [ "$r" = "$victim" ] && continue
    code_of "${PIDS[$r]}" 5; assert_code "$CODE" 3 "rank $r after rank $victim stopped"
  done
}

# 2. Rank 0 stopped
stop_and_wait 0 $((hb + 5))
for r in 1 2; do
  assert_contains "$SCRATCH/rank$r.log" "rank 0 (the store host at 127.0.0.1:" "rank $r names rank 0 as the store host"
  assert_contains "$SCRATCH/rank$r.log" "flight record of this rank: $flight/rank$r.json" "rank $r says where its flight record is"
  if "$SANA_PYTHON" -c '
import json, sys
j = json.load(open(sys.argv[1]))
# Unanswered: still in flight (the watchdog fired) or failed (its socket timed out).
stuck = [o for o in j["ops"] if o["state"] in ("in flight", "failed")]
sys.exit(0 if "rank 0" in j["reason"] and any(o["family"] == "store" for o in stuck) else 1)' "$flight/rank$r.json"; then
    pass "rank $r's flight record shows the unanswered store operation"
  else
    fail "rank $r's flight record"; cat "$flight/rank$r.json"
  fi
done
kill -KILL "${PIDS[0]}"; code_of "${PIDS[0]}" 10
assert_no_leftovers

# 3. Rank 2 stopped: rank 0 notices the missing heartbeats and says how far it had come
stop_and_wait 2 $((hb + 10))
for r in 0 1; do assert_contains "$SCRATCH/rank$r.log" "rank 2 stopped responding" "rank $r names the hung rank"; done
if grep -qE "rank 2 stopped responding \(no heartbeat for [0-9]+ s\).*it had started [0-9]+ collectives, rank 0 [0-9]+" "$SCRATCH/rank0.log"; then
  pass "rank 0 says how many collectives rank 2 and rank 0 had started"
else
  fail "rank 0's message"; cat "$SCRATCH/rank0.log"
fi
kill -KILL "${PIDS[2]}"; code_of "${PIDS[2]}" 10
assert_no_leftovers
finish
