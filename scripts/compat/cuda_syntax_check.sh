#!/usr/bin/env bash
# Compiles every CUDA-only source (SANA_CUDA_SOURCES in src/CMakeLists.txt) in syntax-only
# mode, on machines without a CUDA LibTorch or a GPU, against two sets of headers:
#   1.13  Debian 12's libtorch-dev (/usr/include). It has no c10/cuda/impl/cuda_cmake_macros.h
#         (a CPU build): a one-line shim stands in.
#   2.6   Debian trixie's libtorch-cuda-dev and libgloo-dev, downloaded with apt-get (its own
#         config and state, nothing installed) and unpacked with dpkg -x into
#         SANA_CUDA_HEADERS_CACHE (default /var/cache/sana-cuda-headers), once.
# Both with the CUDA toolkit at CUDA_HOME (default /usr/local/cuda), which must have nccl.h.
# And the CUDA-only tests (SANA_CUDA_TEST_SOURCES in tests/CMakeLists.txt: e.g. fp32 linear
# attention under CUDA autocast), with Catch2's headers. Also fails when a source under src/
# includes CUDA headers but is not in the list (it would be compiled by CMake on no machine
# we can check). Exit 77 (skipped) without a CUDA toolkit.
#   bash scripts/compat/cuda_syntax_check.sh [1.13|2.6]...   (default: both)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
cache=${SANA_CUDA_HEADERS_CACHE:-/var/cache/sana-cuda-headers}
mirror=${SANA_TRIXIE_MIRROR:-http://deb.debian.org/debian}
sets=("$@")
[ ${#sets[@]} -eq 0 ] && sets=(1.13 2.6)
say() { echo "cuda_syntax_check: $*"; }

if [ ! -f "$cuda/include/cuda_runtime_api.h" ] || [ ! -f "$cuda/include/nccl.h" ]; then
  say "no CUDA toolkit with NCCL at $cuda (set CUDA_HOME); skipped"
  exit 77
fi

# The list CMake builds with a CUDA LibTorch.
sources=$(sed -n '/^set(SANA_CUDA_SOURCES/,/)/p' "$repo/src/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.cpp$' || true)
[ -n "$sources" ] || { say "no SANA_CUDA_SOURCES list in src/CMakeLists.txt"; exit 1; }
tests=$(sed -n '/^set(SANA_CUDA_TEST_SOURCES/,/)/p' "$repo/tests/CMakeLists.txt" | tr ' ()' '\n\n\n' | grep '\.cpp$' || true)
[ -n "$tests" ] || { say "no SANA_CUDA_TEST_SOURCES list in tests/CMakeLists.txt"; exit 1; }
cuda_includers=$(cd "$repo/src" && grep -rlE '#include [<"](c10/cuda/|ATen/cuda/|cuda_runtime|nccl\.h|torch/csrc/distributed/c10d/ProcessGroupNCCL)' sana | sort)
unlisted=$(comm -23 <(echo "$cuda_includers") <(echo "$sources" | sort))
if [ -n "$unlisted" ]; then
  say "these include CUDA headers but are not in SANA_CUDA_SOURCES (src/CMakeLists.txt):" $unlisted
  exit 1
fi

# Trixie's CUDA LibTorch headers, fetched once.
fetch_trixie_headers() {
  local root=$cache/root apt=$cache/apt
  [ -f "$root/usr/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp" ] && [ -d "$root/usr/include/gloo" ] && return 0
  say "downloading trixie's libtorch-cuda-dev and libgloo-dev headers into $cache"
  mkdir -p "$apt/etc" "$apt/state/lists/partial" "$apt/cache/archives/partial" "$cache/debs"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror trixie main contrib" > "$apt/etc/sources.list"
  local opts=(-q -o "Dir::Etc::sourcelist=$apt/etc/sources.list" -o Dir::Etc::sourceparts=/nonexistent
              -o "Dir::State=$apt/state" -o "Dir::Cache=$apt/cache" -o Dir::State::status=/dev/null
              -o APT::Sandbox::User=root -o Debug::NoLocking=1)
  apt-get "${opts[@]}" update > "$cache/apt-update.log" 2>&1 || { cat "$cache/apt-update.log"; return 1; }
  (cd "$cache/debs" && apt-get "${opts[@]}" download libtorch-cuda-dev libgloo-dev)
  rm -rf "$root.new" && mkdir -p "$root.new"
  for deb in "$cache"/debs/*.deb; do dpkg -x "$deb" "$root.new"; done
  rm -rf "$root" && mv "$root.new" "$root"
}

shim=$(mktemp -d)
trap 'rm -rf "$shim"' EXIT
mkdir -p "$shim/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$shim/c10/cuda/impl/cuda_cmake_macros.h"

status=0
for set in "${sets[@]}"; do
  case "$set" in
    1.13)
      [ -f /usr/include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp ] || { say "no LibTorch headers in /usr/include (libtorch-dev)"; exit 1; }
      # /usr/include is on the search path already; naming it again breaks #include_next.
      includes=(-isystem "$shim" -isystem /usr/include/torch/csrc/api/include) ;;
    2.6)
      fetch_trixie_headers
      includes=(-isystem "$cache/root/usr/include" -isystem "$cache/root/usr/include/torch/csrc/api/include") ;;
    *) say "unknown header set $set (1.13 or 2.6)"; exit 2 ;;
  esac
  version=$(printf '#include <torch/version.h>\nTORCH_VERSION_MAJOR.TORCH_VERSION_MINOR.TORCH_VERSION_PATCH\n' |
            g++ -E -P "${includes[@]}" -x c++ - | tail -1 | tr -d ' ')
  for src in $sources $tests; do
    file=$repo/src/$src
    [ -f "$file" ] || file=$repo/tests/$src
    start=$(date +%s)
    if g++ -std=c++17 -fsyntax-only -Wall -Wextra -Werror -DUSE_C10D_GLOO -DUSE_C10D_NCCL -DUSE_CUDA \
        -I "$repo/src" -I "$repo/tests/unit" "${includes[@]}" -isystem "$cuda/include" "$file"; then
      say "ok   $src against LibTorch $version headers and $(basename "$(readlink -f "$cuda")") ($(( $(date +%s) - start )) s)"
    else
      say "FAIL $src against LibTorch $version headers"
      status=1
    fi
  done
done
exit $status
