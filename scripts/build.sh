#!/usr/bin/env bash
# Configures and builds sana-train (and, by default, its tests) into build/ (or
# $SANA_BUILD_DIR). Extra arguments go to CMake's configure step, e.g.
# -DCMAKE_PREFIX_PATH=/opt/libtorch for another LibTorch.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=${SANA_BUILD_DIR:-$root/build}
generator=()
if command -v ninja >/dev/null 2>&1; then generator=(-G Ninja); fi
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S "$root" -B "$build_dir" "${generator[@]}" "$@"
elif [ "$#" -gt 0 ]; then
  cmake -S "$root" -B "$build_dir" "$@"
fi
# Two jobs: each torch unit takes ~1 GiB and the machines have 2 cores. SANA_BUILD_TARGET
# builds one target and what it needs (the quickstart: sana-train) instead of all.
target=()
[ -n "${SANA_BUILD_TARGET:-}" ] && target=(--target "$SANA_BUILD_TARGET")
cmake --build "$build_dir" -j "${SANA_BUILD_JOBS:-2}" "${target[@]}"
