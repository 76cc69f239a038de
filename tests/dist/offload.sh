#!/usr/bin/env bash
# Host-resident state (issue 45, docs/memory.md): train.offload_optimizer keeps each rank's
# fp32 master weights and optimizer state in host memory and runs the update there;
# train.ema_device cpu keeps the EMA there; train.ema_update_interval moves it every N-th step.
#  1. 20 AdamW steps on 1 process with EMA (interval 5, rate 0.5; 4 micro-batches a step):
#     offloaded with the EMA on the host, the final weights and EMA are byte-identical to the
#     device-resident run's; memory.json counts the optimizer state, EMA and the gradients
#     (streamed out of the buckets) on the host, none of them on the device.
#     And with one micro-batch a step (each bucket released as soon as its gradients are on
#     the host, mid-backward): byte-identical again.
#  2. The EMA's interval, from the offloaded run's checkpoints (python3): steps 5 to 8 moved
#     the step-4 EMA once, by rate^5 toward the step-4 weights.
#  3. 20 CAME steps at ZeRO stage 2 on 2 processes: offloaded, byte-identical again.
#  4. train.deterministic: offloaded at stage 2 on 2 processes with 3 of the 4 blocks
#     swapped (train.offload_blocks) to step 5, resumed on 3 without offloading or swapping
#     to step 9, then on 1 offloaded with half the blocks swapped to step 20: the weights are
#     byte-identical to an uninterrupted device-resident run on 1 process.
#  5. Block swapping in a full fine-tune (train.offload_blocks: trained blocks in host
#     memory, their gradients streamed to the host optimizer): 3 of the 4 blocks swapped on
#     1 process (sections 1's runs, one micro-batch a step) and on 2 at ZeRO 2 (section 3's
#     CAME runs), with gradient checkpointing: byte-identical to the unswapped runs;
#     memory.json moves the swapped blocks' bytes from the device's parameters to host_blocks.
# Tiny preset on the test photos; every run under `timeout` in this test's scratch folder.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
common=(--config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" --train.visualize=false
        --train.log_interval=10 --dist.timeout_s=60 --train.save_model_epochs=0 --train.micro_batch_size=2
        --train.max_steps=20 --ckpt.format=2 "--work_dir=$SCRATCH/$TOKEN")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
offload=(--train.offload_optimizer=true --train.ema_device=cpu)
# identical A B WHAT: A's and B's final weights (and EMA files, where A has one) byte for byte.
identical() {
  local f same=0 files=0
  for f in model.safetensors ema.safetensors; do
    [ -f "$SCRATCH/$1/$f" ] || continue
    files=$((files + 1))
    cmp -s "$SCRATCH/$1/$f" "$SCRATCH/$2/$f" && same=$((same + 1))
  done
  if [ "$files" -gt 0 ] && [ "$same" = "$files" ]; then pass "$3 ($files files)"; else fail "$3: $same of $files files equal"; fi
}

# 1. AdamW on 1 process.
ema=(--train.optimizer.type=AdamW --train.ema_update=true --train.ema_rate=0.5 --train.ema_update_interval=5)
run device1 1 "${ema[@]}" --train.save_model_steps=0; assert_code $? 0 "20 AdamW steps on 1 process"
run host1 1 "${ema[@]}" "${offload[@]}" --train.save_model_steps=4 --ckpt.keep_last_n=0; assert_code $? 0 "the same, offloaded"
identical device1 host1 "offloaded AdamW and host EMA on 1 process: the weights and EMA of the device-resident run"
assert_contains "$SCRATCH/host1/train.log" "train.offload_optimizer" "the start-up says where the optimizer runs"
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/device1/memory.json" "$SCRATCH/host1/memory.json" > "$SCRATCH/memory.cmp" 2>&1 <<'PY'; then
import json, sys
dev, host = (json.load(open(p))["ranks"][0] for p in sys.argv[1:3])
assert host["optimizer"] == 0 and host["ema"] == 0 and host["gradients"] == 0, f"device-side state left: {host}"
assert host["host_optimizer"] == dev["optimizer"] > 0, (host["host_optimizer"], dev["optimizer"])
assert host["host_ema"] == dev["ema"] > 0, (host["host_ema"], dev["ema"])
assert host["host_weights"] == host["host_gradients"] == dev["gradients"], (host, dev["gradients"])
print(f"optimizer state {host['host_optimizer']} B, EMA {host['host_ema']} B, masters and their gradients "
      f"{host['host_weights']} B each in host memory; 0 B of them on the device (the device-resident run: "
      f"{dev['gradients']} B of gradients)")
PY
  pass "memory.json: $(cat "$SCRATCH/memory.cmp")"
else
  fail "memory.json of the offloaded run: $(cat "$SCRATCH/memory.cmp")"
fi

one=(--train.optimizer.type=AdamW --train.global_batch_size=2 --train.save_model_steps=0)
run device1one 1 "${one[@]}"; assert_code $? 0 "20 AdamW steps of one micro-batch on 1 process"
run host1one 1 "${one[@]}" "${offload[@]}"; assert_code $? 0 "the same, offloaded"
identical device1one host1one "offloaded, one micro-batch a step: the weights of the device-resident run"

# 2. ema_update_interval 5 at rate 0.5: no move before step 5, then one by 0.5^5.
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/host1/checkpoints" > "$SCRATCH/interval.cmp" 2>&1 <<'PY'; then
import json, struct, sys
import numpy as np
def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n]); head.pop("__metadata__", None)
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]], np.float32).astype(np.float64)
            for k, v in head.items()}
