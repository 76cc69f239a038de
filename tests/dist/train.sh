#!/usr/bin/env bash
# Real training on 1, 2 and 3 processes (the tiny config on the example photos, global
# batch 12): rank 0 alone builds the index; after 20 steps every rank's parameters are
# bitwise identical (the trainer
# compares checksums), and the runs at different world sizes see the same samples and
# end with the same weights up to float summation order. Then a graceful stop (SIGTERM to
# one rank: all ranks stop at the same step, exit 0) and non-finite steps (every rank
# skips them, then stops with a clear message).
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_EXAMPLE_DATA:-${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}}
common=(--config "$config" --data.data_dir="[$data]" --train.global_batch_size=12 --train.micro_batch_size=2
        --data.tail=pad --train.log_interval=5 --train.visualize=false --dist.timeout_s=60 "--work_dir=$SCRATCH/$TOKEN")
for n in 1 2 3; do
  out=$SCRATCH/train_$n.log
  timeout 240 "$BIN" launch --nproc-per-node "$n" -- "${common[@]}" "--work_dir=$SCRATCH/w$n" --train.max_steps=20 > "$out" 2>&1
  assert_code $? 0 "20 steps on $n process(es)"
  # The terminal shows rank 0's lines; every rank's are in its log in work_dir.
  logs=("$SCRATCH/w$n/train.log")
  for ((r = 1; r < n; r++)); do logs+=("$SCRATCH/w$n/train.rank$r.log"); done
  sums=$(cat "${logs[@]}" | grep -o "parameters identical on all $n ranks\? (checksum [0-9a-f]*)" | sort -u)
  count=$(cat "${logs[@]}" | grep -c "parameters identical on all $n ranks\? (checksum")
  if [ "$count" -eq "$n" ] && [ "$(echo "$sums" | wc -l)" -eq 1 ]; then pass "$n rank(s): $sums"; else fail "checksums on $n ranks: $sums"; cat "$out"; fi
  lines=$(wc -l < "$SCRATCH/w$n/metrics.jsonl")
  if [ "$lines" -eq 20 ]; then pass "metrics.jsonl has 20 steps"; else fail "metrics.jsonl has $lines lines"; fi
  # The work_dir is shared: rank 0 reads the image headers once, the others open its index.
  if [ "$n" -gt 1 ]; then
    builders=$(cat "${logs[@]}" | grep -o "r[0-9]*/$n I\] indexing " | sort | uniq -c | tr -s ' ')
    if [ "$builders" = " 1 r0/$n I] indexing " ]; then
      pass "the index was built once, by rank 0"
    else
      fail "index builders on $n ranks: $builders"
    fi
  fi
done
# Same samples, same noise: the loss curves and final weights of W = 1, 2, 3 agree.
timeout 300 "$SANA_PYTHON" - "$SCRATCH" <<'PY' > "$SCRATCH/compare.log" 2>&1
import json, struct, sys
import numpy as np
root = sys.argv[1]
def weights(path):
    b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    return {k: np.frombuffer(b[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], dtype=np.float32) for k, v in h.items()}
def losses(w):
    return np.array([json.loads(l)["loss"] for l in open(f"{root}/w{w}/metrics.jsonl")])
base_w, base_l = weights(f"{root}/w1/model.safetensors"), losses(1)
worst = 0.0
for w in (2, 3):
    ws, ls = weights(f"{root}/w{w}/model.safetensors"), losses(w)
    # Per tensor, the norm of the difference over the tensor's norm. Not the largest element:
    # AdamW (eps 1e-10) turns a weight's near-zero gradient, whose rounding differs with the
    # summation order, into a full-size step, so a few elements of a tensor (219 of 49152 in
    # blocks.0.attn.qkv.weight on the test photos) differ by up to lr x steps.
    dw = max(np.linalg.norm(ws[k] - base_w[k]) / max(np.linalg.norm(base_w[k]), 1e-12) for k in base_w)
    dl = np.abs(ls - base_l).max() / np.abs(base_l).max()
    print(f"W={w} vs W=1: largest relative weight difference (per tensor, in norm) {dw:.2e}, "
          f"max relative loss difference {dl:.2e}")
    worst = max(worst, dw, dl)
sys.exit(0 if worst < 1e-3 else 1)
PY
code=$?
cat "$SCRATCH/compare.log"
assert_code $code 0 "world sizes 1, 2, 3 train alike"

