#!/usr/bin/env bash
# Fault-injection trials: a 3-process `sana-train launch` training run on the example
# photos, and one fault per trial at a random (rank, moment):
#   sigstop        a hung rank: SIGSTOP, and it stays stopped
#   sigkill        a dead rank: SIGKILL
#   term_launcher  SIGTERM to the launcher: an orderly stop
#   ckpt_kill      SIGKILL of rank 0 while it writes a checkpoint
# Trials take the ranks 0, 1, 2 and the moments in turn, the moment itself at random:
# start-up (0-2.5 s after the rank's process appears: rendezvous, then rank 0 indexing,
# slowed to 2 s by SANA_TEST_INDEX_DELAY_MS, while the others wait for it), training
# (within a random step), a checkpoint write (a random one of four; each stage slowed by
# SANA_TEST_CKPT_STAGE_DELAY_MS so that the signal lands inside it).
# Every trial checks what a user would notice: every process is gone within
# dist.timeout_s + 10 s (SIGSTOP) or + 5 s (the others); a worker's message names the
# hung rank (SIGSTOP: as silent, as the unanswering store host, or as behind in the
# collectives when Gloo's timeout comes first) or the launcher names the killed one; no C++ backtrace is printed;
# no process remains; `latest` (when there is one) verifies; and `--resume_from latest`
# on 2 or 3 processes finishes with every planned sample trained exactly once (a step after the checkpoint is trained
# again after the resume, by design: the ids logged past it are set aside).
#   bash tests/dist/faults.sh FAULT [TRIALS [SEED]]      (SANA_TRAIN_BIN set)
# Prints a line per trial and a summary: trials, survived, the longest exit time.
. "$(dirname "$0")/lib.sh"
fault=${1:?usage: faults.sh sigstop|sigkill|term_launcher|ckpt_kill [TRIALS [SEED]]}
trials=${SANA_FAULT_TRIALS:-${2:-10}}
seed=${3:-$(( $(date +%s) % 32768 ))}
RANDOM=$seed
echo "faults: $fault, $trials trials, seed $seed (again: bash $0 $fault $trials $seed)"
timeout_s=6
steps=10
config=$(cd "$(dirname "$0")/../../configs" && pwd)/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=1
        --dist.timeout_s=$timeout_s --dist.heartbeat_timeout_s=$timeout_s --train.save_model_steps=2
        --train.save_model_epochs=0 --data.tail=pad --train.global_batch_size=12 --train.micro_batch_size=2
        --train.max_steps=$steps --ckpt.keep_last_n=0)
export SANA_TEST_LOG_IDS=1
case $fault in
  sigstop) limit=$((timeout_s + 10)); moments=(start-up training checkpoint) ;;
  sigkill) limit=$((timeout_s + 5)); moments=(start-up training checkpoint) ;;
  term_launcher) limit=$((timeout_s + 5)); moments=(start-up training checkpoint) ;;
  ckpt_kill) limit=$((timeout_s + 5)); moments=(checkpoint) ;;
  *) echo "unknown fault '$fault'"; exit 2 ;;
esac

rand_delay() { awk -v r="$RANDOM" -v lo="$1" -v hi="$2" 'BEGIN { printf "%.2f", lo + (hi - lo) * r / 32767 }'; }

# Waits for the moment; prints the pid to signal (empty: the moment never came).
strike_target() {  # WORK LOG RANK MOMENT
  local work=$1 log=$2 rank=$3 moment=$4 pid="" deadline=$(( $(date +%s) + 120 ))
  case $moment in
    start-up)  # rendezvous, then rank 0 indexing (slowed to 2 s) while the others wait
      until pid=$(pid_of_rank "$rank" --config); do [ "$(date +%s)" -ge "$deadline" ] && return; sleep 0.02; done
      sleep "$(rand_delay 0 2.5)" ;;
    training)
      wait_for_line "$work/metrics.jsonl" "\"step\":$((1 + RANDOM % (steps - 3)))," 120 || return
      sleep "$(rand_delay 0 0.3)" ;;
    checkpoint)  # the write of a random one of the checkpoints at steps 2, 4, 6, 8
      local name
      name=$(printf 'step_%08d' $((2 + 2 * (RANDOM % 4))))
      until compgen -G "$work/checkpoints/.tmp-$name-*" > /dev/null; do
        [ "$(date +%s)" -ge "$deadline" ] && return
        sleep 0.02
      done ;;
  esac
  if [ "$fault" = term_launcher ]; then echo "$LAUNCHER"; else pid_of_rank "$rank" --config; fi
}

