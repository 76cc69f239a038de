#!/usr/bin/env python3
"""Copies of the example photos (Debian's mate-backgrounds) shrunk to at most MAX_SIDE px,
for the multi-process tests where the photos' pixel count does not matter: the same
folders, names, formats and aspect ratios (within one pixel of rounding), decoding ~50x
faster. Full-size decoding is a third of a 2-process run's CPU with the originals
(5640x3172 at most); the tests that are about decoding keep the originals.

    .venv/bin/python tests/dist/make_test_photos.py OUT [SRC [MAX_SIDE]]

Writes OUT atomically (a sibling folder renamed into place); a complete OUT is kept.
"""
import os
import pathlib
import shutil
import sys

from PIL import Image

out = pathlib.Path(sys.argv[1])
src = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else "/usr/share/backgrounds/mate")
max_side = int(sys.argv[3]) if len(sys.argv) > 3 else 512
if (out / ".complete").exists():
    print(f"make_test_photos: {out} is there")
    sys.exit(0)
tmp = out.with_name(out.name + f".tmp{os.getpid()}")
count = 0
for path in sorted(src.rglob("*")):
    if path.suffix.lower() not in (".jpg", ".jpeg", ".png"):
        continue
    dst = tmp / path.relative_to(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    with Image.open(path) as im:
        exif = im.info.get("exif")
        w, h = im.size
        scale = min(1.0, max_side / max(w, h))
        size = (max(1, round(w * scale)), max(1, round(h * scale)))
        keep_alpha = path.suffix.lower() == ".png" and im.mode in ("RGBA", "LA", "PA")
        im = im.convert("RGBA" if keep_alpha else "RGB").resize(size, Image.BILINEAR)
        if path.suffix.lower() == ".png":
            im.save(dst)
        else:
            im.save(dst, quality=92, **({"exif": exif} if exif else {}))
    count += 1
(tmp / ".complete").write_text(f"{count}\n")
shutil.rmtree(out, ignore_errors=True)
tmp.rename(out)
print(f"make_test_photos: {count} photos of at most {max_side} px in {out}")
