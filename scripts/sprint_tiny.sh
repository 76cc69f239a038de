#!/usr/bin/env bash
# SANA-Sprint end to end on the tiny presets, on CPUs (a benchmark-style script: it prints
# figures, it is not a test). Stage 1: a flow teacher (SanaMS_tiny_P2_D4) trained on the
# example photos with the small TorchScript stand-in text encoder (their sidecar captions).
# (1500 steps: a 300-step teacher's guided samples are pixel noise, nothing to distil). Stage 2:
# the SanaMSCM_tiny_P2_D4 student, initialised from the teacher, distilled from it
# (sCM + LADD; CAME at 1e-5: at 1e-4 it collapses to noise, docs/sprint.md) on 2 processes. Every CHUNK steps the student previews with 2 steps and is
# held against the teacher's 20-step previews from the same noise: the mean squared error
# between the two grids' pixels in [-1, 1] (the previews' noise is keyed by seed, bucket and
# image, so both start from the same x_T; both sample the same 8 captions of the data, the
# teacher with classifier-free guidance 4.5, the student with 4.5 through its guidance
# embedding, as it trained). At the end, grids of 1, 2 and 4 steps.
# The error is also given after 4 x 4 average pooling (the images' coarse content: a student
# that samples the teacher's picture with pixel noise on it is close there, far in full).
#   bash scripts/sprint_tiny.sh [OUT] [STEPS] [CHUNK] [ARGS...]   (defaults /tmp/sana-sprint-tiny 300 50)
# ARGS go to the student's runs (e.g. --train.optimizer.lr=1e-5). SANA_TEACHER_STEPS: the
# teacher's steps (default 1500).
# Needs build/apps/sana-train (cmake --build build --target sana-train) and the project's Python (scripts/install_deps.sh)
# with torch (the stand-in encoder) and PIL.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/python_env.sh"
out=${1:-/tmp/sana-sprint-tiny}
steps=${2:-300}
chunk=${3:-50}
shift $(( $# < 3 ? $# : 3 ))
student_args=("$@")
bin=${SANA_TRAIN_BIN:-$root/build/apps/sana-train}
mkdir -p "$out"
cd "$out"
bash "$root/scripts/prepare_example_data.sh" "$out/data" > /dev/null
[ -f enc/text.pt ] || timeout 120 "$SANA_PYTHON" "$root/tests/reference/make_torchscript_encoders.py" enc > enc.log
cat > teacher.yaml <<EOF
base: $root/configs/sana_tiny_cpu.yaml
work_dir: teacher
data: {data_dir: [data], cache: memory}
text_encoder: {text_encoder_name: torchscript, text_encoder_path: enc/text.pt, caption_channels: 8, model_max_length: 6}
# As upstream's stage 1 (normT): the model sees sigma, not a truncated 1000 sigma, so that the
# student's time derivative (the JVP's dt term) exists.
scheduler: {timestep_norm_scale_factor: 1000}
train: {max_steps: ${SANA_TEACHER_STEPS:-1500}, num_epochs: 1000, visualize: false, save_model_steps: 0, log_interval: 100, preview_steps: 20,
        preview_images: 8,
        optimizer: {lr: 2.0e-3}}
EOF
cat > student.yaml <<EOF
base: teacher.yaml
work_dir: student
model: {model: SanaMSCM_tiny_P2_D4, cfg_embed: true, logvar: true, teacher: SanaMS_tiny_P2_D4,
        teacher_model: teacher/model.safetensors, head_block_ids: [1, 3], load_from: teacher/model.safetensors,
        load_strict: false}
scheduler: {weighting_scheme: logit_normal_trigflow, logit_mean: 0.2, logit_std: 1.6, sigma_data: 0.5, vis_sampler: scm}
train: {discriminator_loss: hinge, scm_cfg_scale: [4, 4.5, 5], tangent_warmup_steps: 100, gradient_clip: 0.1,
        optimizer: {type: CAME, lr: 1.0e-5}, lr_schedule_args: {num_warmup_steps: 20}, log_interval: 50,
        save_model_steps: $chunk, preview_steps: 2}
EOF
# The previews' captions: the first 8 sidecar captions of the data, as a YAML list.
prompts=$(ls data/*/*.txt | head -8 | xargs cat | "$SANA_PYTHON" -c 'import json, sys; print(json.dumps([l.strip() for l in sys.stdin]))')
# ARGS go to every preview too (e.g. --train.preview_cfg_scale=1 with --train.scm_cfg_scale=[1]).
preview() {
  timeout 300 "$bin" preview --config "$1" "--train.validation_prompts=$prompts" "${student_args[@]}" "${@:2}" > /dev/null 2>&1
}
t0=$(date +%s)
if [ ! -f teacher/model.safetensors ]; then
  timeout 1200 "$bin" launch --nproc-per-node 2 -- --config teacher.yaml > teacher.log 2>&1
fi
echo "teacher: $(grep -o 'done: .*' teacher/train.log | tail -1)"
preview teacher.yaml --weights teacher/model.safetensors --out previews/teacher20
# mse DIR: the mean squared error of DIR's grids against the teacher's, in [-1, 1] pixels,
# in full and 4 x 4-pooled.
mse() {
  "$SANA_PYTHON" - previews/teacher20 "$1" <<'PY'
import glob, os, sys
import numpy as np
from PIL import Image
a, b = sys.argv[1:3]
def load(f):
    return np.asarray(Image.open(f).convert("RGB"), np.float64) / 127.5 - 1
def pooled(x, k=4):
    h, w = (x.shape[0] // k) * k, (x.shape[1] // k) * k
    return x[:h, :w].reshape(h // k, k, w // k, k, 3).mean((1, 3))
pairs = [(load(f), load(f"{b}/{os.path.basename(f)}")) for f in sorted(glob.glob(f"{a}/*.png"))]
full = np.mean([((x - y) ** 2).mean() for x, y in pairs])
coarse = np.mean([((pooled(x) - pooled(y)) ** 2).mean() for x, y in pairs])
print(f"{full:.4f} (4x4-pooled {coarse:.4f})")
PY
}
# Step 0: the student as it starts, the teacher's weights with a guidance embedding that adds
# nothing yet (one step at the warm-up's learning rate 0).
rm -rf student student0
timeout 300 "$bin" --config student.yaml "${student_args[@]}" --work_dir=student0 --train.max_steps=1 --train.save_model_steps=0 > student0.log 2>&1
preview student.yaml --weights student0/model.safetensors --out previews/s0
preview student.yaml --weights student0/model.safetensors --out previews/s0_1 --train.preview_steps=1
printf "step %4d  previews vs the teacher's 20-step: 2 steps mse %s, 1 step %s\n" 0 "$(mse previews/s0)" \
  "$(mse previews/s0_1)"
for ((at = chunk; at <= steps; at += chunk)); do
  timeout 1200 "$bin" launch --nproc-per-node 2 -- --config student.yaml "${student_args[@]}" --resume_from=latest \
    --train.max_steps=$at \
    > "student_$at.log" 2>&1
  preview student.yaml --weights student/model.safetensors --out "previews/s$at"
  preview student.yaml --weights student/model.safetensors --out "previews/s${at}_1" --train.preview_steps=1
  losses=$(grep -o 'loss_G [-0-9.]* loss_scm [-0-9.]* loss_adv [-0-9.]*' "student_$at.log" | tail -1 || true)
  printf "step %4d  previews vs the teacher's 20-step: 2 steps mse %s, 1 step %s   (%s)\n" "$at" \
    "$(mse "previews/s$at")" "$(mse "previews/s${at}_1")" "$losses"
done
for n in 1 2 4; do
  preview student.yaml --weights student/model.safetensors --out "previews/final_$n" --train.preview_steps=$n
  echo "final student, $n step(s): mse $(mse "previews/final_$n") against the teacher's 20 steps; grids in $out/previews/final_$n"
done
echo "teacher's 20-step grids in $out/previews/teacher20; $(( $(date +%s) - t0 )) s in all"
