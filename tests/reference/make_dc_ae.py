#!/usr/bin/env python3
"""Small random AutoencoderDCs in diffusers' own layout, and what diffusers computes with
them, for sana-train's native DC-AE (src/sana/model/dc_ae.h) to match.

Usage: make_dc_ae.py DIR [--upstream-shape]
  --upstream-shape         only DIR/f32c32: Sana's DC-AE layout (6 stages, f32, 32 latent channels,
                           as upstream's YAMLs imply) at widths of 8 to 64, for a run of an upstream YAML
  DIR/NAME/                AutoencoderDC.save_pretrained (config.json, the weights; "sana" in
                           shards with their index)
  DIR/NAME.safetensors     images [2, 3, 32, 32] and small [2, 3, 8, 8] in [-1, 1]; latents_fp32 =
                           encode(images).latent, decoded_fp32 = decode(latents_fp32).sample, the
                           same for the small images (small_latents, small_decoded), and for
                           "sana" the bf16 model's (latents_bf16, decoded_bf16, as fp32)
  DIR/cases.json           the names and the parameter count diffusers gives each
  DIR/sana_efficientvit/model.safetensors
                           "sana"'s weights under mit-han-lab's efficientvit names (a fused qkv
                           1x1 convolution, ...): names that diffusers' own converter
                           (convert_autoencoder_dc_checkpoint_to_diffusers) turns back into
                           exactly "sana"'s state dict, which is checked here

The three configurations hold every block type and option the released configs use:
  sana: Sana's DC-AE (dc-ae-f32c32-sana-1.x) in small: ResBlocks then EfficientViTBlocks with
        5x5 multi-scale aggregation, stride-2 conv down samplers, nearest-interpolation up
        samplers, RMSNorm and SiLU throughout, both shortcuts;
  in:   the in/mix-1.0 family's shape: no first-stage layers (conv_in and conv_out are the down
        and up samplers, without shortcuts), pixel-unshuffle / pixel-shuffle, EfficientViTBlocks
        without aggregation, BatchNorm + ReLU decoder stages, shortcuts off, a SiLU last act.
  lite: DC-AE-Lite's shape: Sana's encoder, a decoder of ResBlocks without first-stage layers,
        pixel-shuffle up samplers, a SiLU last act.
The 8 x 8 images make the last stage 2 x 2, no more cells than a head has channels: diffusers
then takes its quadratic attention, which is checked too.
"""
import json
import os
import sys

import torch
from diffusers import AutoencoderDC
from diffusers.loaders.single_file_utils import convert_autoencoder_dc_checkpoint_to_diffusers
from safetensors.torch import save_file

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
configs = {
    "sana": dict(in_channels=3, latent_channels=4, attention_head_dim=8,
                 encoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
                 decoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
                 encoder_block_out_channels=[8, 16, 32], decoder_block_out_channels=[8, 16, 32],
                 encoder_layers_per_block=[1, 1, 2], decoder_layers_per_block=[1, 2, 2],
                 encoder_qkv_multiscales=[[], [], [5]], decoder_qkv_multiscales=[[], [], [5]],
                 downsample_block_type="Conv", upsample_block_type="interpolate",
                 decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407),
    "in": dict(in_channels=3, latent_channels=8, attention_head_dim=8,
               encoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
               decoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
               encoder_block_out_channels=[8, 16, 32], decoder_block_out_channels=[8, 16, 32],
               encoder_layers_per_block=[0, 2, 1], decoder_layers_per_block=[0, 2, 1],
               encoder_qkv_multiscales=[[], [], []], decoder_qkv_multiscales=[[], [], []],
               downsample_block_type="pixel_unshuffle", upsample_block_type="pixel_shuffle",
               decoder_norm_types=["batch_norm", "batch_norm", "rms_norm"], decoder_act_fns=["relu", "relu", "silu"],
               encoder_out_shortcut=False, decoder_in_shortcut=False, decoder_conv_act_fn="silu",
               scaling_factor=0.3189),
    # DC-AE-Lite (mit-han-lab/dc-ae-lite-f32c32-sana-1.1-diffusers, upstream's Sprint lite YAMLs) as
    # upstream's efficientvit dc_ae.py describes it: Sana's encoder, a decoder of ResBlocks only with
    # no first-stage layers (conv_out is the up sampler), pixel-shuffle up samplers, SiLU last act.
    "lite": dict(in_channels=3, latent_channels=4, attention_head_dim=8,
                 encoder_block_types=["ResBlock", "ResBlock", "EfficientViTBlock"],
                 decoder_block_types=["ResBlock", "ResBlock", "ResBlock"],
                 encoder_block_out_channels=[8, 16, 32], decoder_block_out_channels=[8, 16, 32],
                 encoder_layers_per_block=[1, 1, 2], decoder_layers_per_block=[0, 2, 2],
                 encoder_qkv_multiscales=[[], [], [5]], decoder_qkv_multiscales=[[], [], []],
                 downsample_block_type="Conv", upsample_block_type="pixel_shuffle",
                 decoder_norm_types="rms_norm", decoder_act_fns="silu", decoder_conv_act_fn="silu",
                 scaling_factor=0.41407),
}
if "--upstream-shape" in sys.argv[2:]:
    torch.manual_seed(11)
    AutoencoderDC(in_channels=3, latent_channels=32, attention_head_dim=8,
                  encoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                  decoder_block_types=["ResBlock"] * 3 + ["EfficientViTBlock"] * 3,
                  encoder_block_out_channels=[8, 8, 16, 16, 32, 64], decoder_block_out_channels=[8, 8, 16, 16, 32, 64],
                  encoder_layers_per_block=[1, 1, 1, 1, 1, 1], decoder_layers_per_block=[1, 1, 1, 1, 1, 1],
                  encoder_qkv_multiscales=[[], [], [], [5], [5], [5]], decoder_qkv_multiscales=[[], [], [], [5], [5], [5]],
                  downsample_block_type="Conv", upsample_block_type="interpolate", scaling_factor=0.41407
                  ).eval().save_pretrained(os.path.join(out, "f32c32"))
    sys.exit(0)


