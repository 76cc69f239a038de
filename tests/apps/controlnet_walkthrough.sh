#!/usr/bin/env bash
# The README's "Train a ControlNet": every command of its block (between
# <!-- controlnet-walkthrough:begin --> and <!-- controlnet-walkthrough:end -->) runs as
# written, in order, with `sana-train` on PATH and a tiny stand-in my_controlnet.yaml (the
# tiny ControlNet preset with the small TorchScript VAE, whose encoder also takes the canny
# maps, and text encoder). The download is replaced by the plain tiny caption model's
# initial weights exported as a diffusers pipeline folder (its transformer/). The training
# launch is stopped with Ctrl-C once it has taken 10 steps; the resume must pick up there on
# 1 process and reach max_steps. Then, in python3-torch: the exported .pth holds the run's
# whole ControlNet under upstream's names, and its base is the download's (read through
# `sana-train export` into upstream's names), unchanged.
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
as_a_user
cat > my_controlnet.yaml <<EOF
base: $root/configs/sana_tiny_cpu.yaml
work_dir: output/my_controlnet
data: {data_dir: [my_images]}
model: {model: SanaMSControlNet_tiny_P2_D4,
        load_from: output/pretrained_models/Sana_1600M_1024px_diffusers}
vae: {vae_type: torchscript, vae_pretrained: exports/vae.pt, vae_latent_dim: 4, vae_downsample_rate: 4}
text_encoder: {text_encoder_name: torchscript, text_encoder_path: exports/text.pt, caption_channels: 8, model_max_length: 6}
train: {max_steps: 30, log_interval: 5, save_model_steps: 1000, eval_sampling_steps: 1000, preview_steps: 4,
        preview_images: 2, optimizer: {lr: 3.0e-3}}
controlnet: {control_signal_type: canny}
dist: {timeout_s: 60}
EOF

readme_commands controlnet-walkthrough 5

walkthrough_commands output/my_controlnet/metrics.jsonl my_controlnet.yaml --model.model=SanaMS_tiny_P2_D4
# The downloaded base in upstream's names, for the check below.
timeout 120 sana-train export --config my_controlnet.yaml --model.model=SanaMS_tiny_P2_D4 --model.load_from= \
  --from "$download_dir" --format upstream --out base.pth > "$SCRATCH/base.log" 2>&1
assert_code $? 0 "the download's base exported in upstream's names"
base=base.pth

assert_contains cmd2.log "trainable parameters (the control blocks" "sana-train model tells the control blocks' share"
assert_contains cmd3.log "control blocks start as copies" "the run started the control blocks from the base"
assert_contains cmd4.log "resumed from" "the 1-process run resumed"
assert_contains cmd4.log "(saved on 2 processes)" "from the 2-process run"
assert_contains cmd4.log "the base weights are unchanged" "the base did not move"
steps=$(grep -o '"step":[0-9]*' output/my_controlnet/metrics.jsonl | sort -u | wc -l)
if [ "$steps" -eq 30 ]; then pass "every step 1..30 is in metrics.jsonl once"; else fail "$steps distinct steps"; fi
if "$SANA_PYTHON" - "${base:-none}" output/my_controlnet "$root/tests/reference" > check.txt 2>&1 <<'PY'; then
import glob, sys
import numpy as np
import torch
from PIL import Image
sys.path.insert(0, sys.argv[3])
from sana_reference import read_safetensors as read  # (tensors, metadata)
base = torch.load(sys.argv[1], map_location="cpu")["state_dict"]
run, meta = read(sys.argv[2] + "/model.safetensors")
pth = torch.load(sys.argv[2] + "/controlnet.pth", map_location="cpu")["state_dict"]
control = [k for k in pth if k.startswith("controlnet.")]
# The .pth adds upstream's pos_embed buffer (diffusers' single-file loader pops it), not a weight.
same_run = sorted(set(pth) - {"pos_embed"}) == sorted(run) and all(torch.equal(pth[k], run[k]) for k in run)
# The null caption (a buffer) becomes the text encoder's empty prompt at start-up, as upstream's train.py does.
changed = [k for k in base if k in pth and not torch.equal(pth[k], base[k]) and k != "y_embedder.y_embedding"]
same_base = not changed and sorted(set(pth) - set(control)) == sorted(k for k in base if k in pth)
grids = sorted(glob.glob(sys.argv[2] + "/previews/step000030_*.png"))
# Each grid: a row per sample, [control map | sample]; the maps are canny edges, 0 or 255.
pixels = [np.asarray(Image.open(g).convert("RGB")) for g in grids]
binary = all(set(np.unique(p[:, : p.shape[1] // 2 - 1])) <= {0, 255} for p in pixels)
print(f"controlnet.pth: {len(pth)} tensors, {len(control)} under controlnet.*, "
      f"{'the run' if same_run else 'NOT the run'}'s weights; the base {'as downloaded' if same_base else 'CHANGED'} "
      f"(checksum {meta.get('base_checksum')}); {len(grids)} preview grids, control maps "
      f"{'black and white' if binary else 'NOT binary'} beside the samples")
print("changed:", changed[:5]) if changed else None
sys.exit(0 if same_run and same_base and control and len(grids) == 3 and binary else 1)
PY
  pass "$(cat check.txt)"
else
  fail "the exported ControlNet or the previews: $(cat check.txt)"
fi
assert_no_leftovers
finish
