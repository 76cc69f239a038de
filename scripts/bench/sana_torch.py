"""The SanaMS architecture in plain PyTorch (unconditional, pixel space), shared by the
Python benchmark scripts (scripts/bench/py_trainer.py, scripts/bench/ddp_engine.py)."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PRESETS = {  # width, depth, patch
    "SanaMS_tiny_P2_D4": (128, 4, 2),
    "SanaMS_small_P2_D8": (256, 8, 2),
    "SanaMS_100M_P2_D12": (768, 12, 2),
}


class LiteLA(nn.Module):
    def __init__(self, c, head_dim=32):
        super().__init__()
        self.qkv = nn.Linear(c, 3 * c, bias=False)
        self.proj = nn.Linear(c, c)
        self.heads, self.d = c // head_dim, head_dim

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, c).unbind(2)
        q, k, v = (t.transpose(-1, -2).reshape(b, self.heads, self.d, n) for t in (q, k, v))
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), value=1.0)
        out = (v @ k.transpose(-1, -2)) @ q
        out = out[:, :, :-1] / (out[:, :, -1:] + 1e-8)
        return self.proj(out.reshape(b, c, n).permute(0, 2, 1))


class GLUMBConv(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.inverted = nn.Conv2d(c, 2 * h, 1)
        self.depth = nn.Conv2d(2 * h, 2 * h, 3, padding=1, groups=2 * h)
        self.point = nn.Conv2d(h, c, 1, bias=False)

    def forward(self, x, hh, ww):
        b, n, c = x.shape
        t = x.reshape(b, hh, ww, c).permute(0, 3, 1, 2)
        t = self.depth(F.silu(self.inverted(t)))
        a, g = t.chunk(2, dim=1)
        return self.point(a * F.silu(g)).reshape(b, c, n).permute(0, 2, 1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.attn = LiteLA(c)
        self.mlp = GLUMBConv(c, int(c * 2.5))
        self.table = nn.Parameter(torch.randn(6, c) / c ** 0.5)

    def forward(self, x, t0, hh, ww):
        b, _, c = x.shape
        m = (self.table[None] + t0.reshape(b, 6, c)).chunk(6, dim=1)
        ln = lambda z: F.layer_norm(z, (c,), eps=1e-6)
        x = x + m[2] * self.attn(ln(x) * (1 + m[1]) + m[0])
        return x + m[5] * self.mlp(ln(x) * (1 + m[4]) + m[3], hh, ww)


class SanaMS(nn.Module):
    def __init__(self, c, depth, p):
        super().__init__()
        self.p = p
        self.x_embedder = nn.Conv2d(3, c, p, stride=p)
        self.t_embedder = nn.Sequential(nn.Linear(256, c), nn.SiLU(), nn.Linear(c, c))
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(c, 6 * c))
        self.blocks = nn.ModuleList(Block(c) for _ in range(depth))
        self.final = nn.Linear(c, p * p * 3)
        self.final_table = nn.Parameter(torch.randn(2, c) / c ** 0.5)

    def forward(self, x, t):
        b, _, hh, ww = x.shape
        h, w = hh // self.p, ww // self.p
        tok = self.x_embedder(x).flatten(2).transpose(1, 2)
        freqs = torch.exp(-math.log(10000) * torch.arange(128, dtype=torch.float32) / 128)
        args = t[:, None] * freqs[None]
        temb = self.t_embedder(torch.cat([torch.cos(args), torch.sin(args)], -1))
        t0 = self.t_block(temb)
        for blk in self.blocks:
            tok = blk(tok, t0, h, w)
        c = tok.shape[-1]
        shift, scale = (self.final_table[None] + temb[:, None]).chunk(2, dim=1)
        out = self.final(F.layer_norm(tok, (c,), eps=1e-6) * (1 + scale) + shift)
        p = self.p
        return torch.einsum("nhwpqc->nchpwq", out.reshape(b, h, w, p, p, 3)).reshape(b, 3, hh, ww)
