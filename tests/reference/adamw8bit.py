#!/usr/bin/env python3
"""bitsandbytes' AdamW8bit (upstream Sana's AdamW8bitWrapper) as its CUDA kernels compute it,
in python3-torch float32, written from bitsandbytes' published source (0.44 and later:
bitsandbytes/optim/optimizer.py, bitsandbytes/functional.py create_dynamic_map,
csrc/kernels.cu kOptimizer32bit2State, kOptimizerStatic8bit2StateBlockwise and its
quantize_2D), to check the C++ optimizer step for step. Independent of the C++ choices where
it can be: the map is built as bitsandbytes builds it, and codes come from a literal
transcription of the kernel's binary search, not from midpoints.

Usage: adamw8bit.py CASE.safetensors
The case holds initial parameters "p0.<name>", per-step gradients "g<step>.<name>", the C++
parameters after the last step "out.<name>" and its state "s1.<name>", "s2.<name>" (uint8
codes), "a1.<name>", "a2.<name>" (absmax per block of 256); metadata "config" (JSON: lr,
betas, eps, weight_decay, steps, min_8bit_size).

The rules (per parameter; float32 throughout; t = the step, from 1):
- fewer than min_8bit_size elements: fp32 moments, bitsandbytes' 32-bit Adam kernel;
  else uint8 codes of the signed (first moment) and unsigned (second) dynamic maps times an
  fp32 absmax per block of 256 elements, all zero at first;
- m = code1[c1] * a1 * b1 + (1 - b1) g; v = code2[c2] * a2 * b2 + ((1 - b2) g) g; a
  non-finite g gives m = v = 0 and leaves its element alone;
- the new absmax of a block: max |m|, max v over its 256 lanes, the padding lanes of a short
  last block included (g = 0 there, codes 128 and 0: m = code1[128] * a1 * b1, v = 0);
- p += step_size * m / (sqrt(v) + c2 * eps), step_size = -lr * c2 / c1, c1 = 1 - b1^t,
  c2 = sqrt(1 - b2^t); then p *= 1 - lr * wd;
- codes of m / a1' and v / a2' by quantize_2D; a first-moment code whose entry's sign bit
  differs from m's moves one step towards m (mod 256).
Prints per parameter the largest relative difference and how many codes differ; exits 1 when
any parameter differs by more than 1e-6 relative or any code or absmax differs."""
import json
import sys

import numpy as np
import torch

from came8bit import read  # the case file's tensors (float32, uint8) and metadata

F = np.float32
BLOCK = 256


