#!/usr/bin/env bash
# train.masked_loss (docs/finetune.md): each JSONL row's `mask` image weights its sample's loss
# per cell (OneTrainer's masked training), LoRA on the tiny preset, 2 processes, 10 steps:
#  1. every mask white: the losses equal the unmasked run's bitwise (every step: the
#     gradients too);
#  2. masks white on the left half, every other row without one: the batches' loss weights
#     are 1 on the mask's white half and train.masked_loss_unmasked_weight (0.25) on the
#     other, mirrored with the flipped images, and 1 everywhere for a row without a mask;
#     the losses differ from the unmasked run's; and the run replayed in python3-torch
#     (tests/reference/train_replay.py: upstream's modules, PEFT's adapters, torch's AdamW,
#     the loss as OneTrainer weights it) gives every step's loss and the adapters;
#  3. train.masked_loss_alpha, no mask field and RGBA PNGs half opaque on every other row: the
#     alpha channel weighs as the half masks of 2 do, the RGB images' rows are all ones. (Off,
#     as in 1 and 2, the example photos' own alpha channels, ten RGBA wallpapers, are no mask.)
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
photos=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --train.visualize=false --train.log_interval=5 --dist.timeout_s=60
        --train.save_model_steps=0 --train.save_model_epochs=0 --train.micro_batch_size=2 --train.max_steps=10
        --train.optimizer.type=AdamW "--train.optimizer.betas=[0.9, 0.999]" "--train.optimizer.eps=[1e-10]"
        --train.optimizer.weight_decay=0.01 --train.optimizer.lr=3e-3 --train.gradient_clip=0.1
        --train.lr_schedule=constant --train.lr_schedule_args.num_warmup_steps=2 --train.seed=3
        "--model.load_from=$SCRATCH/base.pth" --train.lora.rank=4 --train.lora.alpha=8
        "--train.lora.target_modules=[to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
# half_weights WORK WHAT: every sample of $SCRATCH/WORK's dumped batches weighs 1 everywhere
# (no mask) or, for a half mask, 1 on one side and 0.25 on the other; both kinds occur.
half_weights() {
  if PYTHONPATH="$(dirname "$0")/../reference" timeout 120 "$SANA_PYTHON" - "$SCRATCH/$1" > "$SCRATCH/$1.check" 2>&1 <<'PY'; then
import glob, sys
from sana_reference import read_safetensors
halves = whole = 0
for path in sorted(glob.glob(f"{sys.argv[1]}/batches/*.safetensors")):
    t, _ = read_safetensors(path)
    for w in t["loss_weights"]:
        w = w[0]
        values = sorted(set(w.flatten().tolist()))
        if values == [1.0]:
            whole += 1
            continue
        # Bucket crops keep the middle, where the resized mask blends white into black: the
        # outer quarters are all 1 on the white side and all 0.25 on the other (mirrored
        # when the image was flipped).
        cols = w.shape[1] // 4
        left, right = sorted(set(w[:, :cols].flatten().tolist())), sorted(set(w[:, -cols:].flatten().tolist()))
        if sorted([left, right]) != [[0.25], [1.0]]:
            sys.exit(f"{path}: a half mask's weights are not 1 on one side and 0.25 on the other: {values[:6]}")
        halves += 1
print(f"{halves} half-masked and {whole} unmasked samples' weights as the masks say")
sys.exit(0 if halves > 0 and whole > 0 else 1)
PY
    pass "$2: $(cat "$SCRATCH/$1.check")"
  else
    fail "$2: the dumped loss weights: $(cat "$SCRATCH/$1.check")"
  fi
}
timeout 120 "$BIN" export --config "$config" --format upstream --out "$SCRATCH/base.pth" > "$SCRATCH/export.log" 2>&1
assert_code $? 0 "the tiny preset's initial weights exported as the base"

# Three JSONL files over the same photos: no masks, white masks, left-half masks on every other row.
timeout 120 "$SANA_PYTHON" - "$photos" "$SCRATCH" <<'PY'
import json, pathlib, sys
from PIL import Image
photos, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(out / "masks").mkdir()
rows = {"plain": [], "white": [], "half": []}
for k, path in enumerate(sorted(p for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))):
    w, h = Image.open(path).size
    white, half = out / "masks" / f"{k}.white.png", out / "masks" / f"{k}.half.png"
    Image.new("L", (w, h), 255).save(white)
    im = Image.new("L", (w, h), 0)
    im.paste(255, (0, 0, w // 2, h))
    im.save(half)
    row = {"image": str(path), "caption": ""}
    rows["plain"].append(row)
    rows["white"].append(dict(row, mask=str(white)))
    rows["half"].append(dict(row, mask=str(half)) if k % 2 == 0 else row)
for name, r in rows.items():
    (out / f"{name}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in r))
PY
assert_code $? 0 "the metadata files and masks"

run plain 2 --data.data_dir="[$SCRATCH/plain.jsonl]"; assert_code $? 0 "10 LoRA steps without masks"
run white 2 --data.data_dir="[$SCRATCH/white.jsonl]" --train.masked_loss=true; assert_code $? 0 "white masks"
losses() { timeout 60 "$SANA_PYTHON" -c 'import json, sys
print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$SCRATCH/$1/metrics.jsonl"; }
a=$(losses plain) b=$(losses white)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$(echo "$a" | wc -w)" = 10 ]; then
  pass "white masks: the 10 losses equal the unmasked run's bitwise"
else
  fail "white masks vs none: '$b' vs '$a'"
fi

SANA_TEST_DUMP_BATCHES=1 run half 2 --data.data_dir="[$SCRATCH/half.jsonl]" --train.masked_loss=true \
  --train.masked_loss_unmasked_weight=0.25 --train.save_model_steps=1 --ckpt.keep_last_n=0
assert_code $? 0 "half masks on every other row, batches dumped"
[ "$(losses half)" != "$a" ] && pass "half masks change the losses" || fail "half masks left the losses as without"
half_weights half "half masks"
replayed half "the masked run" '{"kind": "lora", "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-10,
  "weight_decay": 0.01, "gradient_clip": 0.1, "warmup": 2, "alpha": 8.0}' --data.data_dir="[$SCRATCH/plain.jsonl]"

# 3. train.masked_loss_alpha: without a mask field, an image's alpha channel is its mask: RGBA PNGs, opaque on the left
#    half, on every other row (RGB on the others); 2 steps dumped: the weights as in 2.
timeout 120 "$SANA_PYTHON" - "$photos" "$SCRATCH" <<'PY'
import pathlib, sys
from PIL import Image
photos, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]) / "alpha"
out.mkdir()
for k, path in enumerate(sorted(p for p in photos.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))):
    im = Image.open(path).convert("RGB")
    if k % 2 == 0:
        a = Image.new("L", im.size, 0)
        a.paste(255, (0, 0, im.size[0] // 2, im.size[1]))
        im.putalpha(a)
    im.save(out / f"{k:03d}.png")
PY
SANA_TEST_DUMP_BATCHES=1 run alpha 2 --data.data_dir="[$SCRATCH/alpha]" --train.masked_loss=true \
  --train.masked_loss_alpha=true --train.masked_loss_unmasked_weight=0.25 --train.max_steps=2
assert_code $? 0 "alpha-channel masks on every other image, batches dumped"
half_weights alpha "alpha-channel masks"
assert_no_leftovers
finish