ck = sys.argv[1]
w4, ema4, ema8 = read(f"{ck}/step_00000004/model.safetensors"), read(f"{ck}/step_00000004/ema.safetensors"), \
    read(f"{ck}/step_00000008/ema.safetensors")
k = 0.5 ** 5
worst = max(np.abs(ema8[n] - (k * ema4[n] + (1 - k) * w4[n])).max() / (np.abs(ema8[n]).max() + 1e-12) for n in ema8)
moved = max(np.abs(ema4[n] - w4[n]).max() for n in ema4)
assert worst < 1e-6, f"step 8's EMA is not 0.5^5 x step 4's + (1 - 0.5^5) x the step-4 weights: {worst:.3g}"
assert moved > 1e-4, f"the step-4 EMA already equals the weights ({moved:.3g})"
print(f"{len(ema8)} tensors: step 8's EMA = 0.5^5 x step 4's + (1 - 0.5^5) x step 4's weights "
      f"(worst relative {worst:.2g}); the step-4 EMA is not the step-4 weights (they differ by up to {moved:.3g})")
PY
  pass "ema_update_interval: $(cat "$SCRATCH/interval.cmp")"
else
  fail "ema_update_interval: $(tail -3 "$SCRATCH/interval.cmp")"
fi

# 3. CAME at ZeRO stage 2 on 2 processes.
came=(--train.optimizer.type=CAME --train.zero_stage=2 --train.save_model_steps=0)
run device2 2 "${came[@]}"; assert_code $? 0 "20 CAME steps at stage 2 on 2 processes"
run host2 2 "${came[@]}" "${offload[@]}"; assert_code $? 0 "the same, offloaded"
identical device2 host2 "offloaded CAME at ZeRO 2 on 2 processes: the weights of the device-resident run"

# 4. Resume across offloading on and off, at other process counts (train.deterministic).
det=(--train.deterministic=true --dist.threads_per_process=1 --train.optimizer.type=AdamW --train.ema_update=true --train.save_model_steps=0)
chain=(--work_dir="$SCRATCH/chain" --resume_from=latest)
run det-ref 1 "${det[@]}"; assert_code $? 0 "the uninterrupted deterministic run"
run chain2 2 "${det[@]}" "${chain[@]}" "${offload[@]}" --train.zero_stage=2 --train.max_steps=5 --train.offload_blocks=3
assert_code $? 0 "5 steps offloaded at stage 2 on 2 processes, 3 blocks swapped"
run chain3 3 "${det[@]}" "${chain[@]}" --train.max_steps=9; assert_code $? 0 "resumed on 3 without offloading to 9"
run chain1 1 "${det[@]}" "${chain[@]}" "${offload[@]}" --train.max_steps=20 --train.offload_blocks=0.5
assert_code $? 0 "resumed on 1 offloaded to 20, 2 blocks swapped"
assert_contains "$SCRATCH/chain1.log" "resumed from" "the last run resumed"
assert_contains "$SCRATCH/chain1.log" "train.offload_blocks: blocks 2 to 3 of 4 keep their weights (trained" \
  "the last run swaps trained blocks"
identical det-ref chain "offloaded and swapped on 2, device-resident on 3, offloaded and swapped on 1: the uninterrupted run's weights and EMA"

# 5. Trained blocks swapped, on 1 process and at ZeRO 2 on 2.
swap=(--train.offload_blocks=3 --train.grad_checkpointing=true)
run device1gc 1 "${one[@]}" --train.grad_checkpointing=true; assert_code $? 0 "section 1's one-micro-batch run, checkpointed"
run swap1 1 "${one[@]}" "${offload[@]}" "${swap[@]}"; assert_code $? 0 "the same offloaded, 3 of 4 blocks swapped"
assert_contains "$SCRATCH/swap1/train.log" "train.offload_blocks: blocks 1 to 3 of 4 keep their weights (trained" \
  "the swapped run names the trained blocks it keeps in host memory"
identical device1gc swap1 "3 trained blocks swapped on 1 process: the weights of the device-resident run"
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/device1gc/memory.json" "$SCRATCH/swap1/memory.json" > "$SCRATCH/swap.cmp" 2>&1 <<'PY'; then
import json, sys
dev, swap = (json.load(open(p))["ranks"][0] for p in sys.argv[1:3])
assert swap["host_blocks"] > 0, f"no host_blocks: {swap}"
assert swap["parameters"] + swap["host_blocks"] == dev["parameters"], (swap["parameters"], swap["host_blocks"], dev["parameters"])
print(f"{swap['host_blocks']} B of the {dev['parameters']} B of weights in host memory, {swap['parameters']} B on the device")
PY
  pass "memory.json: $(cat "$SCRATCH/swap.cmp")"
else
  fail "memory.json of the swapped run: $(cat "$SCRATCH/swap.cmp")"
fi
run device2gc 2 "${came[@]}" --train.grad_checkpointing=true; assert_code $? 0 "section 3's CAME run, checkpointed"
run swap2 2 "${came[@]}" "${offload[@]}" "${swap[@]}"; assert_code $? 0 "the same offloaded, 3 of 4 blocks swapped"
identical device2gc swap2 "3 trained blocks swapped at ZeRO 2 on 2 processes: the weights of the device-resident run"
finish
