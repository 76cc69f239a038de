#!/usr/bin/env bash
# The GPU check, for a machine with NVIDIA GPUs: finds a CUDA LibTorch, builds sana-train
# with its tests into build-gpu/ and runs ctest, trains with 2 processes sharing one GPU
# (Gloo, dist.allow_shared_device) and with one process per GPU (NCCL), and prints
# samples/s and MFU for both, and runs ZeRO stages 2 and 3 (NCCL, or 2 processes sharing the
# GPU when there is one). Every step runs under `timeout`; a summary table ends it.
#   bash scripts/gpu_smoke.sh
# Environment (all optional):
#   TORCH_PREFIX=DIR            LibTorch to use (an unzipped official zip); else pip torch's
#                               (torch.utils.cmake_prefix_path), else the system's
#   SANA_SMOKE_BUILD_DIR=DIR    build folder (default build-gpu); when set and DIR/apps/sana-train
#                               exists, that binary is used as it is (no build)
#   SANA_SMOKE_BIN=FILE         an installed sana-train (the Docker image sets it): no build, no ctest
#   SANA_SMOKE_SKIP_TESTS=1     no ctest
#   SANA_SMOKE_PEAK_FLOPS=F     dense bf16 peak FLOP/s of one GPU (default: by GPU name, below)
#   SANA_SMOKE_PRESET, SANA_SMOKE_SIZE, SANA_SMOKE_MICRO_BATCH, SANA_SMOKE_STEPS
#                               model preset, image side, per-process batch, steps per run
#   SANA_SMOKE_OUT=DIR          runs, logs and data (default output/gpu_smoke)
#   SANA_SMOKE_ALLOW_CPU=1      without a GPU, run the same flow on the CPU with Gloo
#                               (checks this script; MFU is n/a)
# Exit codes: 0 every step passed, 1 a step failed, 2 no CUDA device or no CUDA LibTorch
# (or a LibTorch that cannot work, e.g. the old C++ ABI).
set -uo pipefail

# Noise images as 24-bit BMPs (one header, random pixels): enough to time training.
#   gpu_smoke.sh --make-data DIR COUNT SIDE
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

self=$(cd "$(dirname "$0")" && pwd)/$(basename "$0")
root=$(cd "$(dirname "$0")/.." && pwd)
out=${SANA_SMOKE_OUT:-$root/output/gpu_smoke}
mkdir -p "$out"
cd "$root" || exit 1

say() { printf 'gpu_smoke: %s\n' "$*"; }
die() { printf 'gpu_smoke: %s\n' "$1" >&2; exit "${2:-1}"; }

# ---- Summary -------------------------------------------------------------------------------
names=() results=() seconds=() details=()
record() { names+=("$1"); results+=("$2"); seconds+=("$3"); details+=("$4"); }
failed=0
summary() {
  printf '\n%-26s %-6s %8s  %s\n' "step" "result" "seconds" "detail"
  local i
  for i in "${!names[@]}"; do
    printf '%-26s %-6s %8s  %s\n' "${names[$i]}" "${results[$i]}" "${seconds[$i]}" "${details[$i]}"
  done
  if [ "${#runs[@]}" -gt 0 ]; then
    printf '\n%-34s %9s %10s %12s %7s\n' "training run" "processes" "samples/s" "GFLOP/sample" "MFU"
    for i in "${!runs[@]}"; do printf '%s\n' "${runs[$i]}"; done
  fi
  printf '\nlogs and runs: %s\n' "$out"
}
runs=()

# Runs NAME SECONDS COMMAND... with its output in $out/NAME.log; records the result.
step() {
  local name=$1 limit=$2 start rc
  shift 2
  say "$name: $*"
  start=$(date +%s)
  timeout --kill-after=30 "$limit" "$@" > "$out/$name.log" 2>&1
  rc=$?
  local took=$(( $(date +%s) - start ))
  if [ "$rc" -eq 0 ]; then
    record "$name" ok "$took" "$out/$name.log"
  else
    local why="exit $rc"
    [ "$rc" -eq 124 ] && why="timed out after ${limit}s"
    record "$name" FAIL "$took" "$why; see $out/$name.log"
    failed=1
    tail -n 25 "$out/$name.log" | sed 's/^/    /'
  fi
  return "$rc"
}

