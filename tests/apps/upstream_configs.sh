#!/usr/bin/env bash
# NVlabs/Sana's own YAMLs (verbatim copies in tests/configs/upstream/) through the real
# binary, unchanged: --print-config exits 0 and writes the accepted-with-no-effect keys as
# notes, and `sana-train model` builds the preset the YAML names. Each invocation has a
# 60 s limit and runs in a folder of its own.
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
  (cd "$dir" && timeout 60 "$BIN" model --config "$yaml" > model.txt 2>&1)
  assert_code $? 0 "$name: sana-train model"
  grep -q "^$preset: width" "$dir/model.txt" || { fail "$name: preset $preset not built"; cat "$dir/model.txt"; }
  grep -q "input: 32 channels (latents" "$dir/model.txt" || fail "$name: not a 32-channel latent model"
  grep -qE "^  total for this config +[0-9.]+ GiB" "$dir/model.txt" || fail "$name: no memory estimate"
  count=$((count + 1))
done
[ "$count" -ge 11 ] || fail "only $count upstream YAMLs found"
echo "upstream_configs: $count YAMLs printed and built"
assert_no_leftovers
finish
