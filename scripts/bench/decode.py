"""The torchvision pipeline on the same files, one process: PIL decode, RGB, Resize to
cover the closest ASPECT_RATIO_<base> bucket, CenterCrop, ToTensor, Normalize."""
import os
import sys
import time

import torch
import torchvision.transforms as T
from PIL import Image

torch.set_num_threads(1)
root, rounds, table = sys.argv[1], int(sys.argv[2]), sys.argv[3]
buckets = [tuple(map(float, b.split(":"))) for b in table.split(",")]  # key:h:w
files = sorted(os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs
               if f.lower().endswith((".jpg", ".jpeg", ".png")))
start = time.perf_counter()
for _ in range(rounds):
    for f in files:
        img = Image.open(f).convert("RGB")
        w, h = img.size
        key, bh, bw = min(buckets, key=lambda b: abs(b[0] - h / w))
        bh, bw = int(bh), int(bw)
        size = (bh, int(w * bh / h)) if bh / h > bw / w else (int(h * bw / w), bw)
        t = T.Compose([T.Resize(size, interpolation=T.InterpolationMode.BICUBIC),
                       T.CenterCrop((bh, bw)), T.ToTensor(), T.Normalize([0.5] * 3, [0.5] * 3)])
        t(img)
n = len(files) * rounds
print(f"torchvision (PIL) pipeline:          {n / (time.perf_counter() - start):7.1f} images/s")
