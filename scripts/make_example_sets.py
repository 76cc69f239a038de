"""Builds the example datasets from extracted Debian packages (run by
fetch_example_data.sh with Debian's python3 and PIL).

argv: ROOT (the dpkg -x folder) OUT (data folder)
- OUT/multiscale: every wallpaper photo, plus deterministic crops of each at aspect
  ratios from 1:4 (panorama) to 4:1 (tower), with captions; metadata.jsonl lists them all
  with width and height.
- OUT/fashion_mnist: Fashion-MNIST's 10,000 test images as PNGs with class labels in
  metadata.jsonl (a class-conditional single-resolution set).
"""
import gzip
import json
import os
import re
import struct
import sys

from PIL import Image, ImageOps

root, out = sys.argv[1], sys.argv[2]
RATIOS = [0.25, 0.33, 0.5, 0.57, 0.75, 1.0, 1.33, 1.78, 2.0, 3.0, 4.0]  # height / width
CLASSES = ["t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker",
           "bag", "ankle boot"]


def words(name):
    name = re.sub(r"([a-z])([A-Z])", r"\1 \2", os.path.splitext(name)[0])
    name = re.sub(r"[-_]+", " ", name)
    return re.sub(r" \d+x\d+$", "", name).lower().strip()


def photos():
    found = []
    for d, _, files in os.walk(os.path.join(root, "usr/share/backgrounds")):
        for f in files:
            p = os.path.join(d, f)
            if f.lower().endswith((".jpg", ".jpeg", ".png", ".webp")) and os.path.getsize(p) > 10000:
                found.append(p)
    return sorted(found)


def multiscale():
    dest = os.path.join(out, "multiscale")
    os.makedirs(dest, exist_ok=True)
    rows = []
    for i, src in enumerate(photos()):
        img = ImageOps.exif_transpose(Image.open(src)).convert("RGB")
        w, h = img.size
        base = f"{i:03d}_{re.sub(r'[^A-Za-z0-9]+', '_', os.path.splitext(os.path.basename(src))[0])}"
        caption = f"{words(os.path.basename(src))}, {os.path.basename(os.path.dirname(src))} wallpaper"
        full = os.path.join(dest, base + ".jpg")
        img.save(full, quality=92)
        rows.append({"path": os.path.basename(full), "caption": caption, "width": w, "height": h})
        # Crops: for each ratio, 6 boxes of decreasing size at positions spread over the
        # image, each resized so its longer side is at most 1024 pixels.
        for r in RATIOS:
            for k in range(6):
                scale = 1.0 - 0.12 * k
                cw = min(w, int(h * scale / r)) if r > h / w else int(w * scale)
                ch = int(cw * r)
                if ch > h:
                    ch = int(h * scale)
                    cw = int(ch / r)
                if cw < 64 or ch < 64:
                    continue
                x = (w - cw) * ((k * 37) % 11) // 10
                y = (h - ch) * ((k * 53) % 11) // 10
                crop = img.crop((x, y, x + cw, y + ch))
                crop.thumbnail((1024, 1024), Image.BICUBIC)
                name = f"{base}_r{r}_{k}.jpg"
                crop.save(os.path.join(dest, name), quality=90)
                rows.append({"path": name, "caption": f"{caption}, a {'tall' if r > 1 else 'wide' if r < 1 else 'square'} crop",
                             "width": crop.size[0], "height": crop.size[1]})
    with open(os.path.join(dest, "metadata.jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return len(rows)


def fashion_mnist():
    src = os.path.join(root, "usr/share/datasets/fashion-mnist")
    dest = os.path.join(out, "fashion_mnist")
    os.makedirs(os.path.join(dest, "images"), exist_ok=True)
    with gzip.open(os.path.join(src, "t10k-images-idx3-ubyte.gz")) as f:
        _, n, rows, cols = struct.unpack(">IIII", f.read(16))
        pixels = f.read(n * rows * cols)
    with gzip.open(os.path.join(src, "t10k-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        labels = f.read(n)
    with open(os.path.join(dest, "metadata.jsonl"), "w") as meta:
        for i in range(n):
            img = Image.frombytes("L", (cols, rows), pixels[i * rows * cols:(i + 1) * rows * cols])
            name = f"images/{i:05d}.png"
            img.save(os.path.join(dest, name))
            meta.write(json.dumps({"path": name, "caption": CLASSES[labels[i]], "label": labels[i],
                                   "width": cols, "height": rows}) + "\n")
    return n


print(f"multiscale: {multiscale()} samples")
print(f"fashion_mnist: {fashion_mnist()} samples")