def create_dynamic_map(signed=True, max_exponent_bits=7, total_bits=8):
    data = []
    non_sign_bits = total_bits - 1
    for i in range(max_exponent_bits):
        items = 2 ** (i + non_sign_bits - max_exponent_bits) + 1 if signed else 2 ** (i + non_sign_bits - max_exponent_bits + 1) + 1
        boundaries = torch.linspace(0.1, 1, items, dtype=torch.float32)
        means = (boundaries[:-1] + boundaries[1:]) / 2.0
        data += ((10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
        if signed:
            data += (-(10 ** (-(max_exponent_bits - 1) + i)) * means).tolist()
    data.append(0)
    data.append(1.0)
    assert len(data) == 2 ** total_bits
    data.sort()
    return torch.tensor(data, dtype=torch.float32)


def quantize_2d(code, x, signed):
    """The kernel's search, element by element (vectorised): 7 halvings from entry 127, then
    the nearer of the last entry and the bound on x's side, by the midpoint."""
    half = torch.tensor(0.5, dtype=torch.float32)
    pivot = torch.full_like(x, 127, dtype=torch.long)
    upper_i = torch.full_like(pivot, 255)
    lower_i = torch.zeros_like(pivot)
    lower = torch.full_like(x, -1.0 if signed else 0.0)
    upper = torch.full_like(x, 1.0)
    val = code[pivot]
    for step in (64, 32, 16, 8, 4, 2, 1):
        gt = x > val
        lower_i = torch.where(gt, pivot, lower_i)
        lower = torch.where(gt, val, lower)
        upper_i = torch.where(gt, upper_i, pivot)
        upper = torch.where(gt, upper, val)
        pivot = torch.where(gt, pivot + step, pivot - step)
        val = code[pivot]
    gt = x > val
    above = torch.where(x > (upper + val) * half, upper_i, pivot)
    below = torch.where(x < (lower + val) * half, lower_i, pivot)
    return torch.where(gt, above, below)


def per_element(per_block, n):
    return per_block.repeat_interleave(BLOCK)[:n]


def block_max(x, pad_value, n):
    blocks = (n + BLOCK - 1) // BLOCK
    full = torch.cat([x, pad_value.reshape(1).expand(blocks * BLOCK - n)])
    return full.view(blocks, BLOCK).max(dim=1).values


def run(p, grads, cfg):
    b1, b2 = (F(b) for b in cfg["betas"])
    eps, lr, wd = F(cfg["eps"]), F(cfg["lr"]), F(cfg["weight_decay"])
    t32 = lambda v: torch.tensor(v, dtype=torch.float32)
    n = p.numel()
    eight = n >= cfg["min_8bit_size"]
    code1, code2 = create_dynamic_map(True), create_dynamic_map(False)
    flat = p.reshape(-1).clone()
    blocks = (n + BLOCK - 1) // BLOCK
    if eight:
        c1s = torch.zeros(n, dtype=torch.long)
        c2s = torch.zeros(n, dtype=torch.long)
        a1 = torch.zeros(blocks)
        a2 = torch.zeros(blocks)
    else:
        m = torch.zeros(n)
        v = torch.zeros(n)
    for step, g in enumerate(grads, start=1):
        g = g.reshape(-1).float()
        c1 = F(1) - b1 ** F(step)
        c2 = np.sqrt(F(1) - b2 ** F(step))
        step_size = t32((-lr * c2) / c1)
        if not eight:
            m = m * t32(b1) + t32(F(1) - b1) * g
            v = v * t32(b2) + t32(F(1) - b2) * (g * g)
            flat = flat + step_size * (m / (v.sqrt() + t32(eps * c2)))
            if wd > 0:
                flat = flat * t32(F(1) - lr * wd)
            continue
        finite = torch.isfinite(g)
        m = code1[c1s] * per_element(a1, n)
        v = code2[c2s] * per_element(a2, n)
        v = v * t32(b2) + (t32(F(1) - b2) * g) * g
        m = m * t32(b1) + t32(F(1) - b1) * g
        m = torch.where(finite, m, torch.zeros_like(m))
        v = torch.where(finite, v, torch.zeros_like(v))
        m_pad = code1[128] * a1[-1] * t32(b1) + t32(F(1) - b1) * t32(0.0)
        v_pad = code2[0] * a2[-1] * t32(b2) + (t32(F(1) - b2) * t32(0.0)) * t32(0.0)
        new1 = block_max(m.abs(), m_pad.abs(), n)
        new2 = block_max(v, v_pad, n)
        upd = flat + step_size * (m / (v.sqrt() + t32(c2 * eps)))
        if wd > 0:
            upd = upd * t32(F(1) - lr * wd)
        flat = torch.where(finite, upd, flat)
        c1s = quantize_2d(code1, m / per_element(new1, n), True)
        flip = torch.signbit(code1[c1s]) != torch.signbit(m)
        c1s = torch.where(flip, (c1s + torch.where(m > 0, 1, -1)) % 256, c1s)
        c2s = quantize_2d(code2, v / per_element(new2, n), False)
        a1, a2 = new1, new2
    state = (c1s.to(torch.uint8), c2s.to(torch.uint8), a1, a2) if eight else None
    return flat.view(p.shape), state


def main():
    t, meta = read(sys.argv[1])
    cfg = json.loads(meta["config"])
    ok = True
    for name in [k[3:] for k in t if k.startswith("p0.")]:
        grads = [t[f"g{s}.{name}"] for s in range(cfg["steps"])]
        ref, state = run(t[f"p0.{name}"].clone(), grads, cfg)
        ours = t[f"out.{name}"]
        rel = ((ours - ref).abs() / ref.abs().clamp(min=1e-12)).max().item()
        line = f"{name}: {ref.numel()} elements, 8-bit {state is not None}, largest relative difference {rel:.3g}"
        ok = ok and rel <= 1e-6
        if state is not None:
            s1, s2, a1, a2 = state
            differ = int((t[f"s1.{name}"].reshape(-1) != s1).sum()) + int((t[f"s2.{name}"].reshape(-1) != s2).sum())
            absmax_same = torch.equal(t[f"a1.{name}"], a1) and torch.equal(t[f"a2.{name}"], a2)
            line += f", codes differing {differ} of {2 * s1.numel()}, absmax {'equal' if absmax_same else 'DIFFERENT'}"
            ok = ok and differ == 0 and absmax_same
        print(line)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
