"""Writes precomputed-feature files into argv[1] with NumPy (and safetensors by hand,
following its published layout: 8-byte little-endian header length, JSON header, data).
Latents are 4 x 6 x 10 (C x h x w: a 24 x 40 bucket at downsample 4) filled with their
sample number; text features are 5 x 6 filled likewise."""
import json
import os
import struct
import sys

import numpy as np

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, arr_bytes, shape) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(arr_bytes)]}
        blobs.append(arr_bytes)
        offset += len(arr_bytes)
    h = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


rows = []
for i in range(12):
    lat = np.full((4, 6, 10), float(i), dtype=np.float32)
    txt = np.full((5, 6), float(i), dtype=np.float16)
    if i % 2:
        np.save(os.path.join(out, f"lat{i}.npy"), lat)
        lat_name = f"lat{i}.npy"
    else:
        safetensors(os.path.join(out, f"lat{i}.safetensors"), {"latent": ("F32", lat.tobytes(), lat.shape)})
        lat_name = f"lat{i}.safetensors"
    np.save(os.path.join(out, f"txt{i}.npy"), txt)
    rows.append({"path": f"img{i}.jpg", "caption": f"sample {i}", "width": 40, "height": 24,
                 "latent": lat_name, "text_feat": f"txt{i}.npy"})
# Sample 3's latent is cut short, sample 5's has the wrong shape.
data = open(os.path.join(out, "lat3.npy"), "rb").read()
open(os.path.join(out, "lat3.npy"), "wb").write(data[:-40])
np.save(os.path.join(out, "lat5.npy"), np.zeros((4, 8, 8), dtype=np.float32))
with open(os.path.join(out, "meta.jsonl"), "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")

# Single files for the reader's own tests.
np.save(os.path.join(out, "half.npy"), np.arange(6, dtype=np.float16).reshape(2, 3))
np.save(os.path.join(out, "ints.npy"), np.arange(6, dtype=np.int32))
np.save(os.path.join(out, "fortran.npy"), np.asfortranarray(np.ones((2, 3), dtype=np.float32)))
np.save(os.path.join(out, "big.npy"), np.ones(3, dtype=">f4"))
bf = (np.arange(4, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
safetensors(os.path.join(out, "two.safetensors"),
            {"a": ("BF16", bf.tobytes(), (4,)), "b": ("F16", np.ones(2, dtype=np.float16).tobytes(), (2,))})
open(os.path.join(out, "empty.npy"), "wb").close()
print("ok")
