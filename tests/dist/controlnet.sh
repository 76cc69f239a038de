#!/usr/bin/env bash
# ControlNet training (issue 30, docs/controlnet.md): the tiny ControlNet preset on the test
# photos with canny maps the loader makes; its base is the plain tiny preset's initial
# weights exported to upstream's .pth (sana-train export), loaded with model.load_from.
#  1. 40 steps on 2 processes (the loss curve is held against python3-torch in 7); the base's checksum at the end equals the one
#     at start-up, and in python3-torch every base tensor of the final model.safetensors
#     equals base.pth's while the control blocks moved; the previews put each control map
#     (black and white only) beside its sample (colours).
#  2. 20 steps on 2 processes, resumed on 1 to step 40: each epoch trains the samples of the
#     uninterrupted run, each once.
#  3. The checkpoint exported in upstream's layout (a .pth of {"state_dict": ...}) holds the
#     whole ControlNet under upstream's names, the trained control blocks included.
#  4. ZeRO stage 3 on 2 processes (the control blocks sharded): 20 losses equal stage 0's.
#  5. A resume against other base weights is refused (exit 2), naming both checksums.
#  6. prepare-features writes control latents (the canny maps through a small TorchScript
#     VAE); training on them gives the losses of encoding online.
#  7. 20 steps with every micro-batch dumped, replayed in python3-torch
#     (tests/reference/train_replay.py: upstream's SanaMSControlNet, torch's clip_grad_norm_
#     and AdamW, diffusers' warmup): every step's loss and the final control blocks as the run's.
#  8. train.frozen_base_dtype bf16: the final model's base is base.pth's in bf16, held in
#     fp32; a resume on an int8 base is refused.
#  9. Block swapping (train.offload_blocks 2: the base's last 2 blocks in host memory) with
#     train.deterministic and gradient checkpointing on 2 processes: the final model
#     byte-identical to the unswapped run's.
# Every run under `timeout` in this test's scratch folder.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
common=(--config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]"
        --model.model=SanaMSControlNet_tiny_P2_D4 "--model.load_from=$SCRATCH/base.pth" --train.visualize=false
        --train.log_interval=10 --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0
        --train.micro_batch_size=2 --train.max_steps=40 --train.optimizer.lr=3e-3 --train.seed=3)
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
timeout 120 "$BIN" export --config "$config" --format upstream --out "$SCRATCH/base.pth" > "$SCRATCH/export.log" 2>&1
assert_code $? 0 "the plain tiny preset's initial weights exported as the base"

# 1. The reference run, with previews at the end.
export SANA_TEST_LOG_IDS=1
run ref 2 --train.visualize=true --train.eval_sampling_steps=1000 --train.preview_steps=4 --train.preview_images=2
assert_code $? 0 "40 ControlNet steps on 2 processes"
assert_contains "$SCRATCH/ref.log" "the 2 control blocks start as copies" "the control blocks started from the base's"
start_sum=$(grep -o "ControlNet: the base (checksum [0-9a-f]*)" "$SCRATCH/ref.log" | grep -o "[0-9a-f]\{16\}")
assert_contains "$SCRATCH/ref.log" "the base weights are unchanged (checksum $start_sum)" \
  "the base's checksum after 40 steps equals start-up's ($start_sum)"
if "$SANA_PYTHON" - "$SCRATCH" "$(dirname "$0")/../reference" > "$SCRATCH/ref.check" 2>&1 <<'PY'; then
import json, sys
import numpy as np
import torch
from PIL import Image
root = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from sana_reference import read_safetensors
steps = [json.loads(l) for l in open(f"{root}/ref/metrics.jsonl") if '"loss"' in l]
losses = [s["loss"] for s in steps]
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
base = torch.load(f"{root}/base.pth", map_location="cpu")["state_dict"]
base.pop("pos_embed")  # upstream's buffer the .pth carries for diffusers' loader; no weight of the model
final, _ = read_safetensors(f"{root}/ref/model.safetensors")
control = sorted(k for k in final if k.startswith("controlnet."))
# Every tensor of the base, each one: in the final file and equal; nothing else but controlnet.*.
missing = sorted(k for k in base if k not in final)
same = not missing and all(torch.equal(final[k], base[k]) for k in base)
covered = sorted(k for k in final if not k.startswith("controlnet.")) == sorted(base)
if missing:
    print(f"base tensors missing from the final file: {missing[:5]}")
moved = sum(not torch.equal(final[k], torch.zeros_like(final[k])) for k in control if "after_proj" in k)
# The 32x32 grid: 2 rows of [control map | sample], 2-pixel gaps.
grid = np.asarray(Image.open(f"{root}/ref/previews/step000040_32x32.png").convert("RGB")).astype(int)
maps, samples = grid[:, :32], grid[:, 34:]
binary = set(np.unique(maps)) <= {0, 255}
print(f"{len(losses)} steps, loss {first:.4f} (first 10) -> {last:.4f} (last 10); {len(control)} control tensors, "
      f"{len(base)} base tensors {'all present and equal to base.pth' if same and covered else 'CHANGED OR MISSING'}, {moved} after_proj moved from 0; "
      f"preview {grid.shape[1]}x{grid.shape[0]}: maps {'black and white' if binary else 'NOT binary'}, "
      f"samples {len(np.unique(samples))} levels")
