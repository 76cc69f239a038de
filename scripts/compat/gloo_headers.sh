#!/usr/bin/env bash
# Installs Gloo's headers into DEST/gloo at the Gloo commit that PyTorch vVERSION pins
# (its third_party/gloo submodule), with the config.h that Gloo's CMake configure step
# generates. Needed for LibTorch builds other than Debian's: the official zips and the pip
# wheels ship torch/csrc/distributed/c10d/ProcessGroupGloo.hpp, which includes
# <gloo/...>, but not Gloo's headers (PyTorch builds Gloo statically with GLOO_INSTALL
# OFF, see its cmake/Dependencies.cmake). Debian's LibTorch has them from libgloo-dev.
# Needs git, cmake, a C/C++ compiler (for the configure step only) and access to github.com
# (or mirrors: SANA_PYTORCH_GIT, SANA_GLOO_GIT).
#   bash scripts/compat/gloo_headers.sh 2.6.0 /opt/libtorch/include
#   bash scripts/compat/gloo_headers.sh 2.6.0+cu126 ~/.cache/sana-train/gloo-2.6.0/include
set -euo pipefail
usage="usage: gloo_headers.sh TORCH_VERSION DEST_INCLUDE_DIR"
version=${1:?$usage}
dest=${2:?$usage}
version=${version%%+*}  # 2.6.0+cu126 -> 2.6.0
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A blobless, shallow clone holds the tree, and the tree holds the submodule's commit.
pytorch_git=${SANA_PYTORCH_GIT:-https://github.com/pytorch/pytorch}
if ! git clone -q --depth 1 --branch "v$version" --filter=blob:none --no-checkout \
    "$pytorch_git" "$work/pytorch"; then
  echo "gloo_headers: cannot fetch PyTorch's tag v$version from $pytorch_git" >&2
  exit 1
fi
commit=$(git -C "$work/pytorch" ls-tree HEAD third_party/gloo | awk '$2 == "commit" { print $3 }')
if [ -z "$commit" ]; then
  echo "gloo_headers: PyTorch v$version has no third_party/gloo submodule" >&2
  exit 1
fi
git init -q "$work/gloo"
git -C "$work/gloo" fetch -q --depth 1 "${SANA_GLOO_GIT:-https://github.com/pytorch/gloo}" "$commit"
git -C "$work/gloo" checkout -q FETCH_HEAD

# Configure only (Gloo itself is not built): Linux defaults, TCP transport, no CUDA/ibverbs/MPI.
# Those switches shape only Gloo's own sources and its CUDA headers, which sana-train
# never includes.
if ! cmake -S "$work/gloo" -B "$work/build" > "$work/cmake.log" 2>&1; then
  cat "$work/cmake.log" >&2
  exit 1
fi
mkdir -p "$dest"
(cd "$work/gloo" && find gloo -name '*.h' -exec cp --parents {} "$dest/" \;)
cp "$work/build/gloo/config.h" "$dest/gloo/config.h"
echo "$commit" > "$dest/gloo/PYTORCH_GLOO_COMMIT"
echo "gloo_headers: Gloo $commit (pinned by PyTorch v$version) installed in $dest/gloo"
