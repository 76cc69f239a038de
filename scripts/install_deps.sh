#!/usr/bin/env bash
# Installs every dependency of sana-train from Debian's package registry.
# Idempotent: a second run installs nothing and takes seconds.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libtorch-dev libgloo-dev
  libyaml-cpp-dev libcli11-dev libopencv-dev libjpeg-dev libpng-dev libfmt-dev
  libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libxxhash-dev zlib1g-dev catch2 libsentencepiece-dev python3-sentencepiece
  libopenblas0-pthread
  openmpi-bin python3-torch python3-torchvision python3-numpy python3-pil
  mate-backgrounds dataset-fashion-mnist time gnuplot-nox universal-ctags
  iproute2 clang-14 libclang-rt-14-dev
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi

if [ "${#missing[@]}" -gt 0 ]; then
  echo "install_deps: installing ${#missing[@]} package(s): ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  echo "install_deps: all ${#packages[@]} packages present"
fi

# Debian's LibTorch calls whichever libblas.so.3 the alternatives system selects.
# The reference BLAS is ~14x slower on a DiT step than OpenBLAS: select OpenBLAS.
arch_dir=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
openblas="/usr/lib/${arch_dir}/openblas-pthread/libblas.so.3"
if [ -e "$openblas" ]; then
  current=$(readlink -f "/usr/lib/${arch_dir}/libblas.so.3" || true)
  if [ "$current" != "$(readlink -f "$openblas")" ]; then
    echo "install_deps: selecting OpenBLAS for libblas.so.3 (was ${current:-none})"
    "${sudo_cmd[@]}" update-alternatives --set "libblas.so.3-${arch_dir}" "$openblas"
  fi
else
  echo "install_deps: warning: $openblas not found; LibTorch will use a slow BLAS" >&2
fi
