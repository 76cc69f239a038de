#!/usr/bin/env bash
# Installs every dependency of sana-train:
#   - the C++ libraries and tools from Debian's package registry;
#   - pip's torch (its LibTorch, CUDA 13.0 compiled in) and the Python packages the tests use
#     as references and judges, from PyPI, exactly as python/requirements.lock pins them
#     (versions and sha256 hashes), into the project's virtual environment $SANA_VENV
#     (default .venv in the repository root).
# Idempotent: a second run installs nothing and takes seconds (the venv records the lock it
# was made from in .venv/sana-lock.sha256; a changed lock reinstalls what changed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

packages=(
  build-essential cmake ninja-build pkg-config
  libgloo-dev
  libyaml-cpp-dev libcli11-dev libopencv-dev libjpeg-dev libpng-dev libfmt-dev
  libprotobuf-dev protobuf-compiler
  nlohmann-json3-dev libxxhash-dev zlib1g-dev catch2 libsentencepiece-dev
  openmpi-bin python3-venv python3-pip
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
  echo "install_deps: all ${#packages[@]} Debian packages present"
fi

# ---- PyPI: the project's virtual environment --------------------------------------------
# Debian's own Python makes it (not whatever python3 is first on PATH), so that the venv is
# the same on every machine of this kind.
venv=${SANA_VENV:-$root/.venv}
lock=$root/python/requirements.lock
want=$(sha256sum "$lock" | cut -d' ' -f1)
stamp=$venv/sana-lock.sha256
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$venv/bin/python" ]; then
  echo "install_deps: $venv matches python/requirements.lock"
  exit 0
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "install_deps: making the virtual environment $venv"
  /usr/bin/python3 -m venv "$venv"
fi
start=$(date +%s)
echo "install_deps: installing python/requirements.lock into $venv (torch with CUDA: ~5 GiB)"
# --no-deps: the lock already lists every package pip resolved, each with its hash.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --require-hashes --no-deps \
  --only-binary=:all: -r "$lock"
"$venv/bin/python" -m pip check --disable-pip-version-check > "$venv/pip-check.log" 2>&1 ||
  { cat "$venv/pip-check.log" >&2; echo "install_deps: the lock's packages do not fit together (python/lock.py)" >&2; exit 1; }
echo "$want" > "$stamp"
echo "install_deps: $venv ready in $(( $(date +%s) - start )) s: $("$venv/bin/python" -c \
  'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda)' 2>/dev/null)"
