#!/usr/bin/env bash
# train.lora (issue 29, docs/finetune.md): low-rank adapters on a frozen base, on the tiny
# preset and the test photos. The base is the preset's initial weights exported to
# upstream's .pth (sana-train export), loaded with model.load_from.
#  1. 20 steps on 2 processes (the loss curve is held against python3-torch in 4); the
#     base's checksum at the end equals the one at start-up; pytorch_lora_weights.safetensors has, for every block, the adapters diffusers names for
#     the targets (transformer.transformer_blocks.N.attn1.to_q.lora_A.weight [r, in], ...),
#     with the rank and alpha in its metadata.
#  2. 10 steps on 2 processes, resumed on 1 to step 20: each epoch trains the samples of the
#     uninterrupted run, each once.
#  3. ZeRO stage 3 on 2 processes (the adapters sharded): 20 losses equal stage 0's.
#  4. 20 steps replayed in python3-torch (tests/reference/train_replay.py): every step's loss
#     and the final adapters equal the run's.
#  5. A resume against other base weights is refused (exit 2), naming both checksums.
#  6. train.frozen_base_dtype bf16 on 2 processes, its adapters' and EMA's files (checkpoint
#     shards included) with diffusers' LoRA settings; a resume of it with int8 is refused (exit 2).
#  7. An NF4 base on 2 processes: a resume of it with the block scales quantised again
#     (nf4-dq, another format) is refused (exit 2), naming the setting that resumes it; on
#     NF4 it resumes on 1 process, its checksum unchanged to the end.
#  8. Block swapping (train.offload_blocks 3: the last 3 of the preset's 4 blocks of an NF4
#     base in host memory), with train.deterministic (one thread per process) and gradient
#     checkpointing: 6 steps at W=2 with ZeRO 2 give bitwise the unswapped run's losses and
#     final adapters; at W=1, and across resumes that turn swapping off (W=3 to W=1) and on
#     (W=1 to W=2), bitwise its final adapters (the logged loss, a mean over ranks, is
#     summed in another order: within 1e-6); each swapped run names the blocks it swaps.
# Every run under `timeout` in this test's scratch folder.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
common=(--config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" --train.visualize=false
        --train.log_interval=10 --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0
        --train.micro_batch_size=2 --train.max_steps=20 --train.optimizer.lr=3e-3 --train.seed=3
        "--model.load_from=$SCRATCH/base.pth" --train.lora.rank=4
        "--train.lora.target_modules=[to_q, to_k, to_v, to_out.0, conv_inverted, conv_point]")
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
timeout 120 "$BIN" export --config "$config" --format upstream --out "$SCRATCH/base.pth" > "$SCRATCH/export.log" 2>&1
assert_code $? 0 "the tiny preset's initial weights exported as the base"

# 1. The reference run.
export SANA_TEST_LOG_IDS=1
run ref 2; assert_code $? 0 "20 LoRA steps on 2 processes"
start_sum=$(grep -o "train.lora: the base (checksum [0-9a-f]*)" "$SCRATCH/ref.log" | grep -o "[0-9a-f]\{16\}")
assert_contains "$SCRATCH/ref.log" "the base weights are unchanged (checksum $start_sum)" \
  "the base's checksum after 20 steps equals start-up's ($start_sum)"
