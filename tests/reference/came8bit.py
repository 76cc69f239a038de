#!/usr/bin/env python3
"""Upstream Sana's 8-bit CAME (CAME8BitWrapper, diffusion/utils/optimizer.py) in python3-torch
float32, written from its rules, to check the C++ optimizer step for step.

Usage: came8bit.py CASE.safetensors
The case holds initial parameters "p0.<name>", per-step gradients "g<step>.<name>", the C++
parameters after the last step "out.<name>" and its quantized first moments
"q.<name>" (uint8); metadata "config" (JSON: lr, betas, eps, weight_decay, steps,
block_size, min_8bit_size).

The rules: a 2-D weight, or a 1x1 convolution, with more than min_8bit_size elements keeps its
first moment as uint8 codes, in chunks of block_size rows (dim 0), each with its fp32 min and
scale (max - min) / 255: code = round((x - min) / scale), value = code * scale + min. The
moment is dequantized at the start of a step, updated in fp32, quantized again right after its
update; the rest of that step (the confidence term, the parameter update) uses the fp32 value.
Row and column statistics stay fp32. Everything else is CAME as upstream's CAMEWrapper.
Prints the largest relative difference and how many codes differ; exits 1 above 1e-6."""
import json
import struct
import sys

import torch


def read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    kinds = {"F32": torch.float32, "U8": torch.uint8}
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = torch.frombuffer(bytearray(b[8 + n + s:8 + n + e]), dtype=kinds[v["dtype"]]).reshape(v["shape"])
    return out, meta


def kind(shape):
    if len(shape) == 4:
        return (True, "1x1_conv") if shape[2] == 1 and shape[3] == 1 else (False, "conv")
    if len(shape) == 2:
        return True, "linear"
    return False, "other"


def eight_bit(shape, min_size):
    if len(shape) == 2 or (len(shape) == 4 and shape[2] == 1 and shape[3] == 1):
        return shape[0] * shape[1] > min_size
    return False


def quantize(x, rows):
    """(codes, scale, min) per chunk of `rows` rows. A chunk of equal values (scale 0) gets
    codes 0: upstream divides 0 by 0 there, and any code dequantizes to its min."""
    chunks = []
    for c in x.split(rows):
        lo, hi = c.min(), c.max()
        scale = (hi - lo) / 255
        codes = ((c - lo) / scale).round().byte() if scale != 0 else torch.zeros_like(c, dtype=torch.uint8)
        chunks.append((codes, scale, lo))
    return chunks


def dequantize(chunks):
    return torch.cat([q.float() * scale + lo for q, scale, lo in chunks])


def rms(t):
    return t.norm(2) / (t.numel() ** 0.5)


def approx(row, col):
    r = (row / row.mean(dim=-1, keepdim=True)).rsqrt_().unsqueeze(-1)
    return torch.mul(r, col.unsqueeze(-2).rsqrt())


def factored_estimate(x, row, col, beta, shape, layer):
    """Updates the running row and column means of x (a 1x1 convolution as [out, in]) and
    returns their rank-1 estimate of 1 / sqrt(x), in x's shape."""
    x2 = x.squeeze(-1).squeeze(-1) if len(shape) == 4 else x
    row.mul_(beta).add_(x2.mean(dim=1), alpha=1.0 - beta)
    col.mul_(beta).add_(x2.mean(dim=0), alpha=1.0 - beta)
    est = approx(row, col)
    return est.view(shape[0], shape[1], 1, 1) if layer == "1x1_conv" else est


def run(p, grads, cfg):
    b1, b2, b3 = cfg["betas"]
    e1, e2 = cfg["eps"]
    lr, wd = cfg["lr"], cfg["weight_decay"]
    shape = p.shape
    factored, layer = kind(shape)
    q8 = eight_bit(shape, cfg["min_8bit_size"])
    st = {}
    for g in grads:
        if not st:
            st["m"] = quantize(torch.zeros_like(g), cfg["block_size"]) if q8 else torch.zeros_like(g)
            if factored:
                st["row"], st["col"] = torch.zeros(shape[0]), torch.zeros(shape[1])
                st["rrow"], st["rcol"] = torch.zeros(shape[0]), torch.zeros(shape[1])
            else:
                st["v"] = torch.zeros_like(g)
        m = dequantize(st["m"]) if q8 else st["m"]
        u = g ** 2 + e1
        if factored:
            u = factored_estimate(u, st["row"], st["col"], b2, shape, layer).mul_(g)
        else:
            st["v"].mul_(b2).add_(u, alpha=1.0 - b2)
            u = st["v"].rsqrt().mul_(g)
        u.div_((rms(u) / 1.0).clamp_(min=1.0))
        m.mul_(b1).add_(u, alpha=1 - b1)
        st["m"] = quantize(m, cfg["block_size"]) if q8 else m
        res = (u - m) ** 2 + e2
        if factored:
            u = factored_estimate(res, st["rrow"], st["rcol"], b3, shape, layer).mul_(m)
        else:
            u = m.clone()
        if wd != 0:
            p.add_(p, alpha=-wd * lr)
        u.mul_(lr)
        p.add_(-u)
    codes = torch.cat([q for q, _, _ in st["m"]]) if q8 else None
    return p, codes


def main():
    t, meta = read(sys.argv[1])
    cfg = json.loads(meta["config"])
    worst, codes_differ, quantized = 0.0, 0, 0
    for name in [k[3:] for k in t if k.startswith("p0.")]:
        grads = [t[f"g{s}.{name}"] for s in range(cfg["steps"])]
        ref, codes = run(t[f"p0.{name}"].clone(), grads, cfg)
        ours = t[f"out.{name}"]
        rel = ((ours - ref).abs() / ref.abs().clamp(min=1e-12)).max().item()
        worst = max(worst, rel)
        if codes is not None:
            quantized += 1
            theirs = t[f"q.{name}"].reshape(codes.shape)
            codes_differ += int((theirs != codes).sum())
        print(f"{name}: shape {list(ref.shape)}, 8-bit {codes is not None}, largest relative difference {rel:.3g}")
    print(f"worst relative difference {worst:.3g}; {quantized} quantized tensors, {codes_differ} codes differ")
    return 0 if worst <= 1e-6 and codes_differ == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
