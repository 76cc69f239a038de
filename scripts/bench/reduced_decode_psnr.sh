#!/usr/bin/env bash
# How far data.jpeg_reduced_decode (JPEGs decoded at 1/2-1/8 scale, then resized) is from
# the default (the whole JPEG decoded, then PIL's filter), on real photos: the bucket images
# of both, from `sana-train check-data --dump`, compared by PSNR (8-bit, over all values of
# each image), with each setting's decode rate.
#   scripts/bench/reduced_decode_psnr.sh [DIR=/usr/share/backgrounds/mate] [SIZE=512]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
dir=${1:-/usr/share/backgrounds/mate}
size=${2:-512}
bin=${SANA_BUILD_DIR:-$root/build}/apps/sana-train
cmake --build "${SANA_BUILD_DIR:-$root/build}" --target sana-train > /dev/null
work=$(mktemp -d /tmp/sana-psnr-XXXXXX)
trap 'rm -rf "$work"' EXIT
. "$root/tests/apps/pixel_config.sh"
pixel_config "$work/run" "$dir" "$size" "" 1 > "$work/c.yaml"
for mode in full reduced; do
  flag=false
  [ "$mode" = reduced ] && flag=true
  timeout 900 "$bin" check-data --config "$work/c.yaml" --dump "$work/$mode" --data.jpeg_reduced_decode=$flag \
    2>/dev/null | grep "images/s" | sed "s/^/$mode: /"
done
"$SANA_PYTHON" - "$work" <<'EOF'
import math, os, sys
import numpy as np
from PIL import Image
work = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(os.path.join(work, "full", "dump.tsv"))][1:]
psnrs = []
for sid, path, h, w, name in (row[:5] for row in rows):
    if not path.lower().endswith((".jpg", ".jpeg")):
        continue
    a = np.asarray(Image.open(os.path.join(work, "full", name)), dtype=np.float64)
    b = np.asarray(Image.open(os.path.join(work, "reduced", name)), dtype=np.float64)
    mse = np.mean((a - b) ** 2)
    psnrs.append(float("inf") if mse == 0 else 10 * math.log10(255.0 ** 2 / mse))
finite = [p for p in psnrs if math.isfinite(p)]
print("reduced vs full decode, %d JPEGs: PSNR median %.1f dB, min %.1f dB, max %.1f dB (%d identical)" %
      (len(psnrs), float(np.median(finite)) if finite else float("inf"), min(finite, default=float("inf")),
       max(finite, default=float("inf")), len(psnrs) - len(finite)))
EOF
