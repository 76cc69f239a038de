#!/usr/bin/env bash
# Does upstream's 8-bit CAME (train.optimizer.type CAME8bit) train like fp32 CAME? Three runs
# of the small preset on the example photos (configs/sana_tiny_cpu.yaml at 32 px, one
# process, the same steps): CAME with seed 1, CAME8bit with seed 1, and CAME with seed 2 as
# the yardstick of run-to-run noise (another data order and other noise draws). Prints the
# loss averaged over windows of 30 steps for each run, the mean absolute gap of CAME8bit to
# CAME and of CAME's two seeds to each other, and a text plot.
#   scripts/bench/came8bit_curve.sh [STEPS=300]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
steps=${1:-300}
build=${SANA_BUILD_DIR:-$root/build}
cmake --build "$build" --target sana-train > /dev/null
work=$(mktemp -d /tmp/sana-came8bit-XXXXXX)
trap 'rm -rf "$work"' EXIT
cd "$root"
run() {  # NAME TYPE SEED
  timeout 3000 "$build/apps/sana-train" --config configs/sana_tiny_cpu.yaml --work_dir="$work/$1" \
    --model.model=SanaMS_small_P2_D8 --train.optimizer.type="$2" --train.optimizer.lr=3e-4 \
    --train.optimizer.weight_decay=0.0 --train.seed="$3" --train.max_steps="$steps" --train.num_epochs=1000 \
    --train.log_interval=1 --train.visualize=false --train.save_model_steps=1000000 --data.cache=memory \
    --train.num_workers=1 > "$work/$1.log" 2>&1 || { tail -20 "$work/$1.log"; exit 1; }
  echo "$1: $(grep -c '"loss"' "$work/$1/metrics.jsonl") steps logged"
}
run came CAME 1
run came8bit CAME8bit 1
run came_seed2 CAME 2
/usr/bin/python3 - "$work" <<'EOF'
import json, sys
work = sys.argv[1]
def losses(name):
    out = {}
    for line in open(f"{work}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            out[r["step"]] = r["loss"]
    return [out[k] for k in sorted(out)]
runs = {n: losses(n) for n in ("came", "came8bit", "came_seed2")}
n = min(len(v) for v in runs.values())
w = 30
win = {k: [sum(v[i:i + w]) / len(v[i:i + w]) for i in range(0, n, w)] for k, v in runs.items()}
print("steps      CAME    CAME8bit  CAME seed 2")
for i, (a, b, c) in enumerate(zip(win["came"], win["came8bit"], win["came_seed2"])):
    print(f"{i * w + 1:4d}-{min(n, (i + 1) * w):<4d} {a:8.4f} {b:9.4f} {c:10.4f}")
gap8 = sum(abs(a - b) for a, b in zip(win["came"], win["came8bit"])) / len(win["came"])
gap_seed = sum(abs(a - c) for a, c in zip(win["came"], win["came_seed2"])) / len(win["came"])
print(f"mean |CAME8bit - CAME| over {w}-step windows: {gap8:.4f}; |CAME seed 2 - CAME|: {gap_seed:.4f} "
      f"(ratio {gap8 / gap_seed:.2f}); last window: CAME {win['came'][-1]:.4f}, CAME8bit {win['came8bit'][-1]:.4f}")
lo = min(min(v) for v in win.values()); hi = max(max(v) for v in win.values())
print("plot (o CAME, x CAME8bit, . CAME seed 2; loss down the page is lower):")
rows = 12
for r in range(rows):
    level = hi - (hi - lo) * r / (rows - 1)
    line = ""
    for i in range(len(win["came"])):
        cell = " "
        for key, mark in (("came_seed2", "."), ("came", "o"), ("came8bit", "x")):
            if abs(win[key][i] - level) <= (hi - lo) / (2 * (rows - 1)):
                cell = mark
        line += cell + " "
    print(f"{level:7.4f} |{line}")
EOF
