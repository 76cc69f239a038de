#!/usr/bin/env python3
"""Writes the first N Fashion-MNIST test images (Debian's dataset-fashion-mnist) as PNGs
with a metadata.jsonl (path, caption, label, width, height).

Usage: make_fashion_subset.py DIR [N]
"""
import gzip
import json
import os
import struct
import sys

from PIL import Image

SRC = "/usr/share/datasets/fashion-mnist"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
           "Ankle boot"]


def main():
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    os.makedirs(os.path.join(out, "images"), exist_ok=True)
    with gzip.open(os.path.join(SRC, "t10k-images-idx3-ubyte.gz")) as f:
        _, total, rows, cols = struct.unpack(">IIII", f.read(16))
        n = min(n, total)
        pixels = f.read(n * rows * cols)
    with gzip.open(os.path.join(SRC, "t10k-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        labels = f.read(n)
    with open(os.path.join(out, "metadata.jsonl"), "w") as meta:
        for i in range(n):
            img = Image.frombytes("L", (cols, rows), pixels[i * rows * cols:(i + 1) * rows * cols])
            name = f"images/{i:05d}.png"
            img.save(os.path.join(out, name))
            meta.write(json.dumps({"path": name, "caption": CLASSES[labels[i]], "label": labels[i],
                                   "width": cols, "height": rows}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
