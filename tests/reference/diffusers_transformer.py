#!/usr/bin/env python3
"""diffusers itself as the judge of our diffusers export: SanaTransformer2DModel.from_pretrained
loads each folder `sana-train export --format diffusers` (model/export.cpp) wrote, with no
missing, unexpected or mismatched key, and its forward on the case's latents, timesteps and
caption features equals the C++ model's output.

usage: diffusers_transformer.py CASE.safetensors FOLDER [CASE.safetensors FOLDER ...]
A case file holds in.x [B, C, H, W], in.t [B], in.y [B, L, C] or [B, 1, L, C] (captions), in.mask [B, L]
(1 keeps a token), optionally in.guidance [B] (SANA-Sprint's guidance embedding), and
out.pred, the C++ forward; its metadata "tolerance" is the largest relative difference
(max |ours - theirs| / max |theirs|) allowed, "case" names it, and "upstream_eps" 1 gives
diffusers' cross-attention q/k norms upstream's eps (see check()). Both sides run in float32:
diffusers' linear attention casts to float32, so float64 is not open to it. Exit 1 on the
first case over its tolerance or with a key diffusers did not load.
"""
import sys

import torch
from diffusers import SanaTransformer2DModel
from safetensors import safe_open


def read_case(path):
    with safe_open(path, framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}


def check(case_path, folder):
    t, meta = read_case(case_path)
    model, info = SanaTransformer2DModel.from_pretrained(folder, output_loading_info=True,
                                                         torch_dtype=torch.float32)
    unloaded = {k: v for k, v in info.items() if v}
    if unloaded:
        print(f"{meta.get('case', case_path)}: diffusers did not load the folder cleanly: {unloaded}")
        return False
    model.eval()
    # diffusers builds the cross-attention's q/k RMSNorms with Attention's eps, 1e-5; upstream's
    # MultiHeadCrossAttention (and so our model) uses 1e-6. With q/k norms that alone moves the
    # output by ~2e-5 relative: the case's "upstream_eps" metadata sets upstream's eps in diffusers'
    # modules, so that the comparison is of everything else, at the tolerance.
    if meta.get("upstream_eps") == "1" and model.config.qk_norm:
        for block in model.transformer_blocks:
            block.attn2.norm_q.eps = block.attn2.norm_k.eps = 1e-6
    config = model.config
    kwargs = {}
    if "in.guidance" in t:  # as SanaSprintPipeline passes it
        kwargs["guidance"] = t["in.guidance"] * config.guidance_embeds_scale
    y = t["in.y"].squeeze(1) if t["in.y"].dim() == 4 else t["in.y"]
    with torch.no_grad():
        # The timesteps as SanaPipeline passes them: times config.timestep_scale.
        theirs = model(hidden_states=t["in.x"], encoder_hidden_states=y, timestep=t["in.t"] * config.timestep_scale,
                       encoder_attention_mask=t["in.mask"].to(torch.float32), return_dict=False, **kwargs)[0]
    ours = t["out.pred"]
    if theirs.shape != ours.shape:
        print(f"{meta.get('case', case_path)}: diffusers' output {list(theirs.shape)}, ours {list(ours.shape)}")
        return False
    rel = ((ours.double() - theirs.double()).abs().max() / theirs.double().abs().max()).item()
    tolerance = float(meta.get("tolerance", "1e-5"))
    print(f"{meta.get('case', case_path)}: diffusers {__import__('diffusers').__version__} loaded "
          f"{sum(1 for _ in model.state_dict())} tensors (qk_norm {config.qk_norm}, "
          f"guidance_embeds {config.guidance_embeds}, timestep_scale {config.timestep_scale}"
          f"{', cross-attention q/k norm eps 1e-6 as upstream' if meta.get('upstream_eps') == '1' else ''}); "
          f"max relative difference {rel:.2e} (tolerance {tolerance:.0e})")
    return rel <= tolerance


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        print(__doc__, file=sys.stderr)
        return 2
    ok = all([check(args[i], args[i + 1]) for i in range(0, len(args), 2)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