sys.exit(0 if len(losses) == 40 and same and covered and moved > 0 and binary and
         grid.shape[:2] == (66, 66) and len(np.unique(samples)) > 2 else 1)
PY
  pass "$(cat "$SCRATCH/ref.check")"
else
  fail "the ControlNet run's loss, weights or previews: $(cat "$SCRATCH/ref.check")"
fi

# 2. Stop at 20 on 2 processes, resume on 1.
resume_on_one ControlNet 20 40

# 3. The checkpoint (control blocks and the base's checksum) in upstream's layout.
ckpt=$(ls -d "$SCRATCH"/chain/checkpoints/step_* | tail -1)
timeout 120 "$BIN" export "${common[@]}" --from "$ckpt" --format upstream --out "$SCRATCH/controlnet.pth" \
  > "$SCRATCH/export3.log" 2>&1
assert_code $? 0 "the ControlNet checkpoint exported in upstream's layout"
if "$SANA_PYTHON" - "$SCRATCH" "$(dirname "$0")/../reference" > "$SCRATCH/pth.check" 2>&1 <<'PY'; then
import sys
import torch
root = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from sana_reference import read_safetensors
pth = torch.load(f"{root}/controlnet.pth", map_location="cpu")["state_dict"]
final, _ = read_safetensors(f"{root}/chain/model.safetensors")
# The .pth adds upstream's pos_embed buffer (diffusers' single-file loader pops it), not a weight.
same = sorted(set(pth) - {"pos_embed"}) == sorted(final) and all(torch.equal(pth[k], final[k]) for k in final)
print(f"{len(pth)} tensors, {sum(k.startswith('controlnet.') for k in pth)} under controlnet.*, "
      f"{'equal to the run' if same else 'NOT the run'}'s model.safetensors")
sys.exit(0 if same and "controlnet.0.before_proj.weight" in pth else 1)
PY
  pass "$(cat "$SCRATCH/pth.check")"
else
  fail "the exported .pth: $(cat "$SCRATCH/pth.check")"
fi

# 4. The control blocks sharded at stage 3 (the frozen base whole on every rank): the same
#    losses as stage 0.
run zero3 2 --train.zero_stage=3 --train.max_steps=20; assert_code $? 0 "20 ControlNet steps at ZeRO stage 3"
same_losses ref zero3 20 "stage 3 vs stage 0"

# 6 (first, while the scratch folder is small). Control latents: prepare-features with the
#    small TorchScript VAE encodes each sample's canny map beside its image; 10 steps on the
#    features (data.load_vae_feat) give the losses of 10 steps that encode both online.
root=$(cd "$(dirname "$0")/../.." && pwd)
timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_torchscript_encoders.py" "$SCRATCH/enc" > /dev/null 2>&1 ||
  fail "python3-torch could not export the stand-in VAE"
vae=(--vae.vae_type=torchscript "--vae.vae_pretrained=$SCRATCH/enc/vae.pt" --vae.vae_latent_dim=4
     --vae.vae_downsample_rate=4 --data.random_flip=false --model.load_from= --train.max_steps=10)
timeout 240 "$BIN" launch --nproc-per-node 2 -- prepare-features "${common[@]}" "${vae[@]}" "--work_dir=$SCRATCH/prep" \
  "--out=$SCRATCH/features" > "$SCRATCH/prep.log" 2>&1
assert_code $? 0 "prepare-features on 2 processes: latents and control latents"
latents=$(find "$SCRATCH/features/latents" -name '*.npy' | wc -l)
controls=$(find "$SCRATCH/features/control" -name '*.npy' | wc -l)
if [ "$latents" -gt 0 ] && [ "$controls" -eq "$latents" ] && grep -q '"control_latent"' "$SCRATCH/features/meta.jsonl"; then
  pass "$controls control latents beside $latents latents, named in meta.jsonl"
else
  fail "$controls control latents, $latents latents"; tail -5 "$SCRATCH/prep.log"
fi
run online 2 "${vae[@]}"; assert_code $? 0 "10 steps encoding images and canny maps online"
run offline 2 "${vae[@]}" --data.load_vae_feat=true "--data.data_dir=[$SCRATCH/features/meta.jsonl]"
assert_code $? 0 "10 steps on the precomputed latents and control latents"
same_losses online offline 10 "precomputed control latents vs encoded online"

