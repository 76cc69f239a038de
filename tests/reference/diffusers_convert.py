#!/usr/bin/env python3
"""Upstream Sana's transformer state dict to diffusers' SanaTransformer2DModel names, in
python3-torch, written from diffusers' published conversion rules
(scripts/convert_sana_to_diffusers.py, models/transformers/sana_transformer.py), to check the
C++ conversion (model/diffusers_names.h) independently.

Usage: diffusers_convert.py UPSTREAM.safetensors OUT.safetensors
Reads upstream's names, writes diffusers' (safetensors, fp32, {"format": "pt"} metadata).

The rules: a rename everywhere except two row splits, no reshapes:
- x_embedder.proj -> patch_embed.proj; t_embedder.mlp.0/2 ->
  time_embed.emb.timestep_embedder.linear_1/2; t_block.1 -> time_embed.linear;
  y_embedder.y_proj.fc1/fc2 -> caption_projection.linear_1/2; attention_y_norm ->
  caption_norm; final_layer.linear -> proj_out; final_layer.scale_shift_table ->
  scale_shift_table;
- blocks.N. -> transformer_blocks.N.: attn.qkv.weight, 3C rows, into attn1.to_q / to_k /
  to_v (rows 0..C, C..2C, 2C..3C); attn.proj -> attn1.to_out.0; attn.q_norm / k_norm ->
  attn1.norm_q / norm_k; cross_attn.q_linear -> attn2.to_q; cross_attn.kv_linear (weight and
  bias, 2C rows) into attn2.to_k / to_v (first half k); cross_attn.proj -> attn2.to_out.0;
  cross_attn.q_norm / k_norm -> attn2.norm_q / norm_k; mlp.inverted_conv.conv ->
  ff.conv_inverted, mlp.depth_conv.conv -> ff.conv_depth, mlp.point_conv.conv ->
  ff.conv_point; scale_shift_table stays;
- dropped: y_embedder.y_embedding (the null caption), pos_embed (diffusers computes its
  own, or none);
- a SANA-Sprint student (it has cfg_embedder.*): t_embedder.mlp.0/2 ->
  time_embed.timestep_embedder.linear_1/2, cfg_embedder.mlp.0/2 ->
  time_embed.guidance_embedder.linear_1/2, logvar_linear dropped.
Exits 1 naming any key it has no rule for."""
import json
import struct
import sys

import torch

TOP = {
    "x_embedder.proj.": "patch_embed.proj.",
    "t_embedder.mlp.0.": "time_embed.emb.timestep_embedder.linear_1.",
    "t_embedder.mlp.2.": "time_embed.emb.timestep_embedder.linear_2.",
    "t_block.1.": "time_embed.linear.",
    "y_embedder.y_proj.fc1.": "caption_projection.linear_1.",
    "y_embedder.y_proj.fc2.": "caption_projection.linear_2.",
    "attention_y_norm.": "caption_norm.",
    "final_layer.linear.": "proj_out.",
    "final_layer.scale_shift_table": "scale_shift_table",
}
BLOCK = {
    "scale_shift_table": "scale_shift_table",
    "attn.proj.": "attn1.to_out.0.",
    "attn.q_norm.": "attn1.norm_q.",
    "attn.k_norm.": "attn1.norm_k.",
    "cross_attn.q_linear.": "attn2.to_q.",
    "cross_attn.proj.": "attn2.to_out.0.",
    "cross_attn.q_norm.": "attn2.norm_q.",
    "cross_attn.k_norm.": "attn2.norm_k.",
    "mlp.inverted_conv.conv.": "ff.conv_inverted.",
    "mlp.depth_conv.conv.": "ff.conv_depth.",
    "mlp.point_conv.conv.": "ff.conv_point.",
}
DROPPED = ("y_embedder.y_embedding", "pos_embed")
# SANA-Sprint's student (diffusers' script, model types SanaSprint_*): the time embedding as
# SanaCombinedTimestepGuidanceEmbeddings' timestep_embedder, cfg_embedder as its
# guidance_embedder, logvar_linear dropped.
SPRINT_TOP = {
    "t_embedder.mlp.0.": "time_embed.timestep_embedder.linear_1.",
    "t_embedder.mlp.2.": "time_embed.timestep_embedder.linear_2.",
    "cfg_embedder.mlp.0.": "time_embed.guidance_embedder.linear_1.",
    "cfg_embedder.mlp.2.": "time_embed.guidance_embedder.linear_2.",
}
SPRINT_DROPPED = ("logvar_linear.weight", "logvar_linear.bias")


def read(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    kinds = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    out = {}
    for k, v in head.items():
        s, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(raw[8 + n + s:8 + n + e]), dtype=kinds[v["dtype"]]).reshape(v["shape"])
    return out


def write(path, tensors):
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for k in sorted(tensors):
        t = tensors[k].contiguous().float()
        b = t.numpy().tobytes()
        header[k] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def rename(prefix_map, key, to):
    for old, new in prefix_map.items():
        if key.startswith(old):
            return to + new + key[len(old):]
    return None


def convert(sd):
    out, unknown = {}, []
    sprint = any(k.startswith("cfg_embedder.") for k in sd)
    top = {**TOP, **SPRINT_TOP} if sprint else TOP
    for key, t in sd.items():
        if key in DROPPED or (sprint and key in SPRINT_DROPPED):
            continue
        if key.startswith("blocks."):
            _, n, rest = key.split(".", 2)
            to = f"transformer_blocks.{n}."
            if rest == "attn.qkv.weight":
                for name, part in zip(("to_q", "to_k", "to_v"), torch.chunk(t, 3, dim=0)):
                    out[f"{to}attn1.{name}.weight"] = part.clone()
                continue
            if rest.startswith("cross_attn.kv_linear."):
                kind = rest.rsplit(".", 1)[1]
                k_part, v_part = torch.chunk(t, 2, dim=0)
                out[f"{to}attn2.to_k.{kind}"] = k_part.clone()
                out[f"{to}attn2.to_v.{kind}"] = v_part.clone()
                continue
            new = rename(BLOCK, rest, to)
        else:
            new = rename(top, key, "")
        if new is None:
            unknown.append(key)
        else:
            out[new] = t.clone()
    return out, unknown


def main():
    sd = read(sys.argv[1])
    out, unknown = convert(sd)
    if unknown:
        print("no rule for:", ", ".join(unknown))
        sys.exit(1)
    write(sys.argv[2], out)
    print(f"{len(sd)} upstream tensors -> {len(out)} diffusers tensors")


if __name__ == "__main__":
    main()
