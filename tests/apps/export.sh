#!/usr/bin/env bash
# `sana-train export` through the binary (docs/finetune.md): a caption-conditioned tiny
# model's initial weights to upstream's .pth, that file to a diffusers folder, the folder
# back to a .pth; python3-torch's torch.load reads both .pth files and finds every tensor
# equal (the null caption, which diffusers' layout lacks, comes from the same seed; upstream's
# pos_embed buffer is in both, as diffusers' single-file loader needs it), and
# a folder whose config.json names another depth is refused with exit 2, naming the field;
# diffusers' SanaPipeline, assembled around the exported folder, samples 2 steps;
# with a text encoder, the null caption exported is the one a run makes.
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
# diffusers' SanaPipeline around the exported folder (a tiny AutoencoderDC, Gemma2Model and
# tokenizer made by the script): 2 sampling steps with guidance, decoded.
if timeout 300 "$SANA_PYTHON" "$(dirname "$0")/diffusers_pipeline.py" "$SCRATCH/transformer" "$SCRATCH/pipeline" \
     > "$SCRATCH/pipeline.log" 2>&1; then
  pass "$(tail -1 "$SCRATCH/pipeline.log")"
else
  fail "diffusers' SanaPipeline does not run on the exported transformer"; tail -20 "$SCRATCH/pipeline.log"
fi
ex --from "$SCRATCH/transformer" --format upstream --out "$SCRATCH/b.pth"; assert_code $? 0 "the folder back to a .pth"
if "$SANA_PYTHON" - "$SCRATCH/a.pth" "$SCRATCH/b.pth" > "$SCRATCH/cmp.txt" 2>&1 <<'PY'; then
import sys, torch
a, b = (torch.load(p, weights_only=True)["state_dict"] for p in sys.argv[1:])  # as PyTorch 2.6 loads by default
same = sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
# upstream's pos_embed buffer, which diffusers' single-file loader pops: [1, N, C] for the
# model.image_size grid, zeros without model.use_pe.
pe, width = a.get("pos_embed"), a["x_embedder.proj.weight"].shape[0]
grid = round(pe.shape[1] ** 0.5) if pe is not None else 0
pe_ok = pe is not None and pe.shape == (1, grid * grid, width) and grid > 1 and not pe.any()
print(f"{len(a)} tensors, {'all equal' if same else 'DIFFERENT'}; pos_embed "
      f"{list(pe.shape) if pe is not None else 'MISSING'}{'' if pe_ok else ' (not [1, grid^2, width] of zeros)'}")
sys.exit(0 if same and pe_ok else 1)
PY
  pass "upstream -> diffusers -> upstream: $(cat "$SCRATCH/cmp.txt")"
else
  fail "the round trip changed the weights"; cat "$SCRATCH/cmp.txt"
fi
timeout 120 "$SANA_PYTHON" -c 'import json, sys; c = json.load(open(sys.argv[1])); c["num_layers"] = 7; json.dump(c, open(sys.argv[1], "w"))' \
  "$SCRATCH/transformer/config.json"
ex --from "$SCRATCH/transformer" --format upstream --out "$SCRATCH/c.pth"; assert_code $? 2 "a config.json of another depth"
assert_contains "$SCRATCH/export.log" "num_layers: file 7, preset 4" "the error names the field"

# The null caption as a run has it: with a text encoder (a TorchScript stand-in), the
# initial weights exported and a diffusers folder (which keeps no null caption) exported
# back hold the encoder's empty-prompt features, as a 1-step run's model.safetensors does.
timeout 120 "$SANA_PYTHON" "$(dirname "$0")/../reference/make_torchscript_encoders.py" "$SCRATCH/enc" \
  > "$SCRATCH/enc.log" 2>&1 || { fail "writing the stand-in encoders"; cat "$SCRATCH/enc.log"; }
te=(--text_encoder.text_encoder_name=torchscript "--text_encoder.text_encoder_path=$SCRATCH/enc/text.pt"
    --text_encoder.caption_channels=8 --text_encoder.model_max_length=6 "--work_dir=$SCRATCH/te")
ex_te() { timeout 120 "$BIN" export --config "$config" "${te[@]}" "$@" > "$SCRATCH/export_te.log" 2>&1; }
ex_te --format upstream --out "$SCRATCH/te_a.pth"; assert_code $? 0 "initial weights with a text encoder"
ex_te --from "$SCRATCH/te_a.pth" --format diffusers --out "$SCRATCH/te_folder"; assert_code $? 0 "to a diffusers folder"
ex_te --from "$SCRATCH/te_folder" --format upstream --out "$SCRATCH/te_b.pth"; assert_code $? 0 "and back"
assert_contains "$SCRATCH/export_te.log" "the text encoder's empty-prompt features" "the export made the null caption"
timeout 300 "$BIN" --config "$config" "${te[@]}" "--data.data_dir=[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" \
  --train.max_steps=1 --train.visualize=false > "$SCRATCH/te_run.log" 2>&1
assert_code $? 0 "one training step with the same text encoder"
if "$SANA_PYTHON" - "$SCRATCH" > "$SCRATCH/null.txt" 2>&1 <<'PY'; then
import json, struct, sys
import torch
d = sys.argv[1]
def safetensors_tensor(path, name):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])[name]
    a, b = head["data_offsets"]
    return torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]), dtype=torch.float32).reshape(head["shape"])
run = safetensors_tensor(f"{d}/te/model.safetensors", "y_embedder.y_embedding")
a, b = (torch.load(f"{d}/{p}", weights_only=True)["state_dict"]["y_embedder.y_embedding"] for p in ("te_a.pth", "te_b.pth"))
print(f"null caption {list(run.shape)}, mean |x| {run.abs().mean():.3f}: initial export "
      f"{'=' if torch.equal(a, run) else '!='} the run's, diffusers -> upstream {'=' if torch.equal(b, run) else '!='} the run's")
sys.exit(0 if torch.equal(a, run) and torch.equal(b, run) else 1)
PY
  pass "$(cat "$SCRATCH/null.txt")"
else
  fail "the exported null caption is not the run's: $(cat "$SCRATCH/null.txt")"
fi
finish
