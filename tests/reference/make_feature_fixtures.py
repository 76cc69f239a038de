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

# --- Upstream Sana's layouts -------------------------------------------------------------
# Caption features as upstream's datasets read them: an .npz with caption_feature (1, T, C)
# and attention_mask (1, T), stored (np.savez) or deflated (np.savez_compressed).
feat = np.arange(18, dtype=np.float16).reshape(1, 3, 6)
mask = np.array([[1, 1, 0]], dtype=np.int16)
np.savez(os.path.join(out, "txt_stored.npz"), caption_feature=feat, attention_mask=mask)
np.savez_compressed(os.path.join(out, "txt_compressed.npz"), caption_feature=feat, attention_mask=mask)
np.savez_compressed(os.path.join(out, "txt_nomask.npz"), caption_feature=feat[0].astype(np.float32))
np.savez_compressed(os.path.join(out, "lat_z.npz"), z=np.full((4, 6, 10), 7.0, dtype=np.float32))
np.savez(os.path.join(out, "two.npz"), a=np.zeros(2, np.float32), b=np.ones(3, np.float32))
data = bytearray(open(os.path.join(out, "txt_compressed.npz"), "rb").read())
data[100] ^= 0xFF  # inside the first member's deflated bytes
open(os.path.join(out, "damaged.npz"), "wb").write(bytes(data))
open(os.path.join(out, "cut.npz"), "wb").write(bytes(data[: len(data) // 2]))

# A wids dataset (SanaWebDatasetMS): wids-meta.json lists two tar shards; each sample is
# <key>.json + <key>.npy (scaled latent, C x h/f x w/f of its bucket) and a caption feature
# <key>.npz, in the shard or beside wids-meta.json. Sample numbers are the fill values.
import io
import tarfile

from PIL import Image

wids = os.path.join(out, "wids")
os.makedirs(wids, exist_ok=True)


def add(tar, name, payload):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def npy_bytes(arr):
    buf = io.BytesIO()
    np.save(buf, arr)
    return buf.getvalue()


def npz_bytes(**arrays):
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    return buf.getvalue()


shards = []
for s, fmt in enumerate([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT]):
    name = f"shard-{s:03d}.tar"
    with tarfile.open(os.path.join(wids, name), "w", format=fmt) as tar:
        for k in range(4):
            i = s * 4 + k
            # Sample 1's key is longer than a ustar name field: a pax or GNU long name.
            key = f"{i:06d}" if i != 1 else "deep/" + "x" * 120 + "000001"
            info = {"file_name": f"{key}.png", "prompt": f"sample {i}", "width": 40, "height": 24}
            add(tar, key + ".json", json.dumps(info).encode())
            lat = np.full((4, 6, 10), float(i), dtype=np.float32)
            add(tar, key + ".npy", npy_bytes(lat[None] if i % 2 else lat))  # (1, C, h, w) too
            t = 2 + i % 3  # tokens: 2..4, with the last one masked out
            caption = np.full((1, t, 6), float(i), dtype=np.float16)
            caption[0, -1] = 100.0 + i
            m = np.ones((1, t), dtype=np.int64)
            m[0, -1] = 0
            if i % 2:
                add(tar, key + ".npz", npz_bytes(caption_feature=caption, attention_mask=m))
            else:
                np.savez(os.path.join(wids, f"{key}.npz"), caption_feature=caption, attention_mask=m)
        if s == 1:
            add(tar, "stray.txt", b"no json here")  # a member with no .json: left out
    shards.append({"url": name, "nsamples": 4, "filesize": os.path.getsize(os.path.join(wids, name))})
with open(os.path.join(wids, "wids-meta.json"), "w") as f:
    json.dump({"name": "fixture", "__kind__": "SANA-WebDataset", "wids_version": 1, "shardlist": shards}, f)
print("ok")

# A shard with pixels: <key>.json + <key>.png (real PNG bytes), the same PNG as a plain file.
img = Image.new("RGB", (40, 24))
img.putdata([((7 * x) % 256, (11 * y) % 256, (x * y) % 256) for y in range(24) for x in range(40)])
img.save(os.path.join(out, "plain.png"))
with tarfile.open(os.path.join(out, "images.tar"), "w") as tar:
    add(tar, "a.json", json.dumps({"prompt": "a picture", "width": 40, "height": 24}).encode())
    add(tar, "a.png", open(os.path.join(out, "plain.png"), "rb").read())
    add(tar, "b.json", json.dumps({"prompt": "no size given"}).encode())  # size from the header
    add(tar, "b.png", open(os.path.join(out, "plain.png"), "rb").read())
print("ok")
