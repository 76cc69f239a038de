#!/usr/bin/env bash
# Upstream's pixels: the bucket images `sana-train check-data --dump` writes, against the
# transform NVlabs/Sana's dataset applies, run with Debian's python3-pil and torchvision
# (tests/reference/pil_pixels.py). Sources: 6 of the example photos (mate-backgrounds,
# JPEG and PNG, 1900x1200 to 5640x3172) and images generated here (gray, gray+alpha, RGBA,
# palette, 16-bit RGB, EXIF-rotated JPEG and PNG, progressive and gray JPEGs, a small one
# that is enlarged, a 1 x 300 strip). Checked:
#   1. ASPECT_RATIO_512 (BICUBIC): PNG sources equal, JPEG sources within 1 level;
#   2. ASPECT_RATIO_2048 (LANCZOS) on five sources, the same limits;
#   3. a single square bucket (model.multi_scale false: upstream's BILINEAR), the same;
#   4. data.exif_orientation true against PIL with ImageOps.exif_transpose;
#   5. --dump on a latent-feature config exits 2 naming data.load_vae_feat.
# Every command runs under `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
. "$(dirname "$0")/pixel_config.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=$SANA_PYTHON
PHOTOS=/usr/share/backgrounds/mate
W=$SCRATCH/$TOKEN
mkdir -p "$W/images"

# Six photos: progressive (5640x3172) and baseline JPEGs; RGBA, gray+alpha and RGB PNGs.
for f in abstract/Elephants_5640x3172.jpg nature/Storm.jpg desktop/GreenTraditional.jpg abstract/Gulp.png \
         desktop/Stripes.png desktop/Ubuntu-Mate-Dark-no-logo.png; do
  cp "$PHOTOS/$f" "$W/images/" || fail "no $PHOTOS/$f (mate-backgrounds)"
done

cat > "$W/make.py" <<'EOF'
import struct, sys, zlib
import numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.RandomState(7)
def picture(w, h):
    """Smooth gradients plus detail, so that every filter tap matters."""
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 3) % 256], -1)
    noise = rng.randint(-40, 40, (h, w, 3))
    return np.clip(base + noise, 0, 255).astype(np.uint8)
Image.fromarray(picture(700, 500)[:, :, 0]).save(d + "/gray.png")
Image.fromarray(picture(480, 640)[:, :, :2]).convert("LA").save(d + "/gray_alpha.png")
rgba = np.dstack([picture(900, 300), rng.randint(0, 256, (300, 900)).astype(np.uint8)])
Image.fromarray(rgba, "RGBA").save(d + "/rgba.png")
Image.fromarray(picture(640, 640)).convert("P", palette=Image.ADAPTIVE, colors=200).save(d + "/palette.png")
# 16-bit RGB, written by hand (PIL writes no 16-bit colour PNGs).
a = (picture(520, 390).astype(np.uint16) * 257 + rng.randint(0, 256, (390, 520, 3))).astype(np.uint16)
raw = b"".join(b"\x00" + a[y].astype(">u2").tobytes() for y in range(a.shape[0]))
def chunk(t, body): return struct.pack(">I", len(body)) + t + body + struct.pack(">I", zlib.crc32(t + body) & 0xFFFFFFFF)
with open(d + "/sixteen_rgb.png", "wb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 520, 390, 16, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
exif = Image.Exif(); exif[0x0112] = 6
Image.fromarray(picture(800, 450)).save(d + "/exif_rot6.jpg", quality=92, exif=exif.tobytes())
Image.fromarray(picture(450, 800)).save(d + "/exif_rot6.png", exif=exif.tobytes())
Image.fromarray(picture(1000, 700)).save(d + "/progressive.jpg", quality=90, progressive=True)
Image.fromarray(picture(600, 900)[:, :, 1]).save(d + "/gray.jpg", quality=85)
Image.fromarray(picture(90, 60)).save(d + "/small.png")       # enlarged to its bucket
Image.fromarray(picture(1, 300)).save(d + "/strip.png")       # 1 x 300: beyond every table
EOF
if ! timeout 120 "$PY" "$W/make.py" "$W/images" > "$W/make.log" 2>&1; then
  fail "writing the test images"; cat "$W/make.log"; finish
fi
n_images=$(find "$W/images" -type f | wc -l)
echo "images: $n_images in $W/images"

# config NAME: a pixel-space config over the images (tests/apps/pixel_config.sh).
config() { pixel_config "$W/work_$1" "$W/images" 512 > "$W/$1.yaml"; }

# dump_and_compare NAME FILTER [PIL ARGS] -- [sana-train overrides]
dump_and_compare() {
  local name=$1 filter=$2
  shift 2
  local pyargs=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do pyargs+=("$1"); shift; done
  [ "${1:-}" = "--" ] && shift
  config "$name"
  local log=$W/$name.log
  timeout -k 5 300 "$BIN" check-data --config "$W/$name.yaml" --dump "$W/dump_$name" "$@" "$TOKEN_ARG" > "$log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then fail "$name: check-data --dump exited $rc"; tail -20 "$log"; return; fi
  local dumped
  dumped=$(($(wc -l < "$W/dump_$name/dump.tsv") - 1))
  if [ "$dumped" -eq "$n_images" ]; then pass "$name: every image dumped ($dumped)"
  else fail "$name: $dumped images dumped, $n_images in the folder"; fi
  if timeout 600 "$PY" "$ROOT/tests/reference/pil_pixels.py" "$W/dump_$name" --filter "$filter" "${pyargs[@]}" \
      > "$W/$name.compare" 2>&1; then
    pass "$name: $(tail -1 "$W/$name.compare")"
  else
    fail "$name: the pixels differ from upstream's transform"; grep -v '^ok' "$W/$name.compare" | head -20
  fi
}
TOKEN_ARG=--work_dir=$W/$TOKEN  # puts the token on the command line (lib.sh's cleanup)

dump_and_compare table512 bicubic -- --data.image_size=512 --model.image_size=512 \
  --data.aspect_ratio_type=ASPECT_RATIO_512
dump_and_compare exif bicubic --exif-transpose -- --data.image_size=512 --model.image_size=512 \
  --data.exif_orientation=true
dump_and_compare square bilinear -- --data.image_size=256 --model.image_size=256 --model.multi_scale=false \
  --data.aspect_ratio_type=ASPECT_RATIO_256

# The 2048 table on five sources (its buckets are large: 4 to 17 MP each).
mkdir -p "$W/few"
for f in gray.png rgba.png exif_rot6.jpg progressive.jpg strip.png; do mv "$W/images/$f" "$W/few/"; done
rm -rf "$W/images"; mv "$W/few" "$W/images"; n_images=5
dump_and_compare table2048 lanczos -- --data.image_size=2048 --model.image_size=2048 \
  --data.aspect_ratio_type=ASPECT_RATIO_2048

# --dump needs pixels.
config latents
log=$W/latents.log
timeout -k 5 60 "$BIN" check-data --config "$W/latents.yaml" --dump "$W/dump_latents" --data.load_vae_feat=true \
  --data.image_size=1024 --model.image_size=1024 --data.aspect_ratio_type=ASPECT_RATIO_1024 \
  "$TOKEN_ARG" > "$log" 2>&1
rc=$?
if [ "$rc" -eq 2 ] && grep -q "data.load_vae_feat" "$log"; then pass "--dump on precomputed latents: exit 2 naming the key"
else fail "--dump on precomputed latents: exit $rc"; tail -5 "$log"; fi
finish