# 7. The loss curve against python3-torch: 20 steps with every micro-batch dumped
#    (SANA_TEST_DUMP_BATCHES), replayed by tests/reference/train_replay.py on upstream's
#    SanaMSControlNet with torch's clip_grad_norm_ and AdamW and diffusers' warmup: every
#    step's loss and the final control blocks as the run's. Weight decay and a clip that
#    bites, so that each shows.
replay=(--train.max_steps=20 --train.save_model_steps=1 --ckpt.keep_last_n=0 --train.optimizer.type=AdamW
        "--train.optimizer.betas=[0.9, 0.999]" "--train.optimizer.eps=[1e-10]" --train.optimizer.weight_decay=0.01
        --train.gradient_clip=0.1 --train.lr_schedule=constant --train.lr_schedule_args.num_warmup_steps=10)
SANA_TEST_DUMP_BATCHES=1 run replay 2 "${replay[@]}"; assert_code $? 0 "20 ControlNet steps with their batches dumped"
replayed replay "20 ControlNet steps" '{"kind": "controlnet", "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-10,
  "weight_decay": 0.01, "gradient_clip": 0.1, "warmup": 10}'

# 8. train.frozen_base_dtype bf16: the base's layers stored in bf16 on 2 processes, the
#    control blocks fp32. The final model.safetensors is all fp32: every base Linear/Conv2d
#    weight is base.pth's rounded to bf16, every other base tensor base.pth's own, the
#    control blocks moved; the checkpoint resumed on an int8 base is refused (exit 2).
run bf16 2 --train.frozen_base_dtype=bf16 --train.max_steps=6 --train.save_model_steps=3
assert_code $? 0 "6 ControlNet steps on a bf16 base on 2 processes"
assert_contains "$SCRATCH/bf16.log" "train.frozen_base_dtype bf16: the frozen base's" "the start-up names the stored dtype"
assert_contains "$SCRATCH/bf16.log" "the base weights are unchanged (checksum bf16:" \
  "the bf16 base's checksum names its dtype and holds to the end"
if "$SANA_PYTHON" - "$SCRATCH" "$(dirname "$0")/../reference" > "$SCRATCH/bf16.check" 2>&1 <<'PY'; then
import sys
import torch
root = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from sana_reference import read_safetensors
base = torch.load(f"{root}/base.pth", map_location="cpu")["state_dict"]
base.pop("pos_embed")
final, _ = read_safetensors(f"{root}/bf16/model.safetensors")
stored = [k for k in base if base[k].dim() >= 2 and k.endswith(".weight") and "embedding" not in k]
rounded = sum(torch.equal(final[k], base[k].to(torch.bfloat16).float()) for k in stored)
changed = sum(not torch.equal(final[k], base[k]) for k in stored)
others = [k for k in base if k not in stored]
kept = sum(torch.equal(final[k], base[k]) for k in others)
fp32 = all(t.dtype == torch.float32 for t in final.values())
extra = sorted(k for k in final if not k.startswith("controlnet.") and k not in base)
moved = sum(not torch.equal(final[k], torch.zeros_like(final[k])) for k in final if "after_proj" in k)
print(f"{len(final)} tensors, all fp32: {fp32}; {rounded} of {len(stored)} base layer weights equal base.pth's in bf16 "
      f"({changed} differ from fp32), {kept} of {len(others)} other base tensors base.pth's; extra {extra[:3]}; "
      f"{moved} after_proj moved")
sys.exit(0 if fp32 and rounded == len(stored) > 10 and changed > 0 and kept == len(others) and not extra and moved else 1)
PY
  pass "the bf16 base's final model: $(cat "$SCRATCH/bf16.check")"
else
  fail "the bf16 base's final model: $(cat "$SCRATCH/bf16.check")"
fi
launch_named bf16 1 --train.frozen_base_dtype=int8 --resume_from=latest --train.max_steps=9 > /dev/null
assert_code $? 2 "resuming the bf16 base's control blocks on an int8 base"
assert_contains "$SCRATCH/bf16.log" "Set train.frozen_base_dtype: bf16 to resume it" "the refusal says which dtype resumes"

# 5. Other base weights: refused, both checksums named.
refuses_other_base "control blocks" 50

# 9. The base's blocks swapped: the same model, byte for byte.
swap=(--train.deterministic=true --dist.threads_per_process=1 --train.grad_checkpointing=true --train.max_steps=4)
run unswapped 2 "${swap[@]}"; assert_code $? 0 "4 ControlNet steps, deterministic, on 2 processes"
run swapped 2 "${swap[@]}" --train.offload_blocks=2; assert_code $? 0 "the same with 2 base blocks swapped"
assert_contains "$SCRATCH/swapped.log" "train.offload_blocks: blocks 2 to 3 of 4" "the run names the blocks it swaps"
if cmp -s "$SCRATCH/unswapped/model.safetensors" "$SCRATCH/swapped/model.safetensors"; then
  pass "the final model is byte-identical with the base's blocks swapped"
else
  fail "the final model differs with the base's blocks swapped"
fi
finish
