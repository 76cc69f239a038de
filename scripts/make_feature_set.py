#!/usr/bin/env python3
"""Makes a SYNTHETIC precomputed-feature folder, laid out as `sana-train prepare-features`
writes one (docs/features.md, "The folder"), filled with seeded random numbers: a machine
without the VAE and text-encoder exports can then train a real config on it (throughput,
memory, multi-GPU runs), e.g. configs/Sana_1600M_img1024.yaml:

  python3 scripts/make_feature_set.py /tmp/feat --count 64 --latent-channels 32 \
      --latent-size 32 --tokens 300 --dim 2304 --base-config $PWD/configs/Sana_1600M_img1024.yaml
  sana-train launch --nproc-per-node 1 -- --config /tmp/feat/train.yaml \
      --train.visualize=false --train.num_epochs=1000 --train.max_steps=50 ...

What training reads with data.load_vae_feat and data.load_text_feat true (src/sana/data,
src/sana/train, src/sana/config/validate.cpp):
  - meta.jsonl rows: `path` (the image: never opened, since width and height are given and
    the latents replace the pixels), `caption`, `width`, `height` (they pick the bucket, so
    width = height = latent_size x vae.vae_downsample_rate makes the square bucket whose
    latent is (C, latent_size, latent_size)), `latent` and `text_feat` relative to the folder;
  - latents: float32 (C, h/f, w/f), checked against vae.vae_latent_dim and the bucket;
  - caption features: `caption_feature` (1, T, D) with D = text_encoder.caption_channels,
    T <= text_encoder.model_max_length, and `attention_mask` (1, T);
  - null_embed.safetensors (`uncond_prompt_embeds` (1, L, D)): required when
    model.class_dropout_prob > 0, and its shape must be (L, D) = (model_max_length,
    caption_channels);
  - no encoder file is checked or loaded (vae.vae_pretrained, text_encoder.text_encoder_path
    need not exist); features.json is read only by a prepare-features rerun into the folder
    (the synthetic one written here makes such a rerun refuse the folder).
Rows may share feature files (the loader reads whatever path a row names): --text-files and
--latent-files below make fewer, shared files; the default is one of each per sample, as
prepare-features writes them.

Needs Python 3 and numpy (without numpy it falls back to the standard library's generator:
slower, and other numbers for the same seed). No torch, no safetensors package.
"""
import argparse
import io
import json
import os
import struct
import sys
import zipfile

try:
    import numpy as np
except ImportError:  # the standard library does it, slower
    np = None


# ---- random numbers ---------------------------------------------------------------------

class Rng:
    def __init__(self, seed):
        if np is not None:
            self.g = np.random.default_rng(seed)
        else:
            import random
            self.g = random.Random(repr(seed))

    def normal_f32(self, n):
        """n float32 values ~ N(0, 1), as little-endian bytes."""
        if np is not None:
            return self.g.standard_normal(n, dtype=np.float32).astype("<f4").tobytes()
        import array
        a = array.array("f", (self.g.gauss(0.0, 1.0) for _ in range(n)))
        if sys.byteorder != "little":
            a.byteswap()
        return a.tobytes()

    def integer(self, low, high):
        """An integer in [low, high]."""
        if np is not None:
            return int(self.g.integers(low, high + 1))
        return self.g.randint(low, high)


# ---- file formats -----------------------------------------------------------------------

