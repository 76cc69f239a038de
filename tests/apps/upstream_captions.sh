#!/usr/bin/env bash
# Upstream's data filters and caption choice on upstream's WebDataset layout: a dataset of
# 240 samples in two tar shards with the files upstream reads beside each shard (prompt CLIP
# scores, external captions with and without "prompt", caption CLIP scores), written and
# judged by tests/reference/upstream_captions.py (NVlabs/Sana's rules transcribed). Checked
# through `sana-train check-data --dump`, whose dump.tsv names each sample and its caption:
#   1. clipscore choice with del_img_clip_thr 22, clip_thr 25, temperature 0.25 (3 seeds):
#      the samples kept and the captions drawn, against upstream's probabilities;
#   2. proportion choice with a name no sample has (3 seeds), the same;
#   3. hq_only: only version "high_quality" kept, each with its own prompt;
#   4. a filter that keeps nothing: exit 2 naming the keys and the counts;
#   5. caption_proportion weights adding up to 0 under proportion: exit 2 naming the key.
# Every command runs under `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
. "$(dirname "$0")/pixel_config.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=$SANA_PYTHON
REF=$ROOT/tests/reference/upstream_captions.py
W=$SCRATCH/$TOKEN
mkdir -p "$W"
if ! timeout 120 "$PY" "$REF" make "$W/data" > "$W/make.log" 2>&1; then
  fail "writing the dataset"; cat "$W/make.log"; finish
fi

# config NAME: a pixel-space config over the dataset (tests/apps/pixel_config.sh) with
# NAME's data keys.
config() { pixel_config "$W/work_$1" "$W/data" 256 "$(cat "$W/$1.data")" > "$W/$1.yaml"; }

# settings NAME JSON: the data keys of a case, as YAML for the run and JSON for the reference.
settings() {
  local defaults='{"hq_only": false, "del_img_clip_thr": 0.0, "caption_selection_type": "clipscore",
    "caption_proportion": {"prompt": 1}, "external_caption_suffixes": [], "external_clipscore_suffixes": [],
    "clip_thr": 0.0, "clip_thr_temperature": 1.0}'
  timeout 120 "$PY" -c 'import json, sys
s = json.loads(sys.argv[1]); s.update(json.loads(sys.argv[2]))
json.dump(s, open(sys.argv[3] + ".json", "w"))
with open(sys.argv[3] + ".data", "w") as f:
    for k, v in json.loads(sys.argv[2]).items():
        f.write(f"  {k}: {json.dumps(v)}\n")' "$defaults" "$2" "$W/$1"
  config "$1"
}

# dump_and_check NAME SEED...: check-data --dump once per seed, then the reference's verdict.
dump_and_check() {
  local name=$1 dumps=() seed rc
  shift
  for seed in "$@"; do
    timeout -k 5 120 "$BIN" check-data --config "$W/$name.yaml" --dump "$W/dump_${name}_$seed" \
      --train.seed="$seed" "--work_dir=$W/work_$name/$TOKEN" > "$W/$name.$seed.log" 2>&1
    rc=$?
    if [ "$rc" -ne 0 ]; then fail "$name: check-data (seed $seed) exited $rc"; tail -20 "$W/$name.$seed.log"; return; fi
    dumps+=("$W/dump_${name}_$seed/dump.tsv")
  done
  if timeout 120 "$PY" "$REF" check "$W/data" "$W/$name.json" "${dumps[@]}" > "$W/$name.compare" 2>&1; then
    pass "$name: $(tail -1 "$W/$name.compare")"
  else
    fail "$name: differs from upstream's rules"; head -12 "$W/$name.compare"
  fi
}

settings clip '{"del_img_clip_thr": 22.0, "external_caption_suffixes": ["_VILA", "_extra"],
  "external_clipscore_suffixes": ["_clip_score"], "clip_thr": 25.0, "clip_thr_temperature": 0.25}'
dump_and_check clip 1 2 3
if grep -q "data filters (hq_only false del_img_clip_thr 22): kept" "$W/clip.1.log"; then
  pass "clip: the log says how many samples the filter kept ($(grep -o 'kept [0-9]* of [0-9]* samples ([^)]*)' "$W/clip.1.log"))"
else fail "clip: no line saying what the filter kept"; grep -i "filter" "$W/clip.1.log" | head -3; fi

settings proportion '{"caption_selection_type": "proportion", "external_caption_suffixes": ["_VILA", "_extra"],
  "caption_proportion": {"prompt": 1, "_VILA": 2, "internvl": 1, "absent": 1}}'
dump_and_check proportion 1 2 3

settings hq '{"hq_only": true}'
dump_and_check hq 5

# Shard 1 has no prompt score file: its samples score 100 (upstream's default), under 200.
settings none_left '{"del_img_clip_thr": 200.0}'
timeout -k 5 60 "$BIN" check-data --config "$W/none_left.yaml" "--data.data_dir=[$W/data/00001.tar]" \
  "--work_dir=$W/work_none/$TOKEN" > "$W/none.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "left no sample of 120" "$W/none.log" && grep -q "data.del_img_clip_thr dropped 120" "$W/none.log"; then
  pass "a filter that keeps nothing: exit 2 with the counts"
else fail "a filter that keeps nothing: exit $rc"; tail -5 "$W/none.log"; fi

settings zero '{"caption_selection_type": "proportion", "caption_proportion": {"prompt": 0}}'
timeout -k 5 60 "$BIN" check-data --config "$W/zero.yaml" "--work_dir=$W/work_zero/$TOKEN" > "$W/zero.log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "data.caption_proportion" "$W/zero.log"; then
  pass "caption_proportion adding up to 0: exit 2 naming the key"
else fail "caption_proportion adding up to 0: exit $rc"; tail -5 "$W/zero.log"; fi

finish
