#!/usr/bin/env bash
# SANA-Sprint's stage 2 (issue 46, docs/sprint.md) on the tiny preset with the TorchScript
# stand-in text encoder: a 20-step flow teacher (SanaMS_tiny_P2_D4), then SanaMSCM_tiny_P2_D4
# distilled from it (sCM + LADD, heads on teacher blocks 1 and 3), generator and
# discriminator alternating.
#  1. 20 steps on 1, 2 and 3 processes: every step's losses (loss_G, loss_scm, loss_adv on
#     even steps, loss_D and its parts on odd ones) agree within 5e-6 (relative, absolute
#     below 1: loss_G = loss_scm + 0.5 loss_adv nears 0 by cancellation), the student's
#     weights within 1e-6 and the heads' within 2e-6 (each part's relative difference as one
#     vector). Measured 2026-11-29: losses 2e-6 (the adversarial loss of step 1, a mean of
#     every token's logit), student 1.5e-8, heads 4e-7 to 1.1e-6: the teacher's features of
#     other micro-batch splits round differently in float32, and the heads learn from them.
#  2. 11 steps on 2 processes (the run stops after a generator step), resumed on 3 to step
#     20 (a discriminator step first): the same losses and weights as the run on 1.
#  3. A teacher file that does not fit the teacher is refused (exit 2), naming the key.
# `sprint.sh deterministic` (dist.sprint_deterministic): 1 and 2 with train.deterministic,
# micro-batches of 2 and one thread per process: the student and the heads after 20 steps
# are the same bits on 1, 2 and 3 processes, and after 11 steps on 3 resumed on 2 (the
# logged losses, float sums over ranks, within 5e-6). Measured 2026-11-29: bitwise, losses
# within 1.5e-7; the 5 runs 65 s in all.
# AdamW's eps is 1e-2 here: with a small eps, Adam's early steps are about lr x sign(g), so
# gradients that are float noise (a bias that starts at zero, the guidance embedding's
# zero-initialised layer) move by lr whichever way rounding tips them, at any world size;
# with eps well above that noise, the weights compare the gradients the runs computed.
mode=${1:-plain}  # plain, or deterministic: the same with train.deterministic, bitwise (below)
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
photos="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]"
timeout 120 "$SANA_PYTHON" "$(dirname "$0")/../reference/make_torchscript_encoders.py" "$SCRATCH/enc" \
  > "$SCRATCH/enc.log" 2>&1 || { fail "writing the stand-in encoders"; cat "$SCRATCH/enc.log"; finish; }
# The teacher and the student see sigma, not a truncated 1000 sigma (upstream's normT), so
# that the JVP has its time derivative.
te=(--text_encoder.text_encoder_name=torchscript "--text_encoder.text_encoder_path=$SCRATCH/enc/text.pt"
    --text_encoder.caption_channels=8 --text_encoder.model_max_length=6 --scheduler.timestep_norm_scale_factor=1000)
timeout 300 "$BIN" --config "$config" "${te[@]}" "--data.data_dir=$photos" --train.max_steps=20 --train.visualize=false \
  --train.save_model_steps=0 "--work_dir=$SCRATCH/teacher" > "$SCRATCH/teacher.log" 2>&1
assert_code $? 0 "a 20-step flow teacher"
teacher=$SCRATCH/teacher/model.safetensors
common=(--config "$config" "${te[@]}" "--data.data_dir=$photos" --train.visualize=false --dist.timeout_s=60
        --model.model=SanaMSCM_tiny_P2_D4 --model.cfg_embed=true --model.logvar=true "--model.teacher_model=$teacher"
        --model.teacher=SanaMS_tiny_P2_D4 "--model.head_block_ids=[1, 3]" "--model.load_from=$teacher"
        --model.load_strict=false --scheduler.weighting_scheme=logit_normal_trigflow --scheduler.sigma_data=0.5
        --scheduler.vis_sampler=scm --scheduler.logit_mean=0.2 --scheduler.logit_std=1.6 --train.discriminator_loss=hinge
        "--train.scm_cfg_scale=[4, 4.5, 5]" --train.tangent_warmup_steps=10 --train.gradient_clip=0.1
        --train.optimizer.type=AdamW --train.optimizer.lr=1e-3 "--train.optimizer.eps=[1e-2]"
        "--train.optimizer.betas=[0.9, 0.999]" --train.optimizer.weight_decay=0 --train.max_steps=20
        --train.save_model_steps=0 --train.save_model_epochs=0 --train.log_interval=10)
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)

