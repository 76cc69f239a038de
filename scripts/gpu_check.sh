#!/usr/bin/env bash
# The GPU check: the one command a borrowed GPU machine runs (docs/testing.md, "On a
# borrowed GPU machine"). It builds sana-train and its torch tests against the machine's
# LibTorch (TORCH_PREFIX, else pip's torch, else the system's) with every other dependency
# from the device kit (.kit, made here by scripts/device_kit.sh and carried along), then
# runs each step under `timeout` (a failing step does not stop the others) and writes one
# table, Markdown and JSON, to OUT_DIR:
#   bash scripts/gpu_check.sh [OUT_DIR]          (default output/gpu_check)
#   bash scripts/gpu_check.sh --rehearse [OUT]   the same in a bare Debian 12 root here, with only
#                                                .kit carried in (scripts/compat/gpu_check_rehearsal.sh)
# Rows (fixed; a step that cannot run is "skip" with the reason):
#   build            cmake + ninja of sana-train and sana_torch_tests, all cores
#   cuda-tests       the [cuda] Catch2 cases (autocast numerics, ...)
#   check-dist-nccl  check-dist over NCCL, one process per GPU
#   tiny-bf16        1 process, SanaMS_tiny_P2_D4 at 128 px, bf16: samples/s, MFU, memory
#   1600m-bf16       1 process, SanaMS_1600M_P1_D20 on 1024 px features (32x32x32 latents,
#                    300 Gemma tokens; scripts/make_feature_set.py), bf16, gradient
#                    checkpointing, the largest micro-batch whose estimate fits: samples/s,
#                    MFU, measured memory against `sana-train model`'s estimate
#   zero0..zero3     2 processes sharing GPU 0 over Gloo (dist.allow_shared_device), 100M
#                    preset, 20 steps: each stage's losses against stage 0's
#   zero3-nccl-w1    stage 3 over NCCL with one process (NCCL allows one rank per GPU)
#   two-ranks-1-gpu  2 NCCL ranks mapped to one GPU: exit 2 with the reason, before NCCL
#   resume-gpu-cpu   10 steps on the GPU, resumed on the CPU with 2 processes to 14, resumed
#                    on the GPU to 18: each resume verifies the checkpoint's checksums
#   lora             20 LoRA steps on the GPU (tiny base exported by sana-train export)
#   controlnet       20 ControlNet steps on the GPU
#   offload          20 AdamW steps of the tiny preset with EMA, the optimizer and EMA in host
#                    memory (train.offload_optimizer, train.ema_device=cpu) against the same 20
#                    device-resident, at 2 micro-batches a step and at 1 (buckets streamed out
#                    mid-backward): weights and EMA within 1e-3 relative on the GPU (its conv
#                    kernels are not bitwise run to run), byte-identical on the CPU; memory.json
#                    has none of the optimizer state, EMA or gradients on the device
#   nf4              20 LoRA steps of the tiny preset on an fp32 base and on an NF4 one (double
#                    quantised), gradient checkpointing: samples/s and the first step's peak
#                    (memory.json) against `sana-train model`'s total, each within 1.15x
#   swap             block swapping (train.offload_blocks), 20 steps each without and with it:
#                    a full fine-tune under train.offload_optimizer (100M preset, half its
#                    blocks) and LoRA on an NF4 base (tiny preset, 3 of 4 blocks): samples/s and
#                    peak against the estimate of each; the full fine-tunes' weights within
#                    1e-3 relative (byte-identical on the CPU)
#   optim-8bit       20 steps each of AdamW8bit and CAME8bit: finite losses, the optimizer
#                    state measured against `sana-train model`'s estimate (within 1%)
#   sprint           SANA-Sprint stage 2 (sCM with its JVP, LADD heads) on synthetic tiny
#                    features: a 5-step teacher, 10 student steps in the check's precision
#                    (finite losses), and the first 2 steps in fp32 on the device against 2
#                    processes on the CPU (losses within 2e-2 relative)
#   tensorboard      the machine's tensorboard package reads tiny-bf16's event file: every
#                    scalar of metrics.jsonl is a tag there
# Columns: step, result (ok, FAIL, skip), seconds, figures, detail.
# Environment (all optional):
#   TORCH_PREFIX=DIR           LibTorch (an unzipped zip's folder)
#   SANA_KIT=DIR               the device kit (default .kit in the repository)
#   SANA_CHECK_BUILD_DIR=DIR   build folder (default build-gpu); an existing binary is rebuilt
#                              incrementally
#   SANA_CHECK_JOBS=N          build jobs (default: nproc)
#   SANA_CHECK_BIN=FILE        an installed sana-train (the Docker image): no build, no tests
#   SANA_CHECK_PEAK_FLOPS=F    dense bf16 FLOP/s of one GPU (default by name: H100, H200, ...)
#   SANA_CHECK_ONLY="a b"      run only these rows (and build)
#   SANA_CHECK_ALLOW_CPU=1     without a GPU, run the same rows on the CPU (fp32, Gloo; the
#                              NCCL rows skip): checks this script
# Exit: 0 every row ok or skipped, 1 a row failed, 2 no GPU (and no SANA_CHECK_ALLOW_CPU) or
# no usable LibTorch.
set -uo pipefail

