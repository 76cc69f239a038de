#!/usr/bin/env bash
# train.optimizer.type ScheduleFreeAdamW (schedulefree's AdamWScheduleFree, judged step by
# step in tests/unit/train/test_optim_adaptive.cpp) in the trainer, train.deterministic:
#  1. resumed at another W and stage: stage 2 on 2 processes with the state in host memory to
#     step 5, then stage 1 on 3 to step 10: the final weights byte-identical to an
#     uninterrupted run on 1 process;
#  2. previews and a held-out loss every 2 steps, which run on its evaluation weights x, at
#     stage 1 on 2 processes: the weights afterwards are the training ones to the last bit,
#     so the final file equals the run's without them;
#  3. the final model.safetensors holds x, not the checkpoint's y; `export --from` the
#     last checkpoint (y, z) writes the same weights as `export --from` the finished
#     work_dir; a checkpoint without optimizer state cannot be exported as x (it says so).
# Tiny preset on the test photos; every run under `timeout` in this test's scratch folder.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
photos=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$photos]" --train.visualize=false --train.log_interval=10
        --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0 --train.micro_batch_size=2
        --train.max_steps=10 --train.deterministic=true --dist.threads_per_process=1
        --train.optimizer.type=ScheduleFreeAdamW --train.optimizer.lr=1e-3 --train.optimizer.warmup_steps=3
        --train.optimizer.weight_decay=0.01 --train.lr_schedule_args.num_warmup_steps=0 "--work_dir=$SCRATCH/$TOKEN")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
same() {  # A B WHAT: two files byte for byte
  if cmp -s "$1" "$2"; then pass "$3"; else fail "$3: $1 and $2 differ"; fi
}

# 1. The resumed chain.
run ref 1 --train.save_model_steps=10; assert_code $? 0 "10 schedule-free steps on 1 process"
assert_contains "$SCRATCH/ref.log" "ScheduleFreeAdamW: lr 0.001, its own warmup over 3 steps" "the start says its warmup"
chain=(--work_dir="$SCRATCH/chain" --resume_from=latest)
run chain2 2 "${chain[@]}" --train.zero_stage=2 --train.offload_optimizer=true --train.max_steps=5
assert_code $? 0 "stage 2 on 2 processes, offloaded, to step 5"
run chain3 3 "${chain[@]}" --train.zero_stage=1; assert_code $? 0 "resumed at stage 1 on 3 to step 10"
assert_contains "$SCRATCH/chain3.log" "resumed from" "the 3-process run resumed the 2-process checkpoint"
same "$SCRATCH/ref/model.safetensors" "$SCRATCH/chain/model.safetensors" \
  "resumed from 2 processes at stage 2 on 3 at stage 1: the weights of the uninterrupted run"

# 2. Previews and the held-out loss on x leave y as it was.
run looked 2 --train.zero_stage=1 --train.visualize=true --train.eval_sampling_steps=2 --train.preview_steps=2 \
  "--train.eval.data_dir=[$photos/nature]" --train.eval.every_steps=2 "--train.eval.timesteps=[500]"
assert_code $? 0 "previews and a held-out loss every 2 steps at stage 1 on 2 processes"
n=$(ls "$SCRATCH/looked/previews" 2> /dev/null | wc -l)
evals=$(grep -c '"eval_step"' "$SCRATCH/looked/metrics.jsonl")
[ "$n" -gt 0 ] && [ "$evals" -ge 5 ] && pass "$n preview grids and $evals held-out losses" ||
  fail "previews: $n grids, $evals held-out losses"
same "$SCRATCH/ref/model.safetensors" "$SCRATCH/looked/model.safetensors" \
  "after previews and held-out losses on x the run trains on as the one without them"

# 3. The final file holds x; export makes x from a checkpoint's y and z.
ckpt=$(ls -d "$SCRATCH"/ref/checkpoints/step_* 2> /dev/null | tail -1)
if [ -z "$ckpt" ]; then
  fail "the 1-process run left no checkpoint"
elif cmp -s "$ckpt/model.safetensors" "$SCRATCH/ref/model.safetensors"; then
  fail "the final weights are the checkpoint's y, not schedule-free's x"
else
  pass "the final weights (x) differ from the last checkpoint's training weights (y)"
fi
export_to() {  # FROM OUT: exit code of `export --from FROM --format upstream` (the tiny preset has no captions)
  timeout 120 "$BIN" export "${common[@]}" --from "$1" --format upstream --out "$2" > "$2.log" 2>&1
}
export_to "$ckpt" "$SCRATCH/from_ckpt.pth"; assert_code $? 0 "export --from the last checkpoint"
assert_contains "$SCRATCH/from_ckpt.pth.log" "export: schedule-free x of" "the export says it made x"
export_to "$SCRATCH/ref" "$SCRATCH/from_run.pth"; assert_code $? 0 "export --from the finished work_dir"
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/from_ckpt.pth" "$SCRATCH/from_run.pth" > "$SCRATCH/pth.cmp" 2>&1 <<'PY'; then
import sys
import torch
a, b = (torch.load(f, map_location="cpu", weights_only=True)["state_dict"] for f in sys.argv[1:3])
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print(f"{len(a)} tensors, {'all equal' if same else 'not equal'}")
sys.exit(0 if same and len(a) > 0 else 1)
PY
  pass "the checkpoint's export (x from y and z) equals the finished run's: $(cat "$SCRATCH/pth.cmp")"
else
  fail "the checkpoint's export differs from the finished run's"; cat "$SCRATCH/pth.cmp"
fi
run no_state 1 --train.max_steps=2 --train.save_model_steps=2 --ckpt.save_optimizer=false
assert_code $? 0 "2 steps, checkpoints without optimizer state"
export_to "$(ls -d "$SCRATCH"/no_state/checkpoints/step_* | tail -1)" "$SCRATCH/from_no_state.pth"; code=$?
assert_contains "$SCRATCH/from_no_state.pth.log" "holds no schedule-free z" "without z the export refuses to pass y off as x"
[ "$code" -ne 0 ] && pass "and fails (exit $code)" || fail "an export of y as x succeeded"
finish