# The planned ids of the first $steps steps, (epoch, step) -> ids, from `sana-train plan` on
# one process (the plan does not depend on the world size); once, since every trial trains
# the same data with the same settings.
plan_steps() {  # OUT_JSON
  timeout 300 "$SANA_PYTHON" - "$1" "$BIN" "$config" "$data" "$steps" "$SCRATCH/plan-$TOKEN" <<'PY'
import json, subprocess, sys
out_json, binary, config, data, steps, work = sys.argv[1:7]
steps = int(steps)
planned = []
epoch = 0
while len(planned) < steps:
    out = subprocess.run([binary, "plan", "--config", config, f"--data.data_dir=[{data}]", "--data.tail=pad",
                          f"--work_dir={work}", "--train.global_batch_size=12", "--train.micro_batch_size=2",
                          "--json", "--world-size", "1", "--epoch", str(epoch)], capture_output=True, text=True, check=True)
    for s, ids in enumerate(json.loads(out.stdout)["steps"]):
        if len(planned) < steps:
            planned.append([epoch, s, ids])
    epoch += 1
json.dump(planned, open(out_json, "w"))
PY
}

# Every planned sample of the first $steps steps trained exactly once: the first run's ids
# before the checkpoint the resume loaded, and all of the resumed run's.
check_samples() {  # WORK RESUME_LOG
  timeout 120 "$SANA_PYTHON" - "$1" "$2" "$SCRATCH/planned.json" <<'PY'
import collections, glob, json, re, sys
work, resume_log, planned_json = sys.argv[1:4]
m = re.search(r"resumed from (\S+) ", open(resume_log).read())
start = (0, 0)
if m:
    st = json.load(open(m.group(1) + "/trainer_state.json"))
    start = (st["epoch"], st["step_in_epoch"])
seen = collections.defaultdict(list)
for pattern, keep in (("first.ids.*.log", lambda k: k < start), ("ids.*.log", lambda k: True)):
    for f in glob.glob(f"{work}/{pattern}"):
        for line in open(f):
            e, s, *ids = map(int, line.split())
            if keep((e, s)):
                seen[(e, s)] += ids
planned = {(e, s): ids for e, s, ids in json.load(open(planned_json))}
bad = [k for k in planned if sorted(seen.get(k, [])) != sorted(planned[k])] + [k for k in seen if k not in planned]
print(f"resumed at (epoch, step) {start}; {len(planned)} steps planned, {len(bad)} wrong" + (f": {sorted(bad)[:5]}" if bad else ""))
sys.exit(1 if bad else 0)
PY
}

plan_steps "$SCRATCH/planned.json" || { fail "sana-train plan failed"; finish; }

