#!/usr/bin/env python3
"""Upstream's LADD discriminator heads and hinge losses in float64, for checking the C++ ones.

Usage: ladd_heads.py CASE.safetensors   (written by the C++ test "SANA-Sprint's discriminator
heads match upstream's DiscHead with torch's spectral norm": the heads' initial state dict
"w.<name>", one real and one fake feature per head "in.real<i>" / "in.fake<i>" ([B, N, C]:
the teacher block's output tokens), the C++ logits of two training-mode forwards, real
first, "out.real" / "out.fake", the losses "out.loss_d" / "out.loss_g", and every head's
spectral-norm vectors after both forwards "out.w.<name>")

The modules follow upstream's diffusion/model/nets/ladd_blocks.py (ResidualBlock,
SpectralConv1d through torch.nn.utils.spectral_norm's SpectralNorm.apply with one power
iteration, BatchNormLocal, make_block, DiscHead with c_dim 0) and sana_ladd.py's
SanaMSCMDiscriminator.forward (tokens transposed to [B, C, N], one logit per token, heads
concatenated); the losses train_scm_ladd.py's hinge: D 0.5 (mean relu(1 - real) + mean
relu(1 + fake)), G -mean(fake). Torch's own spectral norm is the independent part: the C++
code implements it anew. Exits 1 above a relative difference of 1e-9.

       ladd_heads.py --count CHANNELS HEADS
prints the parameters of HEADS heads on blocks of CHANNELS.
"""
import json
import math
import os
import sys

import torch
import torch.nn as nn
from torch.nn.utils.spectral_norm import SpectralNorm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sana_reference import read_safetensors  # noqa: E402

TOLERANCE = 1e-9


class ResidualBlock(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return (self.fn(x) + x) / math.sqrt(2)


class SpectralConv1d(nn.Conv1d):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        SpectralNorm.apply(self, name="weight", n_power_iterations=1, dim=0, eps=1e-12)


class BatchNormLocal(nn.Module):
    def __init__(self, num_features, affine=True, virtual_bs=8, eps=1e-5):
        super().__init__()
        self.virtual_bs, self.eps, self.affine = virtual_bs, eps, affine
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))

    def forward(self, x):
        shape = x.size()
        g = math.ceil(x.size(0) / self.virtual_bs)
        x = x.view(g, -1, x.size(-2), x.size(-1))
        mean = x.mean([1, 3], keepdim=True)
        var = x.var([1, 3], keepdim=True, unbiased=False)
        x = (x - mean) / (torch.sqrt(var + self.eps))
        x = x * self.weight[None, :, None] + self.bias[None, :, None]
        return x.view(shape)


def make_block(channels, kernel_size):
    return nn.Sequential(SpectralConv1d(channels, channels, kernel_size=kernel_size, padding=kernel_size // 2,
                                        padding_mode="circular"),
                         BatchNormLocal(channels), nn.LeakyReLU(0.2, True))


class DiscHead(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.main = nn.Sequential(make_block(channels, kernel_size=1), ResidualBlock(make_block(channels, kernel_size=9)))
        self.cls = SpectralConv1d(channels, 1, kernel_size=1, padding=0)

    def forward(self, x):
        return self.cls(self.main(x))


class Heads(nn.Module):
    def __init__(self, channels, count):
        super().__init__()
        self.heads = nn.ModuleList([DiscHead(channels) for _ in range(count)])

    def forward(self, feats):
        out = []
        for feat, head in zip(feats, self.heads):
            feat = feat.transpose(1, 2)
            out.append(head(feat).reshape(feat.shape[0], -1))
        return torch.cat(out, dim=1)


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def main():
    tensors, meta = read_safetensors(sys.argv[1])
    weights = {k[2:]: v.double() for k, v in tensors.items() if k.startswith("w.")}
    count = sum(1 for k in tensors if k.startswith("in.real"))
    channels = tensors["in.real0"].shape[-1]
    model = Heads(channels, count).double()
    model.load_state_dict(weights, strict=True)
    model.train()
    real_in = [tensors[f"in.real{i}"].double() for i in range(count)]
    fake_in = [tensors[f"in.fake{i}"].double() for i in range(count)]
    with torch.no_grad():
        real, fake = model(real_in), model(fake_in)
        loss_d = 0.5 * (torch.relu(1 - real).mean() + torch.relu(1 + fake).mean())
        loss_g = -fake.mean()
    state = model.state_dict()
    diffs = {"real": rel(tensors["out.real"].double(), real), "fake": rel(tensors["out.fake"].double(), fake),
             "loss_d": rel(tensors["out.loss_d"].double().reshape(()), loss_d),
             "loss_g": rel(tensors["out.loss_g"].double().reshape(()), loss_g),
             "u and v": max(rel(tensors["out.w." + k].double(), state[k]) for k in state if k.endswith(("_u", "_v")))}
    worst = max(diffs.values())
    print(f"{count} heads of {channels} channels, logits {list(real.shape)}: "
          + ", ".join(f"{k} {v:.2e}" for k, v in diffs.items()) + f"; worst {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


def count(channels, heads):
    """The parameters of `heads` DiscHeads of `channels` (one built; they are alike)."""
    print(heads * sum(p.numel() for p in DiscHead(channels).parameters()))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--count"]:
        sys.exit(count(int(sys.argv[2]), int(sys.argv[3])))
    sys.exit(main())