# ---- (a) LibTorch and GPUs -----------------------------------------------------------------
torch_source="" torch_prefix="" torch_version="?" torch_cuda="?" torch_include=""
pip_torch() { python3 -c "import torch; $1" 2>/dev/null; }
if [ -n "${TORCH_PREFIX:-}" ]; then
  torch_source="TORCH_PREFIX"
  torch_prefix=$TORCH_PREFIX
  torch_include=$torch_prefix/include
  if [ -f "$torch_prefix/build-version" ]; then
    torch_version=$(cat "$torch_prefix/build-version")
  elif [ -f "$torch_include/torch/csrc/api/include/torch/version.h" ]; then
    torch_version=$(sed -n 's/^ *"\([0-9.]*\)".*/\1/p' "$torch_include/torch/csrc/api/include/torch/version.h")
  fi
  if [ -e "$torch_prefix/lib/libtorch_cuda.so" ]; then torch_cuda=yes; else torch_cuda=no; fi
  if grep -qs '_GLIBCXX_USE_CXX11_ABI=0' "$torch_prefix/share/cmake/Torch/TorchConfig.cmake"; then
    die "$torch_prefix is a pre-C++11-ABI LibTorch: it cannot link with the system's yaml-cpp, fmt and OpenCV. Use the cxx11-abi zip" 2
  fi
elif cmake_dir=$(pip_torch 'print(torch.utils.cmake_prefix_path)') && [ -f "$cmake_dir/Torch/TorchConfig.cmake" ]; then
  torch_source="pip torch ($(command -v python3))"
  torch_prefix=$cmake_dir
  torch_include=$(cd "$cmake_dir/../../include" && pwd)
  torch_version=$(pip_torch 'print(torch.__version__)')
  torch_cuda=$(pip_torch 'print("yes, CUDA " + torch.version.cuda if torch.version.cuda else "no")')
  say "pip torch: torch.cuda.is_available() = $(pip_torch 'print(torch.cuda.is_available())')"
  if [ "$(pip_torch 'print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')" = 0 ]; then
    die "pip torch $torch_version uses the old C++ ABI (_GLIBCXX_USE_CXX11_ABI=0): it cannot link with the system's yaml-cpp, fmt and OpenCV. Use torch 2.7 or later, or the cxx11-abi LibTorch zip with TORCH_PREFIX=DIR" 2
  fi
else
  torch_source="system"
  for version_h in /usr/include/torch/csrc/api/include/torch/version.h /usr/local/include/torch/csrc/api/include/torch/version.h; do
    [ -f "$version_h" ] && torch_version=$(sed -n 's/^ *"\([0-9.]*\)".*/\1/p' "$version_h") && break
  done
  if compgen -G '/usr/lib/*/libtorch_cuda.so*' > /dev/null || compgen -G '/usr/local/lib/libtorch_cuda.so*' > /dev/null; then
    torch_cuda=yes
  else
    torch_cuda=no
  fi
fi
say "LibTorch: $torch_source ${torch_prefix:+$torch_prefix }version $torch_version, CUDA: $torch_cuda"

gpu_names=()
if command -v nvidia-smi > /dev/null 2>&1; then
  mapfile -t gpu_names < <(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)
