#!/usr/bin/env bash
# The one-GPU memory table (README "On one GPU", docs/finetune.md, issues 45 and 66): `sana-train
# model --json` on the configurations the README's rows name, with gradient checkpointing at
# 1024 px, holds each to the budget it was built for and the README to the figures:
#   1.6B LoRA r16 (configs/Sana_1600M_img1024_lora.yaml, micro-batch 4), bf16 base:  <= 6 GiB
#   4.8B (SanaMS_4800M_P1_D60) LoRA r16, micro-batch 1, int8 base:                  <= 8 GiB
#   1.6B full fine-tune, micro-batch 1, train.offload_optimizer:                      <= 8 GiB,
#     no gradients or optimizer state on the device, the masters, their gradients and
#     the state in host memory;
#   1.6B LoRA r16, micro-batch 1, NF4 base:                                            <= 3 GiB
#   4.8B LoRA r16, micro-batch 1, NF4 base:                                            <= 4.5 GiB
#   4.8B LoRA r16, micro-batch 1, NF4 base (double quantised), 56 of 60 blocks swapped: <= 4.5 GiB,
#     the swapped blocks in host memory;
#   4.8B full fine-tune, micro-batch 1, train.offload_optimizer:                      <= 20 GiB;
#   1.6B full fine-tune, micro-batch 1, train.offload_optimizer, all 20 blocks swapped: <= 4 GiB,
#   4.8B the same with 47 of 60 blocks swapped (what --gpu-memory 8 names):           <= 20 GiB,
#     the swapped blocks in host memory, no gradients or optimizer state on the device.
# Each row's per-GPU total (and host total) in README.md must be the estimate's, to 0.1 GiB.
# Each estimate measures the model's activations on the CPU at depth 1 and 2 (about 45 s
# each alone on 2 cores); the nine run at once, each bounded, in this test's scratch folder.
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cat > "$SCRATCH/lora16.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024_lora.yaml
train: {frozen_base_dtype: bf16}
YAML
cat > "$SCRATCH/lora48.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024_lora.yaml
model: {model: SanaMS_4800M_P1_D60}
train: {frozen_base_dtype: int8, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/full16.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024.yaml
train: {offload_optimizer: true, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/nf4_16.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024_lora.yaml
train: {frozen_base_dtype: nf4, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/nf4_48.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024_lora.yaml
model: {model: SanaMS_4800M_P1_D60}
train: {frozen_base_dtype: nf4, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/swap48.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024_lora.yaml
model: {model: SanaMS_4800M_P1_D60}
train: {frozen_base_dtype: nf4, frozen_base_double_quant: true, offload_blocks: 56, micro_batch_size: 1,
        global_batch_size: 1}
YAML
cat > "$SCRATCH/full48.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024.yaml
model: {model: SanaMS_4800M_P1_D60}
train: {offload_optimizer: true, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/fullswap16.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024.yaml
train: {offload_optimizer: true, offload_blocks: 20, micro_batch_size: 1, global_batch_size: 1}
YAML
cat > "$SCRATCH/fullswap48.yaml" <<YAML
base: $ROOT/configs/Sana_1600M_img1024.yaml
model: {model: SanaMS_4800M_P1_D60}
train: {offload_optimizer: true, offload_blocks: 47, micro_batch_size: 1, global_batch_size: 1}
YAML
rows=(lora16 lora48 full16 nf4_16 nf4_48 swap48 full48 fullswap16 fullswap48)
# All at once (each mostly on one core).
declare -A pid
for c in "${rows[@]}"; do
  start_bounded 600 "$SCRATCH/$c.err" bash -c 'cd "$1" && exec "$2" model --config "$1/$3.yaml" --json > "$1/$3.json"' \
    _ "$SCRATCH" "$BIN" "$c"
  pid[$c]=$BG
done
for c in "${rows[@]}"; do
  code_of "${pid[$c]}"
  assert_code "$CODE" 0 "sana-train model --json on the $c row"
done
if timeout 60 "$SANA_PYTHON" - "$SCRATCH" "$ROOT/README.md" > "$SCRATCH/rows.txt" 2>&1 <<'PY'; then
import json, re, sys
folder, readme = sys.argv[1], open(sys.argv[2]).read()
G = 2 ** 30
m = {c: json.load(open(f"{folder}/{c}.json"))["memory_per_process"]
     for c in ("lora16", "lora48", "full16", "nf4_16", "nf4_48", "swap48", "full48", "fullswap16", "fullswap48")}
bad, text = [], []
def row(key, needle, budget, host=False):
    e = m[key]
    total = e["total_for_config"] / G
    text.append(f"{key} {total:.2f} GiB (<= {budget})" + (f", host {e['host']['total'] / G:.2f} GiB" if host else ""))
    if not e["grad_checkpointing"] or e["bucket"]["tokens"] != 1024:
        bad.append(f"{key}: not at 1024 px with gradient checkpointing: {e['bucket']}")
    if total > budget:
        bad.append(f"{key}: {total:.2f} GiB over {budget} GiB")
    lines = [l for l in readme.splitlines() if l.startswith("| ") and needle in l]
    if len(lines) != 1:
        bad.append(f"{key}: {len(lines)} README rows with {needle!r}")
        return e
    shown = re.search(r"= ([0-9.]+) GiB", lines[0])
    if not shown or abs(float(shown.group(1)) - total) > 0.051:
        bad.append(f"{key}: the README row says {shown.group(0) if shown else lines[0]!r}, the estimate {total:.2f} GiB")
    if host:
        h = re.findall(r"\| ([0-9.]+) GiB \(masters", lines[0])
        if not h or abs(float(h[0]) - e["host"]["total"] / G) > 0.051:
            bad.append(f"{key}: the README's host figure {h} against {e['host']['total'] / G:.2f} GiB")
    return e
a = row("lora16", "`configs/Sana_1600M_img1024_lora.yaml`", 6)
if a["frozen_dtype"] != "bf16" or a["micro_batch"] != 4:
    bad.append(f"lora16: base {a['frozen_dtype']}, micro-batch {a['micro_batch']}")
b = row("lora48", "4.8B 1024 (`--model.model=SanaMS_4800M_P1_D60`)", 8)
if b["frozen_dtype"] != "int8" or b["micro_batch"] != 1:
    bad.append(f"lora48: base {b['frozen_dtype']}, micro-batch {b['micro_batch']}")
c = row("full16", "`offload_optimizer`", 8, host=True)
h = c["host"]
if c["gradients"] != 0 or c["optimizer"] != 0 or c["trainable_parameters"] < 1.5e9:
    bad.append(f"full16: on the device gradients {c['gradients']}, optimizer {c['optimizer']}, "
               f"{c['trainable_parameters']} trainable")
if not (h["weights"] == h["gradients"] > 0 and h["optimizer"] > 0):
    bad.append(f"full16: host {h}")
d = row("nf4_16", "1.6B 1024, micro-batch 1, NF4", 3)
if d["frozen_dtype"] != "nf4" or d["micro_batch"] != 1:
    bad.append(f"nf4_16: base {d['frozen_dtype']}, micro-batch {d['micro_batch']}")
n = row("nf4_48", "4.8B 1024, micro-batch 1, bitsandbytes' NF4", 4.5)
if n["frozen_dtype"] != "nf4" or n["micro_batch"] != 1 or n["swapped_blocks"] != 0:
    bad.append(f"nf4_48: base {n['frozen_dtype']}, micro-batch {n['micro_batch']}, {n['swapped_blocks']} swapped")
e = row("swap48", "4.8B 1024, micro-batch 1, NF4 with its blocks swapped", 4.5)
if e["frozen_dtype"] != "nf4-dq" or e["swapped_blocks"] != 56 or e["host"]["blocks"] <= 0:
    bad.append(f"swap48: base {e['frozen_dtype']}, {e['swapped_blocks']} blocks swapped, host {e['host']}")
swapped_row = [l for l in readme.splitlines() if l.startswith("| ") and "NF4 with its blocks swapped" in l]
if swapped_row and not re.search(rf"\| {e['host']['blocks'] / G:.1f} GiB \(56 of 60 blocks\)", swapped_row[0]):
    bad.append(f"swap48: the README's host figure is not {e['host']['blocks'] / G:.1f} GiB")
row("full48", "4.8B 1024, micro-batch 1, the optimizer on the host", 20, host=True)
for key, needle, budget, blocks in (("fullswap16", "1.6B 1024, micro-batch 1, the optimizer and every block on the host", 4, 20),
                                    ("fullswap48", "4.8B 1024, micro-batch 1, the optimizer and 47 blocks on the host", 20, 47)):
    s = row(key, needle, budget, host=True)
    if s["swapped_blocks"] != blocks or s["host"]["blocks"] <= 0 or s["gradients"] != 0 or s["optimizer"] != 0 \
            or s["trainable_parameters"] < 1.5e9:
        bad.append(f"{key}: {s['swapped_blocks']} blocks swapped, host {s['host']}, on the device gradients "
                   f"{s['gradients']}, optimizer {s['optimizer']}, {s['trainable_parameters']} trainable")
print("; ".join(text))
for line in bad:
    print(line)
sys.exit(1 if bad else 0)
PY
  pass "the one-GPU rows: $(head -1 "$SCRATCH/rows.txt")"
else
  fail "the one-GPU rows: $(cat "$SCRATCH/rows.txt")"
fi
finish
