#!/usr/bin/env bash
# DreamBooth's prior preservation (data.class_data_dir, docs/finetune.md): LoRA on the tiny
# preset, each sample trained beside a class image, loss = the sample's + prior_loss_weight x
# the class image's (diffusers' train_dreambooth_lora_sana.py).
#  1. An empty class folder and data.num_class_images 5 on 2 processes: the 5 class images
#     are generated before the first step (generated_00000.png ...; square PNGs at the
#     preview bucket), and the run's 6 steps replayed in python3-torch
#     (tests/reference/train_replay.py: upstream's modules, PEFT's adapters, torch's AdamW,
#     diffusers' instance + 0.5 x prior) give every step's loss and the adapters.
#  2. Two of them deleted: a run on 1 process (one thread, as each of the 2 had: the sampler's
#     floats depend on the thread count) generates those two alone, byte-identical to
#     the first ones (each image's noise is keyed by the seed and its number); the others
#     are left as they were. A resume of the first run generates nothing.
#  3. train.deterministic: the adapters after 4 steps on 1 and on 2 processes are
#     byte-identical (the pairing and the class rows' noise are the same at any W).
#  4. With data.load_vae_feat: exit 2 naming data.class_data_dir.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
photos=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
classes=$SCRATCH/classes
common=(--config "$config" "--data.data_dir=[$photos]" --train.visualize=false --train.log_interval=2
        --dist.timeout_s=60 --train.save_model_steps=1 --ckpt.keep_last_n=0 --train.save_model_epochs=0
        --train.micro_batch_size=2 --train.max_steps=6 --train.optimizer.type=AdamW
        "--train.optimizer.betas=[0.9, 0.999]" "--train.optimizer.eps=[1e-10]" --train.optimizer.weight_decay=0.01
        --train.optimizer.lr=3e-3 --train.gradient_clip=0.1 --train.lr_schedule=constant
        --train.lr_schedule_args.num_warmup_steps=2 --train.seed=3 "--model.load_from=$SCRATCH/base.pth"
        --train.lora.rank=4 --train.lora.alpha=8
        "--train.lora.target_modules=[to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]"
        "--data.class_data_dir=$classes" --data.num_class_images=5 --train.prior_loss_weight=0.5
        --train.preview_steps=2)
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
timeout 120 "$BIN" export --config "$config" --format upstream --out "$SCRATCH/base.pth" > "$SCRATCH/export.log" 2>&1
assert_code $? 0 "the tiny preset's initial weights exported as the base"
sums() { (cd "$classes" && md5sum generated_*.png 2> /dev/null); }

# 1. Generated, then trained beside; the replay.
SANA_TEST_DUMP_BATCHES=1 run gen 2; assert_code $? 0 "6 steps with class images on 2 processes"
assert_contains "$SCRATCH/gen.log" "generating 5 class images" "the missing class images are generated first"
if timeout 60 "$SANA_PYTHON" - "$classes" > "$SCRATCH/classes.check" 2>&1 <<'PY'; then
import os, sys
from PIL import Image
d = sys.argv[1]
names = sorted(os.listdir(d))
want = [f"generated_{k:05d}.png" for k in range(5)]
sizes = {Image.open(os.path.join(d, n)).size for n in names}
assert names == want, names
assert len(sizes) == 1 and len({*next(iter(sizes))}) == 1, sizes
print(f"{len(names)} files, {names[0]} .. {names[-1]}, each {next(iter(sizes))[0]} px square")
PY
  pass "class images: $(cat "$SCRATCH/classes.check")"
else
  fail "class images: $(tail -3 "$SCRATCH/classes.check")"
fi
assert_contains "$SCRATCH/gen.log" "each sample trains beside one of 5 class images" "the start-up says what pairs"
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/gen/batches" > "$SCRATCH/dumps.check" 2>&1 <<'PY'; then
import glob, json, struct, sys
import numpy as np
bad, rows = [], 0
for path in sorted(glob.glob(f"{sys.argv[1]}/r*.safetensors")):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    def get(k, dtype):
        v = head[k]
        return np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype)
    total = head["noisy"]["shape"][0]
    if "prior_rows" not in head or 2 * int(get("prior_rows", np.int64)[0]) != total \
            or float(get("prior_loss_weight", np.float64)[0]) != 0.5:
        bad.append(path)
    rows += total
assert rows > 0 and not bad, f"{len(bad)} micro-batches without half their rows as class images: {bad[:2]}"
print(f"every dumped micro-batch is half class images ({rows} rows), weighted 0.5")
PY
  pass "$(cat "$SCRATCH/dumps.check")"
else
  fail "the dumped batches: $(tail -2 "$SCRATCH/dumps.check")"
fi
replayed gen "6 steps with prior preservation" '{"kind": "lora", "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-10,
  "weight_decay": 0.01, "gradient_clip": 0.1, "warmup": 2, "alpha": 8.0}'

# 2. Generation resumes where files are missing, with the same pixels; a resume reuses them.
sums > "$SCRATCH/before.md5"
rm -f "$classes/generated_00001.png" "$classes/generated_00004.png"
run regen 1 --train.max_steps=1 --dist.threads_per_process=1; assert_code $? 0 "a run on 1 process with two class images missing"
assert_contains "$SCRATCH/regen.log" "generating 2 class images" "only the two missing ones are generated"
if diff <(sums) "$SCRATCH/before.md5" > /dev/null; then
  pass "the regenerated images are byte-identical to the first ones, the rest untouched (5 files)"
else
  fail "the class images changed: $(diff <(sums) "$SCRATCH/before.md5" | head -4)"
fi
run gen 2 --resume_from=latest --train.max_steps=8; assert_code $? 0 "the first run resumed"
if grep -q "generating" "$SCRATCH/gen.log"; then fail "the resume generated class images again"
else pass "the resume reused the class images"; fi

# 3. The same adapters on 1 and 2 processes.
det=(--train.deterministic=true --dist.threads_per_process=1 --train.max_steps=4 --train.save_model_steps=0)
run det1 1 "${det[@]}"; assert_code $? 0 "4 deterministic steps on 1 process"
run det2 2 "${det[@]}"; assert_code $? 0 "4 deterministic steps on 2 processes"
if cmp -s "$SCRATCH/det1/pytorch_lora_weights.safetensors" "$SCRATCH/det2/pytorch_lora_weights.safetensors"; then
  pass "with class images the adapters on 1 and 2 processes are byte-identical"
else
  fail "the adapters on 1 and 2 processes differ"
fi

# 4. Precomputed features: refused.
run feat 1 --data.load_vae_feat=true; assert_code $? 2 "class images with precomputed latents"
assert_contains "$SCRATCH/feat.log" "data.class_data_dir" "the refusal names the key"
assert_no_leftovers
finish
