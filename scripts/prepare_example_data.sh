#!/usr/bin/env bash
# Prepares the example dataset in data/example/ (or $1): real photographs and artwork from
# Debian's mate-backgrounds package (installed by install_deps.sh), 30 images from 1280x800
# to 5640x3172 at several aspect ratios, each with a caption in a sidecar .txt file.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/data/example}
src=/usr/share/backgrounds/mate

if [ ! -d "$src" ]; then
  echo "prepare_example_data: $src is missing; run scripts/install_deps.sh first" >&2
  exit 1
fi
if [ -f "$out/.complete" ]; then
  echo "prepare_example_data: $out is ready ($(cat "$out/.complete") images)"
  exit 0
fi

mkdir -p "$out"
count=0
for category in nature abstract desktop; do
  mkdir -p "$out/$category"
  for img in "$src/$category"/*; do
    case "$img" in *.jpg|*.jpeg|*.png) ;; *) continue ;; esac
    name=$(basename "${img%.*}")
    cp "$img" "$out/$category/"
    # "LadyBird" -> "lady bird", "Ubuntu-Mate-Cold-no-logo" -> "ubuntu mate cold no logo"
    words=$(echo "$name" | sed -E 's/([a-z])([A-Z])/\1 \2/g; s/[-_]+/ /g; s/ [0-9]+x[0-9]+$//' | tr 'A-Z' 'a-z')
    echo "$words, $category wallpaper" > "$out/$category/$name.txt"
    count=$((count + 1))
  done
done
echo "$count" > "$out/.complete"
echo "prepare_example_data: $count images with captions in $out"
