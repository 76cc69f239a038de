#!/usr/bin/env bash
# work_dir/memory.json, what each rank holds after its first step, against `sana-train model
# --json`'s estimate of the same config: parameters, gradients (the reducer's flat buckets,
# alignment gaps included), optimizer state and EMA must be equal to the byte; the
# activations' peak is measured (peak resident growth on the CPU) and printed beside the
# estimate. Cases: one process with AdamW and EMA; two processes (`sana-train launch`) with
# CAME8bit, where the larger weights keep 8-bit moments. Tiny preset, the example photos
# (shrunk by ctest's test_photos fixture, SANA_TEST_PHOTOS), one step; every command under
# `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=/usr/bin/python3
PHOTOS=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}

# check NAME NPROC OVERRIDES...: one step, then memory.json against the estimate.
check() {
  local name=$1 nproc=$2
  shift 2
  local args=(--config "$ROOT/configs/sana_tiny_cpu.yaml" "--data.data_dir=[$PHOTOS]"
              --train.max_steps=1 --train.visualize=false --dist.timeout_s=60 "$@")
  local work=$SCRATCH/$name-$TOKEN
  if ! timeout 120 "$BIN" launch --nproc-per-node "$nproc" -- "${args[@]}" "--work_dir=$work" > "$SCRATCH/$name.log" 2>&1; then
    fail "$name: the run failed"; tail -15 "$SCRATCH/$name.log"; return
  fi
  timeout 120 "$BIN" model "${args[@]}" "--work_dir=$work" --json > "$SCRATCH/$name.json" 2> /dev/null ||
    { fail "$name: sana-train model --json failed"; return; }
  if "$PY" - "$work/memory.json" "$SCRATCH/$name.json" "$nproc" > "$SCRATCH/$name.cmp" 2>&1 <<'EOF'; then
import json, sys
measured = json.load(open(sys.argv[1]))["ranks"]
est = json.load(open(sys.argv[2]))["memory_per_process"]
assert len(measured) == int(sys.argv[3]), f"{len(measured)} ranks in memory.json"
bad = []
for r in measured:
    for ours, theirs in (("parameters", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer"), ("ema", "ema")):
        if r[ours] != est[theirs]:
            bad.append(f"rank {r['rank']} {ours}: measured {r[ours]}, estimated {est[theirs]}")
    if r["activations_peak"] <= 0:
        bad.append(f"rank {r['rank']}: activations not measured ({r['activations_peak']})")
for b in bad:
    print(b)
r = measured[0]
print(f"{len(measured)} rank(s): parameters {r['parameters']}, gradients {r['gradients']}, optimizer {r['optimizer']} "
      f"({est['optimizer_type']}), EMA {r['ema']} bytes as estimated; activations peak {r['activations_peak']} B "
      f"measured, {est['activations']:.0f} B estimated")
sys.exit(1 if bad else 0)
EOF
    pass "$name: $(tail -1 "$SCRATCH/$name.cmp")"
  else
    fail "$name: memory.json differs from the estimate"; cat "$SCRATCH/$name.cmp"
  fi
}

check adamw_ema 1 --train.optimizer.type=AdamW --train.ema_update=true
check came8bit_w2 2 --train.optimizer.type=CAME8bit --train.optimizer.min_8bit_size=4096 --train.optimizer.block_size=64
finish