# Noise images as 24-bit BMPs (one header, random pixels): enough to time training.
#   gpu_check.sh --make-data DIR COUNT SIDE
le32() {
  printf '%b' "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"
}
if [ "${1:-}" = --make-data ]; then
  dir=$2 count=$3 side=$4
  bytes=$((side * side * 3))
  mkdir -p "$dir" || exit 1
  { printf 'BM'; le32 $((54 + bytes)); le32 0; le32 54; le32 40; le32 "$side"; le32 "$side"
    printf '\x01\x00\x18\x00'; le32 0; le32 "$bytes"; le32 2835; le32 2835; le32 0; le32 0; } > "$dir/.header"
  for ((i = 0; i < count; i++)); do
    head -c "$bytes" /dev/urandom | cat "$dir/.header" - > "$dir/noise_$i.bmp" || exit 1
  done
  rm "$dir/.header"
  echo "$count noise images of ${side}x${side} in $dir"
  exit 0
fi

# The rehearsal: the same check in a bare Debian root with only .kit carried in.
if [ "${1:-}" = --rehearse ]; then
  shift
  exec bash "$(dirname "$0")/compat/gpu_check_rehearsal.sh" "$@"
fi

root=$(cd "$(dirname "$0")/.." && pwd)
self=$root/scripts/gpu_check.sh
out=$(mkdir -p "${1:-$root/output/gpu_check}" && cd "${1:-$root/output/gpu_check}" && pwd)
kit=${SANA_KIT:-$root/.kit}
cd "$root" || exit 1
check_start=$(date +%s)
say() { printf 'gpu_check: %s\n' "$*"; }
py=python3
[ -x /usr/bin/python3 ] && ! python3 -c 'import numpy' 2> /dev/null && py=/usr/bin/python3

# ---- The table ------------------------------------------------------------------------------
rows=(build cuda-tests check-dist-nccl tiny-bf16 1600m-bf16 zero0 zero1 zero2 zero3 zero3-nccl-w1
      two-ranks-1-gpu resume-gpu-cpu lora controlnet offload nf4 swap optim-8bit sprint tensorboard)
declare -A result seconds figures detail
for r in "${rows[@]}"; do result[$r]=skip seconds[$r]=0 figures[$r]="" detail[$r]="not run"; done
failed=0
wanted() { [ -z "${SANA_CHECK_ONLY:-}" ] || [[ " $SANA_CHECK_ONLY build " == *" $1 "* ]]; }
allow_cpu=${SANA_CHECK_ALLOW_CPU:-0} allow_cpu_hint=SANA_CHECK_ALLOW_CPU=1
. "$root/scripts/gpu_common.sh"

if [ -n "${SANA_CHECK_BIN:-}" ]; then
  [ -x "$SANA_CHECK_BIN" ] || { say "SANA_CHECK_BIN=$SANA_CHECK_BIN is not an executable"; exit 2; }
  bin=$SANA_CHECK_BIN tests_bin=""
  skip build "SANA_CHECK_BIN=$bin (installed; no torch tests)"
elif run_logged build 1500 build "${build_cmd[@]}"; then
  ok build "sana-train and sana_torch_tests in $build_dir"
else
  fail build "$(grep -m1 -E 'error|Error' "$out/build.log" | cut -c1-200); see $out/build.log"
  write_table; cat "$out/table.md"; exit 1
fi
if [ "$mode" = cuda ] && ! ldd "$bin" | grep -q libtorch_cuda; then
  fail build "$bin does not load libtorch_cuda: a LibTorch without CUDA"; write_table; exit 1
fi

# ---- Shared settings ------------------------------------------------------------------------
if [ "$mode" = cuda ]; then
  device=cuda precision=bf16 backend=nccl steps=60 side=128 micro=32 images=512
else
  device=cpu precision=fp32 backend=gloo steps=12 side=32 micro=4 images=64
fi
data=$out/data_$side
[ -f "$data/noise_$((images - 1)).bmp" ] || bash "$self" --make-data "$data" "$images" "$side" > /dev/null
base=(--config configs/sana_tiny_cpu.yaml --model.multi_scale=false "--data.image_size=$side" "--model.image_size=$side"
      "--data.data_dir=[\"$data\"]" "--model.mixed_precision=$precision" --train.visualize=false
      --train.save_model_steps=0 --ckpt.async_save=false --train.num_epochs=100000 --train.log_interval=5
      --train.num_workers=4 "--dist.device=$device" --dist.timeout_s=300)

# ---- cuda-tests -----------------------------------------------------------------------------
if ! wanted cuda-tests; then :
elif [ "$mode" != cuda ]; then skip cuda-tests "no GPU"
elif [ -z "$tests_bin" ]; then skip cuda-tests "no test binary (SANA_CHECK_BIN)"
elif run_logged cuda-tests 300 cuda-tests "$tests_bin" "[cuda]"; then
  ok cuda-tests "$(grep -E 'All tests passed|test cases' "$out/cuda-tests.log" | tail -n 1)"
else fail cuda-tests "see $out/cuda-tests.log"; fi