fi
ngpu=${#gpu_names[@]}
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
  IFS=',' read -r -a visible <<< "$CUDA_VISIBLE_DEVICES"
  case "${visible[0]:-}" in ""|-1|NoDevFiles) visible=() ;; esac
  [ "$ngpu" -gt 0 ] && ngpu=${#visible[@]}
fi
if [ "${#gpu_names[@]}" -eq 0 ] && [[ $torch_source == pip* ]]; then
  ngpu=$(pip_torch 'print(torch.cuda.device_count())' || echo 0)
  mapfile -t gpu_names < <(pip_torch 'print("\n".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))')
fi
first_gpu=0
[ -n "${CUDA_VISIBLE_DEVICES:-}" ] && first_gpu=${CUDA_VISIBLE_DEVICES%%,*}

mode=cuda
if [ "$ngpu" -eq 0 ]; then
  if [ "${SANA_SMOKE_ALLOW_CPU:-0}" != 1 ]; then
    die "no CUDA device found (nvidia-smi and CUDA_VISIBLE_DEVICES show none). Run this on a GPU machine, or set SANA_SMOKE_ALLOW_CPU=1 to run the same steps on the CPU" 2
  fi
  mode=cpu
  say "no CUDA device: SANA_SMOKE_ALLOW_CPU=1, so every step runs on the CPU with Gloo"
else
  say "GPUs: $ngpu visible ($(printf '%s; ' "${gpu_names[@]}" | sed 's/; $//'))"
fi
record "environment" ok 0 "LibTorch $torch_version ($torch_source), CUDA $torch_cuda, $ngpu GPU(s), mode $mode"

# Dense bf16 tensor-core peak of one GPU, from NVIDIA's datasheets (no sparsity).
peak_flops_for() {
  case "$1" in
    *H100*PCIe*) echo 756e12 ;;
    *H100*NVL* | *H200*NVL*) echo 835e12 ;;
    *H100* | *H200*) echo 989e12 ;;  # GH200 too
    *A100*) echo 312e12 ;;
    *L40S*) echo 362e12 ;;
    *B200*) echo 2250e12 ;;
    *) echo "" ;;
  esac
}
peak=${SANA_SMOKE_PEAK_FLOPS:-}
[ -z "$peak" ] && [ "$mode" = cuda ] && peak=$(peak_flops_for "${gpu_names[0]:-}")

# ---- (b) Build and tests -------------------------------------------------------------------
bin=${SANA_SMOKE_BIN:-}
build_dir=${SANA_SMOKE_BUILD_DIR:-$root/build-gpu}
if [ -n "$bin" ]; then
  [ -x "$bin" ] || die "SANA_SMOKE_BIN=$bin is not an executable" 2
  record "build" skip 0 "SANA_SMOKE_BIN=$bin"
elif [ -n "${SANA_SMOKE_BUILD_DIR:-}" ] && [ -x "$build_dir/apps/sana-train" ]; then
  bin=$build_dir/apps/sana-train
  record "build" skip 0 "using the existing $bin"
else
  cmake_args=(-DSANA_BUILD_TESTS=ON)
  [ "$torch_source" != system ] && cmake_args+=("-DCMAKE_PREFIX_PATH=$torch_prefix")
  # Gloo's headers: beside LibTorch's, from the system (libgloo-dev), or fetched at the
  # commit this PyTorch pins (scripts/compat/gloo_headers.sh).
  if [ -n "$torch_include" ] && [ ! -f "$torch_include/gloo/algorithm.h" ] &&
     [ ! -f /usr/include/gloo/algorithm.h ] && [ ! -f /usr/local/include/gloo/algorithm.h ]; then
    gloo_dir=${SANA_GLOO_INCLUDE:-${XDG_CACHE_HOME:-$HOME/.cache}/sana-train/gloo-${torch_version%%+*}/include}
    if [ ! -f "$gloo_dir/gloo/algorithm.h" ]; then
      step gloo-headers 600 bash scripts/compat/gloo_headers.sh "$torch_version" "$gloo_dir" ||
        { summary; die "no Gloo headers for LibTorch $torch_version: install libgloo-dev, or run scripts/compat/gloo_headers.sh $torch_version DIR and set SANA_GLOO_INCLUDE=DIR"; }
    fi
    cmake_args+=("-DCMAKE_CXX_FLAGS=-isystem $gloo_dir")
  fi
  step build "${SANA_SMOKE_BUILD_TIMEOUT:-5400}" env SANA_BUILD_DIR="$build_dir" \
    SANA_BUILD_JOBS="${SANA_BUILD_JOBS:-$(nproc)}" bash scripts/build.sh "${cmake_args[@]}" ||
    { summary; exit 1; }
  bin=$build_dir/apps/sana-train
fi
if [ "$mode" = cuda ]; then
  if ! ldd "$bin" 2>/dev/null | grep -q 'libtorch_cuda\.so'; then
    summary
    die "$bin does not load libtorch_cuda: it was built against a LibTorch without CUDA (found: $torch_source, CUDA $torch_cuda). Point TORCH_PREFIX at a CUDA LibTorch" 2
  fi
fi

