#!/usr/bin/env python3
"""Upstream's pixels, computed by upstream's own transform, against `sana-train check-data --dump`.

For every row of DUMP/dump.tsv (id, path, height, width, file, caption) this opens the source with
PIL and applies the transform NVlabs/Sana's SanaWebDatasetMS builds for a sample
(torchvision's T.Resize to upstream's cover size with the table's filter, then
T.CenterCrop to the bucket), then compares it with the dumped PNG.

  pil_pixels.py DUMP --filter bicubic|lanczos|bilinear [--png-max 0] [--jpeg-max 1]
                [--exif-transpose]

Prints one line per image (max difference, share of values that differ) and a summary;
exits 1 when a PNG source differs by more than --png-max or a JPEG one by more than
--jpeg-max. --exif-transpose applies the EXIF orientation first (data.exif_orientation).
Runs with Debian's python3-pil, python3-torchvision and numpy.
"""
import argparse
import os
import sys

import numpy as np
from PIL import Image, ImageOps
import torchvision.transforms as T
from torchvision.transforms import InterpolationMode

FILTERS = {"bicubic": InterpolationMode.BICUBIC, "lanczos": InterpolationMode.LANCZOS,
           "bilinear": InterpolationMode.BILINEAR}


def unescape(field):
    out, i = [], 0
    while i < len(field):
        c = field[i]
        if c == "\\" and i + 1 < len(field):
            out.append({"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}[field[i + 1]])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def upstream_pixels(path, height, width, interpolation, exif_transpose):
    """SanaWebDatasetMS.getdata's transform for a bucket of height x width."""
    img = Image.open(path)
    if exif_transpose:
        img = ImageOps.exif_transpose(img)
    ori_w, ori_h = img.size  # upstream reads them from its metadata, which records these
    closest_size = [height, width]
    if closest_size[0] / ori_h > closest_size[1] / ori_w:
        resize_size = closest_size[0], int(ori_w * closest_size[0] / ori_h)
    else:
        resize_size = int(ori_h * closest_size[1] / ori_w), closest_size[1]
    transform = T.Compose([
        T.Lambda(lambda im: im.convert("RGB")),
        T.Resize(resize_size, interpolation=interpolation),
        T.CenterCrop(closest_size),
    ])
    return np.asarray(transform(img)), img.format


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dump")
    ap.add_argument("--filter", choices=sorted(FILTERS), required=True)
    ap.add_argument("--png-max", type=int, default=0)
    ap.add_argument("--jpeg-max", type=int, default=1)
    ap.add_argument("--exif-transpose", action="store_true")
    args = ap.parse_args()

    with open(os.path.join(args.dump, "dump.tsv"), encoding="utf-8") as f:
        header = f.readline().rstrip("\n").split("\t")
        if header[:5] != ["id", "path", "height", "width", "file"]:
            print("dump.tsv: unexpected header %r" % header)
            return 1
        rows = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    if not rows:
        print("dump.tsv lists no images")
        return 1
    failures, worst = 0, {"PNG": 0, "JPEG": 0}
    for sid, path, h, w, name in (row[:5] for row in rows):
        path = unescape(path)
        ours = np.asarray(Image.open(os.path.join(args.dump, name)).convert("RGB"))
        ref, fmt = upstream_pixels(path, int(h), int(w), FILTERS[args.filter], args.exif_transpose)
        if ours.shape != ref.shape:
            print("FAIL %s: shape %s, upstream %s" % (path, ours.shape, ref.shape))
            failures += 1
            continue
        diff = np.abs(ours.astype(np.int16) - ref.astype(np.int16))
        limit = args.jpeg_max if fmt == "JPEG" else args.png_max
        kind = "JPEG" if fmt == "JPEG" else "PNG"
        worst[kind] = max(worst[kind], int(diff.max()))
        verdict = "ok" if diff.max() <= limit else "FAIL"
        failures += verdict == "FAIL"
        print("%s %s (%s, %sx%s bucket): max difference %d, %.4f%% of values differ" %
              (verdict, os.path.basename(path), fmt, h, w, diff.max(), 100.0 * np.count_nonzero(diff) / diff.size))
    print("pil_pixels: %d images, %d over the limit; worst difference PNG %d (limit %d), JPEG %d (limit %d)" %
          (len(rows), failures, worst["PNG"], args.png_max, worst["JPEG"], args.jpeg_max))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