# ---- check-dist-nccl ------------------------------------------------------------------------
if ! wanted check-dist-nccl; then :
elif [ "$mode" != cuda ]; then skip check-dist-nccl "no GPU"
elif run_logged check-dist-nccl 180 check-dist-nccl "$bin" launch --nproc-per-node "$ngpu" -- check-dist \
       --dist.backend=nccl --dist.device=cuda --dist.timeout_s=120; then
  ok check-dist-nccl "$(grep -iE 'bandwidth|GB/s' "$out/check-dist-nccl.log" | tail -n 1 | cut -c1-160)"
else fail check-dist-nccl "see $out/check-dist-nccl.log"; fi

# ---- tiny-bf16 ------------------------------------------------------------------------------
tiny_run=$out/tiny
if wanted tiny-bf16 || wanted tensorboard; then
  rm -rf "$tiny_run"
  tiny_args=("${base[@]}" --model.model=SanaMS_tiny_P2_D4 "--train.max_steps=$steps" "--train.micro_batch_size=$micro"
             "--train.global_batch_size=$micro" "--dist.backend=$backend")
  model_json tiny-model "${tiny_args[@]}"
  tiny_flops=$(json_get "$out/tiny-model.json" 'd["flops"][0]["train"]')
  if run_logged tiny-bf16 600 tiny-bf16 "$bin" launch --nproc-per-node 1 -- "${tiny_args[@]}" "--work_dir=$tiny_run"; then
    read -r sps mfu < <(throughput "$tiny_run/metrics.jsonl" "$micro" "$tiny_flops" 1)
    figures[tiny-bf16]="$sps samples/s, MFU $mfu, $(memory_figure "$tiny_run" "$out/tiny-model.json")"
    ok tiny-bf16 "$steps steps, micro-batch $micro, $precision"
  else fail tiny-bf16 "see $out/tiny-bf16.log"; fi
fi

# ---- 1600m-bf16 -----------------------------------------------------------------------------
if ! wanted 1600m-bf16; then :
elif [ "$mode" != cuda ]; then skip 1600m-bf16 "no GPU (1.6B on the CPU is hours)"
else
  feats=$out/features_1024
  if [ ! -f "$feats/train.yaml" ]; then
    "$py" scripts/make_feature_set.py "$feats" --count 256 --latent-files 64 --text-files 16 --latent-channels 32 \
      --latent-size 32 --tokens 300 --dim 2304 --base-config "$root/configs/Sana_1600M_img1024.yaml" \
      > "$out/features.log" 2>&1
  fi
  big=(--config "$feats/train.yaml" --model.mixed_precision=bf16 --train.grad_checkpointing=true
       --model.multi_scale=false --train.visualize=false --train.save_model_steps=0 --ckpt.async_save=false
       --train.num_epochs=100000 --train.save_model_epochs=0 --ckpt.save_optimizer=false --train.log_interval=1
       --train.num_workers=8 --dist.device=cuda --dist.backend=nccl --dist.timeout_s=600)
  # The largest power-of-two micro-batch (at most 64) whose estimate stays under 85% of the
  # GPU's memory: one `sana-train model` call per size tried, from the largest down.
  gpu_bytes=$(( $(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -n 1) * 1024 * 1024 ))
  big_micro=0
  for mb in 64 32 16 8 4; do
    model_json 1600m-model-$mb "${big[@]}" "--train.micro_batch_size=$mb" "--train.global_batch_size=$mb" || continue
    need=$(json_get "$out/1600m-model-$mb.json" 'int(d["memory_per_process"]["total_for_config"])') || continue
    if [ -n "$need" ] && [ "$need" -lt $(( gpu_bytes * 85 / 100 )) ]; then big_micro=$mb; break; fi
  done
  [ "$big_micro" -eq 0 ] && big_micro=4
  cp "$out/1600m-model-$big_micro.json" "$out/1600m-model.json" 2> /dev/null
  big_flops=$(json_get "$out/1600m-model.json" 'd["flops"][0]["train"]')
  rm -rf "$out/1600m"
  if run_logged 1600m-bf16 420 1600m-bf16 "$bin" launch --nproc-per-node 1 -- "${big[@]}" --train.max_steps=8 \
       "--train.micro_batch_size=$big_micro" "--train.global_batch_size=$big_micro" "--work_dir=$out/1600m"; then
    read -r sps mfu < <(throughput "$out/1600m/metrics.jsonl" "$big_micro" "$big_flops" 1)
    figures[1600m-bf16]="$sps samples/s, MFU $mfu, $(memory_figure "$out/1600m" "$out/1600m-model.json")"
    ok 1600m-bf16 "8 steps, micro-batch $big_micro, bf16, gradient checkpointing"
  else fail 1600m-bf16 "micro-batch $big_micro; see $out/1600m-bf16.log"; fi
fi

# ---- zero0..zero3 (2 processes sharing the device) -------------------------------------------
zero_model=SanaMS_tiny_P2_D4
[ "$mode" = cuda ] && zero_model=SanaMS_100M_P2_D12
zero_args=("${base[@]}" "--model.model=$zero_model" --train.max_steps=20 "--train.micro_batch_size=$micro"
           "--train.global_batch_size=$((2 * micro))" --dist.backend=gloo --dist.allow_shared_device=true
           --train.log_interval=1)
