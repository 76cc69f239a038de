#!/usr/bin/env bash
# train.zero_stage (issue 28): the optimizer state and EMA (stage 1), the gradients
# (stage 2) and the parameters (stage 3) split over the ranks by whole parameters train
# exactly as stage 0 does.
#  1. Per-step losses of 10 steps at stages 1, 2 and 3 equal stage 0's at the same process
#     count within 1e-6 relative: AdamW with EMA on 3 and 4 processes (8 samples in
#     micro-batches of 2: on 3 the ranks run 2, 2 and 1, so stage 3 pads the third), CAME
#     on 2 with gradient checkpointing and previews; CAME8bit at stage 3 on 4, AdamW8bit at
#     stage 3 on 3. (CAME on 3 and 4 and AdamW on 2 ran here until 2026-11-28: the same
#     sharding code with another optimizer or count, 12 runs of CI time for no new path.) The EMA weights written at the end
#     (gathered from the ranks) equal stage 0's.
#  2. A stage-2 checkpoint (gathered to rank 0) resumed at stage 0 on the same processes
#     continues stage 0's losses within 1e-6.
#  3. train.deterministic, resumed mid-epoch stage 2 on 4 processes -> stage 0 on 3 ->
#     stage 3 on 2: each epoch trains the uninterrupted run's samples, each once, and the
#     weights and EMA are byte-identical to an uninterrupted stage-0 run on 1 process.
#  4. Lion, Adafactor and Prodigy, train.deterministic: stage 2 on 2 processes offloaded to
#     step 5, resumed on 3 to step 10 (stage 0; Prodigy stage 1): the weights byte-identical
#     to an uninterrupted run on 1 process.
# Tiny preset on the test photos; every run under `timeout` in this test's scratch folder.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
common=(--config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" --train.visualize=false
        --train.log_interval=10 --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0
        --train.micro_batch_size=2 --train.max_steps=10 "--work_dir=$SCRATCH/$TOKEN")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
# compare REFERENCE OTHER WHAT: per-step losses (and the EMA file, when both have one) within 1e-6.
compare() {
  if "$SANA_PYTHON" - "$SCRATCH/$1" "$SCRATCH/$2" > "$SCRATCH/$2.cmp" 2>&1 <<'PY'; then
import json, os, struct, sys
import numpy as np
a, b = sys.argv[1], sys.argv[2]
def read(path):  # an fp32 safetensors file
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).astype(np.float64)
            for k, v in head.items()}
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/metrics.jsonl"))}
ref, got = losses(a), losses(b)
steps = sorted(set(ref) & set(got))
worst = max(abs(got[s] - ref[s]) / abs(ref[s]) for s in steps)
ok = worst <= 1e-6 and len(steps) >= 10 and max(got) == max(ref)
note = ""
if os.path.exists(f"{a}/ema.safetensors") and os.path.exists(f"{b}/ema.safetensors"):
    ea, eb = read(f"{a}/ema.safetensors"), read(f"{b}/ema.safetensors")
    same_names = sorted(ea) == sorted(eb)
    diff = max(float(np.abs(ea[k] - eb[k]).max() / (np.abs(ea[k]).max() + 1e-12)) for k in ea) if same_names else 1.0
    note = f"; EMA: {len(eb)} of {len(ea)} tensors, max relative difference {diff:.1e}"
    ok = ok and same_names and diff <= 1e-6
print(f"steps {steps[0]}..{steps[-1]}: max relative loss difference {worst:.1e}{note}")
sys.exit(0 if ok else 1)
PY
    pass "$3: $(cat "$SCRATCH/$2.cmp")"
  else
    fail "$3"; cat "$SCRATCH/$2.cmp"
  fi
}

# 1. Stages against stage 0.
adamw=(--train.optimizer.type=AdamW --train.ema_update=true)
came=(--train.optimizer.type=CAME)
previews=(--train.grad_checkpointing=true --train.visualize=true --train.eval_sampling_steps=10 --train.preview_steps=2)
for case in "adamw 3 1 ${adamw[*]}" "adamw4 4 1 ${adamw[*]}" "came 2 1 ${came[*]} ${previews[*]}" \
            "came8bit 4 3 --train.optimizer.type=CAME8bit --train.optimizer.min_8bit_size=4096 --train.optimizer.block_size=64" \
            "adamw8bit 3 3 --train.optimizer.type=AdamW8bit"; do
  set -- $case
  name=$1 w=$2 first=$3; shift 3
  for stage in 0 $(seq "$first" 3); do
    run "$name-s$stage" "$w" --train.zero_stage=$stage "$@"; assert_code $? 0 "$name, stage $stage on $w processes"
  done
  if [ "$name" = adamw ]; then
    assert_contains "$SCRATCH/$name-s2.log" "train.zero_stage 2: this rank keeps the optimizer state, EMA and gradients" \
      "$name: stage 2 says what each rank keeps"
    assert_contains "$SCRATCH/$name-s3.log" "train.zero_stage 3: this rank keeps the weights, optimizer state, EMA and gradients" \
      "$name: stage 3 says what each rank keeps"
  fi
  if [ "$name" = came ]; then
    n=$(ls "$SCRATCH/came-s3/previews" 2> /dev/null | wc -l)
    [ "$n" -gt 0 ] && [ "$n" = "$(ls "$SCRATCH/came-s0/previews" | wc -l)" ] && pass "stage 3 renders previews ($n grids)" ||
      fail "stage 3 previews: $n grids"
  fi
  for stage in $(seq "$first" 3); do
    [ -f "$SCRATCH/$name-s$stage/metrics.jsonl" ] && compare "$name-s0" "$name-s$stage" "$name: stage $stage = stage 0 on $w processes"
  done
