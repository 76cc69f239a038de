#!/usr/bin/env bash
# Builds this tree and runs its test suite against Debian trixie's LibTorch 2.6 (c10d with
# Gloo, Catch2 v3, python3-torch 2.6 for the reference tests) in a debootstrap chroot kept
# outside the repository (SANA_TRIXIE_ROOT, default /var/cache/sana-trixie; made on the
# first run, ~2 min plus packages). Needs root. Extra arguments go to ctest (e.g. -R unit).
# The fault-injection trials run 3 per fault here (SANA_FAULT_TRIALS; 10 in the main suite).
#   bash scripts/compat/libtorch26_test.sh [CTEST ARGS...]      the whole suite
#   bash scripts/compat/libtorch26_test.sh --ci [CTEST ARGS...] what CI runs (.ci/run)
# --ci: every unit, torch (but the two slow ones named below), reference and config-error test (each LibTorch API we call, the
# numerics against python3-torch 2.6) and the "compat" label: the multi-process runs whose
# outcome rests on this LibTorch's Gloo or trixie's launchers (determinism across world
# sizes, DDP's gradients, a hung rank, a killed rank, TensorBoard, mpirun;
# tests/CMakeLists.txt lists them). What checks our own logic through the binary (apps.*,
# resume, the other faults, soak, elastic, two nodes, launchers, store) runs once, on the
# main LibTorch, in scripts/test.sh --all.
set -euo pipefail
ci_tier=""
ci_exclude=""
unit_once=""
if [ "${1:-}" = --ci ]; then
  shift
  ci_tier='fast|compat'
  # Two slow torch cases run on the main LibTorch only: the 40-step training run (the compat
  # runs train through the binary here) and the float64 finite differences (reference.*
  # checks 2.6's numerics against python3-torch 2.6): 245 s and 177 s here, 78 s and 9 s there.
  # build.test_inventory checks the main build's discovery (Catch2 2.13's), not 2.6's.
  # The torch-free unit tests (sana_unit_tests: trixie's compiler, Catch2 v3, OpenCV, libpng)
  # run as one process before ctest, not one process per case (140 of them: 190 s summed).
  ci_exclude='^(unit\..*|apps\..*|build\.test_inventory|dist\.resume|dist\.faults_(sigstop|term_launcher|ckpt_kill)|torch\.a short training run on real images lowers the loss|torch\.float64 gradients agree with finite differences)$'
  export SANA_FAULT_TRIALS=${SANA_FAULT_TRIALS:-1}
  unit_once="timeout 600 /src/build-sana/tests/sana_unit_tests && "
fi
repo=$(cd "$(dirname "$0")/../.." && pwd)
root=${SANA_TRIXIE_ROOT:-/var/cache/sana-trixie}
mirror=${SANA_TRIXIE_MIRROR:-http://deb.debian.org/debian}
packages=(libtorch-dev libgloo-dev g++ cmake ninja-build pkg-config libyaml-cpp-dev libcli11-dev libopencv-dev libjpeg-dev
          libpng-dev libprotobuf-dev protobuf-compiler
          libfmt-dev nlohmann-json3-dev libxxhash-dev zlib1g-dev catch2 libsentencepiece-dev python3-sentencepiece libopenblas0-pthread openmpi-bin python3-torch
          python3-numpy python3-pil gnuplot-nox mate-backgrounds dataset-fashion-mnist procps time)
if [ ! -x "$root/usr/bin/apt-get" ]; then
  command -v debootstrap > /dev/null || apt-get install -y -q debootstrap
  echo "libtorch26_test: creating a trixie chroot in $root"
  debootstrap --variant=minbase trixie "$root" "$mirror"
fi
cleanup() { for m in proc dev sys; do umount "$root/$m" 2>/dev/null || true; done; }
trap cleanup EXIT
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
# /sys for hwloc: without it mpirun prints "hwloc/linux: failed to find sysfs cpu topology".
mountpoint -q "$root/sys" || mount --bind /sys "$root/sys"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
missing=""
for p in "${packages[@]}"; do
  chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=" $p"
done
if [ -n "$missing" ]; then
  echo "libtorch26_test: installing into the chroot:" $missing
  chroot "$root" bash -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -q && apt-get install -y -q --no-install-recommends $missing"
fi
# OpenBLAS as libblas.so.3, as scripts/install_deps.sh does on the host.
blas=$(chroot "$root" bash -c 'ls /usr/lib/*/openblas-pthread/libblas.so.3 2>/dev/null | head -1')
[ -n "$blas" ] && chroot "$root" update-alternatives --set "libblas.so.3-$(basename "$(dirname "$(dirname "$blas")")")" "$blas" > /dev/null 2>&1 || true
# The committed tree (HEAD). The build folder stays between runs, so a rerun is incremental:
# only files whose content changed are copied, stamped now (git archive's stamps are the
# commit's time, which can be older than the last build's objects), and gone ones removed.
stage=$(mktemp -d)
trap 'cleanup; rm -rf "$stage"' EXIT
git -C "$repo" archive HEAD | tar -x -C "$stage"
dst=$root/src/sana
mkdir -p "$dst"
(cd "$stage" && find . -type f) | while IFS= read -r f; do
  cmp -s "$stage/$f" "$dst/$f" || { mkdir -p "$(dirname "$dst/$f")" && cp "$stage/$f" "$dst/$f"; }
done
(cd "$dst" && find . -type f) | while IFS= read -r f; do [ -e "$stage/$f" ] || rm -f "$dst/$f"; done
[ -n "$ci_tier" ] && set -- -L "$ci_tier" -E "$ci_exclude" "$@"
ctest_args=$(printf '%q ' "$@")
chroot "$root" bash -c "cd /src/sana && python3 -c 'import torch; print(\"python3-torch\", torch.__version__)' && \
  cmake -S . -B /src/build-sana -G Ninja -DSANA_BUILD_TESTS=ON > /dev/null && \
  cmake --build /src/build-sana -j\$(nproc) && cd /src/build-sana && $unit_once\
  SANA_FAULT_TRIALS=\${SANA_FAULT_TRIALS:-3} ctest --output-on-failure $ctest_args"