# Elastic determinism: G = 8 on W = 1 (accumulation 2), W = 2 (1 and 2), W = 4 (1): the
# same per-step loss for 10 steps.
runs=("1 4" "2 4" "2 2" "4 2")
for run in "${runs[@]}"; do
  set -- $run
  out=$SCRATCH/elastic_$1_$2.log
  timeout 240 "$BIN" launch --nproc-per-node "$1" -- "${common[@]}" "--work_dir=$SCRATCH/e$1_$2" --train.max_steps=10 \
    --train.global_batch_size=8 "--train.micro_batch_size=$2" > "$out" 2>&1
  assert_code $? 0 "G 8 on $1 process(es), micro-batch $2"
done
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY' > "$SCRATCH/elastic.log" 2>&1
import json, sys
import numpy as np
root = sys.argv[1]
def losses(name):
    return np.array([json.loads(l)["loss"] for l in open(f"{root}/{name}/metrics.jsonl")])
base = losses("e1_4")
assert len(base) == 10, len(base)
worst = 0.0
for name in ("e2_4", "e2_2", "e4_2"):
    d = np.abs(losses(name) - base).max() / np.abs(base).max()
    print(f"{name} vs e1_4 (W=1, accumulation 2): max relative per-step loss difference {d:.2e}")
    worst = max(worst, d)
sys.exit(0 if worst <= 1e-5 else 1)
PY
code=$?
cat "$SCRATCH/elastic.log"
assert_code $code 0 "the per-step loss does not depend on the world size or accumulation"

# Graceful stop: SIGTERM to rank 1 alone; both ranks stop after the same step and exit 0.
out=$SCRATCH/stop.log
timeout 300 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/stop" --train.max_steps=100000 \
  > "$out" 2>&1 &
launcher=$!
if wait_for_line "$SCRATCH/stop/metrics.jsonl" '"step":3,' 120; then
  kill -TERM "$(pid_of_rank 1 --config)"
  code_of "$launcher" 60; assert_code "$CODE" 0 "a stop request ends the run cleanly"
else
  fail "training did not reach step 3"; cat "$out"
fi
assert_contains "$out" "stop requested (SIGINT/SIGTERM) on rank 1" "the stop names the rank that asked"
s0=$(grep -o 'every rank stops after step [0-9]*' "$SCRATCH/stop/train.log" | grep -o '[0-9]*$')
s1=$(grep -o 'every rank stops after step [0-9]*' "$SCRATCH/stop/train.rank1.log" | grep -o '[0-9]*$')
last=$(tail -1 "$SCRATCH/stop/metrics.jsonl" | grep -o '"step":[0-9]*' | grep -o '[0-9]*')
if [ -n "$s0" ] && [ "$s0" = "$s1" ] && [ "$s0" = "$last" ]; then pass "both ranks stopped after step $s0"; else fail "stop steps: rank 0 '$s0', rank 1 '$s1', metrics '$last'"; cat "$out"; fi

# A data error on rank 1 mid-epoch: every rank ends within seconds, naming rank 1.
out=$SCRATCH/inject.log
SANA_TEST_FAIL_AT=1:3 timeout 300 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/inject" \
  --train.max_steps=100000 > "$out" 2>&1 &
launcher=$!
if wait_for_line "$out" 'injected data error at step 3' 120; then
  start=$(now)
  code_of "$launcher" 30
  took=$(elapsed_since "$start")
  assert_code "$CODE" 1 "the run fails with the data error's code"
  if awk -v t="$took" 'BEGIN { exit !(t < 10) }'; then pass "all ranks ended ${took} s after the error"; else fail "ending took ${took} s"; fi
else
  fail "the injected error did not happen"; cat "$out"
fi
if of_rank 0 "$out" | grep -q 'rank 1 .*failed: injected data error'; then pass "rank 0 names rank 1 and the error"; else fail "rank 0 does not name rank 1"; cat "$out"; fi

# Non-finite steps: a learning rate that blows the weights up. Every step after is skipped
# on all ranks, then the run stops with a message saying what to do.
out=$SCRATCH/nonfinite.log
timeout 120 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/nan" --train.max_steps=50 \
  --train.optimizer.lr=1e30 --train.gradient_clip=0 --train.lr_schedule_args.num_warmup_steps=0 --train.max_nonfinite=2 > "$out" 2>&1
assert_code $? 1 "too many non-finite steps"
assert_contains "$out" "non-finite steps in a row (train.max_nonfinite 2)" "the reason is given"
assert_contains "$out" "the step is skipped on all ranks" "skipped steps are logged"
assert_no_leftovers
finish
