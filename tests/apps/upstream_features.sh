#!/usr/bin/env bash
# Precomputed features in upstream Sana's on-disk layout, through the real binary with
# upstream's own CI YAML (512ms/ci_Sana_600M_img512.yaml, unchanged): latents as <key>.npy
# members of wids tar shards under the YAML's data_dir, caption features as <key>.npz in the
# working directory (where upstream's datasets look). Two processes train with
# data.load_vae_feat and data.load_text_feat on a CPU-sized preset and use every sample; a
# missing caption-feature file is a named bad sample, not a crash; the null caption comes
# from upstream's null-embedding file, from scratch (as upstream's train.py writes it before
# building the model) and on loading weights. Each run has a limit.
. "$(dirname "$0")/../dist/lib.sh"
YAML=$(cd "$(dirname "$0")/../configs/upstream/512ms" && pwd)/ci_Sana_600M_img512.yaml
MAKE=$(cd "$(dirname "$0")/../reference" && pwd)/make_wids_dataset.py
cd "$SCRATCH" || exit 1
timeout 120 "$SANA_PYTHON" "$MAKE" data/data_public/vaef32c32_v2_512/dir1 . 16 > make.log 2>&1 || { cat make.log; exit 1; }
# The empty prompt's features where upstream's train.py writes them (train.null_embed_root).
null=output/pretrained_models/null_embed_diffusers_gemma-2-2b-it_300token_2304.pth
mkdir -p output/pretrained_models
timeout 120 "$SANA_PYTHON" -c "import torch; torch.save({'uncond_prompt_embeds': torch.randn(1, 300, 2304),
  'uncond_prompt_embeds_mask': torch.ones(1, 300, dtype=torch.long)}, '$null')" ||
  fail "python3-torch could not write $null"
common=(--config "$YAML" --data.load_vae_feat=true --data.load_text_feat=true --model.model=SanaMS_tiny_P1_D4
        --train.train_batch_size=2 --train.visualize=false --train.log_interval=1 --dist.timeout_s=60)

log=$SCRATCH/run.log
timeout 240 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" --train.num_epochs=1 --work_dir="$SCRATCH/$TOKEN/a" > "$log" 2>&1
assert_code $? 0 "one epoch of upstream-layout features on 2 processes"
assert_contains "$log" "indexed 16 samples" "16 samples indexed from the two shards"
assert_contains "$log" "done: 4 steps" "16 samples / global batch 4 = 4 steps"
assert_contains "$log" "the empty prompt's features from '$null'" "from scratch, upstream's null-embedding file is the null caption"
grep -q "bad sample" "$log" && fail "a sample was substituted: $(grep -m1 'bad sample' "$log")"
grep -q "512x512" "$log" && grep -q "320x800" "$log" || fail "not both buckets trained: $(grep -c step "$log") step lines"

rm 00000005.npz  # sample 5 has no caption features now
log=$SCRATCH/missing.log
timeout 240 "$BIN" "${common[@]}" --train.num_epochs=1 --data.max_bad_fraction=0.2 --work_dir="$SCRATCH/$TOKEN/b" > "$log" 2>&1
assert_code $? 0 "a run with one sample's caption features missing"
if grep -qE "bad sample 5 .*no text features" "$log"; then pass "the sample without features is named"; else
  fail "no line names sample 5's missing features"; cat "$log"; fi

# Loading weights with precomputed features: the null caption is the file's again.
log=$SCRATCH/load.log
timeout 240 "$BIN" "${common[@]}" --train.max_steps=1 "--model.load_from=$SCRATCH/$TOKEN/a/model.safetensors" \
  --work_dir="$SCRATCH/$TOKEN/c" > "$log" 2>&1
assert_code $? 0 "a run that loads weights"
assert_contains "$log" "the empty prompt's features from '$null'" "upstream's null-embedding file is the null caption"
assert_no_leftovers
finish
