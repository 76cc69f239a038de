#!/usr/bin/env bash
# Both encoders by upstream's names, as a user downloads them, no TorchScript: a small random
# Gemma-2 written by transformers (tests/reference/make_gemma2.py, tokenizer.model included)
# and a small random AutoencoderDC written by diffusers (tests/reference/make_dc_ae.py), laid
# out in a Hugging Face cache as huggingface_hub writes one (blobs, snapshot links, refs/main)
# under upstream's repo names.
#   1. With the cache empty, `text_encoder_name: gemma-2-2b-it` and `vae_pretrained:
#      mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers` stop at start with exit 2, each naming the
#      cache folder looked in and the download command.
#   2. With them there, prepare-features on 2 processes writes caption features that equal
#      transformers' tokenizer and decoder computing them with upstream train.py's rules
#      (CHI prompt, select_index) in Python, and the null caption; and latents that equal
#      diffusers' encode() x scaling_factor of the pixels sana-train fed it (check-data --dump).
#   3. Training runs the same config online (both encoders every step) to its last step; each
#      rank's memory.json holds the encoders' bytes that `sana-train model` counts from their
#      config.json, and its parameter counts are diffusers' and transformers'.
#   4. Upstream's own YAML (sana1-5_1024ms/Sana_1600M_1024px_AdamW_fsdp.yaml: AutoencoderDC
#      mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers, gemma-2-2b-it, its CHI prompt, 300 tokens)
#      starts training with folders of those shapes in the cache (a 2304-wide Gemma-2, a f32c32
#      DC-AE), the file unchanged and on the command line only a CPU-sized preset, the data (the
#      images, where the YAML reads precomputed latents: load_vae_feat false) and the step
#      count; and stops with exit 2 naming the download commands when they are not.
. "$(dirname "$0")/../dist/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
bash "$root/scripts/prepare_example_data.sh" "$SCRATCH/data" > /dev/null || { fail "no example data"; finish; }
hf_encoders  # the cached folders (HF_HOME=$SCRATCH/hf); step 1 points HF_HOME elsewhere
repo=$SCRATCH/hf/hub/models--Efficient-Large-Model--gemma-2-2b-it
vae_repo=$SCRATCH/hf/hub/models--mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers

cat > "$SCRATCH/my.yaml" <<EOF
base: $root/configs/sana_tiny_cpu.yaml
data:
  data_dir: [$SCRATCH/data]
  random_flip: false
vae: {vae_type: AutoencoderDC, vae_pretrained: mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers, vae_latent_dim: 4,
      vae_downsample_rate: 4, scale_factor: 0.41407}
text_encoder:
  text_encoder_name: gemma-2-2b-it
  caption_channels: 32
  model_max_length: 12
  chi_prompt:
    - 'Given a user prompt, generate an enhanced prompt:'
    - 'User Prompt: '
train: {max_steps: 4, log_interval: 1, visualize: false, save_model_steps: 1000}
dist: {timeout_s: 60}
EOF

# 1. Not downloaded.
mkdir -p "$SCRATCH/empty"
HF_HOME=$SCRATCH/empty timeout 120 "$BIN" --config "$SCRATCH/my.yaml" "--work_dir=$SCRATCH/none" > "$SCRATCH/missing.log" 2>&1
assert_code $? 2 "the encoders not in the cache: a config error"
for name in Efficient-Large-Model/gemma-2-2b-it mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers; do
  assert_contains "$SCRATCH/missing.log" "huggingface-cli download $name" "the download command for $name is named"
  assert_contains "$SCRATCH/missing.log" "$SCRATCH/empty/hub/models--${name/\//--}" "the cache folder looked in for $name is named"
done
[ -e "$SCRATCH/none/metrics.jsonl" ] && fail "a step ran without the text encoder"

# 2. Features from the cached folder, on 2 processes, against transformers.
timeout 300 "$BIN" launch --nproc-per-node 2 -- prepare-features --config "$SCRATCH/my.yaml" \
  "--work_dir=$SCRATCH/prep-$TOKEN" "--out=$SCRATCH/features" --batch-size=4 > "$SCRATCH/prep.log" 2>&1
