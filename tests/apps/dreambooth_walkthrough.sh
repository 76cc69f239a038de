#!/usr/bin/env bash
# The README's "Fine-tune on one GPU: DreamBooth LoRA with prior preservation": every command of
# its block (between <!-- dreambooth-walkthrough:begin --> and <!-- dreambooth-walkthrough:end -->)
# runs as written, in order, with `sana-train` on PATH and a tiny stand-in my_dreambooth.yaml: the
# README's keys on the tiny preset with captions from the small TorchScript text encoder, 4
# class images, previews of 2 sampler steps. The download is replaced by the tiny caption
# model's initial weights exported as a diffusers pipeline folder. The launch is stopped with
# Ctrl-C once it has taken 10 steps; the resume must reach max_steps. Checked: `sana-train
# model` puts the optimizer state and EMA in host memory; the first launch generates the 4
# class images (generated_00000.png ...), the resume none; every step 1..20 once in
# metrics.jsonl with the held-out loss before and after the resume; the adapters' file.
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
as_a_user
cat > my_dreambooth.yaml <<EOF
base: $root/configs/sana_tiny_cpu.yaml
work_dir: output/my_dreambooth
data: {data_dir: [my_images], random_flip: false, class_data_dir: output/class_dog, class_prompt: a photo of a dog,
       num_class_images: 4}
model: {load_from: output/pretrained_models/Sana_1600M_1024px_diffusers}
text_encoder: {text_encoder_name: torchscript, text_encoder_path: exports/text.pt, caption_channels: 8, model_max_length: 6}
train: {max_steps: 20, log_interval: 5, save_model_steps: 1000, visualize: false, preview_steps: 2, optimizer: {lr: 3.0e-3},
        lora: {rank: 4, alpha: 8, target_modules: [to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]},
        frozen_base_dtype: bf16, offload_optimizer: true, ema_update: true, ema_device: cpu, prior_loss_weight: 1.0,
        eval: {fraction: 0.2, every_steps: 5}}
dist: {timeout_s: 60}
EOF

readme_commands dreambooth-walkthrough 4
walkthrough_commands output/my_dreambooth/metrics.jsonl my_dreambooth.yaml

assert_contains cmd2.log "host memory per process" "sana-train model tells what the host holds"
assert_contains cmd2.log "EMA weights" "the EMA among it"
assert_contains cmd3.log "generating 4 class images" "the first launch generates the class images"
assert_contains cmd3.log "train.frozen_base_dtype bf16" "the base is kept in bf16"
assert_contains cmd3.log "train.offload_optimizer" "the optimizer runs in host memory"
assert_contains cmd4.log "resumed from" "the second launch resumed"
if grep -q "generating" cmd4.log; then fail "the resume generated class images again"; else pass "the resume reused the class images"; fi
n=$(ls output/class_dog/generated_*.png 2> /dev/null | wc -l)
if [ "$n" -eq 4 ]; then pass "4 class images in output/class_dog"; else fail "$n class images"; fi
if "$SANA_PYTHON" - output/my_dreambooth > check.txt 2>&1 <<'PY'; then
import json, os, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(f"{d}/metrics.jsonl")]
steps = sorted(l["step"] for l in lines if "loss" in l and "step" in l)
evals = sorted(l["eval_step"] for l in lines if "eval_step" in l)
assert steps == list(range(1, 21)), f"steps {steps}"
assert any(s <= 10 for s in evals) and any(s > 10 for s in evals), f"held-out losses at steps {evals}"
assert os.path.getsize(f"{d}/pytorch_lora_weights.safetensors") > 0
print(f"steps 1..20 once; held-out loss at steps {evals}; pytorch_lora_weights.safetensors written")
PY
  pass "$(cat check.txt)"
else
  fail "the run's record: $(tail -3 check.txt)"
fi
assert_no_leftovers
finish
