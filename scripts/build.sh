#!/usr/bin/env bash
# Configures and builds sana-train (and, by default, its tests) into build/ (or
# $SANA_BUILD_DIR) against the LibTorch of the project's virtual environment (pip's torch,
# CUDA compiled in; scripts/install_deps.sh makes it), found through
# torch.utils.cmake_prefix_path. Extra arguments go to CMake's configure step; a
# -DCMAKE_PREFIX_PATH of your own (another LibTorch 2.x, e.g. an unzipped CUDA zip) comes
# before the venv's. SANA_VENV (or SANA_PYTHON) names another environment.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/python_env.sh"
build_dir=${SANA_BUILD_DIR:-$root/build}
python=$SANA_PYTHON
[ -x "$python" ] || { echo "build: no Python at $python: run bash scripts/install_deps.sh" >&2; exit 2; }
torch_cmake=$("$python" -c 'import torch.utils; print(torch.utils.cmake_prefix_path)') ||
  { echo "build: $python cannot import torch: run bash scripts/install_deps.sh" >&2; exit 2; }
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
# A build folder configured against another LibTorch (an older checkout's Debian 1.13, say)
# keeps that one in its cache: start it afresh.
if [ -f "$build_dir/CMakeCache.txt" ]; then
  cached=$(sed -n 's/^Torch_DIR:PATH=//p' "$build_dir/CMakeCache.txt")
  if [ -n "$cached" ] && [ "${cached#"$torch_cmake"}" = "$cached" ] &&
     ! printf '%s\n' "$@" | grep -q -- '^-DCMAKE_PREFIX_PATH='; then
    echo "build: $build_dir was configured against $cached; configuring it afresh against $torch_cmake"
    rm -rf "$build_dir/CMakeCache.txt" "$build_dir/CMakeFiles"
  fi
fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" "-DCMAKE_PREFIX_PATH=$torch_cmake" \
        "-DSANA_PYTHON=$python" "$@"
elif [ "$#" -gt 0 ]; then
  cmake -S "$root" -B "$build_dir" "$@"
fi
# Two jobs: each torch unit takes ~1 GiB and the machines have 2 cores. SANA_BUILD_TARGET
# builds one target and what it needs (the quickstart: sana-train) instead of all.
target=()
[ -n "${SANA_BUILD_TARGET:-}" ] && target=(--target "$SANA_BUILD_TARGET")
cmake --build "$build_dir" -j "${SANA_BUILD_JOBS:-2}" "${target[@]}"
