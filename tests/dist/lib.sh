# Helpers for the multi-process tests. Each test script sources this, gets a unique TOKEN
# that appears on the command line of every process it starts (so leftovers can be
# found), and a scratch folder. ctest gives every test a hard timeout on top.
set -u
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/python_env.sh"
BIN=${SANA_TRAIN_BIN:?set SANA_TRAIN_BIN to the sana-train binary}
LIB_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # the repository, whatever the caller's folder
TOKEN=sanatest$$x$RANDOM
SCRATCH=$(mktemp -d /tmp/sana-dist-XXXXXX)
FAILURES=0
trap 'pkill -KILL -f "$TOKEN" 2>/dev/null; [ -n "${SANA_TEST_KEEP:-}" ] || rm -rf "$SCRATCH"' EXIT

fail() { echo "FAIL: $*"; FAILURES=$((FAILURES + 1)); }
pass() { echo "ok: $*"; }

free_port() {
  timeout 30 "$SANA_PYTHON" -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
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

# Every process a test starts runs under `timeout`, or is started by start_bounded when
# the test must signal the process itself (a `timeout` in between would take the signal):
# then code_of waits for it until its deadline at most. scripts/check_layout.sh (rule e)
# holds tests/ to this.
declare -A DEADLINE
# start_bounded SECONDS OUT CMD...: CMD in the background, output in OUT, its pid in BG;
# code_of BG waits for it until SECONDS after the start.
start_bounded() {
  local seconds=$1 out=$2
  shift 2
  "$@" > "$out" 2>&1 &  # bounded: code_of's deadline
  BG=$!
  DEADLINE[$BG]=$(( $(date +%s) + seconds ))
}

# Starts rank R of W by hand with a torchrun-style environment (no launcher); output goes
# to $SCRATCH/rank<R>.log; the pid is in PIDS[R]; code_of waits for it 300 s after the
# start at most. Extra arguments go to sana-train.
declare -a PIDS
start_rank() {
  local rank=$1 world=$2 port=$3
  shift 3
  start_bounded 300 "$SCRATCH/rank$rank.log" env RANK="$rank" WORLD_SIZE="$world" LOCAL_RANK="$rank" \
    LOCAL_WORLD_SIZE="$world" MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$BIN" "$@" --work_dir="$SCRATCH/$TOKEN"
  PIDS[$rank]=$BG
}

# code_of PID [SECONDS]: waits for a background pid of this shell, at most SECONDS (by
# default until start_bounded's deadline, or 300 s), and puts its exit code in CODE. One
# still running then fails the test, naming its command line, and is killed (CODE 124).
code_of() {
  local pid=$1 seconds=${2:-}
  if [ -z "$seconds" ]; then
    seconds=$(( ${DEADLINE[$pid]:-$(( $(date +%s) + 300 ))} - $(date +%s) ))
    [ "$seconds" -lt 1 ] && seconds=1
  fi
  if wait_for_exit "$pid" "$seconds"; then
    wait "$pid"; CODE=$?  # bounded: it has exited
  else
    fail "still running after $seconds s, killed: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-160)"
    kill -KILL "$pid" 2>/dev/null
    wait "$pid"; CODE=124  # bounded: killed above
  fi
}

# skip WHY: this test cannot run here. It says "skipped: WHY" and exits 77, which ctest
# (SKIP_RETURN_CODE) shows as Skipped; a check that already failed still fails the test.
skip() {
  [ "$FAILURES" -ne 0 ] && finish
  echo "skipped: $*"
  exit 77
}

# launch_named NAME NPROC ARGS...: `sana-train launch` of NPROC processes with the script's
# `common` arguments and work_dir $SCRATCH/NAME (a later --work_dir in ARGS wins), under a
# 300 s limit; output in $SCRATCH/NAME.log, whose tail is shown when it fails.
launch_named() {
  local name=$1 n=$2 t0; shift 2
  t0=$(now)
  timeout 300 "$BIN" launch --nproc-per-node "$n" -- "${common[@]}" "--work_dir=$SCRATCH/$name" "$@" \
    > "$SCRATCH/$name.log" 2>&1
  local code=$?
  echo "  (run $name on $n processes: $(elapsed_since "$t0") s)"
  [ $code -eq 0 ] || tail -20 "$SCRATCH/$name.log"
  return $code
}

# resume_on_one WHAT STOP MAX: the script's run (its `common` arguments, work_dir
# $SCRATCH/chain) stopped at step STOP on 2 processes, then resumed on 1 to step MAX; every
# epoch must train the samples of the uninterrupted $SCRATCH/ref, each once (both with
# SANA_TEST_LOG_IDS=1, which this unsets). WHAT names the run in the checks.
resume_on_one() {
  local what=$1 stop=$2 max=$3
  local chain=(--work_dir="$SCRATCH/chain" --resume_from=latest)
  launch_named chain2 2 "${chain[@]}" --train.max_steps="$stop"; assert_code $? 0 "$stop $what steps on 2 processes"
  launch_named chain1 1 "${chain[@]}" --train.max_steps="$max"; assert_code $? 0 "resumed on 1 process to step $max"
  unset SANA_TEST_LOG_IDS
  assert_contains "$SCRATCH/chain1.log" "resumed from" "the 1-process run resumed the 2-process checkpoint"
  if "$SANA_PYTHON" "$LIB_ROOT/tests/dist/same_samples.py" "$SCRATCH" ref chain > "$SCRATCH/ids.log" 2>&1; then
    pass "every sample once per epoch, 2 processes then 1: $(tr '\n' ' ' < "$SCRATCH/ids.log")"
  else
    fail "samples lost or repeated across the resume"; cat "$SCRATCH/ids.log"
  fi
}

# same_losses A B N WHAT: runs $SCRATCH/A and $SCRATCH/B logged the same first N losses
# (metrics.jsonl) within 1e-6 relative, and B logged exactly N.
same_losses() {
  local a=$1 b=$2 n=$3 what=$4
  if "$SANA_PYTHON" - "$SCRATCH/$a/metrics.jsonl" "$SCRATCH/$b/metrics.jsonl" "$n" > "$SCRATCH/$b.cmp" 2>&1 <<'PY'; then
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
n = int(sys.argv[3])
worst = max(abs(x - y) / abs(x) for x, y in zip(a[:n], b))
print(f"{len(b)} losses, max relative difference {worst:.3g}")
sys.exit(0 if len(b) == n and worst <= 1e-6 else 1)
PY
    pass "$what: $(cat "$SCRATCH/$b.cmp")"
  else
    fail "$what: the losses differ: $(cat "$SCRATCH/$b.cmp")"
  fi
}

# replayed WORK WHAT KEYS [MODEL_ARGS...]: the run in $SCRATCH/WORK (its micro-batches dumped with
# SANA_TEST_DUMP_BATCHES=1) replayed in python3-torch by tests/reference/train_replay.py on
# $SCRATCH/base.pth: every step's loss and the final trained tensors must match. KEYS is a
# JSON object of the run's settings as train_replay.py names them ("kind", "lr", "betas", ...);
# the model's spec comes from `sana-train model --json` with the script's `common` arguments
# and MODEL_ARGS.
replayed() {
  local work=$1 what=$2 keys=$3 settings; shift 3
  timeout 120 "$BIN" model --json --no-memory "${common[@]}" "$@" "--work_dir=$SCRATCH/$work" \
    > "$SCRATCH/$work.model.json" 2> /dev/null
  settings=$(timeout 60 "$SANA_PYTHON" -c 'import json, sys
s = json.loads(sys.argv[2])
s["spec"] = json.load(open(sys.argv[1]))["spec"]
print(json.dumps(s))' "$SCRATCH/$work.model.json" "$keys")
  if timeout 300 "$SANA_PYTHON" "$LIB_ROOT/tests/reference/train_replay.py" "$SCRATCH/$work" \
      "$SCRATCH/base.pth" "$settings" > "$SCRATCH/$work.replay" 2>&1; then
    pass "$what: $(tail -1 "$SCRATCH/$work.replay")"
  else
    fail "$what: the run against its python3-torch replay:"; tail -25 "$SCRATCH/$work.replay"
  fi
}

# walkthrough_command I CMD METRICS: a README walkthrough's command I as a user runs it (in
# the current folder, output in $SCRATCH/cmdI.log): a first launch is stopped with Ctrl-C
# once METRICS has step 10 (its checkpoint is what the resume picks up); a resume, `sana-train
# model` and `sana-train export` must exit 0 within 300 s; anything else fails the test.
walkthrough_command() {
  local i=$1 cmd=$2 metrics=$3 log=$SCRATCH/cmd$1.log
  case "$cmd" in
    *launch*--resume_from*|sana-train\ model\ *|sana-train\ export\ *)
      timeout 300 bash -c "$cmd" > "$log" 2>&1
      assert_code $? 0 "[$i] $cmd"
      ;;
    *launch*)
      stop_at_step "$cmd" "$metrics" 10 "$log" "[$i] $cmd"
      ;;
    *)
      fail "[$i] a command this test does not know how to check: $cmd"
      ;;
  esac
}