if "$SANA_PYTHON" - "$SCRATCH/ref" > "$SCRATCH/ref.check" 2>&1 <<'PY'; then
import json, struct, sys
root = sys.argv[1]
steps = [json.loads(l) for l in open(f"{root}/metrics.jsonl") if '"loss"' in l]
losses = [s["loss"] for s in steps if "loss" in s]
first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
raw = open(f"{root}/pytorch_lora_weights.safetensors", "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
head = json.loads(raw[8:8 + n])
meta = head.pop("__metadata__")
config = json.loads(meta["lora_adapter_metadata"])
# diffusers' names: transformer.transformer_blocks.N.<module>.lora_A.weight [r, in], lora_B [out, r]
# (1x1 convolutions [r, in, 1, 1] / [out, r, 1, 1]); hidden 128, GLUMBConv 2.5 x 128 = 320.
want = {}
for b in range(4):
    p = f"transformer.transformer_blocks.{b}."
    for m in ("attn1.to_q", "attn1.to_k", "attn1.to_v", "attn1.to_out.0"):
        want[p + m + ".lora_A.weight"], want[p + m + ".lora_B.weight"] = [4, 128], [128, 4]
    want[p + "ff.conv_inverted.lora_A.weight"], want[p + "ff.conv_inverted.lora_B.weight"] = [4, 128, 1, 1], [640, 4, 1, 1]
    want[p + "ff.conv_point.lora_A.weight"], want[p + "ff.conv_point.lora_B.weight"] = [4, 320, 1, 1], [128, 4, 1, 1]
got = {k: v["shape"] for k, v in head.items()}
print(f"{len(losses)} steps, loss {first:.4f} (first 10) -> {last:.4f} (last 10); {len(got)} tensors, "
      f"{'as diffusers names them' if got == want else 'NOT as diffusers names them'}; "
      f"r {config.get('transformer.r')}, lora_alpha {config.get('transformer.lora_alpha')}")
if got != want:
    print("missing", sorted(set(want) - set(got))[:4], "unexpected", sorted(set(got) - set(want))[:4],
          "shapes", [(k, got[k], want[k]) for k in want if k in got and got[k] != want[k]][:4])
sys.exit(0 if got == want and len(losses) == 20 and config["transformer.r"] == 4 and
         config["transformer.lora_alpha"] == 4 else 1)
PY
  pass "$(cat "$SCRATCH/ref.check")"
else
  fail "the LoRA run's loss or file: $(cat "$SCRATCH/ref.check")"
fi

# 2. Stop at 10 on 2 processes, resume on 1.
resume_on_one LoRA 10 20

# 3. The adapters sharded at stage 3: the same losses as stage 0.
run zero3 2 --train.zero_stage=3 --train.max_steps=20; assert_code $? 0 "20 LoRA steps at ZeRO stage 3"
same_losses ref zero3 20 "stage 3 vs stage 0"

# 4. The loss curve against python3-torch: 20 steps on 2 processes with every micro-batch
#    dumped (SANA_TEST_DUMP_BATCHES), replayed by tests/reference/train_replay.py on upstream's
#    modules with PEFT's adapters, torch's clip_grad_norm_ and AdamW and diffusers' warmup:
#    every step's loss and the final adapters as the run's. Weight decay, a clip that bites
#    and alpha 8 (scale 2) so that each shows.
replay=(--train.max_steps=20 --train.save_model_steps=1 --ckpt.keep_last_n=0 --train.optimizer.type=AdamW
        "--train.optimizer.betas=[0.9, 0.999]" "--train.optimizer.eps=[1e-10]" --train.optimizer.weight_decay=0.01
        --train.gradient_clip=0.1 --train.lr_schedule=constant --train.lr_schedule_args.num_warmup_steps=10
        --train.lora.alpha=8)
SANA_TEST_DUMP_BATCHES=1 run replay 2 "${replay[@]}"; assert_code $? 0 "20 LoRA steps with their batches dumped"
replayed replay "20 LoRA steps" '{"kind": "lora", "lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-10,
  "weight_decay": 0.01, "gradient_clip": 0.1, "warmup": 10, "alpha": 8.0}'

# 5. Other base weights: refused, both checksums named.
refuses_other_base "adapters" 60

# 6. train.frozen_base_dtype: the base's layers stored in bf16 on 2 processes (rank 0's
#    broadcast as int16 bytes on Gloo); its checksum names the dtype and holds to the end;
#    the bf16 run's checkpoint resumed with an int8 base is refused (exit 2), naming both.
run bf16 2 --train.frozen_base_dtype=bf16 --train.max_steps=6 --train.save_model_steps=3 --train.ema_update=true
assert_code $? 0 "6 LoRA steps on a bf16 base on 2 processes"
# Every file of the adapters and of their EMA, the checkpoints' shards included, carries
# diffusers' LoRA settings (without them diffusers would take alpha = rank).
if timeout 60 "$SANA_PYTHON" - "$SCRATCH/bf16" > "$SCRATCH/bf16.meta" 2>&1 <<'PY'; then
import glob, json, struct, sys
files = [f for pattern in ("pytorch_lora_weights.safetensors", "ema.safetensors", "checkpoints/step_*/lora-*.safetensors",
                           "checkpoints/step_*/ema-*.safetensors") for f in glob.glob(f"{sys.argv[1]}/{pattern}")]
missing = []
for f in files:
    raw = open(f, "rb").read(1 << 20)
    (n,) = struct.unpack("<Q", raw[:8])
    meta = json.loads(raw[8:8 + n]).get("__metadata__", {})
    if "transformer.lora_alpha" not in json.loads(meta.get("lora_adapter_metadata", "{}")):
        missing.append(f)
print(f"{len(files)} adapter and EMA files, {len(missing)} without diffusers' LoRA settings {missing[:3]}")
sys.exit(0 if len(files) >= 6 and not missing else 1)
PY
  pass "$(cat "$SCRATCH/bf16.meta")"
else
  fail "LoRA metadata: $(cat "$SCRATCH/bf16.meta")"
fi
assert_contains "$SCRATCH/bf16.log" "train.frozen_base_dtype bf16: the frozen base's" "the start-up names the stored dtype"
assert_contains "$SCRATCH/bf16.log" "the base weights are unchanged (checksum bf16:" \
  "the bf16 base's checksum names its dtype and holds to the end"
launch_named bf16 1 --train.frozen_base_dtype=int8 --resume_from=latest --train.max_steps=9 > /dev/null
assert_code $? 2 "resuming the bf16 base's adapters on an int8 base"
assert_contains "$SCRATCH/bf16.log" "Set train.frozen_base_dtype: bf16 to resume it" "the refusal says which dtype resumes"