if [ "${SANA_SMOKE_SKIP_TESTS:-0}" = 1 ] || [ -n "${SANA_SMOKE_BIN:-}" ] || [ ! -f "$build_dir/CTestTestfile.cmake" ]; then
  record "ctest" skip 0 "SANA_SMOKE_SKIP_TESTS=1, SANA_SMOKE_BIN, or a build without tests"
else
  step ctest "${SANA_SMOKE_TEST_TIMEOUT:-3600}" ctest --test-dir "$build_dir" --output-on-failure \
    -j "${SANA_TEST_JOBS:-2}" --timeout 900
fi

# ---- Data and model ------------------------------------------------------------------------
if [ "$mode" = cuda ]; then
  preset=${SANA_SMOKE_PRESET:-SanaMS_100M_P2_D12} size=${SANA_SMOKE_SIZE:-128}
  micro=${SANA_SMOKE_MICRO_BATCH:-16} steps=${SANA_SMOKE_STEPS:-100} images=512
  device=cuda precision=bf16 nproc_all=$ngpu
else
  preset=${SANA_SMOKE_PRESET:-SanaMS_tiny_P2_D4} size=${SANA_SMOKE_SIZE:-32}
  micro=${SANA_SMOKE_MICRO_BATCH:-4} steps=${SANA_SMOKE_STEPS:-20} images=64
  device=cpu precision=fp32 nproc_all=2
fi
[ $((size % 4)) -eq 0 ] || die "SANA_SMOKE_SIZE must be a multiple of 4" 2

data=$out/data_${size}
if [ ! -f "$data/noise_$((images - 1)).bmp" ]; then
  step data 300 bash "$self" --make-data "$data" "$images" "$size" || { summary; exit 1; }
else
  record "data" ok 0 "$images noise images in $data"
fi

config=$root/configs/sana_tiny_cpu.yaml
model_args=(--config "$config" "--model.model=$preset" --model.multi_scale=false "--data.image_size=$size"
            "--model.image_size=$size" "--data.data_dir=[\"$data\"]" "--model.mixed_precision=$precision")
train_flops=""
if step model 120 "$bin" model "${model_args[@]}" --json; then
  train_flops=$(grep -o '"train": *[0-9.eE+]*' "$out/model.log" | head -n 1 | sed 's/.*: *//')
fi
say "model: $preset at ${size}x${size}, training FLOPs per sample: ${train_flops:-unknown}"

# ---- (c), (d) Training ---------------------------------------------------------------------
train_args=("${model_args[@]}" "--train.max_steps=$steps" --train.num_epochs=100000 --train.log_interval=10
            --train.visualize=false --train.save_model_steps=0 --ckpt.save_optimizer=false
            --ckpt.async_save=false "--train.micro_batch_size=$micro" --train.num_workers=4
            "--dist.device=$device" --dist.timeout_s=300)