survived=0
max_exit=0
for trial in $(seq 1 "$trials"); do
  before=$FAILURES
  # Every (rank, moment) pair in turn, the moment within it at random.
  rank=$(( (trial - 1) % 3 ))
  moment=${moments[$(( (trial - 1) / 3 % ${#moments[@]} ))]}
  [ "$fault" = ckpt_kill ] && rank=0  # rank 0 writes the checkpoints
  work=$SCRATCH/$TOKEN/t$trial
  log=$SCRATCH/t$trial.launch.log
  ckpt_delay=0 index_delay=0
  [ "$moment" = checkpoint ] && ckpt_delay=150
  [ "$moment" = start-up ] && index_delay=2000
  # start_bounded, not `timeout`: term_launcher's SIGTERM must reach the launcher itself.
  start_bounded 400 "$log" env SANA_TEST_CKPT_STAGE_DELAY_MS=$ckpt_delay SANA_TEST_INDEX_DELAY_MS=$index_delay \
    "$BIN" launch --nproc-per-node 3 -- "${common[@]}" "--work_dir=$work"
  LAUNCHER=$BG
  target=$(strike_target "$work" "$log" "$rank" "$moment")
  if [ -z "$target" ]; then
    fail "trial $trial: the moment ($moment) never came"; tail -20 "$log"; kill -KILL "$LAUNCHER"; code_of "$LAUNCHER" 10
    pkill -KILL -f "$TOKEN"; continue
  fi
  case $fault in
    sigstop) kill -STOP "$target" ;;
    sigkill | ckpt_kill) kill -KILL "$target" ;;
    term_launcher) kill -TERM "$target" ;;
  esac
  t0=$(now)
  wait_until_gone $((limit + 20))
  secs=$(elapsed_since "$t0")
  kill -KILL "$LAUNCHER" 2>/dev/null  # gone already, unless the limit check below fails
  code_of "$LAUNCHER" 10; code=$CODE
  max_exit=$(awk -v a="$max_exit" -v b="$secs" 'BEGIN { print (b > a) ? b : a }')
  echo "trial $trial: $fault of rank $rank at $moment -> launcher exit $code, all gone after $secs s"
  awk -v s="$secs" -v l="$limit" 'BEGIN { exit !(s <= l) }' || fail "trial $trial: processes ran ${secs} s after the fault (limit $limit s)"
  assert_no_leftovers
  pkill -KILL -f "$TOKEN"
  workers=$(grep -v '^\[launcher\]' "$log")
  if grep -q "frame #[0-9]" "$log"; then fail "trial $trial: a C++ backtrace reached the output"; grep -m3 "frame #" "$log"; fi
  case $fault in
    sigstop)
      if grep -qE "rank $rank (stopped responding|\(the store host)|no word from rank $rank\b|store of rank $rank at|rank $rank made no progress|behind: (rank [0-9]+ at #[0-9]+, )*rank $rank at #" <<< "$workers"; then
        :
      else
        fail "trial $trial: no worker names the hung rank $rank"; tail -15 "$log"
      fi ;;
    sigkill | ckpt_kill)
      grep -q "rank $rank exited with code 137" "$log" || { fail "trial $trial: the launcher does not name rank $rank"; tail -15 "$log"; } ;;
  esac
  if [ -f "$work/checkpoints/latest" ]; then
    named=$work/checkpoints/$(cat "$work/checkpoints/latest")
    timeout 120 "$BIN" inspect "$named" > "$SCRATCH/inspect.log" 2>&1 || { fail "trial $trial: latest ($named) does not verify"; cat "$SCRATCH/inspect.log"; }
  fi
  for f in "$work"/ids.*.log; do [ -f "$f" ] && mv "$f" "$work/first.$(basename "$f")"; done
  nproc=$((2 + trial % 2))
  timeout 300 "$BIN" launch --nproc-per-node "$nproc" -- "${common[@]}" "--work_dir=$work" --resume_from=latest \
    > "$SCRATCH/resume.log" 2>&1
  code=$?
  if [ "$code" -ne 0 ]; then
    fail "trial $trial: the resume on $nproc processes exited $code"; tail -20 "$SCRATCH/resume.log"
  elif ! check_samples "$work" "$SCRATCH/resume.log"; then
    fail "trial $trial: samples lost or repeated after the resume on $nproc processes"
  fi
  [ "$FAILURES" -eq "$before" ] && survived=$((survived + 1))
  rm -rf "$work"
done
echo "faults summary: $fault: $trials trials, $survived survived, longest exit ${max_exit} s (limit $limit s, dist.timeout_s $timeout_s)"
finish