# same_run A B WHAT: every step's losses and the final student and heads of runs A and B.
same_run() {
  local a=$1 b=$2 what=$3
  if "$SANA_PYTHON" - "$SCRATCH/$a" "$SCRATCH/$b" "$mode" > "$SCRATCH/$b.same" 2>&1 <<'PY'; then
import glob, json, struct, sys
import numpy as np
def steps(root):
    out = {}
    for line in open(f"{root}/metrics.jsonl"):
        m = json.loads(line)
        if "step" in m:
            out[m["step"]] = {k: v for k, v in m.items() if k.startswith("loss_")}
    return out
def tensors(pattern):
    out = {}
    for f in sorted(glob.glob(pattern)):
        raw = open(f, "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        head = json.loads(raw[8:8 + n])
        for k, v in head.items():
            if k != "__metadata__" and v["dtype"] == "F32":
                lo, hi = v["data_offsets"]
                out[k] = np.frombuffer(raw[8 + n + lo:8 + n + hi], dtype=np.float32).astype(np.float64)
    return out
def relative(pa, pb):
    x, y = tensors(pa), tensors(pb)
    assert x and x.keys() == y.keys(), f"{pa}: {len(x)} tensors, {pb}: {len(y)}"
    num = sum(float(((x[k] - y[k]) ** 2).sum()) for k in x)
    return len(x), (num / sum(float((x[k] ** 2).sum()) for k in x)) ** 0.5
a, b, mode = sys.argv[1:4]
sa, sb = steps(a), steps(b)
assert sorted(sa) == list(range(1, 21)) and sorted(sb) == sorted(sa), f"steps {sorted(sb)}"
worst, where = max((abs(sa[s][k] - sb[s][k]) / max(abs(sa[s][k]), 1.0), f"{k} at step {s}: {sa[s][k]} vs {sb[s][k]}")
                   for s in sa for k in sa[s])
kinds = {tuple(sorted(sa[s])) for s in sa}
n_student, student = relative(f"{a}/model.safetensors", f"{b}/model.safetensors")
last = sorted(glob.glob(f"{a}/checkpoints/step_*"))[-1].rsplit("/", 1)[1]
n_heads, heads = relative(f"{a}/checkpoints/{last}/discriminator[-.]*safetensors", f"{b}/checkpoints/{last}/discriminator[-.]*safetensors")
print(f"20 steps ({len(kinds)} kinds of step), losses within {worst:.2g} ({where}); student ({n_student} tensors) "
      f"{student:.2g}, heads ({n_heads} tensors) {heads:.2g} relative")
# train.deterministic: the weights bitwise (the logged losses are float sums over ranks).
close = student == 0 and heads == 0 if mode == "deterministic" else student <= 1e-6 and heads <= 2e-6
sys.exit(0 if len(kinds) == 2 and worst <= 5e-6 and close else 1)
PY
    pass "$what: $(cat "$SCRATCH/$b.same")"
  else
    fail "$what: $(tail -3 "$SCRATCH/$b.same")"
  fi
}

stop_on=2 resume_on=3 kind=""
if [ "$mode" = deterministic ]; then
  # Canonical micro-batches of 2 (the global batch of 8 in 4), which 3 ranks take 2, 1, 1.
  common+=(--train.deterministic=true --train.micro_batch_size=2 --dist.threads_per_process=1)
  stop_on=3 resume_on=2 kind="train.deterministic, bitwise: "
fi

# 1. The same 20 steps on 1, 2 and 3 processes (a checkpoint at the end of each: the heads' file).
run w1 1 --train.save_model_steps=20; assert_code $? 0 "${kind}20 stage-2 steps on 1 process"
assert_contains "$SCRATCH/w1.log" "SANA-Sprint stage 2 (sCM + LADD): teacher SanaMS_tiny_P2_D4" "the start-up names the teacher"
assert_contains "$SCRATCH/w1.log" "discriminator heads identical on all 1 rank" "the heads are checked at the end"
for n in 2 3; do
  run w$n $n --train.save_model_steps=20; assert_code $? 0 "${kind}20 stage-2 steps on $n processes"
  same_run w1 w$n "${kind}$n processes vs 1"
done

# 2. Stopped after step 11 (a generator step) on one process count, resumed on another to step 20.
run chain $stop_on --train.max_steps=11 --train.save_model_steps=11; assert_code $? 0 "${kind}11 steps on $stop_on processes"
run chain $resume_on --resume_from=latest --train.save_model_steps=20
assert_code $? 0 "${kind}resumed on $resume_on processes to step 20"
assert_contains "$SCRATCH/chain.log" "resumed from" "the second launch resumed"
same_run w1 chain "${kind}11 steps on $stop_on, resumed on $resume_on, vs 20 on 1"

# 3. A teacher that does not fit: refused before training, naming the key.
if [ "$mode" = plain ]; then
  run misfit 1 "--model.teacher_model=$SCRATCH/enc/text.pt"
  assert_code $? 2 "a file that is not the teacher's weights"
  assert_contains "$SCRATCH/misfit.log" "model.teacher_model" "the error names the key"
fi
assert_no_leftovers
finish
