#!/usr/bin/env bash
# Compiles the CUDA-only sources in syntax-only mode against this LibTorch's headers and
# the CUDA toolkit (default /usr/local/cuda), for machines without a CUDA LibTorch or GPU.
# Debian's CPU LibTorch lacks c10/cuda/impl/cuda_cmake_macros.h: a one-line shim stands in.
# Exit 77 (skipped) when no CUDA toolkit with NCCL is installed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
torch_include=${TORCH_INCLUDE:-/usr/include}
if [ ! -f "$cuda/include/cuda_runtime_api.h" ] || [ ! -f "$cuda/include/nccl.h" ]; then
  echo "check_cuda_syntax: no CUDA toolkit with NCCL at $cuda; skipped"
  exit 77
fi
shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$shim/c10/cuda/impl/cuda_cmake_macros.h"
includes=(-I "$root/src" -isystem "$shim")
# /usr/include is already on the search path; naming it again breaks #include_next.
[ "$torch_include" != /usr/include ] && includes+=(-isystem "$torch_include")
includes+=(-isystem "$torch_include/torch/csrc/api/include" -isystem "$cuda/include")
for src in "$root"/src/sana/dist/backend_cuda.cpp; do
  g++ -std=c++17 -fsyntax-only -Wall -Wextra -DUSE_C10D_GLOO -DUSE_C10D_NCCL \
    "${includes[@]}" "$src"
  echo "check_cuda_syntax: $(basename "$src") compiles against $torch_include and $cuda"
done
