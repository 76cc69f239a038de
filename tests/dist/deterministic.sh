#!/usr/bin/env bash
# train.deterministic (issue 17): 20 steps on 1, 2, 3 and 4 processes (global batch 8 in
# micro-batches of 2: accumulation 4, 2, 2/1/1 and 1 per rank) end with byte-identical
# model.safetensors, one thread per process; without it the files differ.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
common=(--config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" --train.visualize=false
        --train.log_interval=10 --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0
        --train.micro_batch_size=2 --train.max_steps=20 --dist.threads_per_process=1 --train.ema_update=true
        "--work_dir=$SCRATCH/$TOKEN")  # the token finds this test's processes; a later --work_dir wins
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
for w in 1 2 3 4; do
  run "det$w" "$w" --train.deterministic=true; assert_code $? 0 "20 deterministic steps on $w process(es)"
done
assert_contains "$SCRATCH/det3.log" " r0/3 I] " "3 processes ran"
assert_contains "$SCRATCH/det3.log" "global batch 8: 4 samples on this rank in 2 micro-batches of at most 2" \
  "ranks take whole micro-batches (8 on 3: 4, 2, 2)"
for w in 2 3 4; do
  for f in model.safetensors ema.safetensors; do
    if cmp -s "$SCRATCH/det1/$f" "$SCRATCH/det$w/$f"; then
      pass "$f byte-identical on $w processes and on 1"
    else
      fail "$f differs between $w processes and 1"
    fi
  done
done
for w in 1 2; do
  run "normal$w" "$w"; assert_code $? 0 "20 steps without train.deterministic on $w process(es)"
done
if cmp -s "$SCRATCH/normal1/model.safetensors" "$SCRATCH/normal2/model.safetensors"; then
  fail "without train.deterministic the weights were byte-identical too: the test proves nothing"
else
  pass "without train.deterministic 1 and 2 processes differ in the last bits (float sums in another order)"
fi
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY'
import json, statistics, sys
root = sys.argv[1]
def step_time(name):  # median seconds per step after the first (start-up) steps
    rows = [json.loads(l) for l in open(f"{root}/{name}/metrics.jsonl")]
    return statistics.median(r["time"]["total"] for r in rows[3:])
for w in (1, 2):
    d, n = step_time(f"det{w}"), step_time(f"normal{w}")
    print(f"{w} process(es): {d * 1000:.1f} ms a step deterministic, {n * 1000:.1f} ms normal ({d / n:.2f}x)")
PY
assert_no_leftovers
finish