losses() { "$py" -c 'import json,sys; print(" ".join(repr(json.loads(l)["loss"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$1"; }
for stage in 0 1 2 3; do
  row=zero$stage
  wanted "$row" || continue
  rm -rf "$out/$row"
  if run_logged "$row" 400 "$row" "$bin" launch --nproc-per-node 2 -- "${zero_args[@]}" "--train.zero_stage=$stage" \
       "--work_dir=$out/$row"; then
    read -r sps _ < <(throughput "$out/$row/metrics.jsonl" $((2 * micro)) 0 1)
    figures[$row]="$sps samples/s"
    if [ "$stage" = 0 ]; then
      ok "$row" "20 steps, 2 processes on one device, gloo"
    elif [ "${result[zero0]}" != ok ]; then
      ok "$row" "20 steps; stage 0 did not run, losses not compared"
    else
      diff=$("$py" -c '
import sys
a, b = [list(map(float, s.split())) for s in sys.argv[1:3]]
print(len(a) == len(b) and len(a) > 0, max((abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)), default=0))' \
        "$(losses "$out/zero0/metrics.jsonl")" "$(losses "$out/$row/metrics.jsonl")")
      read -r same rel <<< "$diff"
      figures[$row]+=", losses vs stage 0: max rel diff $rel"
      if [ "$same" = True ] && [ "$rel" = 0.0 ]; then ok "$row" "20 losses equal stage 0's"
      else fail "$row" "losses differ from stage 0's (max rel $rel; same count: $same)"; fi
    fi
  else fail "$row" "see $out/$row.log"; fi
done

# ---- zero3-nccl-w1 --------------------------------------------------------------------------
if ! wanted zero3-nccl-w1; then :
elif [ "$mode" != cuda ]; then skip zero3-nccl-w1 "no GPU"
else
  rm -rf "$out/zero3-nccl"
  if run_logged zero3-nccl-w1 300 zero3-nccl-w1 "$bin" launch --nproc-per-node 1 -- "${base[@]}" \
       --model.model=SanaMS_100M_P2_D12 --train.max_steps=20 "--train.micro_batch_size=$micro" \
       "--train.global_batch_size=$micro" --dist.backend=nccl --train.zero_stage=3 "--work_dir=$out/zero3-nccl"; then
    read -r sps _ < <(throughput "$out/zero3-nccl/metrics.jsonl" "$micro" 0 1)
    figures[zero3-nccl-w1]="$sps samples/s"
    ok zero3-nccl-w1 "20 steps, ZeRO 3, NCCL, 1 process"
  else fail zero3-nccl-w1 "see $out/zero3-nccl-w1.log"; fi
fi

# ---- two-ranks-1-gpu ------------------------------------------------------------------------
if ! wanted two-ranks-1-gpu; then :
elif [ "$mode" != cuda ]; then skip two-ranks-1-gpu "no GPU"
else
  run_logged two-ranks-1-gpu 120 two-ranks-1-gpu env CUDA_VISIBLE_DEVICES=0 "$bin" launch --nproc-per-node 2 -- \
    "${base[@]}" --train.max_steps=2 --dist.backend=nccl "--work_dir=$out/two-ranks"
  rc=$?
  why=$(grep -m1 -iE 'has no GPU of its own|NCCL cannot run two ranks' "$out/two-ranks-1-gpu.log" | cut -c1-200)
  if [ "$rc" -eq 2 ] && [ -n "$why" ] && ! grep -q 'Duplicate GPU' "$out/two-ranks-1-gpu.log"; then
    ok two-ranks-1-gpu "exit 2: $why"
  else fail two-ranks-1-gpu "exit $rc (want 2 with the reason, before NCCL); see $out/two-ranks-1-gpu.log"; fi
fi

# ---- resume-gpu-cpu -------------------------------------------------------------------------
if ! wanted resume-gpu-cpu; then :
elif [ "$mode" != cuda ]; then skip resume-gpu-cpu "no GPU"
else
  rr=$out/resume
  rm -rf "$rr"
  resume_args=("${base[@]}" --model.model=SanaMS_tiny_P2_D4 --model.mixed_precision=fp32 --train.micro_batch_size=4
               --train.global_batch_size=8 --train.save_model_steps=2 "--work_dir=$rr" --train.log_interval=1)
  if run_logged resume-gpu-cpu 200 resume-1-gpu "$bin" launch --nproc-per-node 1 -- "${resume_args[@]}" \
       --train.max_steps=10 --dist.backend=nccl &&
     run_logged resume-gpu-cpu 300 resume-2-cpu env CUDA_VISIBLE_DEVICES= "$bin" launch --nproc-per-node 2 -- \
       "${resume_args[@]}" --train.max_steps=14 --dist.device=cpu --dist.backend=gloo --resume_from=latest &&
     run_logged resume-gpu-cpu 200 resume-3-gpu "$bin" launch --nproc-per-node 1 -- "${resume_args[@]}" \
       --train.max_steps=18 --dist.backend=nccl --resume_from=latest; then
    steps_seen=$("$py" -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1]) if "\"loss\"" in l))' "$rr/metrics.jsonl")
    figures[resume-gpu-cpu]="steps logged: $steps_seen"
    ok resume-gpu-cpu "GPU 10 steps -> CPU x2 to 14 -> GPU to 18"
  else fail resume-gpu-cpu "see $out/resume-*.log"; fi
fi

