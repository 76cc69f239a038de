#!/usr/bin/env bash
# train.micro_batch_size auto on the CPU: 2 processes of the tiny preset, global batch 8 (4
# samples a process), the memory given by train.micro_batch_memory_gib so the choice does not
# follow this host's free memory.
#   - A roomy budget: the run takes `sana-train model --device-memory`'s pick for the same
#     config and world size (4 samples, no checkpointing), says so, and trains as the run
#     with those numbers written out: the same losses, bit for bit.
#   - A budget of the every-block-checkpointed estimate's bytes: the pick checkpoints, and
#     the run takes that too.
#   - A budget below the state: exit 2 on every rank, the message naming the key and sizes.
# Every command under `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PHOTOS=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$ROOT/configs/sana_tiny_cpu.yaml" "--data.data_dir=[$PHOTOS]" --train.max_steps=3
        --train.log_interval=1 --train.visualize=false --train.save_model_steps=0 --dist.timeout_s=60)
G=$((1 << 30))
# pick GIB: `sana-train model`'s pick at 2 processes for a device of GIB: "micro gc_step bytes
# every-block-bytes".
pick() {
  timeout 120 "$BIN" model --json --world-size 2 "${common[@]}" --train.micro_batch_size=auto \
    "--train.micro_batch_memory_gib=$1" 2> /dev/null | timeout 60 "$SANA_PYTHON" -c '
import json, sys
text = sys.stdin.read()
s = json.loads(text[text.find("\n{") + 1:])["micro_batch_suggestion"]
assert s["taken"], s
print(s["pick"]["micro_batch"], s["pick"]["gc_step"], s["pick"]["bytes"], s["largest"][2]["bytes"])'
}
# train NAME ARGS...: 2 processes, the log in $SCRATCH/NAME.log, the work dir $SCRATCH/NAME.
train() {
  local name=$1; shift
  timeout 240 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/$name" "$@" \
    > "$SCRATCH/$name.log" 2>&1
}
# exact_losses A B WHAT: the two runs logged the same losses, as written.
exact_losses() {
  if "$SANA_PYTHON" - "$SCRATCH/$1/metrics.jsonl" "$SCRATCH/$2/metrics.jsonl" > "$SCRATCH/$2.cmp" 2>&1 <<'PY'; then
import json, sys
a, b = ([json.loads(l)["loss"] for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
print(f"{len(a)} and {len(b)} losses: {b}")
sys.exit(0 if a == b and len(a) == 3 else 1)
PY
    pass "$3: $(cat "$SCRATCH/$2.cmp")"
  else
    fail "$3: $(cat "$SCRATCH/$2.cmp")"
  fi
}

read -r m gc bytes every < <(pick 64) || { fail "sana-train model gave no suggestion at 64 GiB"; finish; }
if [ "$m" = 4 ] && [ "$gc" = 0 ]; then
  pass "at 64 GiB sana-train model suggests the whole share, 4 samples, without checkpointing"
else
  fail "at 64 GiB sana-train model suggests micro-batch $m with gc_step $gc"
fi
if train roomy --train.micro_batch_size=auto --train.micro_batch_memory_gib=64; then
  assert_contains "$SCRATCH/roomy.log" "train.micro_batch_size auto: 4 with train.grad_checkpointing false" \
    "the run says what auto took"
  assert_contains "$SCRATCH/roomy.log" "4 samples on this rank in 1 micro-batch of at most 4" "the run's batching"
else
  fail "the auto run failed: $(tail -5 "$SCRATCH/roomy.log")"
fi
if train written --train.micro_batch_size=4 --train.grad_checkpointing=false; then
  exact_losses written roomy "auto trains as micro_batch_size 4 written out"
else
  fail "the written-out run failed: $(tail -5 "$SCRATCH/written.log")"
fi

# A device of exactly what checkpointing every block needs for the whole share (plus the 2 GiB
# kept for the CUDA context): no checkpointing does not fit, so the pick recomputes.
tight=$(awk -v b="$every" -v g="$G" 'BEGIN { printf "%.9f", (b + 1024) / g + 2 }')
read -r tm tgc _ _ < <(pick "$tight") || { fail "sana-train model gave no suggestion at $tight GiB"; finish; }
if [ "$tgc" -gt 0 ] 2> /dev/null; then
  pass "at $tight GiB sana-train model suggests micro-batch $tm with gc_step $tgc"
else
  fail "at $tight GiB sana-train model suggests micro-batch $tm with gc_step $tgc, no checkpointing"
fi
want="train.micro_batch_size auto: $tm with train.grad_checkpointing true"
[ "$tgc" = 1 ] && want="$want (every block)" || want="$want, train.gc_step $tgc"
if train tight --train.micro_batch_size=auto "--train.micro_batch_memory_gib=$tight"; then
  assert_contains "$SCRATCH/tight.log" "$want" "the run takes the checkpointing pick"
else
  fail "the tight auto run failed: $(tail -5 "$SCRATCH/tight.log")"
fi

# Nothing fits: a config error, exit 2, with the sizes.
train none --train.micro_batch_size=auto --train.micro_batch_memory_gib=2.0000001
assert_code "$?" 2 "auto with no room"
assert_contains "$SCRATCH/none.log" "train.micro_batch_size: auto finds no micro-batch that fits" "the message"
assert_contains "$SCRATCH/none.log" "one sample with every block checkpointed needs" "the sizes"
finish