# walkthrough_commands METRICS CONFIG [ARGS...]: a README walkthrough's commands.txt
# (readme_commands) run in order as a user runs them. A `huggingface-cli download ...
# --local-dir DIR` of a diffusers pipeline is replaced by CONFIG's model (with ARGS) at its
# initial weights exported as DIR/transformer, and sets download_dir=DIR; every other
# command goes to walkthrough_command with METRICS.
walkthrough_commands() {
  local metrics=$1 config=$2 i=0 cmd
  shift 2
  while IFS= read -r cmd <&3; do
    i=$((i + 1))
    case "$cmd" in
      huggingface-cli\ download\ *)
        download_dir=$(echo "$cmd" | sed -E 's/.*--local-dir +([^ ]+).*/\1/')
        timeout 120 sana-train export --config "$config" "$@" --model.load_from= --format diffusers \
          --out "$download_dir/transformer" > "$SCRATCH/cmd$i.log" 2>&1
        assert_code $? 0 "[$i] the download's stand-in: a tiny caption model as a diffusers pipeline folder at $download_dir"
        ;;
      *)
        walkthrough_command "$i" "$cmd" "$metrics"
        ;;
    esac
  done 3< commands.txt
}

# refuses_other_base WHAT MAX: the script's run resumed from $SCRATCH/chain on other base
# weights (the config's initial weights at train.seed 9, exported) to step MAX is refused,
# exit 2, naming the checkpoint's base checksum $start_sum and what to do.
refuses_other_base() {
  local what=$1 max=$2
  timeout 120 "$BIN" export --config "$config" --train.seed=9 --format upstream --out "$SCRATCH/other.pth" \
    > "$SCRATCH/export_other.log" 2>&1
  launch_named other 1 "--model.load_from=$SCRATCH/other.pth" --work_dir="$SCRATCH/chain" --resume_from=latest \
    --train.max_steps="$max"
  assert_code $? 2 "resuming the $what on other base weights"
  assert_contains "$SCRATCH/other.log" "checksum $start_sum" "the refusal names the checkpoint's base checksum"
  assert_contains "$SCRATCH/other.log" "Resume with the base it was trained on" "and says what to do"
}