# 7. NF4: another format is refused at resume, the same one resumes on another count.
run nf4 2 --train.frozen_base_dtype=nf4 --train.max_steps=4 --train.save_model_steps=2
assert_code $? 0 "4 LoRA steps on an NF4 base on 2 processes"
nf4_sum=$(grep -o "the base weights are unchanged (checksum nf4:[0-9a-f]*" "$SCRATCH/nf4.log" | grep -o "nf4:[0-9a-f]*")
assert_contains "$SCRATCH/nf4.log" "train.frozen_base_dtype nf4: the frozen base's" "the start-up names the stored format"
launch_named nf4 1 --train.frozen_base_dtype=nf4 --train.frozen_base_double_quant=true --resume_from=latest \
  --train.max_steps=6 > /dev/null
assert_code $? 2 "resuming the NF4 base's adapters on an nf4-dq base"
assert_contains "$SCRATCH/nf4.log" "Set train.frozen_base_dtype: nf4 with train.frozen_base_double_quant: false to resume it" \
  "the refusal names the setting that resumes it"
launch_named nf4 1 --train.frozen_base_dtype=nf4 --resume_from=latest --train.max_steps=6
assert_code $? 0 "the NF4 run resumed on 1 process to step 6"
assert_contains "$SCRATCH/nf4.log" "the base weights are unchanged (checksum ${nf4_sum:-none})" \
  "the NF4 base's checksum ($nf4_sum) holds across the resume"

# 8. Block swapping: bitwise the unswapped run, at another W and across resumes toggling it.
# bitwise NAME REFERENCE WHAT [exact]: every tensor of the final adapters equal, and every
# loss equal (exact: at the same W) or within 1e-6 relative.
bitwise() {
  if timeout 60 "$SANA_PYTHON" - "$SCRATCH/$2" "$SCRATCH/$1" "${4:-close}" > "$SCRATCH/$1.bitwise" 2>&1 <<'PY'; then
import json, sys
from safetensors.torch import load_file
ref, got, how = sys.argv[1:4]
losses = [[json.loads(l)["loss"] for l in open(f"{d}/metrics.jsonl") if '"loss"' in l] for d in (ref, got)]
a, b = (load_file(f"{d}/pytorch_lora_weights.safetensors") for d in (ref, got))
same = sorted(a) == sorted(b) and all(a[k].equal(b[k]) for k in a)
worst = max(abs(x - y) / abs(x) for x, y in zip(*losses))
close = len(losses[1]) == len(losses[0]) == 6 and (losses[0] == losses[1] if how == "exact" else worst <= 1e-6)
print(f"{len(b)} adapter tensors {'equal' if same else 'NOT equal'}; {len(losses[1])} losses, the largest relative "
      f"difference {worst:.3g} ({'bitwise' if how == 'exact' else 'within 1e-6'} wanted)")
sys.exit(0 if close and same else 1)
PY
    pass "$3: $(cat "$SCRATCH/$1.bitwise")"
  else
    fail "$3: $(cat "$SCRATCH/$1.bitwise")"
  fi
}
swap=(--train.frozen_base_dtype=nf4 --train.deterministic=true --dist.threads_per_process=1 --train.grad_checkpointing=true
      --train.zero_stage=2)
run swap_ref 2 "${swap[@]}" --train.max_steps=6; assert_code $? 0 "6 unswapped steps on an NF4 base on 2 processes"
run swap_w2 2 "${swap[@]}" --train.max_steps=6 --train.offload_blocks=3
assert_code $? 0 "6 steps with 3 blocks swapped on 2 processes"
assert_contains "$SCRATCH/swap_w2.log" "train.offload_blocks: blocks 1 to 3 of 4 keep their frozen weights in host memory" \
  "the swapped run names the blocks it keeps in host memory"
bitwise swap_w2 swap_ref "swapped at W=2, ZeRO 2, against unswapped" exact
run swap_w1 1 "${swap[@]}" --train.max_steps=6 --train.offload_blocks=3
bitwise swap_w1 swap_ref "swapped at W=1 against unswapped at W=2"
run swap_off 3 "${swap[@]}" --train.max_steps=3 --train.save_model_steps=3 --train.offload_blocks=3
launch_named swap_off 1 "${swap[@]}" --train.max_steps=6 --resume_from=latest
assert_code $? 0 "swapped on 3 processes to step 3, resumed unswapped on 1"
bitwise swap_off swap_ref "swapping turned off at a resume on another W"
run swap_on 1 "${swap[@]}" --train.max_steps=3 --train.save_model_steps=3
launch_named swap_on 2 "${swap[@]}" --train.max_steps=6 --resume_from=latest --train.offload_blocks=0.75
assert_code $? 0 "unswapped on 1 process to step 3, resumed with 3 of 4 blocks swapped on 2"
bitwise swap_on swap_ref "swapping turned on at a resume on another W"
finish
