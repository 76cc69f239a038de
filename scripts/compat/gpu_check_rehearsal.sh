#!/usr/bin/env bash
# The GPU check's rehearsal (scripts/gpu_check.sh --rehearse): proves the device kit is
# complete by running the check's build and its CPU rows in a bare Debian 12 root that has a
# compiler, cmake, ninja, python3 and a LibTorch, and none of sana-train's other libraries:
# only .kit is carried in, as on a borrowed GPU machine. A script for a person, not a test.
#   bash scripts/gpu_check.sh --rehearse [OUT_DIR]   (default output/gpu_check_rehearsal)
# The LibTorch is the GPU machine's kind: pip's torch in a venv at /opt/torch/.venv (this
# checkout's .venv, bind-mounted read-only: the same Debian 12 Python), with the CUDA
# toolkit's folder bind-mounted as /usr/local/cuda (the build needs nvcc; a GPU it does not).
# Needs root (debootstrap, chroot, mounts). The root is kept between runs
# (SANA_BARE_ROOT, default /var/cache/sana-bare-bookworm), and so is its build folder.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
root=${SANA_BARE_ROOT:-/var/cache/sana-bare-bookworm}
mirror=${SANA_KIT_MIRROR:-http://deb.debian.org/debian}
out=$(mkdir -p "${1:-$repo/output/gpu_check_rehearsal}" && cd "${1:-$repo/output/gpu_check_rehearsal}" && pwd)
say() { echo "gpu_check_rehearsal: $*"; }
die() { echo "gpu_check_rehearsal: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "needs root (debootstrap, chroot)"
[ -d "$repo/.kit/usr" ] || die "no device kit in $repo/.kit: run bash scripts/device_kit.sh first"
[ -x "$repo/.venv/bin/python" ] || die "no $repo/.venv: run bash scripts/install_deps.sh first"
cuda=$(readlink -f /usr/local/cuda)
[ -x "$cuda/bin/nvcc" ] || die "no CUDA toolkit at /usr/local/cuda (the build needs nvcc)"
start=$(date +%s)

if [ ! -f "$root/.sana-bare-ready-2" ]; then
  command -v debootstrap > /dev/null || apt-get install -y -q debootstrap
  rm -rf "$root"
  say "a bare bookworm root in $root: minbase, a compiler, cmake, ninja, python3"
  debootstrap --variant=minbase --include=g++,make,cmake,ninja-build,python3,procps bookworm "$root" "$mirror" \
    > "$out/debootstrap.log" 2>&1 || { tail -n 20 "$out/debootstrap.log" >&2; die "debootstrap failed"; }
  cp /etc/resolv.conf "$root/etc/resolv.conf" 2> /dev/null || true
  touch "$root/.sana-bare-ready-2"
fi
# Bare: none of the kit's libraries' headers are in the root.
found=""
for h in yaml-cpp/yaml.h fmt/format.h CLI/CLI.hpp nlohmann/json.hpp catch2/catch.hpp catch2/catch_all.hpp xxhash.h \
         google/protobuf/message.h zlib.h png.h jpeglib.h gloo/algorithm.h opencv4/opencv2/core.hpp; do
  [ -e "$root/usr/include/$h" ] || [ -e "$root/usr/local/include/$h" ] && found+=" $h"
done
[ -z "$found" ] || die "the root is not bare, it has:$found"
say "the root holds none of the kit's headers"

cleanup() { for m in proc dev sys opt/torch/.venv usr/local/cuda; do umount "$root/$m" 2> /dev/null || true; done; }
trap cleanup EXIT
mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
mountpoint -q "$root/dev" || mount --bind /dev "$root/dev"
mountpoint -q "$root/sys" || mount --bind /sys "$root/sys"
mkdir -p "$root/opt/torch/.venv" "$root/usr/local/cuda"
mountpoint -q "$root/opt/torch/.venv" || mount --bind -o ro "$repo/.venv" "$root/opt/torch/.venv"
mountpoint -q "$root/usr/local/cuda" || mount --bind -o ro "$cuda" "$root/usr/local/cuda"
# The committed tree (a clean clone's files) and the kit, nothing else.
rm -rf "$root/work/repo.new" && mkdir -p "$root/work/repo.new"
git -C "$repo" archive HEAD | tar -x -C "$root/work/repo.new"
cp -a "$repo/.kit" "$root/work/repo.new/.kit"
# The build folder stays between runs (incremental); the tree is replaced.
[ -d "$root/work/repo/build-gpu" ] && mv "$root/work/repo/build-gpu" "$root/work/repo.new/"
rm -rf "$root/work/repo" && mv "$root/work/repo.new" "$root/work/repo"
rm -rf "$root/work/out"
say "running gpu_check.sh in the root (SANA_CHECK_ALLOW_CPU=1)"
set +e
chroot "$root" env -i PATH=/opt/torch/.venv/bin:/usr/local/cuda/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root SANA_CHECK_ALLOW_CPU=1 \
  bash -c 'cd /work/repo && bash scripts/gpu_check.sh /work/out' 2>&1 | tee "$out/check.log"
rc=${PIPESTATUS[0]}
set -e
cp "$root/work/out/table.md" "$root/work/out/table.json" "$out/" 2> /dev/null || true
cp "$root"/work/out/*.log "$out/" 2> /dev/null || true
say "exit $rc in $(( $(date +%s) - start )) s; table: $out/table.md"
exit "$rc"