# stop_at_step CMD METRICS STEP LOG WHAT: runs the shell line CMD in its own process group
# (output in LOG), sends it Ctrl-C (SIGINT to the group) once METRICS has step STEP, and
# checks that it exits 130 (128 + SIGINT) within 120 s; 240 s to reach the step.
stop_at_step() {
  local cmd=$1 metrics=$2 step=$3 log=$4 what=$5
  start_bounded 360 "$log" setsid bash -c "exec $cmd"
  local pid=$BG
  if ! wait_for_line "$metrics" "\"step\":$step," 240; then
    fail "$what did not reach step $step"; kill -KILL -- "-$pid"; code_of "$pid" 10; cat "$log"; return
  fi
  kill -INT -- "-$pid"
  wait_for_exit "$pid" 120 || { fail "$what did not stop within 120 s of Ctrl-C"; kill -KILL -- "-$pid"; }
  code_of "$pid" 10
  assert_code "$CODE" 130 "$what, stopped with Ctrl-C (the launcher exits 128 + SIGINT)"
}

# readme_commands NAME MIN: the commands of README.md's block between <!-- NAME:begin -->
# and <!-- NAME:end --> (its ```sh fence; comments and blank lines dropped, one command per
# line) into commands.txt; the test ends here unless there are at least MIN.
readme_commands() {
  local root=$LIB_ROOT
  sed -n "/<!-- $1:begin -->/,/<!-- $1:end -->/p" "$root/README.md" |
    sed '1,/^```sh$/d; /^```$/,$d' | grep -vE '^\s*(#|$)' > commands.txt
  n=$(wc -l < commands.txt)
  if [ "$n" -ge "$2" ]; then pass "the README's $1 block has $n commands"; else fail "$1 block: $n commands"; cat commands.txt; finish; fi
}

