#!/usr/bin/env python3
"""Upstream Sana's ControlNet state dict to diffusers' SanaControlNetModel names, in
python3-torch, written from diffusers' published conversion
(scripts/convert_sana_controlnet_to_diffusers.py, models/controlnets/controlnet_sana.py),
tensor by tensor as that script lists them, to check the C++ export
(model/diffusers_format.h, controlnet_to_diffusers) independently. It shares no table with
diffusers_convert.py.

Usage: diffusers_controlnet_convert.py UPSTREAM.safetensors OUT.safetensors
UPSTREAM holds the whole ControlNet (the base and controlnet.N.*); OUT gets the
SanaControlNetModel's tensors (fp32). The base's blocks, final layer, null caption and
pos_embed are not the ControlNet's and are left out. Exits 1 when a tensor the script
pops is missing or a controlnet.* tensor is left over."""
import sys

import torch

from diffusers_convert import read, write


def convert(sd):
    sd = dict(sd)
    out = {}

    def take(src, dst):
        out[dst] = sd.pop(src).clone()

    # The ControlNet's own copies of the base's embeddings.
    take("x_embedder.proj.weight", "patch_embed.proj.weight")
    take("x_embedder.proj.bias", "patch_embed.proj.bias")
    take("y_embedder.y_proj.fc1.weight", "caption_projection.linear_1.weight")
    take("y_embedder.y_proj.fc1.bias", "caption_projection.linear_1.bias")
    take("y_embedder.y_proj.fc2.weight", "caption_projection.linear_2.weight")
    take("y_embedder.y_proj.fc2.bias", "caption_projection.linear_2.bias")
    take("t_embedder.mlp.0.weight", "time_embed.emb.timestep_embedder.linear_1.weight")
    take("t_embedder.mlp.0.bias", "time_embed.emb.timestep_embedder.linear_1.bias")
    take("t_embedder.mlp.2.weight", "time_embed.emb.timestep_embedder.linear_2.weight")
    take("t_embedder.mlp.2.bias", "time_embed.emb.timestep_embedder.linear_2.bias")
    take("t_block.1.weight", "time_embed.linear.weight")
    take("t_block.1.bias", "time_embed.linear.bias")
    take("attention_y_norm.weight", "caption_norm.weight")
    take("controlnet.0.before_proj.weight", "input_block.weight")
    take("controlnet.0.before_proj.bias", "input_block.bias")
    depth = 1 + max(int(k.split(".")[1]) for k in sd if k.startswith("controlnet."))
    for d in range(depth):
        src, dst = f"controlnet.{d}.copied_block.", f"transformer_blocks.{d}."
        take(src + "scale_shift_table", dst + "scale_shift_table")
        q, k, v = torch.chunk(sd.pop(src + "attn.qkv.weight"), 3, dim=0)
        out[dst + "attn1.to_q.weight"], out[dst + "attn1.to_k.weight"], out[dst + "attn1.to_v.weight"] = q, k, v
        take(src + "attn.proj.weight", dst + "attn1.to_out.0.weight")
        take(src + "attn.proj.bias", dst + "attn1.to_out.0.bias")
        take(src + "mlp.inverted_conv.conv.weight", dst + "ff.conv_inverted.weight")
        take(src + "mlp.inverted_conv.conv.bias", dst + "ff.conv_inverted.bias")
        take(src + "mlp.depth_conv.conv.weight", dst + "ff.conv_depth.weight")
        take(src + "mlp.depth_conv.conv.bias", dst + "ff.conv_depth.bias")
        take(src + "mlp.point_conv.conv.weight", dst + "ff.conv_point.weight")
        take(src + "cross_attn.q_linear.weight", dst + "attn2.to_q.weight")
        take(src + "cross_attn.q_linear.bias", dst + "attn2.to_q.bias")
        k, v = torch.chunk(sd.pop(src + "cross_attn.kv_linear.weight"), 2, dim=0)
        out[dst + "attn2.to_k.weight"], out[dst + "attn2.to_v.weight"] = k, v
        k, v = torch.chunk(sd.pop(src + "cross_attn.kv_linear.bias"), 2, dim=0)
        out[dst + "attn2.to_k.bias"], out[dst + "attn2.to_v.bias"] = k, v
        take(src + "cross_attn.proj.weight", dst + "attn2.to_out.0.weight")
        take(src + "cross_attn.proj.bias", dst + "attn2.to_out.0.bias")
        take(f"controlnet.{d}.after_proj.weight", f"controlnet_blocks.{d}.weight")
        take(f"controlnet.{d}.after_proj.bias", f"controlnet_blocks.{d}.bias")
    left = sorted(k for k in sd if k.startswith("controlnet."))
    return out, left


def main():
    try:
        out, left = convert(read(sys.argv[1]))
    except KeyError as e:
        print(f"missing upstream tensor {e}")
        sys.exit(1)
    if left:
        print("controlnet tensors with no rule:", ", ".join(left))
        sys.exit(1)
    write(sys.argv[2], out)
    print(f"{len(out)} SanaControlNetModel tensors")


if __name__ == "__main__":
    main()
