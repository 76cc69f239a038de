#!/usr/bin/env bash
# sana-train prepare-features on 2 processes with small TorchScript encoders (a VAE with 4
# latent channels at 1/4 size, a text encoder of 6 tokens x 8 features): a process killed
# mid-run leaves whole files only, and the rerun writes only what is missing (the earlier
# files keep their inodes); NumPy reads every file with the shapes of each sample's bucket;
# then 2 processes train on the features (data.load_vae_feat + load_text_feat) with the
# same loss at every step as a run that encodes the same images online. A rerun with other
# encoder settings is refused (exit 2). From scratch, the null caption is the encoder's
# empty prompt; precomputed captions without that file are refused (exit 2). Tiled VAE
# encoding resumes too, within 1e-2 of the whole images' latents.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
bash "$root/scripts/prepare_example_data.sh" "$SCRATCH/data" > /dev/null || { fail "no example data"; finish; }
timeout 300 "$SANA_PYTHON" "$root/tests/reference/make_torchscript_encoders.py" "$SCRATCH/enc" > /dev/null 2>&1 ||
  { fail "python3-torch could not export the encoders"; finish; }
enc=(--vae.vae_type=torchscript "--vae.vae_pretrained=$SCRATCH/enc/vae.pt" --vae.vae_latent_dim=4
     --vae.vae_downsample_rate=4 --text_encoder.text_encoder_name=torchscript
     "--text_encoder.text_encoder_path=$SCRATCH/enc/text.pt" --text_encoder.caption_channels=8
     --text_encoder.model_max_length=6)
common=(--config "$root/configs/sana_tiny_cpu.yaml" "--data.data_dir=[$SCRATCH/data]" "${enc[@]}"
        --data.random_flip=false --train.visualize=false --dist.timeout_s=60)
feat=$SCRATCH/features
prep() {  # LOG ARGS...
  local log=$1; shift
  timeout 240 "$BIN" launch --nproc-per-node 2 -- prepare-features "${common[@]}" "--work_dir=$SCRATCH/prep-$TOKEN" \
    "--out=$feat" --batch-size=4 "$@" > "$log" 2>&1
}
files() { (cd "$feat" && find latents text -type f -printf '%i %p\n' 2>/dev/null | sort -k2); }

# 1. Rank 1 dies after its 5th sample: whole files only, and no meta.jsonl yet.
SANA_TEST_KILL_AFTER_FEATURES=1:5 prep "$SCRATCH/killed.log"
code=$?
if [ "$code" -ne 0 ]; then pass "the run with a killed rank fails (exit $code)"; else fail "a killed rank went unnoticed"; fi
files > "$SCRATCH/before.txt"
n_before=$(grep -c ' latents/' "$SCRATCH/before.txt")
if [ "$n_before" -ge 5 ] && [ "$n_before" -lt 30 ]; then pass "$n_before samples' latents written before the kill"; else fail "$n_before latents before the kill"; cat "$SCRATCH/killed.log"; fi
if find "$feat" -name '*.tmp*' | grep -q .; then fail "half-written files left: $(find "$feat" -name '*.tmp*' | head -3)"; else pass "no half-written file left"; fi
[ -e "$feat/meta.jsonl" ] && fail "meta.jsonl written by a run that did not finish"

# 2. The rerun finishes and writes only the missing samples.
prep "$SCRATCH/resumed.log"
assert_code $? 0 "the rerun finishes"
assert_contains "$SCRATCH/resumed.log" "prepare-features: 30 samples: $((30 - n_before)) written now, $n_before there before, 0 bad" \
  "the rerun counts what was there and what it wrote"
files > "$SCRATCH/after.txt"
redone=$(join -1 2 -2 2 <(sort -k2 "$SCRATCH/before.txt") <(sort -k2 "$SCRATCH/after.txt") | awk '$2 != $3' | wc -l)
if [ "$redone" -eq 0 ]; then pass "none of the $n_before finished samples was written again (inodes kept)"; else fail "$redone finished files were rewritten"; fi
rank1=$(grep -c "prepare-features: .* of this rank's samples" "$SCRATCH/prep-$TOKEN/prepare_features.rank1.log")
if [ "$rank1" -ge 1 ]; then pass "rank 1 showed progress in its log ($rank1 lines)"; else fail "no progress line from rank 1"; fi