# as_a_user [hub]: for the README walkthroughs, work in $SCRATCH with `sana-train` on PATH and
# the example photos with captions in my_images/; then the small TorchScript encoders in
# exports/, or with `hub` the two encoders as a user downloads them (hf_encoders). The test
# ends here if any of it cannot be made.
as_a_user() {
  local root=$LIB_ROOT
  cd "$SCRATCH" || exit 1
  mkdir bin && ln -s "$BIN" bin/sana-train
  export PATH=$SCRATCH/bin:$PATH
  bash "$root/scripts/prepare_example_data.sh" my_images > /dev/null || { fail "no example data"; finish; }
  if [ "${1:-}" = hub ]; then hf_encoders; return; fi
  timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_torchscript_encoders.py" exports > /dev/null 2>&1 ||
    { fail "python3-torch could not export the stand-in encoders"; finish; }
}

# hf_cache_repo FOLDER ORG--NAME: FOLDER's files in $SCRATCH/hf/hub as huggingface_hub lays a
# download out: models--ORG--NAME/{blobs/SHA256, snapshots/REV/FILE -> ../../blobs/SHA256,
# refs/main holding REV}.
HF_REV=4f3c2b1a0e9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b
hf_cache_repo() {
  local repo=$SCRATCH/hf/hub/models--$2 f sha
  mkdir -p "$repo/blobs" "$repo/snapshots/$HF_REV" "$repo/refs"
  for f in "$1"/*; do
    sha=$(sha256sum "$f" | cut -c1-64)
    cp "$f" "$repo/blobs/$sha"
    ln -s "../../blobs/$sha" "$repo/snapshots/$HF_REV/$(basename "$f")"
  done
  printf '%s' "$HF_REV" > "$repo/refs/main"
}

# hf_encoders: a small random Gemma-2 written by transformers (hidden 32, tokenizer.model
# included) and a small random AutoencoderDC written by diffusers (4 latent channels at 1/4)
# in the Hugging Face cache under upstream's names, Efficient-Large-Model/gemma-2-2b-it and
# mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers, with HF_HOME pointing there and nothing else
# the lookup reads set. Python only makes them; sana-train reads the folders itself.
hf_encoders() {
  local root=$LIB_ROOT
  timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_gemma2.py" "$SCRATCH/made-gemma" > "$SCRATCH/made-gemma.log" 2>&1 ||
    { fail "transformers could not write the Gemma-2 folder"; cat "$SCRATCH/made-gemma.log"; finish; }
  timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_dc_ae.py" "$SCRATCH/made-vae" > "$SCRATCH/made-vae.log" 2>&1 ||
    { fail "diffusers could not write the AutoencoderDC folder"; cat "$SCRATCH/made-vae.log"; finish; }
  hf_cache_repo "$SCRATCH/made-gemma/gemma" Efficient-Large-Model--gemma-2-2b-it
  hf_cache_repo "$SCRATCH/made-vae/sana" mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers
  unset HF_HUB_CACHE SANA_MODELS_DIR XDG_CACHE_HOME
  export HF_HOME=$SCRATCH/hf
}

finish() {
  if [ "$FAILURES" -ne 0 ]; then echo "$FAILURES check(s) failed"; exit 1; fi
  echo "all checks passed"
  exit 0
}
