#!/usr/bin/env bash
# work_dir/memory.json, what each rank holds after its first step, against `sana-train model
# --json --world-size W`'s estimate of the same config: parameters, gradients (the reducer's
# flat buckets, alignment gaps included), optimizer state and EMA must be equal to the byte,
# the gathered parameters (ZeRO 3) within their bound, and the activations' peak (the CPU
# allocator's count during the first step's forward and backward) within 15% of the
# estimate at the shape measured, where the gradients exist before the step (stages 0, 1).
# Cases: AdamW and CAME with EMA on one process; CAME8bit on two (the larger weights keep
# 8-bit moments); AdamW8bit at stage 2 on two (uint8 moments of parameters of 4096 elements
# or more); Lion at stage 1 on two (one moment per parameter); ZeRO stages 1 to 3 on 2 and 4 (stages 1 and 3 on both), with each rank's share of the state;
# train.lora at stages 0 and 3 on two (the adapters' state alone), its base in int8, fp8, NF4
# (double quantised) and bf16, and NF4 with 2 blocks swapped (train.offload_blocks);
# a ControlNet's base in int8;
# train.offload_optimizer with the EMA on the host at stage 2 on two, and with 3 trained blocks
# swapped. Tiny preset, the example photos
# (shrunk by ctest's test_photos fixture, SANA_TEST_PHOTOS), one step; every command under
# `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=$SANA_PYTHON
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
  timeout 120 "$BIN" model "${args[@]}" "--work_dir=$work" --json --world-size "$nproc" > "$SCRATCH/$name.json" 2> /dev/null ||
    { fail "$name: sana-train model --json failed"; return; }
  cp "$work/memory.json" "$SCRATCH/$name.measured.json"
  if "$PY" - "$work/memory.json" "$SCRATCH/$name.json" "$nproc" > "$SCRATCH/$name.cmp" 2>&1 <<'EOF'; then
import json, sys
measured = json.load(open(sys.argv[1]))["ranks"]
est = json.load(open(sys.argv[2]))["memory_per_process"]
assert len(measured) == int(sys.argv[3]), f"{len(measured)} ranks in memory.json"
assert len(est["ranks"]) == len(measured), f"{len(est['ranks'])} ranks estimated"
bad = []
for r in measured:
    mine = est["ranks"][r["rank"]]
    for ours, theirs in (("parameters", "weights"), ("gradients", "gradients"), ("optimizer", "optimizer"), ("ema", "ema"),
                         ("host_weights", "host_weights"), ("host_gradients", "host_gradients"),
                         ("host_optimizer", "host_optimizer"), ("host_ema", "host_ema"), ("working", "working"),
                         ("host_blocks", "host_blocks")):
        if r[ours] != mine[theirs]:
            bad.append(f"rank {r['rank']} {ours}: measured {r[ours]}, estimated {mine[theirs]}")
    if (r["gathered"] > 0) != (mine["gathered"] > 0) or r["gathered"] > mine["gathered"]:
        bad.append(f"rank {r['rank']} gathered: measured {r['gathered']}, estimated at most {mine['gathered']}")
    if r["activations_peak"] <= 0:
        bad.append(f"rank {r['rank']}: activations not measured ({r['activations_peak']})")
# The activations at the shape the run measured them (its first step's largest micro-batch),
# from the estimate's per-sample terms: within 15% where the gradients exist before the step
# (stages 0 and 1; stage 2 allocates its buckets in the backward, stage 3 gathers too).
model = json.load(open(sys.argv[2]))
terms = est["activation_terms_grad_checkpointing" if est["grad_checkpointing"] else "activation_terms"]
depth = model["spec"]["depth"]
ratios = []
for r in measured:
    n = r["h_tokens"] * r["w_tokens"]
    expected = (terms["outside"] + terms["outside_per_token"] * n +
                depth * (terms["block"] + terms["block_per_token"] * n)) * r["micro_batch"]
    ratios.append(r["activations_peak"] / expected)
    if est["zero_stage"] <= 1 and not 0.85 <= ratios[-1] <= 1.15:
        bad.append(f"rank {r['rank']}: activations {r['activations_peak']} B measured, {expected:.0f} B estimated "
                   f"for {r['micro_batch']} x {n} tokens ({ratios[-1]:.2f}x)")
for b in bad:
    print(b)
def host(r):
    kept = {k: r[k] for k in ("host_weights", "host_gradients", "host_optimizer", "host_ema") if r[k]}
    return "".join(f", {k} {v}" for k, v in kept.items())
r = measured[0]
print(f"{len(measured)} rank(s): parameters {r['parameters']}, gradients {r['gradients']}, optimizer {r['optimizer']} "
      f"({est['optimizer_type']}), EMA {r['ema']}{host(r)} bytes as estimated; gathered {r['gathered']} B (at most "
      f"{est['ranks'][0]['gathered']:.0f}); activations peak {r['activations_peak']} B measured, "
      f"{'/'.join(f'{x:.2f}' for x in ratios)} x the estimate at that shape")
sys.exit(1 if bad else 0)
EOF
    pass "$name: $(tail -1 "$SCRATCH/$name.cmp")"
  else
    fail "$name: memory.json differs from the estimate"; cat "$SCRATCH/$name.cmp"
  fi
}

