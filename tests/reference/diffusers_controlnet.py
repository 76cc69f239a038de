#!/usr/bin/env python3
"""diffusers itself as the judge of our ControlNet export: SanaControlNetModel and
SanaTransformer2DModel load the two folders `export_controlnet_diffusers` wrote (controlnet/
and transformer/, as SanaControlNetPipeline takes them) with no missing, unexpected or
mismatched key, and diffusers' modules, wired as upstream's SanaMSControlNet wires them, give
the C++ model's output.

The wiring is upstream's, not SanaControlNetPipeline's, because the two differ: upstream
(diffusion/model/nets/sana_multi_scale_controlnet.py, and sana-train) feeds the first control
block the output of base block 0 plus before_proj of the control tokens, and adds control
block k's after_proj before base block k+1; diffusers' SanaControlNetModel feeds it the patch
embedding before any base block, and SanaTransformer2DModel adds sample k after base block
k+1. The script prints how far diffusers' own wiring lands from ours, as a figure, not a check.

usage: diffusers_controlnet.py CASE.safetensors FOLDER
The case holds in.x, in.t, in.y [B, L, C], in.mask, in.control (the control latent, like x),
out.pred (our forward) and the metadata "scale" (conditioning_scale) and "tolerance". Exit 1
over the tolerance or with a key diffusers did not load."""
import sys

import diffusers
import torch
from diffusers import SanaControlNetModel, SanaTransformer2DModel
from safetensors import safe_open


def load(cls, folder):
    model, info = cls.from_pretrained(folder, output_loading_info=True, torch_dtype=torch.float32)
    return model.eval(), {k: v for k, v in info.items() if v}


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with safe_open(sys.argv[1], framework="pt") as f:
        t, meta = {k: f.get_tensor(k) for k in f.keys()}, f.metadata()
    folder = sys.argv[2]
    controlnet, c_bad = load(SanaControlNetModel, folder + "/controlnet")
    transformer, t_bad = load(SanaTransformer2DModel, folder + "/transformer")
    if c_bad or t_bad:
        print(f"diffusers did not load the folders cleanly: controlnet {c_bad}, transformer {t_bad}")
        return 1
    mask = t["in.mask"].to(torch.float32)
    scale = float(meta["scale"])
    # Upstream's wiring, with diffusers' modules: before base block k (1 <= k <= N) the control
    # chain takes the hidden state, and its after_proj output joins it.
    control = {"c": None}

    def before_base_block(k):
        def hook(module, args):
            x, rest = args[0], args[1:]
            if k == 1:
                tokens = controlnet.patch_embed(t["in.control"].to(x.dtype))
                control["c"] = controlnet.transformer_blocks[0](x + controlnet.input_block(tokens), *rest)
            else:
                control["c"] = controlnet.transformer_blocks[k - 1](control["c"], *rest)
            return (x + controlnet.controlnet_blocks[k - 1](control["c"]) * scale, *rest)
        return hook

    handles = [transformer.transformer_blocks[k].register_forward_pre_hook(before_base_block(k))
               for k in range(1, controlnet.config.num_layers + 1)]
    with torch.no_grad():
        upstream_wired = transformer(t["in.x"], encoder_hidden_states=t["in.y"], timestep=t["in.t"],
                                     encoder_attention_mask=mask, return_dict=False)[0]
    for h in handles:
        h.remove()
    with torch.no_grad():
        samples = controlnet(t["in.x"], encoder_hidden_states=t["in.y"], timestep=t["in.t"],
                             controlnet_cond=t["in.control"], conditioning_scale=float(meta["scale"]),
                             encoder_attention_mask=mask, return_dict=False)[0]
        theirs = transformer(t["in.x"], encoder_hidden_states=t["in.y"], timestep=t["in.t"],
                             encoder_attention_mask=mask, controlnet_block_samples=samples, return_dict=False)[0]
    ours = t["out.pred"]
    rel = lambda a, b: ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()
    tolerance = float(meta["tolerance"])
    print(f"diffusers {diffusers.__version__}: SanaControlNetModel with {controlnet.config.num_layers} control "
          f"blocks and SanaTransformer2DModel loaded cleanly; at scale {meta['scale']}, their modules in upstream's "
          f"wiring: max relative difference {rel(ours, upstream_wired):.2e} (tolerance {tolerance:.0e}); "
          f"SanaControlNetPipeline's own wiring ({len(samples)} block samples): {rel(ours, theirs):.2e} from ours")
    return 0 if rel(ours, upstream_wired) <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
