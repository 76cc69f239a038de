#!/usr/bin/env bash
# Upstream keys that act here as in NVlabs/Sana's train.py, through the real binary
# (docs/upstream.md; the refused ones are tests/configs/bad/*.yaml, the mapped ones
# tests/unit/config/test_upstream.cpp):
#   train.early_stop_hours: the first step that ends after the limit saves a checkpoint and
#   stops every rank (exit 0, the log says why); resume_from: latest continues from it.
# Each run has a 120 s limit and its own folder under a `mktemp -d` one, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
common=(--config "$ROOT/configs/sana_tiny_cpu.yaml" "--data.data_dir=[/usr/share/backgrounds/mate]"
        --train.visualize=false --train.max_steps=6 --train.save_model_steps=0 --train.log_interval=1)
W=$SCRATCH/$TOKEN

# 1. A limit of 0.1 ms: the first step ends past it.
timeout -k 5 120 "$BIN" "${common[@]}" --train.early_stop_hours=0.00000003 "--work_dir=$W/limited" \
  > "$SCRATCH/limited.log" 2>&1
assert_code $? 0 "a run past train.early_stop_hours"
assert_contains "$SCRATCH/limited.log" "train.early_stop_hours: 3e-08 h have passed since start-up" \
  "the log says why the run stopped"
steps=$(grep -c '"step"' "$W/limited/metrics.jsonl" 2>/dev/null || echo 0)
if [ "$steps" -eq 1 ]; then pass "it stopped after step 1 of 6"; else fail "$steps steps in metrics.jsonl, expected 1"; fi
if [ -d "$W/limited/checkpoints/step_00000001" ]; then pass "a checkpoint at step 1"; else fail "no checkpoint at step 1"; ls "$W/limited/checkpoints" 2>&1; fi

# 2. Resumed without the limit: the run continues at step 2 and ends at max_steps.
timeout -k 5 120 "$BIN" "${common[@]}" --train.early_stop_hours=0 --resume_from=latest "--work_dir=$W/limited" \
  > "$SCRATCH/resumed.log" 2>&1
assert_code $? 0 "the resume with train.early_stop_hours 0 (no limit)"
steps=$(grep -c '"step"' "$W/limited/metrics.jsonl" 2>/dev/null || echo 0)
if [ "$steps" -eq 6 ]; then pass "steps 2..6 followed after the resume"; else fail "$steps steps in metrics.jsonl, expected 6"; fi
finish
