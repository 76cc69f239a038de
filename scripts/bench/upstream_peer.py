"""The SanaMS architecture as upstream's own classes build it (diffusion/model/nets/
sana_multi_scale.py, sana_blocks.py, basic_modules.py), in plain PyTorch: the speed peer of
issue 31, written from upstream's module choices and not from ours (sana_torch.py is a
compact transcription that followed our earlier forward). Unconditional and in pixel space, as the benchmarks' presets: upstream's
block without its cross-attention, which those presets do not have.

Upstream's choices kept: nn.Linear qkv without bias and LiteLA's ReLU kernels with the
padded value row and the divide (eps 1e-8 from SanaMSBlock), nn.LayerNorm modules without
affine (eps 1e-6), t2i_modulate, GLUMBConv as three ConvLayer-wrapped nn.Conv2d (1x1 with
SiLU, 3x3 depthwise, 1x1 without bias) and a SiLU gate, PatchEmbedMS's strided convolution,
TimestepEmbedder's cos-then-sin frequencies and MLP, t_block, T2IFinalLayer and
unpatchify's einsum. `PRESETS` and `SanaMS(width, depth, patch)` as in sana_torch.py, so
py_trainer.py takes either (--peer)."""
import math

import torch
import torch.nn as nn

from sana_torch import PRESETS  # noqa: F401  (the same presets)


def t2i_modulate(x, shift, scale):
    return x * (1 + scale) + shift


class LiteLA(nn.Module):
    PAD_VAL = 1

    def __init__(self, in_dim, out_dim, dim=32, eps=1e-8):
        super().__init__()
        self.heads = out_dim // dim
        self.dim = out_dim // self.heads
        self.eps = eps
        self.qkv = nn.Linear(in_dim, in_dim * 3, bias=False)
        self.proj = nn.Linear(in_dim, in_dim)
        self.kernel_func = nn.ReLU(inplace=False)

    def attn_matmul(self, q, k, v):
        q = self.kernel_func(q)  # B, h, h_d, N
        k = self.kernel_func(k)
        q, k, v = q.float(), k.float(), v.float()  # fp32_attention (fp32 already here)
        v = nn.functional.pad(v, (0, 0, 0, 1), mode="constant", value=LiteLA.PAD_VAL)
        vk = torch.matmul(v, k)
        out = torch.matmul(vk, q)
        return out[:, :, :-1] / (out[:, :, -1:] + self.eps)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, C).unbind(2)
        dtype = q.dtype
        q = q.transpose(-1, -2).reshape(B, C // self.dim, self.dim, N)
        k = k.transpose(-1, -2).reshape(B, C // self.dim, self.dim, N)
        v = v.transpose(-1, -2).reshape(B, C // self.dim, self.dim, N)
        out = self.attn_matmul(q, k.transpose(-1, -2), v).to(dtype)
        out = out.view(B, C, N).permute(0, 2, 1)
        return self.proj(out)


class ConvLayer(nn.Module):
    def __init__(self, in_dim, out_dim, kernel_size=3, groups=1, use_bias=False, act=None):
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel_size, 1, kernel_size // 2, 1, groups, use_bias)
        self.act = act

    def forward(self, x):
        x = self.conv(x)
        return self.act(x) if self.act is not None else x


class GLUMBConv(nn.Module):
    def __init__(self, in_features, hidden_features):
        super().__init__()
        self.glu_act = nn.SiLU(inplace=False)
        self.inverted_conv = ConvLayer(in_features, hidden_features * 2, 1, use_bias=True, act=nn.SiLU(inplace=False))
        self.depth_conv = ConvLayer(hidden_features * 2, hidden_features * 2, 3, groups=hidden_features * 2,
                                    use_bias=True)
        self.point_conv = ConvLayer(hidden_features, in_features, 1, use_bias=False)

    def forward(self, x, HW):
        B, N, C = x.shape
        H, W = HW
        x = x.reshape(B, H, W, C).permute(0, 3, 1, 2)
        x = self.inverted_conv(x)
        x = self.depth_conv(x)
        x, gate = torch.chunk(x, 2, dim=1)
        gate = self.glu_act(gate)
        x = x * gate
        x = self.point_conv(x)
        return x.flatten(2).permute(0, 2, 1)


class SanaMSBlock(nn.Module):
    def __init__(self, hidden_size, mlp_ratio=2.5):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = LiteLA(hidden_size, hidden_size, eps=1e-8)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = GLUMBConv(hidden_size, int(hidden_size * mlp_ratio))
        self.scale_shift_table = nn.Parameter(torch.randn(6, hidden_size) / hidden_size ** 0.5)

    def forward(self, x, t, HW):
        B, N, C = x.shape
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.scale_shift_table[None] + t.reshape(B, 6, -1)).chunk(6, dim=1)
        x = x + gate_msa * self.attn(t2i_modulate(self.norm1(x), shift_msa, scale_msa))
        x = x + gate_mlp * self.mlp(t2i_modulate(self.norm2(x), shift_mlp, scale_mlp), HW=HW)
        return x


class TimestepEmbedder(nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(frequency_embedding_size, hidden_size), nn.SiLU(),
                                 nn.Linear(hidden_size, hidden_size))
        self.frequency_embedding_size = frequency_embedding_size

    @staticmethod
    def timestep_embedding(t, dim, max_period=10000):
        half = dim // 2
        freqs = torch.exp(-math.log(max_period) * torch.arange(0, half, dtype=torch.float32) / half)
        args = t[:, None].float() * freqs[None]
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, t):
        return self.mlp(self.timestep_embedding(t, self.frequency_embedding_size))


class T2IFinalLayer(nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.norm_final = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.linear = nn.Linear(hidden_size, patch_size * patch_size * out_channels)
        self.scale_shift_table = nn.Parameter(torch.randn(2, hidden_size) / hidden_size ** 0.5)

    def forward(self, x, t):
        shift, scale = (self.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)
        return self.linear(t2i_modulate(self.norm_final(x), shift, scale))


class SanaMS(nn.Module):
    def __init__(self, hidden_size, depth, patch_size, in_channels=3):
        super().__init__()
        self.p, self.out_channels = patch_size, in_channels
        self.x_embedder = nn.Conv2d(in_channels, hidden_size, patch_size, stride=patch_size)  # PatchEmbedMS
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size))
        self.blocks = nn.ModuleList(SanaMSBlock(hidden_size) for _ in range(depth))
        self.final_layer = T2IFinalLayer(hidden_size, patch_size, in_channels)

    def unpatchify(self, x, h, w):
        c, p = self.out_channels, self.p
        x = x.reshape(x.shape[0], h, w, p, p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(x.shape[0], c, h * p, w * p)

    def forward(self, x, timestep):
        h, w = x.shape[-2] // self.p, x.shape[-1] // self.p
        x = self.x_embedder(x).flatten(2).transpose(1, 2)
        t = self.t_embedder(timestep)
        t0 = self.t_block(t)
        for block in self.blocks:
            x = block(x, t0, (h, w))
        return self.unpatchify(self.final_layer(x, t), h, w)
