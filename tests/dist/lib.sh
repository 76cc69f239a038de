# Helpers for the multi-process tests. Each test script sources this, gets a unique TOKEN
# that appears on the command line of every process it starts (so leftovers can be
# found), and a scratch folder. ctest gives every test a hard timeout on top.
set -u
BIN=${SANA_TRAIN_BIN:?set SANA_TRAIN_BIN to the sana-train binary}
TOKEN=sanatest$$x$RANDOM
SCRATCH=$(mktemp -d /tmp/sana-dist-XXXXXX)
FAILURES=0
trap 'pkill -KILL -f "$TOKEN" 2>/dev/null; rm -rf "$SCRATCH"' EXIT

fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
pass() { echo "ok: $*"; }

free_port() {
  /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
}

now() { date +%s.%N; }
elapsed_since() { awk -v a="$(now)" -v b="$1" 'BEGIN { printf "%.2f", a - b }'; }

# Waits until FILE contains PATTERN (grep -E), at most SECONDS; returns 1 on timeout.
wait_for_line() {
  local file=$1 pattern=$2 seconds=$3
  local deadline=$(( $(date +%s) + seconds ))
  until grep -qE "$pattern" "$file" 2>/dev/null; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}

# Waits until process PID has exited, at most SECONDS; returns 1 on timeout.
wait_for_exit() {
  local pid=$1 seconds=$2
  local deadline=$(( $(date +%s) + seconds ))
  while kill -0 "$pid" 2>/dev/null; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.05
  done
}

# Waits until every PID has exited, at most SECONDS; returns 1 on timeout.
wait_for_exits() {
  local seconds=$1 pid
  shift
  local deadline
  deadline=$(awk -v n="$(now)" -v s="$seconds" 'BEGIN { printf "%.2f", n + s }')
  for pid in "$@"; do
    while kill -0 "$pid" 2>/dev/null; do
      awk -v n="$(now)" -v d="$deadline" 'BEGIN { exit !(n >= d) }' && return 1
      sleep 0.05
    done
  done
}

# Waits until no process of this test remains, at most SECONDS; returns 1 on timeout.
wait_until_gone() {
  local deadline=$(( $(date +%s) + $1 ))
  while pgrep -f "$TOKEN" > /dev/null; do
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.05
  done
}

# The pid of the process of this test whose environment has RANK=<rank> and whose command
# line has the word WORD (default check-dist).
pid_of_rank() {
  local rank=$1 word=${2:-check-dist} pid
  for pid in $(pgrep -f "$TOKEN"); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "RANK=$rank"; then
      if tr '\0' '\n' < "/proc/$pid/cmdline" 2>/dev/null | grep -qx -- "$word"; then
        echo "$pid"
        return 0
      fi
    fi
  done
  return 1
}

# The lines of rank R in a launcher's output FILE: sana-train's log lines carry the rank
# ("[2026-11-25 06:02:50.861 r1/2 I] ..."), the launcher puts "[rank 1] " before any other.
of_rank() { grep -E "^\[rank $1\] |^\[[0-9-]+ [0-9:.]+ r$1/[0-9]+ " "$2"; }

assert_no_leftovers() {
  local left
  left=$(pgrep -af "$TOKEN" | grep -v pgrep || true)
  if [ -n "$left" ]; then fail "processes of the run remain: $left"; else pass "no process of the run remains"; fi
}

assert_contains() {  # FILE TEXT WHAT
  if grep -qF -- "$2" "$1"; then pass "$3"; else fail "$3: '$2' not in $1"; echo "--- $1"; cat "$1"; fi
}

assert_code() {  # ACTUAL EXPECTED WHAT
  if [ "$1" -eq "$2" ]; then pass "$3 (exit $1)"; else fail "$3: exit code $1, expected $2"; fi
}

# Starts rank R of W by hand with a torchrun-style environment (no launcher); output goes
# to $SCRATCH/rank<R>.log; the pid is in PIDS[R]. Extra arguments go to sana-train.
declare -a PIDS
start_rank() {
  local rank=$1 world=$2 port=$3
  shift 3
  RANK=$rank WORLD_SIZE=$world LOCAL_RANK=$rank LOCAL_WORLD_SIZE=$world \
    MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$BIN" "$@" --work_dir="$SCRATCH/$TOKEN" > "$SCRATCH/rank$rank.log" 2>&1 &
  PIDS[$rank]=$!
}

# Waits for a background pid of this shell and puts its exit code in CODE.
code_of() { wait "$1"; CODE=$?; }

finish() {
  if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES check(s) failed"; exit 1; fi
  echo "all checks passed"
  exit 0
}
