"""The SanaMS architecture as upstream's own classes build it: the speed peer of issue 31,
written from upstream's module choices and not from ours (sana_torch.py is a compact
transcription that followed our earlier forward). The blocks are those of
tests/reference/upstream_model.py, the modules the reference tests hold the C++ model
against (upstream's sana_blocks.py and sana_multi_scale.py: nn.Linear qkv and LiteLA's
pad-and-divide, nn.LayerNorm, t2i_modulate, GLUMBConv of ConvLayer-wrapped nn.Conv2d, the
TimestepEmbedder's frequencies, unpatchify's einsum), without the cross-attention and
caption embedding, which the benchmarks' unconditional pixel-space presets do not have.
`PRESETS` and `SanaMS(width, depth, patch)` as in sana_torch.py, so py_trainer.py takes
either (--peer)."""
import os
import sys

import torch
import torch.nn as nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "reference"))
from upstream_model import SanaMSBlock, t2i_modulate, timestep_embedding  # noqa: E402

from sana_torch import PRESETS  # noqa: E402,F401  (the same presets)


class SanaMS(nn.Module):
    def __init__(self, hidden_size, depth, patch_size, in_channels=3):
        super().__init__()
        c, p = hidden_size, patch_size
        self.p, self.out_channels = p, in_channels
        spec = {"hidden": c, "linear_head_dim": 32, "norm_eps": 1e-6, "mlp_hidden": int(c * 2.5)}
        self.x_embedder = nn.Conv2d(in_channels, c, p, stride=p)  # PatchEmbedMS
        self.t_embedder = nn.Sequential(nn.Linear(256, c), nn.SiLU(), nn.Linear(c, c))
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(c, 6 * c))
        self.blocks = nn.ModuleList(SanaMSBlock(spec, caption=False) for _ in range(depth))
        for block in self.blocks:  # upstream's initialisation scale, not the reference's zeros
            nn.init.normal_(block.scale_shift_table, std=c ** -0.5)
        self.final_linear = nn.Linear(c, p * p * in_channels)  # T2IFinalLayer
        self.final_table = nn.Parameter(torch.randn(2, c) / c ** 0.5)

    def forward(self, x, timestep):
        h, w = x.shape[-2] // self.p, x.shape[-1] // self.p
        x = self.x_embedder(x).flatten(2).transpose(1, 2)
        t = self.t_embedder(timestep_embedding(timestep, 256))
        t0 = self.t_block(t)
        for block in self.blocks:
            x = block(x, None, t0, None, (h, w))
        shift, scale = (self.final_table[None] + t[:, None]).chunk(2, dim=1)
        x = self.final_linear(t2i_modulate(nn.functional.layer_norm(x, (x.shape[-1],), eps=1e-6), shift, scale))
        c, p = self.out_channels, self.p  # unpatchify
        x = torch.einsum("nhwpqc->nchpwq", x.reshape(x.shape[0], h, w, p, p, c))
        return x.reshape(x.shape[0], c, h * p, w * p)