assert_code $? 0 "prepare-features with both encoders from the Hugging Face cache"
assert_contains "$SCRATCH/prep.log" "prepare-features: 30 samples: 30 written now" "every sample's features written"
if timeout 300 "$SANA_PYTHON" - "$SCRATCH/features" "$repo/snapshots/$HF_REV" > "$SCRATCH/compare.log" 2>&1 <<'PY'
import json, os, sys
import numpy as np
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, Gemma2ForCausalLM
out, folder = sys.argv[1], sys.argv[2]
tokenizer = AutoTokenizer.from_pretrained(folder)
tokenizer.padding_side = "right"
decoder = Gemma2ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").get_decoder().eval()
chi = "\n".join(["Given a user prompt, generate an enhanced prompt:", "User Prompt: "])
L = 12
n_chi = len(tokenizer.encode(chi))
select_index = [0] + list(range(-L + 1, 0))
rows = [json.loads(line) for line in open(os.path.join(out, "meta.jsonl"))]
assert len(rows) == 30, len(rows)
worst = 0.0
with torch.no_grad():
    for r in rows:  # upstream train.py, one caption at a time
        tok = tokenizer([chi + r["caption"]], max_length=n_chi + L - 2, padding="max_length", truncation=True,
                        return_tensors="pt")
        want = decoder(tok.input_ids, attention_mask=tok.attention_mask)[0][:, select_index].numpy()
        got = np.load(os.path.join(out, r["text_feat"]))
        assert np.array_equal(got["attention_mask"], tok.attention_mask[:, select_index].numpy()), r["caption"]
        worst = max(worst, float(np.abs(got["caption_feature"] - want).max() / np.abs(want).max()))
    null = tokenizer("", max_length=L, padding="max_length", truncation=True, return_tensors="pt")
    want_null = decoder(null.input_ids, attention_mask=null.attention_mask)[0]
    got_null = load_file(os.path.join(out, "null_embed.safetensors"))["uncond_prompt_embeds"]
    null_diff = float((got_null - want_null).abs().max() / want_null.abs().max())
print(f"30 captions: largest relative difference {worst:.2e}; null caption {null_diff:.2e}")
assert worst < 1e-5 and null_diff < 1e-5
PY
then pass "caption features equal transformers' with upstream's rules ($(tail -1 "$SCRATCH/compare.log"))"
else fail "caption features differ from transformers'"; cat "$SCRATCH/compare.log"; fi
# The latents: diffusers' AutoencoderDC on the very pixels sana-train encoded.
timeout 300 "$BIN" check-data --config "$SCRATCH/my.yaml" "--work_dir=$SCRATCH/dump-$TOKEN" --dump "$SCRATCH/dump" \
  > "$SCRATCH/dump.log" 2>&1
assert_code $? 0 "check-data --dump writes the pixels the VAE sees"
if timeout 300 "$SANA_PYTHON" - "$SCRATCH/features" "$SCRATCH/dump" "$vae_repo/snapshots/$HF_REV" > "$SCRATCH/latents.log" 2>&1 <<'PY'
import csv, json, os, sys
import numpy as np
import torch
from diffusers import AutoencoderDC
from PIL import Image
out, dump, folder = sys.argv[1:4]
vae = AutoencoderDC.from_pretrained(folder).eval()
rows = {json.loads(line)["path"]: json.loads(line) for line in open(os.path.join(out, "meta.jsonl"))}
worst, n = 0.0, 0
with open(os.path.join(dump, "dump.tsv")) as f, torch.no_grad():
    for r in csv.DictReader(f, delimiter="\t"):
        pixels = np.asarray(Image.open(os.path.join(dump, r["file"])).convert("RGB"), dtype=np.float32)
        x = torch.from_numpy(pixels / 127.5 - 1.0).permute(2, 0, 1)[None]
        want = (vae.encode(x).latent * vae.config.scaling_factor)[0].numpy()
        got = np.load(os.path.join(out, rows[os.path.abspath(r["path"])]["latent"]))
        assert got.shape == want.shape, (got.shape, want.shape)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        n += 1
print(f"{n} images: largest relative difference {worst:.2e}")
assert n == 30 and worst < 1e-5
PY
then pass "latents equal diffusers' encode() x scaling_factor ($(tail -1 "$SCRATCH/latents.log"))"
else fail "latents differ from diffusers'"; cat "$SCRATCH/latents.log"; fi

# 3. Training with the encoder online.
timeout 300 "$BIN" launch --nproc-per-node 2 -- --config "$SCRATCH/my.yaml" "--work_dir=$SCRATCH/run-$TOKEN" \
  > "$SCRATCH/train.log" 2>&1