# Samples/s over the last two thirds of the steps (the first third holds the warm-up), from
# metrics.jsonl's step and time_s; then MFU for DEVICES devices.
throughput() {
  local label=$1 nproc=$2 devices=$3 global=$4 metrics=$5 sps mfu gflop
  sps=$(awk -v g="$global" '
    { if (match($0, /"step":[0-9]+/)) s[NR] = substr($0, RSTART + 7, RLENGTH - 7)
      if (match($0, /"time_s":[0-9.eE+-]+/)) t[NR] = substr($0, RSTART + 9, RLENGTH - 9) }
    END { if (NR < 3) exit 1; a = int(NR / 3); if (a < 1) a = 1
          if (t[NR] <= t[a]) exit 1; printf "%.1f", (s[NR] - s[a]) * g / (t[NR] - t[a]) }' "$metrics") || sps=""
  gflop=n/a mfu=n/a
  [ -n "$train_flops" ] && gflop=$(awk -v f="$train_flops" 'BEGIN { printf "%.1f", f / 1e9 }')
  if [ -n "$sps" ] && [ -n "$train_flops" ] && [ -n "$peak" ]; then
    mfu=$(awk -v s="$sps" -v f="$train_flops" -v p="$peak" -v d="$devices" 'BEGIN { printf "%.1f%%", 100 * s * f / (p * d) }')
  fi
  runs+=("$(printf '%-34s %9s %10s %12s %7s' "$label" "$nproc" "${sps:-n/a}" "$gflop" "$mfu")")
}

if [ "$mode" = cuda ]; then
  step check-dist-nccl 300 "$bin" launch --nproc-per-node "$ngpu" -- check-dist --dist.backend=nccl \
    --dist.device=cuda --dist.timeout_s=120
else
  step check-dist-gloo 300 "$bin" launch --nproc-per-node 2 -- check-dist --dist.backend=gloo \
    --dist.device=cpu --dist.timeout_s=120
fi

# (c) Two processes on one device with Gloo: the debugging path of dist.allow_shared_device.
shared_label="(c) 2 on GPU $first_gpu, gloo"
[ "$mode" = cpu ] && shared_label="(c) 2 on the CPU, gloo, shared"
rm -rf "$out/train_shared"
one_device=()
[ "$mode" = cuda ] && one_device=("CUDA_VISIBLE_DEVICES=$first_gpu")
if step train-shared-gloo "${SANA_SMOKE_TRAIN_TIMEOUT:-900}" env "${one_device[@]}" \
     "$bin" launch --nproc-per-node 2 -- "${train_args[@]}" --dist.backend=gloo \
     --dist.allow_shared_device=true "--train.global_batch_size=$((2 * micro))" \
     "--work_dir=$out/train_shared"; then
  throughput "$shared_label" 2 1 $((2 * micro)) "$out/train_shared/metrics.jsonl"
fi

# (d) One process per GPU with NCCL (CPU mode: 2 processes with Gloo).
backend=nccl
[ "$mode" = cpu ] && backend=gloo
all_label="(d) $nproc_all on $nproc_all GPUs, nccl"
[ "$mode" = cpu ] && all_label="(d) $nproc_all on the CPU, gloo"
rm -rf "$out/train_all"
if step "train-all-$backend" "${SANA_SMOKE_TRAIN_TIMEOUT:-900}" "$bin" launch --nproc-per-node "$nproc_all" -- \
     "${train_args[@]}" "--dist.backend=$backend" "--train.global_batch_size=$((nproc_all * micro))" \
     "--work_dir=$out/train_all"; then
  devices=$nproc_all
  [ "$mode" = cpu ] && devices=1
  throughput "$all_label" "$nproc_all" "$devices" $((nproc_all * micro)) "$out/train_all/metrics.jsonl"
fi

# (e) ZeRO stages 2 and 3 (train.zero_stage): one process per GPU with NCCL, or with one GPU
# two processes sharing it over Gloo; each rank's memory.json line is printed.
zero_np=$nproc_all zero_backend=$backend zero_env=() zero_extra=()
if [ "$nproc_all" -lt 2 ]; then
  zero_np=2 zero_backend=gloo zero_env=("${one_device[@]}") zero_extra=(--dist.allow_shared_device=true)
fi
for stage in 2 3; do
  rm -rf "$out/zero$stage"
  if step "zero$stage-$zero_backend" "${SANA_SMOKE_TRAIN_TIMEOUT:-900}" env "${zero_env[@]}" "$bin" launch \
       --nproc-per-node "$zero_np" -- "${train_args[@]}" "--dist.backend=$zero_backend" "${zero_extra[@]}" \
       --train.zero_stage=$stage "--train.global_batch_size=$((zero_np * micro))" "--work_dir=$out/zero$stage"; then
    throughput "(e) ZeRO $stage, $zero_np processes, $zero_backend" "$zero_np" 1 $((zero_np * micro)) \
      "$out/zero$stage/metrics.jsonl"
    say "ZeRO $stage memory.json: $(tr -d ' \n' < "$out/zero$stage/memory.json" | head -c 600)"
  fi
done

# ---- (f) Summary ---------------------------------------------------------------------------
summary
if [ "$mode" = cuda ] && [ -z "$peak" ]; then
  printf 'MFU: n/a (unknown GPU "%s"; set SANA_SMOKE_PEAK_FLOPS to its dense bf16 FLOP/s)\n' "${gpu_names[0]:-}"
elif [ -n "$peak" ]; then
  printf 'MFU: achieved FLOP/s (samples/s x training FLOPs per sample, ~3 x forward) / (%s FLOP/s x GPUs)\n' "$peak"
fi
[ "$mode" = cpu ] && printf 'CPU mode (SANA_SMOKE_ALLOW_CPU=1): the GPU path was not exercised\n'
exit "$failed"
