#!/usr/bin/env python3
"""Upstream's HEDdetector (tools/controlnet/annotator/hed) on the image a C++ case file holds,
with the TorchScript network given, against the edges sana-train computed.

Usage: hed_reference.py CASE.safetensors HED.pt
CASE holds "rgb" [H, W, 3] uint8 (the network's input) and "edges" [H, W] uint8 (ours).
Upstream: the five side outputs as float32, each resized to H x W by cv2.resize(INTER_LINEAR)
(written out here in numpy: half-pixel centres, edges clamped), their float32 mean, a sigmoid
in float64, x 255, clipped, truncated to uint8. Prints the largest difference and how many
pixels differ; exits 1 unless every pixel is within 1 and at most 0.1% differ at all."""
import sys

import numpy as np
import torch

from sana_reference import read_safetensors


def resize_linear(e, h, w):
    """cv2.resize(e, (w, h), interpolation=cv2.INTER_LINEAR) for a float32 map."""
    def taps(n_out, n_in):
        x = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
        x0 = np.floor(x).astype(int)
        f = x - x0
        f[x0 < 0] = 0
        x0 = np.clip(x0, 0, n_in - 1)
        x1 = np.clip(x0 + 1, 0, n_in - 1)
        return x0, x1, f.astype(np.float32)
    y0, y1, fy = taps(h, e.shape[0])
    x0, x1, fx = taps(w, e.shape[1])
    top = e[y0][:, x0] * (1 - fx) + e[y0][:, x1] * fx
    bottom = e[y1][:, x0] * (1 - fx) + e[y1][:, x1] * fx
    return (top * (1 - fy)[:, None] + bottom * fy[:, None]).astype(np.float32)


def main():
    tensors, _ = read_safetensors(sys.argv[1])
    rgb, ours = tensors["rgb"], tensors["edges"].numpy().astype(int)
    h, w = rgb.shape[:2]
    net = torch.jit.load(sys.argv[2])
    with torch.no_grad():
        sides = net(rgb.permute(2, 0, 1)[None].float())
    edges = np.stack([resize_linear(e.numpy().astype(np.float32)[0, 0], h, w) for e in sides], axis=2)
    edge = 1 / (1 + np.exp(-np.mean(edges, axis=2).astype(np.float64)))
    theirs = (edge * 255.0).clip(0, 255).astype(np.uint8).astype(int)
    worst = np.abs(theirs - ours).max()
    differ = (theirs != ours).mean()
    print(f"{h}x{w}: largest difference {worst}, {differ:.3%} of pixels differ; "
          f"edges span {theirs.min()}-{theirs.max()}")
    sys.exit(0 if worst <= 1 and differ <= 0.001 and theirs.max() > theirs.min() else 1)


if __name__ == "__main__":
    main()