# ---- lora, controlnet -----------------------------------------------------------------------
if wanted lora || wanted controlnet; then
  timeout 120 "$bin" export --config configs/sana_tiny_cpu.yaml --format upstream --out "$out/base.pth" > "$out/export.log" 2>&1
fi
ft_args=("${base[@]}" "--model.load_from=$out/base.pth" --train.max_steps=20 "--train.micro_batch_size=$micro"
         "--train.global_batch_size=$micro" "--dist.backend=$backend")
if wanted lora; then
  rm -rf "$out/lora"
  if run_logged lora 300 lora "$bin" launch --nproc-per-node 1 -- "${ft_args[@]}" --model.model=SanaMS_tiny_P2_D4 \
       --train.lora.rank=4 "--work_dir=$out/lora" && [ -f "$out/lora/pytorch_lora_weights.safetensors" ]; then
    read -r sps _ < <(throughput "$out/lora/metrics.jsonl" "$micro" 0 1)
    figures[lora]="$sps samples/s"
    ok lora "20 steps, rank 4; $(grep -o 'the base weights are unchanged' "$out/lora.log" | head -n 1)"
  else fail lora "see $out/lora.log"; fi
fi
if wanted controlnet; then
  rm -rf "$out/controlnet"
  if run_logged controlnet 300 controlnet "$bin" launch --nproc-per-node 1 -- "${ft_args[@]}" \
       --model.model=SanaMSControlNet_tiny_P2_D4 "--work_dir=$out/controlnet"; then
    read -r sps _ < <(throughput "$out/controlnet/metrics.jsonl" "$micro" 0 1)
    figures[controlnet]="$sps samples/s"
    ok controlnet "20 steps; $(grep -o 'the base weights are unchanged' "$out/controlnet.log" | head -n 1)"
  else fail controlnet "see $out/controlnet.log"; fi
fi

