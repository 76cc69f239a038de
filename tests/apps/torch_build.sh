#!/usr/bin/env bash
# The binary is the GPU build (README, Requirements): it loads libtorch_cuda, and a run's first
# line names the LibTorch it was built with, that CUDA is compiled in, and what devices it sees
# ("no device" on a machine without a GPU, as here). The LibTorch is the one the venv's torch
# carries: the version the first line names is the venv's torch.__version__.
# Every command under `timeout` in a `mktemp -d` folder.
. "$(dirname "$0")/../dist/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
if ldd "$BIN" | grep -q 'libtorch_cuda\.so => /'; then
  pass "$(ldd "$BIN" | grep -o 'libtorch_cuda\.so => [^ ]*')"
else
  fail "sana-train does not load libtorch_cuda: $(ldd "$BIN" | grep -i torch | tr '\n' ' ')"
fi
want=$(timeout 120 "$SANA_PYTHON" -c 'import torch; print(torch.__version__.split("+")[0], torch.version.cuda)') ||
  { fail "the venv's torch did not answer"; finish; }
read -r version cuda <<< "$want"
timeout 120 "$BIN" --config "$config" --data.data_dir="[${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}]" \
  --train.max_steps=1 --train.visualize=false "--work_dir=$SCRATCH/run" > "$SCRATCH/run.log" 2>&1
assert_code $? 0 "one training step"
devices=$(timeout 60 "$SANA_PYTHON" -c 'import torch; n = torch.cuda.device_count(); print("no device" if n == 0 else f"{n} CUDA device" + ("s" if n > 1 else ""))')
line=$(grep -m1 "sana-train .*(LibTorch" "$SCRATCH/run.log")
if [[ "$line" == *"(LibTorch $version, CUDA $cuda compiled in, $devices)"* ]]; then
  pass "the start line: ${line#*] }"
else
  fail "the start line does not say 'LibTorch $version, CUDA $cuda compiled in, $devices': ${line:-none}"
fi
finish
