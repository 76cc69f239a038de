#!/usr/bin/env bash
# What a run carries over from a checkpoint besides its weights, as upstream's train.py reads
# its keys (docs/upstream.md, "Resume and load_from"):
#   1. train.resume_lr_scheduler false: a resume from a named checkpoint starts the
#      learning-rate schedule again (warm-up included), and a later resume_from latest of
#      that run goes on with the restarted schedule; resume_from latest that finds a
#      checkpoint continues the schedule whatever the key says.
#   2. resume_from latest with no checkpoint yet and model.load_from naming a checkpoint
#      folder: its weights, and with train.load_from_optimizer / load_from_lr_scheduler its
#      optimizer state (format 3, written on 2 processes, read on 1) and schedule position;
#      without them, a fresh optimizer and schedule.
#   3. load_from_optimizer with a file that is no sana-train checkpoint: exit 2 naming the key.
# The learning rates compared are metrics.jsonl's per step; the optimizer's step count is read
# from the format-2 optimizer.safetensors its checkpoint writes.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=4
        --dist.timeout_s=60 --train.save_model_epochs=0 --data.tail=pad
        --train.lr_schedule_args.num_warmup_steps=20 "--work_dir=$SCRATCH/$TOKEN")
run() {  # NAME NPROC ARGS... (output in $SCRATCH/NAME.log)
  local name=$1 n=$2; shift 2
  timeout 300 "$BIN" launch --nproc-per-node "$n" -- "${common[@]}" "$@" > "$SCRATCH/$name.log" 2>&1
}
# The learning rate of each global step FIRST..LAST in a work_dir's metrics.jsonl, one line.
rates() {  # WORK_DIR FIRST LAST
  timeout 60 "$SANA_PYTHON" - "$1/metrics.jsonl" "$2" "$3" <<'PY'
import json, sys
by_step = {}
for line in open(sys.argv[1]):
    m = json.loads(line)
    by_step[m["step"]] = m["lr"]
print(" ".join(repr(by_step.get(s)) for s in range(int(sys.argv[2]), int(sys.argv[3]) + 1)))
PY
}
same() {  # A B WHAT
  if [ -n "$1" ] && [ "$1" = "$2" ] && [ "${1#*None}" = "$1" ]; then pass "$3 ($1)"; else fail "$3: '$1' vs '$2'"; fi
}
# The largest per-parameter step count in a format-2 checkpoint's optimizer.safetensors.
optimizer_steps() {  # CHECKPOINT_DIR
  timeout 60 "$SANA_PYTHON" - "$1/optimizer.safetensors" <<'PY'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
steps = [struct.unpack("<q", raw[8 + n + e["data_offsets"][0]:8 + n + e["data_offsets"][0] + 8])[0]
         for k, e in header.items() if k.endswith("/step")]
print(max(steps) if steps else "none")
PY
}

# A: 9 steps on 2 processes, a checkpoint at step 6 (format 3) and at the end.
run a 2 "--work_dir=$SCRATCH/a" --train.max_steps=9 --train.save_model_steps=6
assert_code $? 0 "9 steps with a checkpoint at 6"
six=$SCRATCH/a/checkpoints/step_00000006
[ -f "$six/index.json" ] && pass "the step-6 checkpoint is format 3" || fail "no format-3 checkpoint at $six"

# 1. A named resume with train.resume_lr_scheduler false: steps 7-9 take the rates of steps 1-3.
run b 2 "--work_dir=$SCRATCH/b" --train.max_steps=9 "--resume_from=$six" --train.resume_lr_scheduler=false
assert_code $? 0 "named resume, schedule restarted"
assert_contains "$SCRATCH/b.log" "the learning-rate schedule starts again at global step 7" "the restart is logged"
same "$(rates "$SCRATCH/b" 7 9)" "$(rates "$SCRATCH/a" 1 3)" "after the restart, steps 7-9 have the rates of steps 1-3"
# ... and resume_from latest of that run continues the restarted schedule (step 10 = step 4).
run b2 2 "--work_dir=$SCRATCH/b" --train.max_steps=11 --resume_from=latest --train.resume_lr_scheduler=false
assert_code $? 0 "latest after the restart"
assert_contains "$SCRATCH/b2.log" "resume_from latest continues the learning-rate schedule" "latest says it continues"
same "$(rates "$SCRATCH/b" 10 11)" "$(rates "$SCRATCH/a" 4 5)" "the restarted schedule goes on across a resume"
# The same named resume with the key true continues: steps 7-9 as the straight run's (this
# run writes format 2: a format-3 checkpoint resumes whatever format the run writes).
run c 2 "--work_dir=$SCRATCH/c" --train.max_steps=9 "--resume_from=$six" --ckpt.format=2
assert_code $? 0 "named resume of a format-3 checkpoint by a format-2 run, schedule kept"
same "$(rates "$SCRATCH/c" 7 9)" "$(rates "$SCRATCH/a" 7 9)" "resume_lr_scheduler true: steps 7-9 as the straight run's"

# 2. A fresh work_dir, resume_from latest, model.load_from the step-6 folder, on 1 process.
run d 1 "--work_dir=$SCRATCH/d" --train.max_steps=2 --train.save_model_steps=2 --ckpt.format=2 --resume_from=latest \
  "--model.load_from=$six" --train.load_from_optimizer=true --train.load_from_lr_scheduler=true
assert_code $? 0 "load_from a checkpoint folder with its optimizer and schedule"
assert_contains "$SCRATCH/d.log" "model.load_from: " "the weights came from the folder"
assert_contains "$SCRATCH/d.log" "train.load_from_optimizer: the optimizer state of $six" "the optimizer state is named"
same "$(rates "$SCRATCH/d" 1 2)" "$(rates "$SCRATCH/a" 7 8)" "load_from_lr_scheduler: steps 1-2 have the rates of steps 7-8"
steps=$(optimizer_steps "$SCRATCH/d/checkpoints/step_00000002")
[ "$steps" = 8 ] && pass "load_from_optimizer: the optimizer went on from step 6 to 8" || fail "optimizer step count $steps, not 8"
# Without the two keys: the weights alone, a fresh optimizer and schedule.
run e 1 "--work_dir=$SCRATCH/e" --train.max_steps=2 --train.save_model_steps=2 --ckpt.format=2 --resume_from=latest \
  "--model.load_from=$six"
assert_code $? 0 "load_from a checkpoint folder, weights only"
same "$(rates "$SCRATCH/e" 1 2)" "$(rates "$SCRATCH/a" 1 2)" "without load_from_lr_scheduler the schedule starts at its step 0"
steps=$(optimizer_steps "$SCRATCH/e/checkpoints/step_00000002")
[ "$steps" = 2 ] && pass "without load_from_optimizer the optimizer starts afresh" || fail "optimizer step count $steps, not 2"

# 3. load_from_optimizer with a weights file outside any checkpoint folder: exit 2, naming the key.
mkdir -p "$SCRATCH/loose" && echo "not read: the config check comes first" > "$SCRATCH/loose/weights.safetensors"
run f 1 "--work_dir=$SCRATCH/f" --resume_from=latest "--model.load_from=$SCRATCH/loose/weights.safetensors" \
  --train.load_from_optimizer=true
assert_code $? 2 "load_from_optimizer without a checkpoint folder is a config error"
assert_contains "$SCRATCH/f.log" "train.load_from_optimizer" "the error names the key"
assert_no_leftovers
finish
