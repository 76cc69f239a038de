#!/usr/bin/env bash
# NVlabs/Sana's own YAMLs (verbatim copies in tests/configs/upstream/) through the real
# binary, unchanged: --print-config exits 0 and writes the accepted-with-no-effect keys as
# notes, and `sana-train model` builds the preset the YAML names. The memory estimate (a
# few CPU forwards of the model at depth 1 and 2) runs on one 600M YAML, --no-memory on the
# others (apps.one_gpu_memory measures the 1.6B's, and the 4.8B's below). Each invocation
# runs in a folder of its own under a limit: 60 s, 150 s with the memory estimate.
. "$(dirname "$0")/../dist/lib.sh"
UPSTREAM=$(cd "$(dirname "$0")/../configs/upstream" && pwd)
count=0
for yaml in "$UPSTREAM"/*/*.yaml; do
  name=${yaml#"$UPSTREAM"/}
  dir=$(mktemp -d "$SCRATCH/$TOKEN-case-XXXXXX")
  (cd "$dir" && timeout 60 "$BIN" --config "$yaml" --print-config > printed.yaml 2> stderr.log)
  assert_code $? 0 "$name: --print-config"
  grep -q '^# note: upstream' "$dir/printed.yaml" || fail "$name: no notes on upstream's keys"
  preset=$(sed -n 's/^  model: *\([A-Za-z0-9_]*\).*/\1/p' "$yaml" | head -1)
  memory=--no-memory
  case $name in 512ms/Sana_600M_img512.yaml) memory= ;; esac
  limit=60
  [ -z "$memory" ] && limit=150
  (cd "$dir" && timeout "$limit" "$BIN" model --config "$yaml" $memory > model.txt 2>&1)
  assert_code $? 0 "$name: sana-train model $memory"
  grep -q "^$preset: width" "$dir/model.txt" || { fail "$name: preset $preset not built"; cat "$dir/model.txt"; }
  grep -q "input: 32 channels (latents" "$dir/model.txt" || fail "$name: not a 32-channel latent model"
  if [ -z "$memory" ]; then
    if grep -qE "^  total for this config +[0-9.]+ GiB" "$dir/model.txt"; then
      pass "$name: $(grep -E '^  total for this config' "$dir/model.txt" | tr -s ' ' | cut -c2-)"
    else
      fail "$name: no memory estimate"; cat "$dir/model.txt"
    fi
  fi
  count=$((count + 1))
done
[ "$count" -ge 15 ] || fail "only $count upstream YAMLs found"
echo "upstream_configs: $count YAMLs printed and built"

# The ZeRO configs act: use_fsdp is stage 3, and SANA-1.5 4.8B (its CAME8bit) fits 80 GB
# GPUs on 8 of them at stage 3, where with AdamW and an EMA on one without ZeRO it does not.
dir=$(mktemp -d "$SCRATCH/$TOKEN-case-XXXXXX")
(cd "$dir" && timeout 60 "$BIN" --config "$UPSTREAM/sana1-5_1024ms/Sana_1600M_1024px_AdamW_fsdp.yaml" --print-config \
   > fsdp.yaml 2> /dev/null)
grep -q "^  zero_stage: 3" "$dir/fsdp.yaml" && pass "Sana_1600M_1024px_AdamW_fsdp.yaml: use_fsdp is train.zero_stage 3" ||
  fail "use_fsdp: true did not set train.zero_stage 3"
big=$UPSTREAM/sana1-5_1024ms/Sana_4800M_1024px_came8bit_grow_constant_allqknorm_bf16_lr2e5.yaml
# Its activations are measured on the CPU: 36 s alone here, over 120 s with a build beside the fast tier.
(cd "$dir" && timeout 240 "$BIN" model --config "$big" --train.zero_stage=3 --world-size 8 --json > m3.json 2> /dev/null)
assert_code $? 0 "4.8B: sana-train model at stage 3 on 8"
# Its state alone (weights, gradients, AdamW's moments, EMA: 20 bytes a parameter) passes
# 80 GB, so the activations need no measuring (36 s here) to say it does not fit.
(cd "$dir" && timeout 120 "$BIN" model --config "$big" --train.optimizer.type=AdamW "--train.optimizer.betas=[0.9,0.999]" \
   "--train.optimizer.eps=[1e-8]" --train.ema_update=true --no-activations --json > m0.json 2> /dev/null)
assert_code $? 0 "4.8B: sana-train model with AdamW and EMA on 1"
if "$SANA_PYTHON" - "$dir/m3.json" "$dir/m0.json" > "$dir/fits.txt" 2>&1 <<'PY'; then
import json, sys
w8, w1 = (json.load(open(f))["memory_per_process"] for f in sys.argv[1:])
gib = lambda m: m["total_for_config"] / 2**30
print(f"4.8B: {gib(w8):.1f} GiB per GPU with CAME8bit at stage 3 on 8 (fits {w8['fits_gpus_gb']} GB), "
      f"{gib(w1):.1f} GiB with AdamW and EMA on one without ZeRO (fits {w1['fits_gpus_gb']} GB)")
sys.exit(0 if 80 in w8["fits_gpus_gb"] and 80 not in w1["fits_gpus_gb"] else 1)
PY
  pass "$(cat "$dir/fits.txt")"
else
  fail "the 4.8B estimate: $(cat "$dir/fits.txt")"
fi
assert_no_leftovers
finish
