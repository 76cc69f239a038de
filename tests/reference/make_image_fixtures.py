"""Writes image files of every kind a dataset holds into argv[1], with PIL (Debian's
python3-pil), so the decoder is tested on files another library wrote: modes, depths,
EXIF orientation, and a corpus of bad files."""
import io
import os
import struct
import sys
import zlib

from PIL import Image

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def path(name):
    return os.path.join(out, name)


# Good files of unusual kinds, 120x80 (w x h) unless said otherwise.
Image.new("L", (120, 80), 200).save(path("gray.png"))
Image.new("RGBA", (120, 80), (255, 0, 0, 128)).save(path("rgba.png"))
Image.new("P", (120, 80), 3).save(path("palette.png"))
Image.new("CMYK", (120, 80), (0, 255, 255, 0)).save(path("cmyk.jpg"))
Image.new("I;16", (120, 80), 65535).save(path("sixteen.png"))
Image.new("RGB", (120, 80), (0, 0, 255)).save(path("plain.webp"))
Image.new("RGB", (120, 80), (0, 255, 0)).save(path("plain.bmp"))
Image.new("RGB", (120, 80), (0, 255, 0)).save(path("plain.gif"))
# Stored 120x80, left half red, right half blue; EXIF orientation 6 = rotate 90 clockwise
# for display, so it shows 80x120 with red on top.
img = Image.new("RGB", (120, 80), (255, 0, 0))
img.paste((0, 0, 255), (60, 0, 120, 80))
exif = Image.Exif()
exif[0x0112] = 6
img.save(path("rotated.jpg"), exif=exif.tobytes(), quality=95)
# A large photo-like JPEG for reduced decoding: a smooth gradient, 1600x1200.
grad = Image.linear_gradient("L").resize((1600, 1200)).convert("RGB")
grad.save(path("large.jpg"), quality=95)
# Progressive JPEGs with detail in every block (odd sizes, every chroma subsampling), as
# cameras and web encoders write them; one gray, one with an EXIF orientation.
fractal = Image.effect_mandelbrot((331, 203), (-2.0, -1.2, 1.0, 1.2), 60)
detail = Image.merge("RGB", (fractal, Image.linear_gradient("L").resize((331, 203)), fractal.rotate(180)))
for name, sub in (("420", 2), ("422", 1), ("444", 0)):
    detail.save(path(f"progressive{name}.jpg"), quality=90, progressive=True, subsampling=sub)
detail.convert("L").save(path("progressive_gray.jpg"), quality=90, progressive=True)
detail.save(path("progressive_rotated.jpg"), quality=90, progressive=True, exif=exif.tobytes())

# Bad files.
open(path("bad_empty.jpg"), "wb").close()
full = open(path("large.jpg"), "rb").read()
open(path("bad_truncated.jpg"), "wb").write(full[: len(full) // 2])
png = open(path("rgba.png"), "rb").read()
open(path("bad_truncated.png"), "wb").write(png[: len(png) - 20])
open(path("bad_text.jpg"), "w").write("not an image, just words\n" * 10)
open(path("bad_html.png"), "w").write("<html><body>404 Not Found</body></html>\n")
open(path("bad_random.webp"), "wb").write(os.urandom(3000))
# A JPEG with a valid start and end but garbage in between.
open(path("bad_corrupt.jpg"), "wb").write(full[:200] + os.urandom(5000) + b"\xff\xd9")
# A PNG whose header claims 100000 x 100000 pixels (a decompression bomb).
ihdr = struct.pack(">IIBBBBB", 100000, 100000, 8, 2, 0, 0, 0)
chunk = b"IHDR" + ihdr
bomb = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(ihdr)) + chunk + struct.pack(">I", zlib.crc32(chunk))
bomb += struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
open(path("bad_bomb.png"), "wb").write(bomb)
os.makedirs(path("bad_directory.jpg"), exist_ok=True)
print("ok")
