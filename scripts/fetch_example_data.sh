#!/usr/bin/env bash
# The larger example data (real, not synthetic), under data/ (git ignores it):
#   data/multiscale/     wallpaper photos from Debian's mate-backgrounds, ukui-wallpapers and
#                        gnome-backgrounds (256^2 to 5640x3172) plus deterministic crops at
#                        aspect ratios 1:4 to 4:1 -- a few thousand captioned samples and
#                        metadata.jsonl with their sizes
#   data/fashion_mnist/  Debian's dataset-fashion-mnist test set: 10,000 labelled 28x28 PNGs
# Packages are fetched with apt-get download and unpacked with dpkg -x (nothing installed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/python_env.sh"
out=${1:-$root/data}
cache=$out/.cache
if [ -f "$out/.fetched" ]; then
  echo "fetch_example_data: $out is ready ($(cat "$out/.fetched"))"
  exit 0
fi
mkdir -p "$cache/debs" "$cache/root"
packages=(mate-backgrounds ukui-wallpapers gnome-backgrounds dataset-fashion-mnist)
(
  cd "$cache/debs"
  # apt-get download runs as _apt where it can: let it write here.
  chmod 777 . 2>/dev/null || true
  if ! apt-get download "${packages[@]}" > /dev/null 2>&1; then
    apt-get update -q > /dev/null && apt-get download "${packages[@]}" > /dev/null
  fi
)
for deb in "$cache"/debs/*.deb; do dpkg -x "$deb" "$cache/root"; done
"$SANA_PYTHON" "$root/scripts/make_example_sets.py" "$cache/root" "$out" | tee "$out/.fetched.tmp"
tr '\n' ' ' < "$out/.fetched.tmp" > "$out/.fetched"
rm -f "$out/.fetched.tmp"
echo "fetch_example_data: done; index them with: sana-train index --input $out/multiscale/metadata.jsonl --output $out/multiscale.sidx"