def npy_bytes(descr, shape, data):
    """NumPy format 1.0: magic, version, header length, a dict padded to 64 bytes, the data."""
    shape_text = "(%d,)" % shape[0] if len(shape) == 1 else "(" + ", ".join("%d" % s for s in shape) + ")"
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape_text)
    used = 6 + 2 + 2 + len(header) + 1  # magic, version, length, header, '\n'
    header += " " * ((64 - used % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data


def npz_bytes(arrays):
    """np.savez's layout: a zip of NAME.npy members, stored (not compressed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
        for name, (descr, shape, data) in arrays:
            info = zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_STORED
            z.writestr(info, npy_bytes(descr, shape, data))
    return buf.getvalue()


def safetensors_bytes(tensors, metadata=None):
    """8-byte little-endian header length, the JSON header (padded with spaces so the data
    starts 8-byte aligned), the raw data."""
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def write_file(path, data):
    """Written to a temporary name and renamed: a killed run leaves whole files only."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


# prepare-features' names: sample ID of the index, a thousand per folder.
def latent_rel(i):
    return "latents/%05d/%010d.npy" % (i // 1000, i)


def text_rel(i):
    return "text/%05d/%010d.npz" % (i // 1000, i)


# ---- main -------------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="the folder to write (created; files in it are replaced)")
    p.add_argument("--count", type=int, default=64, help="samples (rows of meta.jsonl); default 64")
    p.add_argument("--latent-channels", type=int, default=32, help="C: vae.vae_latent_dim (32 for DC-AE)")
    p.add_argument("--latent-size", type=int, default=32,
                   help="h = w of each latent: the bucket's side / vae.vae_downsample_rate (32 at 1024 px)")
    p.add_argument("--downsample", type=int, default=32,
                   help="vae.vae_downsample_rate: width = height = latent_size x this in meta.jsonl (default 32)")
    p.add_argument("--tokens", type=int, default=300, help="L: text_encoder.model_max_length (300)")
    p.add_argument("--dim", type=int, default=2304, help="D: text_encoder.caption_channels (2304 for Gemma-2 2B)")
    p.add_argument("--valid-tokens", type=int, default=0,
                   help="attention-mask ones per caption; 0 (default): a random number in [min(16, L), L] per file")
    p.add_argument("--text-files", type=int, default=0,
                   help="distinct caption-feature files, shared round-robin by the rows; 0 (default): one per sample "
                        "(a 300 x 2304 file is 2.8 MB)")
    p.add_argument("--latent-files", type=int, default=0,
                   help="distinct latent files, shared round-robin; 0 (default): one per sample")
    p.add_argument("--scale", type=float, default=1.0, help="standard deviation of the latents (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of every random number (default 0)")
    p.add_argument("--base-config", default="",
                   help="the config train.yaml is based on (written as an absolute path), e.g. "
                        "configs/Sana_1600M_img1024.yaml; without it no train.yaml is written")
    p.add_argument("--image-dir", default="",
                   help="where meta.jsonl says the images are (never read); default OUT/images")
    a = p.parse_args(argv)

    for name in ("count", "latent_channels", "latent_size", "downsample", "tokens", "dim"):
        if getattr(a, name) < 1:
            p.error("--%s must be at least 1" % name.replace("_", "-"))
    if a.valid_tokens < 0 or a.valid_tokens > a.tokens:
        p.error("--valid-tokens must be in [0, --tokens]")
    if a.base_config and not os.path.isfile(a.base_config):
        p.error("--base-config: no file '%s'" % a.base_config)
    n_text = a.count if a.text_files <= 0 else min(a.text_files, a.count)
    n_lat = a.count if a.latent_files <= 0 else min(a.latent_files, a.count)
    out = os.path.abspath(a.out)
    os.makedirs(out, exist_ok=True)
    side = a.latent_size * a.downsample
    C, S, L, D = a.latent_channels, a.latent_size, a.tokens, a.dim

    # Independent streams per kind of file, so --count or --*-files do not change the others.
    lat_rng, text_rng, null_rng = Rng([a.seed, 1]), Rng([a.seed, 2]), Rng([a.seed, 3])
    for i in range(n_lat):
        data = lat_rng.normal_f32(C * S * S)
        if a.scale != 1.0:
            if np is not None:
                data = (np.frombuffer(data, dtype="<f4") * np.float32(a.scale)).astype("<f4").tobytes()
            else:
                vals = struct.unpack("<%df" % (C * S * S), data)
                data = struct.pack("<%df" % len(vals), *(v * a.scale for v in vals))
        write_file(os.path.join(out, latent_rel(i)), npy_bytes("<f4", (C, S, S), data))
    for i in range(n_text):
        valid = a.valid_tokens or text_rng.integer(min(16, L), L)
        mask = struct.pack("<%dq" % L, *([1] * valid + [0] * (L - valid)))
        feats = text_rng.normal_f32(L * D)
        write_file(os.path.join(out, text_rel(i)),
                   npz_bytes([("caption_feature", ("<f4", (1, L, D), feats)),
                              ("attention_mask", ("<i8", (1, L), mask))]))

    null_path = os.path.join(out, "null_embed.safetensors")
    write_file(null_path, safetensors_bytes([("uncond_prompt_embeds", ("F32", (1, L, D), null_rng.normal_f32(L * D)))],
                                            {"text_encoder": "synthetic (scripts/make_feature_set.py)"}))

    images = os.path.abspath(a.image_dir) if a.image_dir else os.path.join(out, "images")
    meta_path = os.path.join(out, "meta.jsonl")
    with open(meta_path + ".tmp", "w") as f:
        for i in range(a.count):
            row = {"path": os.path.join(images, "%010d.jpg" % i), "caption": "synthetic sample %d" % i,
                   "width": side, "height": side, "latent": latent_rel(i % n_lat), "text_feat": text_rel(i % n_text)}
            f.write(json.dumps(row) + "\n")
    os.replace(meta_path + ".tmp", meta_path)

    # Read by a prepare-features rerun only: these settings match no real run, so one is refused.
    settings = {"format": "synthetic (scripts/make_feature_set.py)", "samples": a.count, "seed": a.seed,
                "latent": {"channels": C, "size": S, "downsample": a.downsample, "files": n_lat, "scale": a.scale},
                "text_encoder": {"model_max_length": L, "caption_channels": D, "files": n_text,
                                 "valid_tokens": a.valid_tokens or "random"},
                "generator": "numpy" if np is not None else "python random"}
    write_file(os.path.join(out, "features.json"), (json.dumps(settings, indent=2) + "\n").encode())

    if a.base_config:
        y = ("# Written by scripts/make_feature_set.py: SYNTHETIC features (seeded random numbers), laid out as\n"
             "# sana-train prepare-features writes them. The base config's vae.* and text_encoder.* must agree:\n"
             "# vae_latent_dim %d, vae_downsample_rate %d, model_max_length %d, caption_channels %d; every\n"
             "# sample is %dx%d px (one square bucket).\n" % (C, a.downsample, L, D, side, side))
        y += "base: %s\ndata:\n  data_dir: [%s]\n  load_vae_feat: true\n  load_text_feat: true\n" % (
            json.dumps(os.path.abspath(a.base_config)), json.dumps(meta_path))
        y += "text_encoder:\n  null_embed_path: %s\n" % json.dumps(null_path)
        write_file(os.path.join(out, "train.yaml"), y.encode())

    total = 0
    for root, _, files in os.walk(out):
        total += sum(os.path.getsize(os.path.join(root, x)) for x in files)
    print("make_feature_set: %d samples (%d latent files %dx%dx%d, %d caption files %dx%d), %dx%d px each, "
          "%.1f MiB in %s%s" % (a.count, n_lat, C, S, S, n_text, L, D, side, side, total / 2**20, out,
                                "; train with --config %s" % os.path.join(out, "train.yaml") if a.base_config else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