# A block's tensors: diffusers' name (after SIDE.down_blocks.I.J.) -> efficientvit's (after
# SIDE.stages.I.op_list.J.); q, k and v are fused below.
BLOCK_NAMES = [
    ("attn.to_qkv_multiscale.0.proj_in.", "context_module.main.aggreg.0.0."),
    ("attn.to_qkv_multiscale.0.proj_out.", "context_module.main.aggreg.0.1."),
    ("attn.norm_out.", "context_module.main.proj.norm."),
    ("attn.to_out.", "context_module.main.proj.conv."),
    ("attn.to_", "context_module.main.qkv.conv.to_"),
    ("conv_out.conv_inverted.", "local_module.main.inverted_conv.conv."),
    ("conv_out.conv_depth.", "local_module.main.depth_conv.conv."),
    ("conv_out.conv_point.", "local_module.main.point_conv.conv."),
    ("conv_out.norm.", "local_module.main.point_conv.norm."),
    ("conv1.", "main.conv1.conv."),
    ("conv2.", "main.conv2.conv."),
    ("norm.", "main.conv2.norm."),
    ("conv.", "main.conv.conv."),
]
ENDS = [("encoder.conv_in.", "encoder.project_in.conv."), ("encoder.conv_out.", "encoder.project_out.0.conv."),
        ("decoder.conv_in.", "decoder.project_in.conv."), ("decoder.norm_out.", "decoder.project_out.0."),
        ("decoder.conv_out.", "decoder.project_out.2.conv.")]


def efficientvit_names(state):
    """diffusers' names -> efficientvit's, for a config whose first stage has layers (Sana's)."""
    out, qkv = {}, {}
    for key, t in state.items():
        k = key
        for a, b in ENDS:
            if k.startswith(a):
                k = b + k[len(a):]
        parts = k.split(".")
        if parts[1] in ("down_blocks", "up_blocks"):
            rest = ".".join(parts[4:])
            rest = next(b + rest[len(a):] for a, b in BLOCK_NAMES if rest.startswith(a))
            k = f"{parts[0]}.stages.{parts[2]}.op_list.{parts[3]}.{rest}"
        if ".qkv.conv.to_" in k:
            parent, which = k.split(".qkv.conv.to_")
            qkv.setdefault(parent, {})[which[0]] = t
            continue
        out[k] = t[:, :, None, None] if k.endswith("proj.conv.weight") else t
    for parent, w in qkv.items():
        out[parent + ".qkv.conv.weight"] = torch.cat([w["q"], w["k"], w["v"]])[:, :, None, None].contiguous()
    return out


cases = {}
torch.manual_seed(11)
for name, cfg in configs.items():
    vae = AutoencoderDC(**cfg).eval()
    with torch.no_grad():
        for mod_name, mod in vae.named_modules():
            if isinstance(mod, torch.nn.BatchNorm2d):  # statistics away from the identity
                mod.running_mean.copy_(torch.randn_like(mod.running_mean) * 0.3)
                mod.running_var.copy_(torch.rand_like(mod.running_var) + 0.5)
        for p_name, p in vae.named_parameters():
            if "norm" in p_name:  # norm weights away from 1, biases away from 0
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p_name.endswith("weight") else 0.0))
    folder = os.path.join(out, name)
    vae.save_pretrained(folder, max_shard_size="200KB" if name == "sana" else "10GB")
    images = torch.rand(2, 3, 32, 32) * 2 - 1
    small = torch.rand(2, 3, 8, 8) * 2 - 1
    tensors = {"images": images, "small": small}

    def run(dtype, prefix):
        m = AutoencoderDC.from_pretrained(folder, torch_dtype=dtype).eval()
        with torch.no_grad():
            z = m.encode(images.to(dtype)).latent
            tensors[f"latents_{prefix}"] = z.float().contiguous()
            tensors[f"decoded_{prefix}"] = m.decode(z).sample.float().contiguous()
            if dtype == torch.float32:
                zs = m.encode(small).latent
                tensors["small_latents"] = zs.contiguous()
                tensors["small_decoded"] = m.decode(zs).sample.contiguous()
        return sum(p.numel() for p in m.parameters())

    cases[name] = {"parameters": run(torch.float32, "fp32"), "scaling_factor": cfg["scaling_factor"]}
    if name == "sana":  # efficientvit's layout, as diffusers' converter reads it
        state = {k: v.clone() for k, v in vae.state_dict().items()}
        original = efficientvit_names(state)
        back = convert_autoencoder_dc_checkpoint_to_diffusers(dict(original))
        assert sorted(back) == sorted(state), sorted(set(back) ^ set(state))[:8]
        assert all(torch.equal(back[k].reshape(state[k].shape), state[k]) and back[k].shape == state[k].shape
                   for k in state), [k for k in state if back[k].shape != state[k].shape][:8]
        os.makedirs(os.path.join(out, "sana_efficientvit"), exist_ok=True)
        save_file(original, os.path.join(out, "sana_efficientvit", "model.safetensors"))
    if name == "sana":
        run(torch.bfloat16, "bf16")
    save_file(tensors, os.path.join(out, name + ".safetensors"))
with open(os.path.join(out, "cases.json"), "w") as f:
    json.dump(cases, f)