# ---- offload --------------------------------------------------------------------------------
# Relative difference of two runs' safetensors files (float32 tensors, as one vector; the
# standard library only, for a bare machine's python3): prints "TENSORS RELATIVE".
weights_diff() {  # FILE_A FILE_B
  "$py" - "$1" "$2" <<'PY'
import array, json, struct, sys
def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for k, v in json.loads(raw[8:8 + n]).items():
        if k != "__metadata__" and v["dtype"] == "F32":
            a = array.array("f")
            a.frombytes(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            out[k] = a
    return out
x, y = read(sys.argv[1]), read(sys.argv[2])
assert x and x.keys() == y.keys(), f"{len(x)} tensors against {len(y)}"
num = sum((p - q) ** 2 for k in x for p, q in zip(x[k], y[k]))
den = sum(p * p for k in x for p in x[k])
print(len(x), f"{(num / den) ** 0.5:.3g}")
PY
}
if wanted offload; then
  # Two micro-batches a step (gradients accumulated on the device, then streamed out) and one
  # (each bucket streamed to the host and released mid-backward).
  limit=1e-3
  [ "$mode" = cpu ] && limit=0
  off_fig="" off_bad=""
  for acc in 2 1; do
    off_args=("${base[@]}" --model.model=SanaMS_tiny_P2_D4 --train.max_steps=20 "--train.micro_batch_size=$micro"
              "--train.global_batch_size=$((acc * micro))" "--dist.backend=$backend" --model.mixed_precision=fp32
              --train.optimizer.type=AdamW --train.ema_update=true --train.log_interval=1)
    dev=$out/offload-device-$acc host=$out/offload-host-$acc
    rm -rf "$dev" "$host"
    if run_logged offload 300 "offload-device-$acc" "$bin" launch --nproc-per-node 1 -- "${off_args[@]}" "--work_dir=$dev" &&
       run_logged offload 300 "offload-host-$acc" "$bin" launch --nproc-per-node 1 -- "${off_args[@]}" \
         --train.offload_optimizer=true --train.ema_device=cpu "--work_dir=$host"; then
      read -r _ wrel < <(weights_diff "$dev/model.safetensors" "$host/model.safetensors")
      read -r _ erel < <(weights_diff "$dev/ema.safetensors" "$host/ema.safetensors")
      mem=$("$py" - "$dev/memory.json" "$host/memory.json" <<'PY' 2>&1
import json, sys
dev, host = (json.load(open(p))["ranks"][0] for p in sys.argv[1:3])
left = {k: host[k] for k in ("optimizer", "ema", "gradients") if host[k]}
moved = host["host_optimizer"] == dev["optimizer"] > 0 and host["host_ema"] == dev["ema"] > 0
print(f"device state {'left: ' + str(left) if left else 'none'}, host optimizer {host['host_optimizer'] / 2**20:.1f} MiB"
      f"{'' if moved else ' (not the device-resident run' + chr(39) + 's ' + str(dev['optimizer']) + ' B)'}")
sys.exit(0 if not left and moved else 1)
PY
)
      mem_ok=$?
      read -r dsps _ < <(throughput "$dev/metrics.jsonl" $((acc * micro)) 0 1)
      read -r hsps _ < <(throughput "$host/metrics.jsonl" $((acc * micro)) 0 1)
      off_fig+="${off_fig:+; }$acc micro-batch(es) a step: weights rel diff ${wrel:-?}, EMA ${erel:-?}, $dsps samples/s device-resident, $hsps offloaded, $mem"
      "$py" -c "import sys; sys.exit(0 if float('$wrel') <= $limit and float('$erel') <= $limit else 1)" 2> /dev/null &&
        [ "$mem_ok" = 0 ] || off_bad+=" $acc-micro-batch"
    else off_bad+=" $acc-micro-batch" off_fig+="${off_fig:+; }$acc: see $out/offload-*-$acc.log"; fi
  done
  figures[offload]=$off_fig
  if [ -z "$off_bad" ]; then ok offload "20 steps offloaded against device-resident (weights and EMA within $limit)"
  else fail offload "failed:$off_bad (limit $limit relative)"; fi
fi

# ---- nf4, swap ------------------------------------------------------------------------------
# The device's peak in a run's first step (memory.json, rank 0: the state plus the step's
# growth, which holds the swapped blocks in use, the gradient buckets in flight and a stored
# layer restored) against `sana-train model`'s total for the same config. Prints
# "measured/estimated GiB (ratio)"; exits 1 above 1.15 times the estimate.
peak_figure() {  # WORK_DIR MODEL_JSON
  "$py" - "$1/memory.json" "$2" <<'PY' 2> /dev/null || { echo "peak n/a"; return 1; }
import json, sys
m = json.load(open(sys.argv[1]))["ranks"][0]
measured = sum(m[k] for k in ("parameters", "gradients", "optimizer", "ema", "gathered", "working", "activations_peak"))
estimated = json.load(open(sys.argv[2]))["memory_per_process"]["total_for_config"]
g = 1 << 30
print(f"peak {measured / g:.3f}/{estimated / g:.3f} GiB ({measured / estimated:.2f}x)")
sys.exit(0 if measured <= 1.15 * estimated else 1)
PY
}
# pair ROW NAME_A NAME_B ARGS...: a run without and one with the extra ARGS after "--":
# sets pair_fig (samples/s and peak of each) and pair_ok (0: both ran and both peaks are
# within the bound).
pair() {
  local row=$1 a=$2 b=$3
  shift 3
  local common=() extra=() seen=0
  for x in "$@"; do
    if [ "$x" = -- ]; then seen=1; elif [ "$seen" = 0 ]; then common+=("$x"); else extra+=("$x"); fi
  done
  pair_fig="" pair_ok=0
  for name in "$a" "$b"; do
    local args=("${common[@]}")
    [ "$name" = "$b" ] && args+=("${extra[@]}")
    rm -rf "$out/$name"
    model_json "$name-model" "${args[@]}" || { pair_ok=1; pair_fig+="${pair_fig:+; }$name: no estimate"; continue; }
    if run_logged "$row" 300 "$name" "$bin" launch --nproc-per-node 1 -- "${args[@]}" "--work_dir=$out/$name"; then
      local sps at_peak  # (throughput reads the global $peak, the GPU's FLOP/s)
      read -r sps _ < <(throughput "$out/$name/metrics.jsonl" "$micro" 0 1)
      at_peak=$(peak_figure "$out/$name" "$out/$name-model.json") || pair_ok=1
      pair_fig+="${pair_fig:+; }$name: $sps samples/s, $at_peak"
    else pair_ok=1 pair_fig+="${pair_fig:+; }$name: see $out/$name.log"; fi
  done
}
if wanted nf4 || wanted swap; then
  [ -f "$out/base.pth" ] ||
    timeout 120 "$bin" export --config configs/sana_tiny_cpu.yaml --format upstream --out "$out/base.pth" > "$out/export.log" 2>&1
fi
lora_args=("${base[@]}" "--model.load_from=$out/base.pth" --model.model=SanaMS_tiny_P2_D4 --train.max_steps=20
           "--train.micro_batch_size=$micro" "--train.global_batch_size=$micro" "--dist.backend=$backend"
           --train.lora.rank=4 --train.grad_checkpointing=true --train.log_interval=1)
if wanted nf4; then
  # LoRA on the tiny base stored as fp32 against NF4 (double quantised).
  pair nf4 nf4-fp32 nf4-nf4 "${lora_args[@]}" -- --train.frozen_base_dtype=nf4 --train.frozen_base_double_quant=true
  figures[nf4]=$pair_fig
  if [ "$pair_ok" = 0 ]; then ok nf4 "20 LoRA steps on an fp32 and an NF4 base; peaks within 1.15x the estimate"
  else fail nf4 "a run failed or its peak is above 1.15x the estimate"; fi
fi
if wanted swap; then
  # A full fine-tune under train.offload_optimizer (the 100M preset's 12 blocks on a GPU),
  # without and with half its blocks swapped, and LoRA on an NF4 base without and with 3 of
  # 4 blocks swapped: step time and peak of each; the full fine-tunes' weights within 1e-3
  # relative on the GPU (byte-identical on the CPU).
  swap_model=SanaMS_tiny_P2_D4
  [ "$mode" = cuda ] && swap_model=SanaMS_100M_P2_D12
  full_args=("${base[@]}" "--model.model=$swap_model" --train.max_steps=20 "--train.micro_batch_size=$micro"
             "--train.global_batch_size=$micro" "--dist.backend=$backend" --train.optimizer.type=AdamW
             --train.offload_optimizer=true --train.grad_checkpointing=true --train.log_interval=1)
  pair swap swap-full swap-full-half "${full_args[@]}" -- --train.offload_blocks=0.5
  swap_fig=$pair_fig swap_ok=$pair_ok
  limit=1e-3
  [ "$mode" = cpu ] && limit=0
  read -r _ wrel < <(weights_diff "$out/swap-full/model.safetensors" "$out/swap-full-half/model.safetensors" 2> /dev/null)
  swap_fig+=", weights rel diff ${wrel:-?}"
  "$py" -c "import sys; sys.exit(0 if float('${wrel:-inf}') <= $limit else 1)" 2> /dev/null || swap_ok=1
  pair swap swap-lora swap-lora-3 "${lora_args[@]}" --train.frozen_base_dtype=nf4 -- --train.offload_blocks=3
  figures[swap]="$swap_fig; $pair_fig"
  if [ "$swap_ok" = 0 ] && [ "$pair_ok" = 0 ]; then
    ok swap "20 steps each with and without block swapping; full fine-tune weights within $limit, peaks within 1.15x"
  else fail swap "a run failed, a peak is above 1.15x the estimate, or the swapped weights differ (limit $limit)"; fi
fi

# ---- optim-8bit -----------------------------------------------------------------------------
if wanted optim-8bit; then
  q_args=("${base[@]}" --model.model=SanaMS_tiny_P2_D4 --train.max_steps=20 "--train.micro_batch_size=$micro"
          "--train.global_batch_size=$micro" "--dist.backend=$backend" --train.log_interval=1)
  q_fig="" q_bad=""
  for opt in AdamW8bit CAME8bit; do
    rm -rf "$out/$opt"
    model_json "$opt-model" "${q_args[@]}" "--train.optimizer.type=$opt"
    if run_logged optim-8bit 300 "$opt" "$bin" launch --nproc-per-node 1 -- "${q_args[@]}" "--train.optimizer.type=$opt" \
         "--work_dir=$out/$opt"; then
      line=$("$py" - "$out/$opt/metrics.jsonl" "$out/$opt/memory.json" "$out/$opt-model.json" <<'PY' 2>&1
import json, math, sys
losses = [json.loads(l).get("loss") for l in open(sys.argv[1])]
losses = [x for x in losses if x is not None]
measured = json.load(open(sys.argv[2]))["ranks"][0]["optimizer"]
estimate = json.load(open(sys.argv[3]))["memory_per_process"]["optimizer"]
good = len(losses) == 20 and all(math.isfinite(x) for x in losses) and abs(measured - estimate) <= 0.01 * estimate
print(f"{len(losses)} losses {losses[0]:.4f} -> {losses[-1]:.4f}, optimizer {measured / 2**20:.2f} MiB "
      f"(estimate {estimate / 2**20:.2f})")
sys.exit(0 if good else 1)
PY
)
      [ $? = 0 ] || q_bad+=" $opt"
      q_fig+="${q_fig:+; }$opt: $line"
    else q_bad+=" $opt" q_fig+="${q_fig:+; }$opt: see $out/$opt.log"; fi
  done
  figures[optim-8bit]=$q_fig
  if [ -z "$q_bad" ]; then ok optim-8bit "20 steps each, $precision"; else fail optim-8bit "failed:$q_bad"; fi
fi

# ---- sprint ---------------------------------------------------------------------------------
if wanted sprint; then
  sf=$out/sprint_features
  [ -f "$sf/train.yaml" ] || "$py" scripts/make_feature_set.py "$sf" --count 64 --latent-channels 4 --latent-size 16 \
    --downsample 8 --tokens 8 --dim 16 --base-config "$root/configs/sana_tiny_cpu.yaml" > "$out/sprint-features.log" 2>&1
  sp_common=(--config "$sf/train.yaml" --vae.vae_type=dc-ae --vae.vae_latent_dim=4 --vae.vae_downsample_rate=8
             --text_encoder.caption_channels=16 --text_encoder.model_max_length=8 --data.image_size=128
             --model.image_size=128 --model.multi_scale=false --scheduler.timestep_norm_scale_factor=1000
             --train.visualize=false --train.save_model_steps=0 --train.save_model_epochs=0 --ckpt.async_save=false
             --train.num_epochs=1000 --train.log_interval=1 --dist.timeout_s=300)
  student=(--model.model=SanaMSCM_tiny_P2_D4 --model.cfg_embed=true --model.logvar=true --model.teacher=SanaMS_tiny_P2_D4
           "--model.teacher_model=$out/sprint-teacher/model.safetensors" "--model.head_block_ids=[1, 3]"
           "--model.load_from=$out/sprint-teacher/model.safetensors" --model.load_strict=false
           --scheduler.weighting_scheme=logit_normal_trigflow --scheduler.sigma_data=0.5 --scheduler.vis_sampler=scm
           --train.discriminator_loss=hinge "--train.scm_cfg_scale=[4, 4.5, 5]" --train.tangent_warmup_steps=4)
  rm -rf "$out"/sprint-teacher "$out"/sprint-student "$out"/sprint-fp32 "$out"/sprint-cpu
  cpu_env=(env)
  [ "$mode" = cuda ] && cpu_env=(env CUDA_VISIBLE_DEVICES=)
  if run_logged sprint 300 sprint-teacher "$bin" launch --nproc-per-node 1 -- "${sp_common[@]}" --train.max_steps=5 \
       "--dist.device=$device" "--dist.backend=$backend" "--work_dir=$out/sprint-teacher" &&
     run_logged sprint 300 sprint-student "$bin" launch --nproc-per-node 1 -- "${sp_common[@]}" "${student[@]}" \
       --train.max_steps=10 "--model.mixed_precision=$precision" "--dist.device=$device" "--dist.backend=$backend" \
       "--work_dir=$out/sprint-student" &&
     run_logged sprint 300 sprint-fp32 "$bin" launch --nproc-per-node 1 -- "${sp_common[@]}" "${student[@]}" \
       --train.max_steps=2 "--dist.device=$device" "--dist.backend=$backend" "--work_dir=$out/sprint-fp32" &&
     run_logged sprint 300 sprint-cpu "${cpu_env[@]}" "$bin" launch --nproc-per-node 2 -- "${sp_common[@]}" "${student[@]}" \
       --train.max_steps=2 --dist.device=cpu --dist.backend=gloo "--work_dir=$out/sprint-cpu"; then
    line=$("$py" - "$out/sprint-student/metrics.jsonl" "$out/sprint-fp32/metrics.jsonl" "$out/sprint-cpu/metrics.jsonl" <<'PY' 2>&1
import json, math, sys
def steps(path):
    return {m["step"]: {k: v for k, v in m.items() if k.startswith("loss_")}
            for m in map(json.loads, open(path)) if "step" in m}
run, dev, cpu = (steps(p) for p in sys.argv[1:4])
finite = sorted(run) == list(range(1, 11)) and all(math.isfinite(v) for s in run.values() for v in s.values())
assert sorted(dev) == sorted(cpu) == [1, 2], f"steps {sorted(dev)} and {sorted(cpu)}"
worst, where = max((abs(dev[s][k] - cpu[s][k]) / max(abs(cpu[s][k]), 1.0), f"{k} at step {s}")
                   for s in cpu for k in cpu[s])
print(f"10 steps, losses {'finite' if finite else 'NOT finite or missing'} (loss_G {run[1]['loss_G']:.4f} -> "
      f"{run[max(run)].get('loss_G', run[max(run) - 1].get('loss_G', float('nan'))):.4f}); fp32 on the device "
      f"against 2 CPU processes: {worst:.2g} ({where})")
sys.exit(0 if finite and worst <= 2e-2 else 1)
PY
)
    sp_ok=$?
    read -r sps _ < <(throughput "$out/sprint-student/metrics.jsonl" 8 0 1)
    figures[sprint]="$sps samples/s; $line"
    if [ "$sp_ok" = 0 ]; then ok sprint "stage 2, 10 steps $precision, 2 steps fp32 against the CPU"
    else fail sprint "$line"; fi
  else fail sprint "see $out/sprint-*.log"; fi
fi

# ---- tensorboard ----------------------------------------------------------------------------
if ! wanted tensorboard; then :
elif ! python3 -c 'import tensorboard' 2> /dev/null; then skip tensorboard "no tensorboard package for $(command -v python3)"
elif [ ! -f "$tiny_run/metrics.jsonl" ]; then skip tensorboard "tiny-bf16 made no run"
elif tb=$(python3 - "$tiny_run" 2>&1 <<'PY'
import glob, json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
files = glob.glob(f"{run}/**/events.out.tfevents.*", recursive=True)
if not files: sys.exit(f"no event file under {run}")
acc = EventAccumulator(files[0], size_guidance={"scalars": 0}); acc.Reload()
tags = set(acc.Tags()["scalars"])
# Every per-step series of metrics.jsonl is a tag; not the position and bucket fields
# (epoch, epoch_step, samples, height, width) or the run's average (run_samples_per_s).
rows = [json.loads(line) for line in open(f"{run}/metrics.jsonl")]
skip = {"step", "epoch", "epoch_step", "samples", "height", "width", "time_s", "run_samples_per_s"}
keys = {k for r in rows for k, v in r.items() if isinstance(v, (int, float)) and not isinstance(v, bool) and k not in skip}
missing = sorted(k for k in keys if not any(t == k or t.endswith("/" + k) for t in tags))
# And the values: train/loss at every step equals metrics.jsonl's (float32 in the event).
loss = {e.step: e.value for e in acc.Scalars("train/loss")} if "train/loss" in tags else {}
off = [r["step"] for r in rows if "loss" in r and abs(loss.get(r["step"], float("inf")) - r["loss"]) > 1e-6 * max(1, abs(r["loss"]))]
print(f"{len(tags)} scalar tags, {len(keys)} metrics.jsonl series, missing {missing}; train/loss at "
      f"{len(loss)} steps, {len(off)} differ from metrics.jsonl")
sys.exit(1 if missing or off or not tags else 0)
PY
); then
  ok tensorboard "$tb"
else fail tensorboard "$tb"; fi

# ---- Summary --------------------------------------------------------------------------------
write_table
say "done in $(( $(date +%s) - check_start )) s"
echo
echo "$environment"
cat "$out/table.md"
[ -n "$peak" ] && echo "MFU: samples/s x training FLOPs per sample (sana-train model) / ($peak FLOP/s x GPUs)"
exit "$failed"
