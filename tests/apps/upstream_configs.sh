#!/usr/bin/env bash
# NVlabs/Sana's own YAMLs (verbatim copies in tests/configs/upstream/) through the real
# binary, unchanged: --print-config exits 0 and writes the accepted-with-no-effect keys as
# notes, and `sana-train model` builds the preset the YAML names. The memory estimate (a
# few CPU forwards of the model at depth 1 and 2, seconds for 1.6B) runs on one 600M and
# one 1.6B YAML, --no-memory on the others. Each invocation has a 60 s limit and runs in a
# folder of its own.
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
  case $name in 512ms/Sana_600M_img512.yaml | 1024ms/Sana_1600M_img1024.yaml) memory= ;; esac
  (cd "$dir" && timeout 60 "$BIN" model --config "$yaml" $memory > model.txt 2>&1)
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
assert_no_leftovers
finish