done

# 2. A stage-2 checkpoint (3 processes, step 5) resumed at stage 0.
run half-s2 3 --train.zero_stage=2 --train.optimizer.type=AdamW --train.ema_update=true --train.max_steps=5
assert_code $? 0 "5 steps at stage 2 on 3 processes"
cp -r "$SCRATCH/half-s2" "$SCRATCH/half-s0"
run half-s0 3 --train.zero_stage=0 --train.optimizer.type=AdamW --train.ema_update=true --resume_from=latest
assert_code $? 0 "resumed at stage 0 to step 10"
compare adamw-s0 half-s0 "stage 2 checkpoint -> stage 0: the losses of an uninterrupted stage-0 run"

# 3. Deterministic chain across stages and process counts.
det=(--train.deterministic=true --dist.threads_per_process=1 --train.ema_update=true)
export SANA_TEST_LOG_IDS=1
run det-ref 1 "${det[@]}"; assert_code $? 0 "10 deterministic steps on 1 process"
x=(--work_dir="$SCRATCH/chain" --resume_from=latest "${det[@]}")
run chain4 4 "${x[@]}" --train.zero_stage=2 --train.max_steps=4; assert_code $? 0 "stage 2 on 4 processes to step 4"
run chain3 3 "${x[@]}" --train.zero_stage=0 --train.max_steps=7; assert_code $? 0 "stage 0 on 3 to step 7"
run chain2 2 "${x[@]}" --train.zero_stage=3 --train.max_steps=10; assert_code $? 0 "stage 3 on 2 to step 10"
unset SANA_TEST_LOG_IDS
for f in model.safetensors ema.safetensors; do
  if cmp -s "$SCRATCH/det-ref/$f" "$SCRATCH/chain/$f"; then
    pass "$f of the resumed chain byte-identical to the uninterrupted run's"
  else
    fail "$f of the resumed chain differs from the uninterrupted run's"
  fi
done
if "$SANA_PYTHON" "$(dirname "$0")/same_samples.py" "$SCRATCH" det-ref chain > "$SCRATCH/ids.log" 2>&1; then
  pass "every sample once per epoch across the chain: $(tr '\n' ' ' < "$SCRATCH/ids.log")"
else
  fail "samples lost or repeated across the chain"; cat "$SCRATCH/ids.log"
fi

# 4. Lion, Adafactor and Prodigy (each judged by its PyPI package, tests/unit/train/
# test_optim*.cpp) resumed at another W and stage: stage 2 on 2 processes with the state in
# host memory to step 5, then on 3 to step 10 (Prodigy at stage 1 there, so that its step
# size is a sum over the shards in both runs).
resumed_chain() {  # OPTIMIZER STAGE-ON-3 ARGS...
  local o=$1 stage3=$2; shift 2
  local a=(--train.deterministic=true --dist.threads_per_process=1 --train.optimizer.type="$o" "$@")
  run "$o-ref" 1 "${a[@]}"; assert_code $? 0 "10 deterministic $o steps on 1 process"
  local y=(--work_dir="$SCRATCH/$o-chain" --resume_from=latest "${a[@]}")
  run "${o}2" 2 "${y[@]}" --train.zero_stage=2 --train.offload_optimizer=true --train.max_steps=5
  assert_code $? 0 "$o at stage 2 on 2 processes, offloaded, to step 5"
  run "${o}3" 3 "${y[@]}" --train.zero_stage="$stage3" --train.max_steps=10
  assert_code $? 0 "$o resumed at stage $stage3 on 3 to step 10"
  assert_contains "$SCRATCH/${o}3.log" "optimizer $o" "the resumed run trains with $o"
  if cmp -s "$SCRATCH/$o-ref/model.safetensors" "$SCRATCH/$o-chain/model.safetensors"; then
    pass "$o resumed from 2 processes at stage 2 on 3 at stage $stage3: the weights of the uninterrupted run"
  else
    fail "$o resumed at another W and stage: the weights differ from the uninterrupted run's"
  fi
}
resumed_chain Lion 0 --train.optimizer.lr=1e-4
resumed_chain Adafactor 0 --train.optimizer.relative_step=false --train.optimizer.lr=1e-4 --train.optimizer.betas=[0.9]
# d_coef 1e3: the step size d grows past d0 within the 10 steps, so that its sums over the shards
# decide the weights (without their all-reduce the chain's weights differ; at the default d stays d0).
resumed_chain Prodigy 1 --train.optimizer.d_coef=1e3
finish