assert_code $? 0 "training with both encoders from the cache"
last=$(grep -o '"step":[0-9]*' "$SCRATCH/run-$TOKEN/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
if [ "$last" = 4 ]; then pass "trained to step 4"; else fail "last step '${last:-none}'"; tail -20 "$SCRATCH/train.log"; fi
# What the encoders hold: `sana-train model`'s count from the two config.json files against
# diffusers' and transformers' own parameter counts, and its bytes against what each rank
# measured after its first step (memory.json).
timeout 120 "$BIN" model --config "$SCRATCH/my.yaml" --json --no-activations --dist.device=cpu > "$SCRATCH/model.json" \
  2> "$SCRATCH/model.err"
assert_code $? 0 "sana-train model counts the encoders"
if timeout 120 "$SANA_PYTHON" - "$SCRATCH/model.json" "$SCRATCH/run-$TOKEN/memory.json" "$vae_repo/snapshots/$HF_REV" \
     "$repo/snapshots/$HF_REV" > "$SCRATCH/count.log" 2>&1 <<'PY'
import json, sys
import torch
from diffusers import AutoencoderDC
from transformers import Gemma2ForCausalLM
model, memory = (json.load(open(p)) for p in sys.argv[1:3])
enc = {e["role"]: e for e in model["encoders"]}
vae = sum(p.numel() for p in AutoencoderDC.from_pretrained(sys.argv[3]).parameters())
text = sum(p.numel() for p in Gemma2ForCausalLM.from_pretrained(sys.argv[4], dtype=torch.float32).parameters())
assert enc["VAE"]["parameters"] == vae, (enc["VAE"], vae)
assert enc["text encoder"]["parameters"] == text, (enc["text encoder"], text)
want = model["memory_per_process"]["encoders"]
got = [r["encoders"] for r in memory["ranks"]]
assert want == 4 * (vae + text) and got == [want, want], (want, got)
print(f"DC-AE {vae:,} and Gemma-2 {text:,} parameters as diffusers and transformers count them; "
      f"{want:,} bytes in fp32 on each of the 2 ranks")
PY
then pass "the encoders' count and bytes ($(tail -1 "$SCRATCH/count.log"))"
else fail "the encoders' count or bytes differ"; cat "$SCRATCH/count.log"; fi
# 4. Upstream's YAML as it is.
timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_gemma2.py" "$SCRATCH/up-gemma" --upstream-width \
  > "$SCRATCH/up.log" 2>&1 &&
  timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_dc_ae.py" "$SCRATCH/up-vae" --upstream-shape >> "$SCRATCH/up.log" 2>&1 ||
  { fail "could not write the upstream-shaped folders"; cat "$SCRATCH/up.log"; }
rm -rf "$SCRATCH/hf"
hf_cache_repo "$SCRATCH/up-gemma/gemma" Efficient-Large-Model--gemma-2-2b-it
hf_cache_repo "$SCRATCH/up-vae/f32c32" mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers
upstream=(--config "$root/tests/configs/upstream/sana1-5_1024ms/Sana_1600M_1024px_AdamW_fsdp.yaml"
          --model.model=SanaMS_tiny_P2_D4 --model.load_from= "--data.data_dir=[$SCRATCH/data]" --data.load_vae_feat=false
          --train.train_batch_size=2
          --train.max_steps=2 --data.tail=pad --train.visualize=false --train.log_interval=1 --dist.timeout_s=60)
HF_HOME=$SCRATCH/empty timeout 120 "$BIN" "${upstream[@]}" "--work_dir=$SCRATCH/up-none" > "$SCRATCH/up-missing.log" 2>&1
assert_code $? 2 "upstream's YAML without the folders: a config error"
assert_contains "$SCRATCH/up-missing.log" "huggingface-cli download mit-han-lab/dc-ae-f32c32-sana-1.1-diffusers" "its VAE's download command"
assert_contains "$SCRATCH/up-missing.log" "huggingface-cli download Efficient-Large-Model/gemma-2-2b-it" "its text encoder's download command"
timeout 300 "$BIN" "${upstream[@]}" "--work_dir=$SCRATCH/up-$TOKEN" > "$SCRATCH/up-train.log" 2>&1
assert_code $? 0 "upstream's YAML trains with both folders in the Hugging Face cache"
last=$(grep -o '"step":[0-9]*' "$SCRATCH/up-$TOKEN/metrics.jsonl" 2>/dev/null | tail -1 | grep -o '[0-9]*$')
if [ "$last" = 2 ]; then pass "upstream's YAML trained to step 2"; else fail "last step '${last:-none}'"; tail -20 "$SCRATCH/up-train.log"; fi
assert_no_leftovers
finish
