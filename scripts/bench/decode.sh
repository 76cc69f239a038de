#!/usr/bin/env bash
# Decode + bucket transform of real photos, images/s on one core: sana-train's decoder,
# a plain full-resolution OpenCV decode, and the torchvision pipeline, on the same files.
#   scripts/bench/decode.sh [DIR=/usr/share/backgrounds/mate] [ROUNDS=3]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
dir=${1:-/usr/share/backgrounds/mate}
rounds=${2:-3}
cmake --build "${SANA_BUILD_DIR:-$root/build}" --target bench_decode > /dev/null
"${SANA_BUILD_DIR:-$root/build}/apps/bench_decode" "$dir" "$rounds" 512 2>/dev/null
table="0.25:256:1024,0.26:256:992,0.27:256:960,0.28:256:928,0.32:288:896,0.33:288:864,0.35:288:832,0.4:320:800,0.42:320:768,0.48:352:736,0.5:352:704,0.52:352:672,0.57:384:672,0.6:384:640,0.68:416:608,0.72:416:576,0.78:448:576,0.82:448:544,0.88:480:544,0.94:480:512,1.0:512:512,1.07:512:480,1.13:544:480,1.21:544:448,1.29:576:448,1.38:576:416,1.46:608:416,1.67:640:384,1.75:672:384,2.0:704:352,2.09:736:352,2.4:768:320,2.5:800:320,2.89:832:288,3.0:864:288,3.11:896:288,3.62:928:256,3.75:960:256,3.88:992:256,4.0:1024:256"
"$SANA_PYTHON" "$root/scripts/bench/decode.py" "$dir" "$rounds" "$table" 2>/dev/null
