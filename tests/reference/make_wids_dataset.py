"""Writes a dataset in upstream Sana's feature layout, as upstream's CI data
(data/data_public/vaef32c32_v2_512/dir1) has it: argv[1]/wids-meta.json lists tar shards
whose samples are <key>.json ({"file_name", "prompt", "width", "height"}) and <key>.npy
(the scaled DC-AE f32c32 latent of the image resized and cropped to its bucket: 32 x h/32 x
w/32); caption features <key>.npz (caption_feature (1, T, C), attention_mask (1, T)) go to
argv[2], which upstream resolves against the working directory.
  make_wids_dataset.py DATA_DIR TEXT_DIR [SAMPLES [CAPTION_CHANNELS [TOKENS]]]
Sizes are two buckets of ASPECT_RATIO_512: 512x512 (1.0) and 320x800 (0.4)."""
import io
import json
import os
import sys
import tarfile

import numpy as np

data_dir, text_dir = sys.argv[1], sys.argv[2]
samples = int(sys.argv[3]) if len(sys.argv) > 3 else 16
channels = int(sys.argv[4]) if len(sys.argv) > 4 else 2304
tokens = int(sys.argv[5]) if len(sys.argv) > 5 else 12
os.makedirs(data_dir, exist_ok=True)
os.makedirs(text_dir, exist_ok=True)
rng = np.random.default_rng(0)


def add(tar, name, payload):
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


shards, per_shard = [], (samples + 1) // 2
for s in range(2):
    name = f"{s:05d}.tar"
    with tarfile.open(os.path.join(data_dir, name), "w") as tar:
        count = 0
        for i in range(s * per_shard, min(samples, (s + 1) * per_shard)):
            key = f"{i:08d}"
            h, w = (512, 512) if i % 2 == 0 else (320, 800)
            info = {"file_name": f"{key}.jpg", "prompt": f"a photo number {i}", "width": w, "height": h}
            add(tar, f"{key}.json", json.dumps(info).encode())
            buf = io.BytesIO()
            np.save(buf, rng.standard_normal((32, h // 32, w // 32)).astype(np.float32))
            add(tar, f"{key}.npy", buf.getvalue())
            t = tokens - i % 3
            mask = np.zeros((1, t), dtype=np.int16)
            mask[0, : t - 2] = 1
            np.savez(os.path.join(text_dir, f"{key}.npz"),
                     caption_feature=rng.standard_normal((1, t, channels)).astype(np.float16), attention_mask=mask)
            count += 1
    shards.append({"url": name, "nsamples": count, "filesize": os.path.getsize(os.path.join(data_dir, name))})
with open(os.path.join(data_dir, "wids-meta.json"), "w") as f:
    json.dump({"name": "sana-ci-like", "__kind__": "SANA-WebDataset", "wids_version": 1, "shardlist": shards}, f)
print(f"wrote {samples} samples in {len(shards)} shards to {data_dir}, caption features to {text_dir}")