# 3. NumPy reads every file, in the shapes of each sample's bucket.
if "$SANA_PYTHON" - "$feat" > "$SCRATCH/numpy.log" 2>&1 <<'PY'
import json, os, sys
import numpy as np
out = sys.argv[1]
rows = [json.loads(line) for line in open(os.path.join(out, "meta.jsonl"))]
assert len(rows) == 30, len(rows)
shapes = set()
for r in rows:
    z = np.load(os.path.join(out, r["latent"]))
    assert z.dtype == np.float32 and z.ndim == 3 and z.shape[0] == 4, (r, z.shape)
    assert np.isfinite(z).all()
    t = np.load(os.path.join(out, r["text_feat"]))
    assert t["caption_feature"].shape == (1, 6, 8), t["caption_feature"].shape
    m = t["attention_mask"]
    assert m.shape == (1, 6) and m.sum() == min(6, len(r["caption"])), (m, r["caption"])
    assert os.path.exists(r["path"]) and r["width"] > 0 and r["height"] > 0
    shapes.add(z.shape)
print(f"30 rows, latent shapes {sorted(shapes)}")
PY
then pass "NumPy reads every file: $(tail -1 "$SCRATCH/numpy.log")"; else fail "NumPy: $(tail -3 "$SCRATCH/numpy.log")"; fi

# 4. Training on the features = training with the encoders online, step by step.
train() {  # NAME ARGS...
  local name=$1; shift
  timeout 300 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" --train.max_steps=8 --train.log_interval=4 \
    --train.save_model_steps=0 "--work_dir=$SCRATCH/$name-$TOKEN" "$@" > "$SCRATCH/$name.log" 2>&1
}
train online
assert_code $? 0 "8 steps with the encoders online"
train features "--data.data_dir=[$feat/meta.jsonl]" --data.load_vae_feat=true --data.load_text_feat=true \
  "--text_encoder.null_embed_path=$feat/null_embed.safetensors"
assert_code $? 0 "8 steps on the prepared features"
if "$SANA_PYTHON" - "$SCRATCH/online-$TOKEN/metrics.jsonl" "$SCRATCH/features-$TOKEN/metrics.jsonl" > "$SCRATCH/cmp.log" 2>&1 <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 8, (len(a), len(b))
worst = max(abs(x["loss"] - y["loss"]) / abs(x["loss"]) for x, y in zip(a, b))
assert worst < 1e-4, f"losses differ by {worst:.2e}: {[x['loss'] for x in a]} vs {[y['loss'] for y in b]}"
print(f"8 steps, largest relative loss difference {worst:.1e}")
PY
then pass "same losses: $(tail -1 "$SCRATCH/cmp.log")"; else fail "losses: $(tail -2 "$SCRATCH/cmp.log")"; fi

# 5. From scratch, the null caption is the text encoder's empty prompt, as upstream's
#    train.py makes it before step 1: y_embedder.y_embedding (a buffer, never trained) in
#    the online run's last checkpoint equals the empty prompt's features prepare-features
#    wrote. Without that file, a run on precomputed captions with caption dropout refuses to
#    start (exit 2), naming the file it looked for and the command that writes it.
if "$SANA_PYTHON" - "$SCRATCH/online-$TOKEN/checkpoints" "$feat/null_embed.safetensors" \
    "$(dirname "$0")/../reference" > "$SCRATCH/null.log" 2>&1 <<'PY'
