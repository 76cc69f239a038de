#!/usr/bin/env python3
"""LoRA on Sana as PEFT computes it, for checking the C++ adapters (src/sana/model/lora.h).

Usage: lora_reference.py CASE.safetensors
The case file (written by the C++ test "LoRA's forward and backward match a python3-torch
reference"): the base weights "w.<upstream name>", the adapters "lora.<diffusers LoRA name>"
(transformer.transformer_blocks.N.attn1.to_q.lora_A.weight, ...), the inputs "in.*", the C++
prediction "out.pred" and the C++ gradients "grad.<diffusers LoRA name>" of the loss
mean((pred - in.target)^2); metadata: the spec (JSON) and the adapters' alpha.

Independent of the C++ code: the base is upstream_model.SanaMS (upstream's modules, strict
names); each adapter is PEFT's LoRA layer as peft/tuners/lora/layer.py builds it: lora_A then
lora_B without bias (nn.Linear(in, r), nn.Linear(r, out); for a Conv2d base nn.Conv2d(in, r)
with the base's kernel, stride and padding, then a 1x1 nn.Conv2d(r, out)), added as
base(x) + lora_B(lora_A(x)) * lora_alpha / r. Each adapter sits on a module of diffusers'
SanaTransformer2DModel; that module is found in upstream's model through diffusers'
conversion rules (the rename tables of diffusers_convert.py, and its row splits: to_q, to_k,
to_v are thirds of upstream's qkv; attn2.to_k and to_v halves of kv_linear), so an adapter
on to_k adds to rows C..2C of qkv's output. Runs in float64; prints the largest relative
difference of the prediction and of the gradients; exits 1 above 1e-6.
"""
import json
import sys

import torch
from torch import nn

from diffusers_convert import BLOCK, TOP
from sana_reference import read_safetensors
from upstream_model import model_of_case

TOLERANCE = 1e-6
# diffusers' parts of upstream's fused layers: (upstream module, part, parts).
SPLITS = {
    "attn1.to_q": ("attn.qkv", 0, 3),
    "attn1.to_k": ("attn.qkv", 1, 3),
    "attn1.to_v": ("attn.qkv", 2, 3),
    "attn2.to_k": ("cross_attn.kv_linear", 0, 2),
    "attn2.to_v": ("cross_attn.kv_linear", 1, 2),
}


def upstream_module(diffusers_name):
    """diffusers' module name -> (upstream module path, part, parts)."""
    if diffusers_name.startswith("transformer_blocks."):
        _, n, rest = diffusers_name.split(".", 2)
        if rest in SPLITS:
            path, part, parts = SPLITS[rest]
            return f"blocks.{n}.{path}", part, parts
        for old, new in BLOCK.items():
            if new == rest + ".":
                return f"blocks.{n}.{old[:-1]}", 0, 1
        raise KeyError(diffusers_name)
    for old, new in TOP.items():
        if new == diffusers_name + ".":
            return old[:-1], 0, 1
    raise KeyError(diffusers_name)


class LoraLayer(nn.Module):  # PEFT's lora.Linear / lora.Conv2d, one adapter
    def __init__(self, base, r, alpha, out):  # out: the rows of the diffusers module
        super().__init__()
        if isinstance(base, nn.Conv2d):
            self.lora_A = nn.Conv2d(base.in_channels, r, base.kernel_size, base.stride, base.padding, bias=False)
            self.lora_B = nn.Conv2d(r, out, (1, 1), (1, 1), bias=False)
        else:
            self.lora_A = nn.Linear(base.in_features, r, bias=False)
            self.lora_B = nn.Linear(r, out, bias=False)
        self.scaling = alpha / r

    def forward(self, x):
        return self.lora_B(self.lora_A(x)) * self.scaling


def attach(model, adapters, alpha):
    """adapters: diffusers module name -> {"lora_A": tensor, "lora_B": tensor}. Returns the
    LoRA layers by name (their parameters are the only ones that require gradients)."""
    layers = {}
    sites = {}
    for name, pair in adapters.items():
        path, part, parts = upstream_module(name)
        base = model.get_submodule(path)
        r = pair["lora_A"].shape[0]
        out = (base.out_channels if isinstance(base, nn.Conv2d) else base.out_features) // parts
        layer = LoraLayer(base, r, alpha, out).double()
        layer.lora_A.weight.data.copy_(pair["lora_A"])
        layer.lora_B.weight.data.copy_(pair["lora_B"])
        layers[name] = layer
        sites.setdefault(path, []).append((part, parts, layer))

    for path, entries in sites.items():
        base = model.get_submodule(path)
        dim = 1 if isinstance(base, nn.Conv2d) else -1

        def hook(module, inputs, output, entries=entries, dim=dim):
            out = output.clone()
            rows = out.shape[dim] // entries[0][1]
            for part, _, layer in entries:
                out.narrow(dim, part * rows, rows).add_(layer(inputs[0]))
            return out

        base.register_forward_hook(hook)
    return layers


def check(path):
    tensors, meta = read_safetensors(path)
    spec = json.loads(meta["spec"])
    alpha = float(meta["alpha"])
    model = model_of_case(tensors, spec)
    model.requires_grad_(False)
    adapters = {}
    for key, t in tensors.items():
        if not key.startswith("lora.transformer."):
            continue
        module, kind = key[len("lora.transformer."):].rsplit(".", 2)[0], key.rsplit(".", 2)[1]
        adapters.setdefault(module, {})[kind] = t.double()
    layers = attach(model, adapters, alpha)
    pred = model(tensors["in.x"].double(), tensors["in.t"].double(), tensors["in.y"].double(), tensors["in.mask"],
                 tensors["in.drop"].long())
    loss = (pred - tensors["in.target"].double()).pow(2).mean()
    loss.backward()
    ours = tensors["out.pred"].double()
    worst_pred = ((pred.detach() - ours).abs().max() / ours.abs().max()).item()
    worst_grad = 0.0
    for name, layer in layers.items():
        for kind in ("lora_A", "lora_B"):
            mine = getattr(layer, kind).weight.grad
            theirs = tensors[f"grad.transformer.{name}.{kind}.weight"].double()
            scale = max(theirs.abs().max().item(), 1e-300)
            worst_grad = max(worst_grad, (mine - theirs).abs().max().item() / scale)
    print(f"{meta.get('case', path)}: {len(layers)} adapters; prediction max relative difference {worst_pred:.3g}, "
          f"gradients {worst_grad:.3g}")
    return max(worst_pred, worst_grad)


def main():
    worst = max(check(path) for path in sys.argv[1:])
    print(f"worst relative difference {worst:.3g} (tolerance {TOLERANCE})")
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
