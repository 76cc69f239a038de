#!/usr/bin/env python3
"""CAME in numpy (float64), written from the paper's Algorithm 1 (Luo et al., 2023), to
check the C++ optimizer.

Usage: came.py CASE.safetensors
The case holds initial parameters "p0.<name>", per-step gradients "g<step>.<name>" and
the C++ results "out.<name>"; metadata "config" (JSON: lr, betas, eps, weight_decay,
steps). Factored statistics for 2-D tensors and 1x1 convolutions (as [out, in]).
Prints the largest relative difference; exits 1 above 1e-5.
"""
import json
import struct
import sys

import numpy as np


def read(path):
    b = open(path, "rb").read()
    (n,) = struct.unpack("<Q", b[:8])
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    out = {}
    for k, v in h.items():
        s, e = v["data_offsets"]
        out[k] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"]).astype(np.float64)
    return out, meta


def factored(shape):
    return len(shape) == 2 or (len(shape) == 4 and shape[2] == 1 and shape[3] == 1)


def rank1(row, col):
    # (R / mean(R)) outer C, then the inverse square root of that estimate
    return 1.0 / np.sqrt(np.outer(row / row.mean(), col))


def came(p, grads, lr, betas, eps, wd):
    b1, b2, b3 = betas
    e1, e2 = eps
    shape = p.shape
    fac = factored(shape)
    m = None
    for g in grads:
        g = g.reshape(shape[0], shape[1]) if fac else g
        u = g * g + e1
        if fac:
            if m is None:
                r = np.zeros(g.shape[0]); c = np.zeros(g.shape[1])
                rr = np.zeros(g.shape[0]); rc = np.zeros(g.shape[1])
                m = np.zeros_like(g)
            r = b2 * r + (1 - b2) * u.mean(axis=1)
            c = b2 * c + (1 - b2) * u.mean(axis=0)
            upd = rank1(r, c) * g
        else:
            if m is None:
                v = np.zeros_like(g); m = np.zeros_like(g)
            v = b2 * v + (1 - b2) * u
            upd = g / np.sqrt(v)
        upd = upd / max(1.0, np.sqrt((upd ** 2).mean()) / 1.0)
        m = b1 * m + (1 - b1) * upd
        if fac:
            res = (upd - m) ** 2 + e2
            rr = b3 * rr + (1 - b3) * res.mean(axis=1)
            rc = b3 * rc + (1 - b3) * res.mean(axis=0)
            step = rank1(rr, rc) * m
        else:
            step = m
        p = p * (1 - wd * lr)
        p = p - lr * step.reshape(shape)
    return p


def main():
    t, meta = read(sys.argv[1])
    cfg = json.loads(meta["config"])
    worst = 0.0
    for name in [k[3:] for k in t if k.startswith("p0.")]:
        grads = [t[f"g{s}.{name}"] for s in range(cfg["steps"])]
        ref = came(t["p0." + name], grads, cfg["lr"], cfg["betas"], cfg["eps"], cfg["weight_decay"])
        ours = t["out." + name]
        rel = np.abs(ours - ref).max() / np.abs(ref).max()
        print(f"{name} {list(ref.shape)} factored={factored(ref.shape)}: max relative difference {rel:.2e}")
        worst = max(worst, rel)
    print(f"worst {worst:.2e}")
    return 0 if worst <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