import glob, os, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from sana_reference import read_checkpoint_part, read_safetensors
# The checkpoint in whichever format the run wrote (format 3: every rank's entries by
# index.json), read by the Python reference, not by sana-train.
last = sorted(glob.glob(os.path.join(sys.argv[1], "step_*")), key=lambda p: int(p.rsplit("_", 1)[1]))[-1]
ours = read_checkpoint_part(last, "model")[0]["y_embedder.y_embedding"].numpy()
empty = read_safetensors(sys.argv[2])[0]["uncond_prompt_embeds"].numpy().reshape(ours.shape)
assert ours.dtype == np.float32 and empty.dtype == np.float32, (ours.dtype, empty.dtype)
assert np.array_equal(ours, empty), f"largest difference {np.abs(ours - empty).max()}"
assert np.abs(empty).max() > 0
print(f"y_embedding {ours.shape} in {os.path.basename(last)} equals the empty prompt's features")
PY
then pass "$(tail -1 "$SCRATCH/null.log")"; else fail "null caption from scratch: $(tail -3 "$SCRATCH/null.log")"; fi
train no_null "--data.data_dir=[$feat/meta.jsonl]" --data.load_vae_feat=true --data.load_text_feat=true \
  --model.class_dropout_prob=0.1 "--train.null_embed_root=$SCRATCH/no_such_folder"
assert_code $? 2 "precomputed captions with caption dropout and no null-embedding file"
assert_contains "$SCRATCH/no_null.log" "$SCRATCH/no_such_folder/null_embed_diffusers_torchscript_6token_8.pth" \
  "the refusal names the file it looked for"
assert_contains "$SCRATCH/no_null.log" "sana-train prepare-features" "the refusal names the command that writes it"

# 6. The same folder with another text encoder length: refused, naming the setting.
prep "$SCRATCH/other.log" --text_encoder.model_max_length=5
assert_code $? 2 "a rerun with other encoder settings"
assert_contains "$SCRATCH/other.log" "holds features made with other settings (text_encoder:" "the refusal names the setting"

# 7. Tiled encoding (vae.tile_size 16, tile_overlap 8: every bucket of the 32 px table is
#    larger than a tile) into its own folder: killed after rank 1's 3rd sample and rerun, it
#    finishes, and every latent is within 1e-2 (mean absolute, relative) of the whole-image
#    encoding's; other tiles into that folder are refused (exit 2).
whole=$feat
feat=$SCRATCH/features_tiled
tiles=(--vae.tile_size=16 --vae.tile_overlap=8)
SANA_TEST_KILL_AFTER_FEATURES=1:3 prep "$SCRATCH/tiled_killed.log" "${tiles[@]}"
prep "$SCRATCH/tiled.log" "${tiles[@]}"
assert_code $? 0 "tiled: the rerun after a kill finishes"
assert_contains "$SCRATCH/tiled.log" "there before, 0 bad" "tiled: the rerun counts what was there"
if "$SANA_PYTHON" - "$whole" "$feat" > "$SCRATCH/tiled_cmp.log" 2>&1 <<'PY'
import json, os, sys
import numpy as np
whole, tiled = sys.argv[1], sys.argv[2]
rows = [json.loads(line) for line in open(os.path.join(tiled, "meta.jsonl"))]
worst = 0.0
for r in rows:
    a, b = np.load(os.path.join(whole, r["latent"])), np.load(os.path.join(tiled, r["latent"]))
    assert a.shape == b.shape, (r["latent"], a.shape, b.shape)
    worst = max(worst, float(np.abs(a - b).mean() / np.abs(a).mean()))
assert len(rows) == 30 and worst <= 1e-2, (len(rows), worst)
print(f"{len(rows)} tiled latents, worst mean relative difference to the whole image's {worst:.1e}")
PY
then pass "$(tail -1 "$SCRATCH/tiled_cmp.log")"; else fail "tiled latents: $(tail -3 "$SCRATCH/tiled_cmp.log")"; fi
prep "$SCRATCH/tiled_other.log" --vae.tile_size=24 --vae.tile_overlap=8
assert_code $? 2 "tiled: other tiles into the same folder"
feat=$whole
assert_no_leftovers
finish
