#!/usr/bin/env python3
"""SANA-1.5's model growth by the rules of upstream's ModelGrowthInitializer
(diffusion/model/model_growth_utils.py), written here from those rules, against the C++
model/growth.h.

Usage: model_growth.py SOURCE.safetensors CASE.safetensors...
Each case file (the C++ test "model growth ...") holds the grown model's tensors before
("init.<name>") and after ("out.<name>") growing it from SOURCE, and as metadata the
strategy, its parameters, the layer counts, the seed and the model's tensor order. This
applies the rules to SOURCE and "init.*" and compares every tensor for exact equality.
Random draws come from torch.Generator().manual_seed(seed), drawn in the model's tensor
order as the C++ side draws them (upstream uses torch's global generator: its draws cannot
be repeated, its rules can). Tensor names are matched as upstream matches them: by
substring ("blocks.3." in key). Exits 1 when a tensor differs.
"""
import json
import sys

import torch

from sana_reference import read_safetensors

GATED = ("scale_shift_table", "cross_attn.proj.weight", "cross_attn.proj.bias", "attn.proj.weight",
         "attn.proj.bias", "mlp.point_conv.conv.weight", "mlp.point_conv.conv.bias")


def grow(source, init, order, meta):
    target = {k: v.clone() for k, v in init.items()}
    S, T = int(meta["source_layers"]), int(meta["target_layers"])
    p = json.loads(meta["params"])
    gen = torch.Generator().manual_seed(int(meta["seed"]))

    def randn_like(t):
        return torch.randn(t.shape, generator=gen, dtype=t.dtype)

    def copy(src, dst, zero_gate):
        for k, v in source.items():
            if f"blocks.{src}." in k:
                nk = k.replace(f"blocks.{src}.", f"blocks.{dst}.")
                assert nk in target, f"{nk} not in the model"
                if zero_gate and any(g in nk for g in GATED):
                    target[nk] = torch.zeros_like(v)
                else:
                    target[nk] = v

    def block_keys(i):
        return [k for k in order if f"blocks.{i}." in k]

    for k, v in source.items():  # everything outside the blocks, pos_embed excepted
        if "blocks." not in k and k != "pos_embed":
            target[k] = v
    strategy = meta["strategy"]
    if strategy == "cyclic":
        for i in range(T):
            copy(i % S, i, p["zero_gate"] and i >= S)
    elif strategy == "block_expand":
        r = p["expand_ratio"]
        assert T == S * r
        for s in range(S):
            for off in range(r):
                copy(s, s * r + off, p["zero_gate"] and off > 0)
    else:
        for i in range(S):
            copy(i, i, False)
        for i in range(S, T):
            if strategy == "progressive":
                for k in block_keys(i):
                    prev = target[k.replace(f"blocks.{i}.", f"blocks.{i - 1}.")]
                    noise = randn_like(prev) * p["noise_scale"]
                    target[k] = prev + noise
            elif strategy == "interpolation":
                lo = (i * S) // T
                hi = min(lo + 1, S - 1)
                alpha = (i * S) / T - lo
                for k in block_keys(i):
                    low = source[k.replace(f"blocks.{i}.", f"blocks.{lo}.")]
                    high = source[k.replace(f"blocks.{i}.", f"blocks.{hi}.")]
                    target[k] = (1 - alpha) * low + alpha * high
            elif strategy == "constant":
                for k in block_keys(i):
                    t = target[k]
                    if any(x in k for x in ("cross_attn.proj.weight", "attn.proj.weight", "mlp.point_conv.conv.weight")):
                        target[k] = randn_like(t) * p["scale_spec"]
                    elif "q_norm.weight" in k or "k_norm.weight" in k:
                        target[k] = torch.ones_like(t)
                    elif ("attn.proj.bias" in k or "cross_attn.q_linear.bias" in k or "cross_attn.kv_linear.bias" in k
                          or "cross_attn.proj.bias" in k):
                        target[k] = torch.zeros_like(t)
                    elif "mlp.depth_conv.conv.weight" in k or "mlp.depth_conv.conv.bias" in k:
                        target[k] = randn_like(t) * 0.2
                    else:
                        target[k] = randn_like(t) * p["scale_others"]
            elif strategy != "random":  # random: the new blocks keep the model's initialisation
                raise ValueError(f"unknown strategy {strategy}")
    return target


def check(source, path):
    tensors, meta = read_safetensors(path)
    init = {k[5:]: v for k, v in tensors.items() if k.startswith("init.")}
    out = {k[4:]: v for k, v in tensors.items() if k.startswith("out.")}
    expected = grow(source, init, json.loads(meta["order"]), meta)
    differ = [k for k in out if not torch.equal(out[k], expected[k].to(out[k].dtype))]
    changed = sum(1 for k in out if not torch.equal(out[k], init[k]))
    name = meta.get("case", path)
    print(f"{name}: {len(out)} tensors, {changed} changed by the growth, {len(differ)} differ"
          + (f" (first: {differ[0]})" if differ else ""))
    return not differ


def main():
    source, _ = read_safetensors(sys.argv[1])
    ok = all([check(source, path) for path in sys.argv[2:]])
    print("every tensor equal" if ok else "FAILED: tensors differ")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
