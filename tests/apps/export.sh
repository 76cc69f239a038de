#!/usr/bin/env bash
# `sana-train export` through the binary (docs/finetune.md): a caption-conditioned tiny
# model's initial weights to upstream's .pth, that file to a diffusers folder, the folder
# back to a .pth; python3-torch's torch.load reads both .pth files and finds every tensor
# equal (the null caption, which diffusers' layout lacks, comes from the same seed), and
# a folder whose config.json names another depth is refused with exit 2, naming the field.
# Every command under `timeout` in a `mktemp -d` folder.
. "$(dirname "$0")/../dist/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
caption=(--text_encoder.text_encoder_name=gemma-2-2b-it --text_encoder.caption_channels=64
         --text_encoder.model_max_length=8 "--work_dir=$SCRATCH/w")
ex() { timeout 120 "$BIN" export --config "$config" "${caption[@]}" "$@" > "$SCRATCH/export.log" 2>&1; }
ex --format upstream --out "$SCRATCH/a.pth"; assert_code $? 0 "initial weights to upstream's .pth"
ex --from "$SCRATCH/a.pth" --format diffusers --out "$SCRATCH/transformer"; assert_code $? 0 ".pth to a diffusers folder"
[ -f "$SCRATCH/transformer/config.json" ] && [ -f "$SCRATCH/transformer/diffusion_pytorch_model.safetensors" ] &&
  pass "the folder has config.json and diffusion_pytorch_model.safetensors" || fail "diffusers folder incomplete"
ex --from "$SCRATCH/transformer" --format upstream --out "$SCRATCH/b.pth"; assert_code $? 0 "the folder back to a .pth"
if /usr/bin/python3 - "$SCRATCH/a.pth" "$SCRATCH/b.pth" > "$SCRATCH/cmp.txt" 2>&1 <<'PY'; then
import sys, torch
a, b = (torch.load(p, weights_only=True)["state_dict"] for p in sys.argv[1:])  # as PyTorch 2.6 loads by default
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
print(f"{len(a)} tensors, {'all equal' if same else 'DIFFERENT'}")
sys.exit(0 if same else 1)
PY
  pass "upstream -> diffusers -> upstream: $(cat "$SCRATCH/cmp.txt")"
else
  fail "the round trip changed the weights"; cat "$SCRATCH/cmp.txt"
fi
timeout 120 /usr/bin/python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_layers"] = 7; json.dump(c, open(sys.argv[1], "w"))' \
  "$SCRATCH/transformer/config.json"
ex --from "$SCRATCH/transformer" --format upstream --out "$SCRATCH/c.pth"; assert_code $? 2 "a config.json of another depth"
assert_contains "$SCRATCH/export.log" "num_layers: file 7, preset 4" "the error names the field"
finish