check adamw_ema 1 --train.optimizer.type=AdamW --train.ema_update=true
check came8bit_w2 2 --train.optimizer.type=CAME8bit --train.optimizer.min_8bit_size=4096 --train.optimizer.block_size=64
check adamw8bit_s2_w2 2 --train.optimizer.type=AdamW8bit --train.zero_stage=2
check lion_s1_w2 2 --train.optimizer.type=Lion --train.zero_stage=1
# ZeRO: the same, and each rank's share against one process's whole (stage 0).
check came_s0 1 --train.optimizer.type=CAME --train.ema_update=true
check adamw_s1_w2 2 --train.optimizer.type=AdamW --train.ema_update=true --train.zero_stage=1
check adamw_s2_w4 4 --train.optimizer.type=AdamW --train.ema_update=true --train.zero_stage=2
check came_s2_w2 2 --train.optimizer.type=CAME --train.ema_update=true --train.zero_stage=2
check adamw_s3_w2 2 --train.optimizer.type=AdamW --train.ema_update=true --train.zero_stage=3
check adamw_s1_w4 4 --train.optimizer.type=AdamW --train.ema_update=true --train.zero_stage=1
check adamw_s3_w4 4 --train.optimizer.type=AdamW --train.ema_update=true --train.zero_stage=3
# train.offload_optimizer and ema_device cpu: the masters, their gradients, the state and the
# EMA of each rank's share counted in host memory, none of it on the device.
check came_offload_s2_w2 2 --train.optimizer.type=CAME --train.ema_update=true --train.zero_stage=2 \
  --train.offload_optimizer=true --train.ema_device=cpu
# A full fine-tune with 3 of the 4 trained blocks swapped (train.offload_blocks): their
# buckets in host memory, out of the device's parameters.
check full_swap_s2_w2 2 --train.optimizer.type=AdamW --train.zero_stage=2 --train.offload_optimizer=true \
  --train.offload_blocks=3 --train.grad_checkpointing=true
# train.lora: the base frozen (whole on every rank), the adapters alone in the buckets, the
# optimizer and the EMA; at stage 3 the adapters sharded.
lora=(--train.lora.rank=4 "--train.lora.target_modules=[to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]")
check lora_w2 2 --train.optimizer.type=AdamW --train.ema_update=true "${lora[@]}"
check lora_s3_w2 2 --train.optimizer.type=CAME --train.ema_update=true --train.zero_stage=3 "${lora[@]}"
# train.frozen_base_dtype: the base's layers in int8 (their scales counted), in fp8 and in NF4
# with double quantisation (its codes, absmax codes, nested absmax and offset), and in bf16.
check lora_int8_w2 2 --train.optimizer.type=AdamW "${lora[@]}" --train.frozen_base_dtype=int8
check lora_fp8_w2 2 --train.optimizer.type=AdamW "${lora[@]}" --train.frozen_base_dtype=fp8
check lora_nf4_w2 2 --train.optimizer.type=AdamW "${lora[@]}" --train.frozen_base_dtype=nf4 \
  --train.frozen_base_double_quant=true
# train.offload_blocks: 2 of the 4 blocks of an NF4 base in host memory, out of the device's
# parameters.
check lora_swap_w2 2 --train.optimizer.type=AdamW "${lora[@]}" --train.frozen_base_dtype=nf4 \
  --train.offload_blocks=2 --train.grad_checkpointing=true
check lora_bf16_s3_w2 2 --train.optimizer.type=CAME --train.zero_stage=3 "${lora[@]}" --train.frozen_base_dtype=bf16
# A ControlNet preset's base in int8 (the control blocks fp32 in the buckets).
check controlnet_int8_w2 2 --model.model=SanaMSControlNet_tiny_P2_D4 --train.optimizer.type=AdamW \
  --train.frozen_base_dtype=int8
# share REFERENCE RUN STAGE: each rank keeps 1/W of the reference's optimizer state and EMA
# (and of its gradients at stage 2), within the largest parameter's bytes (whole parameters
# are owned).
share() {
  if "$PY" - "$SCRATCH/$1.measured.json" "$SCRATCH/$2.measured.json" "$3" "$SCRATCH/$1-$TOKEN/model.safetensors" \
      > "$SCRATCH/$2.share" 2>&1 <<'EOF'; then
import json, struct, sys
ref = json.load(open(sys.argv[1]))["ranks"][0]
ranks = json.load(open(sys.argv[2]))["ranks"]
stage, w = int(sys.argv[3]), len(ranks)
raw = open(sys.argv[4], "rb").read()
head = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
head.pop("__metadata__", None)
sizes = [4 * eval("*".join(map(str, v["shape"])) or "1") for v in head.values()]
# A rank's share may differ from 1/W by the largest parameter (its two AdamW moments), and
# by the step counters (8 B per parameter).
largest = 2 * max(sizes) + 8 * len(sizes)
fields = ["optimizer", "ema"] + (["gradients"] if stage >= 2 else []) + (["parameters"] if stage >= 3 else [])
bad, text = [], []
for f in fields:
    parts = [r[f] / ref[f] for r in ranks]
    text.append(f"{f} " + "/".join(f"{p:.3f}" for p in parts))
    for r in ranks:
        if abs(r[f] - ref[f] / w) > largest:
            bad.append(f"rank {r['rank']} {f}: {r[f]} B, 1/{w} of {ref[f]} B is {ref[f] / w:.0f}")
    if 1 <= stage <= 2 and not ranks[0]["parameters"] == ref["parameters"]:
        bad.append("parameters are not whole on every rank")
print("; ".join(text) + f" of one process's (1/{w} = {1 / w:.3f})")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
EOF
    pass "$2: each rank's share: $(head -1 "$SCRATCH/$2.share")"
  else
    fail "$2: the shares are not 1/W"; cat "$SCRATCH/$2.share"
  fi
}
share adamw_ema adamw_s1_w2 1
share adamw_ema adamw_s2_w4 2
share came_s0 came_s2_w2 2
share adamw_ema adamw_s3_w2 3
share adamw_ema adamw_s1_w4 1
share adamw_ema adamw_s3_w4 3
finish
