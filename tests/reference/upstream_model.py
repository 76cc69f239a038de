#!/usr/bin/env python3
"""The SanaMS forward pass as upstream's modules compute it, for checking the C++ model.

Usage: upstream_model.py CASE.safetensors...   (the case files of the C++ test "the C++ model
matches an independent Python implementation": weights "w.<name>", inputs "in.*", the C++
output "out.pred", the shape as JSON metadata)

Independent of sana_reference.py (our own reading of the maths): this file builds torch.nn
modules with the structure, parameter names and forward code paths of upstream's
diffusion/model/nets/sana_multi_scale.py (SanaMS, SanaMSBlock) and sana_blocks.py (LiteLA and
its attn_matmul, MultiHeadCrossAttention on the scaled_dot_product_attention path, GLUMBConv
of ConvLayers, T2IFinalLayer, TimestepEmbedder, CaptionEmbedder with its forced token drop,
PatchEmbedMS, RMSNorm from norms.py, t2i_modulate, unpatchify), loads the case's weights
strictly (a name or shape that differs from upstream's modules fails here), and runs it in
float64. Class-label cases are skipped: upstream's SanaMS conditions on captions only. A case
whose spec has "control_blocks" is upstream's SanaMSControlNet (sana_multi_scale_controlnet.py:
ControlSanaMSBlock's copied_block, before_proj and after_proj, the injection of its forward),
fed the control latent "in.control". A case whose spec has "trigflow" is SANA-Sprint's student,
upstream's SanaMSCM (its forward: the TrigFlow to flow transformation and back) with
cfg_embedder (TimestepEmbedder of cfg_scale x cfg_embed_scale added to t), logvar_linear
(its log-variance of t, checked against "out.logvar") and timestep_norm_scale_factor (the
timestep divided by it in float32, not truncated), fed "in.s" (TrigFlow times) and
"in.cfg_scale".
Prints the largest relative difference per case; exits 1 above 1e-5.

       upstream_model.py --save-init SPEC_JSON CAPTION_CHANNELS TOKENS OUT.safetensors
writes the state dict of those modules (see save_init).

       upstream_model.py --flops SPEC_JSON HEIGHT WIDTH
prints the multiply-adds x 2 of one forward pass of one sample at HEIGHT x WIDTH pixels as
python3-torch's profiler records them (with_flops: every aten::mm, addmm, bmm, baddbmm and
conv2d these modules run), for the spec `sana-train model --json` prints: an oracle for the
model's FLOP count that shares no code with it (see flops).

       upstream_model.py --count-sprint HIDDEN HEADS DEPTH
prints the parameters of SANA-Sprint's stage-2 student (cfg_embed, logvar, q/k norms) and of
its teacher (no cfg_embed, no logvar), one line each.

       upstream_model.py --count HIDDEN HEADS PATCH QK_NORM CROSS_NORM DEPTH...
prints, one line per DEPTH, the parameter count of SanaMS built from these modules for a
registry preset
(32 latent channels, gemma-2-2b's 2304 caption features, mlp_ratio 2.5, head dim 32): the
models of depth 1 and 2 are built, and the count follows as base + DEPTH x per block, so
that a 4.8 B model is counted without 19 GB of memory.
"""
import copy
import json
import math
import sys

import torch
import torch.nn.functional as F
from torch import nn

from sana_reference import read_safetensors  # the case-file reader only; none of its maths

TOLERANCE = 1e-5

# The dtype of upstream's float32 islands (the timestep and its sinusoidal features, RMSNorm's
# x.float()): float32 as upstream, float64 where the C++ model ran in float64 (it computes
# them in float64 then); model_of_case sets it from the case's weights.
ISLAND_DTYPE = torch.float32


def t2i_modulate(x, shift, scale):  # sana_blocks.t2i_modulate
    return x * (1 + scale) + shift


class RMSNorm(nn.Module):  # norms.RMSNorm
    def __init__(self, dim, scale_factor=1.0, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim) * scale_factor)

    def forward(self, x):
        xf = x.to(ISLAND_DTYPE)
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.to(ISLAND_DTYPE)).type_as(x)


class LiteLA(nn.Module):  # sana_blocks.LiteLA, heads of `dim` channels, ReLU kernel
    PAD_VAL = 1

    def __init__(self, c, dim, eps, qk_norm, norm_eps):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.qkv = nn.Linear(c, 3 * c, bias=False)
        self.proj = nn.Linear(c, c)
        self.q_norm = RMSNorm(c, 1.0, norm_eps) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(c, 1.0, norm_eps) if qk_norm else nn.Identity()

    def attn_matmul(self, q, k, v):  # fp32_attention: inputs are float64 here already
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 0, 0, 1), mode="constant", value=LiteLA.PAD_VAL)
        vk = torch.matmul(v, k)
        out = torch.matmul(vk, q)
        return out[:, :, :-1] / (out[:, :, -1:] + self.eps)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, c).unbind(2)
        q = self.q_norm(q).transpose(-1, -2).reshape(b, c // self.dim, self.dim, n)
        k = self.k_norm(k).transpose(-1, -2).reshape(b, c // self.dim, self.dim, n).transpose(-1, -2)
        v = v.transpose(-1, -2).reshape(b, c // self.dim, self.dim, n)
        out = self.attn_matmul(q, k, v).to(x.dtype)
        return self.proj(out.view(b, c, n).permute(0, 2, 1))


class MultiHeadCrossAttention(nn.Module):  # sana_blocks, the scaled_dot_product_attention path
    def __init__(self, c, heads, qk_norm=False):
        super().__init__()
        self.heads, self.head_dim = heads, c // heads
        self.q_linear = nn.Linear(c, c)
        self.kv_linear = nn.Linear(c, 2 * c)
        self.proj = nn.Linear(c, c)
        self.q_norm = RMSNorm(c, 1.0, 1e-6) if qk_norm else nn.Identity()
        self.k_norm = RMSNorm(c, 1.0, 1e-6) if qk_norm else nn.Identity()

    def forward(self, x, cond, mask=None):
        b, n, c = x.shape
        q = self.q_linear(x)
        k, v = self.kv_linear(cond).view(b, -1, 2, c).unbind(2)
        q = self.q_norm(q).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_norm(k).view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        v = v.view(b, -1, self.heads, self.head_dim).transpose(1, 2)
        if mask is not None:
            mask = ((1 - mask.to(q.dtype)) * -10000.0)[:, None, None].repeat(1, self.heads, 1, 1)
        x = sdpa(q, k, v, mask)
        return self.proj(x.transpose(1, 2).reshape(b, -1, c))


# True while jvp() below runs: torch 2.x's CPU kernel behind F.scaled_dot_product_attention
# has no derivative of its backward ("derivative for
# aten::_scaled_dot_product_flash_attention_for_cpu_backward is not implemented"), which a JVP
# by double backward needs, so attention then takes the documented equivalent, the same equation.
ATTENTION_BY_MATMUL = False


def jvp(fn, inputs, tangents):
    """torch.autograd.functional.jvp (reverse mode twice) with attention by matmul while fn's
    graph is built and differentiated; every JVP of the references goes through here."""
    global ATTENTION_BY_MATMUL
    before, ATTENTION_BY_MATMUL = ATTENTION_BY_MATMUL, True
    try:
        return torch.autograd.functional.jvp(fn, inputs, tangents)
    finally:
        ATTENTION_BY_MATMUL = before


def sdpa(q, k, v, mask):
    """F.scaled_dot_product_attention (torch 2.x); Debian's torch 1.13 has no such function, so
    there its documented equivalent: softmax(q k^T / sqrt(d) + mask) v."""
    if hasattr(F, "scaled_dot_product_attention") and not ATTENTION_BY_MATMUL:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores + mask
    return torch.softmax(scores, dim=-1) @ v


class ConvLayer(nn.Module):  # sana_blocks.ConvLayer: same padding, optional activation
    def __init__(self, cin, cout, kernel, groups=1, bias=True, act=None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, groups=groups, bias=bias)
        self.act = act

    def forward(self, x):
        x = self.conv(x)
        return self.act(x) if self.act is not None else x


class GLUMBConv(nn.Module):  # sana_blocks.GLUMBConv, act ("silu", "silu", None)
    def __init__(self, c, hidden):
        super().__init__()
        self.inverted_conv = ConvLayer(c, hidden * 2, 1, act=nn.SiLU())
        self.depth_conv = ConvLayer(hidden * 2, hidden * 2, 3, groups=hidden * 2)
        self.point_conv = ConvLayer(hidden, c, 1, bias=False)
        self.glu_act = nn.SiLU()

    def forward(self, x, hw):
        b, n, c = x.shape
        x = x.reshape(b, hw[0], hw[1], c).permute(0, 3, 1, 2)
        x = self.depth_conv(self.inverted_conv(x))
        x, gate = torch.chunk(x, 2, dim=1)
        x = self.point_conv(x * self.glu_act(gate))
        return x.flatten(2).permute(0, 2, 1)


class SanaMSBlock(nn.Module):
    def __init__(self, spec, caption):
        super().__init__()
        c = spec["hidden"]
        self.norm1 = nn.LayerNorm(c, elementwise_affine=False, eps=1e-6)
        self.attn = LiteLA(c, spec["linear_head_dim"], 1e-8, spec.get("qk_norm", False), spec["norm_eps"])
        self.cross_attn = MultiHeadCrossAttention(c, spec["cross_heads"], spec.get("cross_norm", False)) if caption else None
        self.norm2 = nn.LayerNorm(c, elementwise_affine=False, eps=1e-6)
        self.mlp = GLUMBConv(c, spec["mlp_hidden"])
        self.scale_shift_table = nn.Parameter(torch.zeros(6, c))

    def forward(self, x, y, t, mask, hw):
        b = x.shape[0]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            self.scale_shift_table[None] + t.reshape(b, 6, -1)).chunk(6, dim=1)
        x = x + gate_msa * self.attn(t2i_modulate(self.norm1(x), shift_msa, scale_msa))
        if self.cross_attn is not None:
            x = x + self.cross_attn(x, y, mask)
        return x + gate_mlp * self.mlp(t2i_modulate(self.norm2(x), shift_mlp, scale_mlp), hw)


def timestep_embedding(t, dim, max_period=10000):  # sana_blocks.TimestepEmbedder.timestep_embedding
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(start=0, end=half, dtype=ISLAND_DTYPE) / half)
    args = t[:, None].to(ISLAND_DTYPE) * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class SanaMS(nn.Module):
    """caption_channels None: an unconditional model (no caption path, no cross-attention),
    as the C++ model's "conditioning": "none"; forward then takes no y, mask or drop."""

    def __init__(self, spec, caption_channels, tokens, y_norm_scale):
        super().__init__()
        caption = caption_channels is not None
        c, p = spec["hidden"], spec["patch"]
        self.p, self.out_channels = p, spec["out_channels"]
        self.x_embedder = nn.Module()
        self.x_embedder.proj = nn.Conv2d(spec["in_channels"], c, p, stride=p)
        self.t_embedder = nn.Module()
        self.t_embedder.mlp = nn.Sequential(nn.Linear(256, c), nn.SiLU(), nn.Linear(c, c))
        self.t_block = nn.Sequential(nn.SiLU(), nn.Linear(c, 6 * c))
        if caption:
            self.y_embedder = nn.Module()
            self.y_embedder.y_proj = nn.Module()
            self.y_embedder.y_proj.fc1 = nn.Linear(caption_channels, c)
            self.y_embedder.y_proj.fc2 = nn.Linear(c, c)
            self.y_embedder.register_buffer("y_embedding", torch.zeros(tokens, caption_channels))
            self.attention_y_norm = RMSNorm(c, y_norm_scale, 1e-5)
        self.blocks = nn.ModuleList([SanaMSBlock(spec, caption) for _ in range(spec["depth"])])
        self.final_layer = nn.Module()
        self.final_layer.linear = nn.Linear(c, p * p * spec["out_channels"])
        self.final_layer.scale_shift_table = nn.Parameter(torch.zeros(2, c))
        self.timestep_norm_scale_factor = spec.get("timestep_norm_scale", 1.0)
        self.cfg_embed_scale = spec.get("cfg_embed_scale", 1.0)
        self.logvar_scale_factor = spec.get("logvar_scale", 1.0)
        self.cfg_embedder = None
        if spec.get("cfg_embed"):  # sana.py: TimestepEmbedder(hidden_size)
            self.cfg_embedder = nn.Module()
            self.cfg_embedder.mlp = nn.Sequential(nn.Linear(256, c), nn.SiLU(), nn.Linear(c, c))
        self.logvar_linear = nn.Linear(c, 1) if spec.get("logvar") else None

    def embed(self, x, timestep, y, force_drop_ids, cfg_scale=None):
        """The tokens, t, t0 and the caption tokens (None without captions), as SanaMS.forward
        makes them."""
        if self.timestep_norm_scale_factor != 1.0:  # SanaMS.forward
            timestep = (timestep.to(ISLAND_DTYPE) / self.timestep_norm_scale_factor).to(ISLAND_DTYPE)
        else:
            timestep = timestep.long().to(torch.float32)  # integer timesteps
        x = self.x_embedder.proj(x).flatten(2).transpose(1, 2)  # PatchEmbedMS
        t = self.t_embedder.mlp(timestep_embedding(timestep, 256).to(x.dtype))
        if self.cfg_embedder is not None:  # t += cfg_embedder(cfg_scale * cfg_embed_scale)
            t = t + self.cfg_embedder.mlp(timestep_embedding(cfg_scale * self.cfg_embed_scale, 256).to(x.dtype))
        t0 = self.t_block(t)
        if y is None:
            return x, t, t0, None
        y = y[:, None]  # upstream's captions are [B, 1, L, C]
        drop_ids = force_drop_ids == 1  # CaptionEmbedder.token_drop
        y = torch.where(drop_ids[:, None, None, None], self.y_embedder.y_embedding, y)
        y = self.y_embedder.y_proj.fc2(F.gelu(self.y_embedder.y_proj.fc1(y), approximate="tanh"))
        return x, t, t0, self.attention_y_norm(y).squeeze(1)

    def forward(self, x, timestep, y=None, mask=None, force_drop_ids=None):
        h, w = x.shape[-2] // self.p, x.shape[-1] // self.p
        x, t, t0, y = self.embed(x, timestep, y, force_drop_ids)
        for block in self.blocks:
            x = block(x, y, t0, mask, (h, w))
        return self.final(x, t, h, w)

    def forward_cm(self, x, timestep, y, mask, force_drop_ids, cfg_scale):
        """SanaMSCM.forward with return_logvar: (TrigFlow output, logvar)."""
        t = torch.sin(timestep) / (torch.cos(timestep) + torch.sin(timestep))
        pretrain_timestep = t * 1000
        t = t.view(-1, 1, 1, 1)
        x = x * torch.sqrt(t**2 + (1 - t) ** 2)
        h, w = x.shape[-2] // self.p, x.shape[-1] // self.p
        xs, temb, t0, yy = self.embed(x, pretrain_timestep, y, force_drop_ids, cfg_scale)
        for block in self.blocks:
            xs = block(xs, yy, t0, mask, (h, w))
        model_out = self.final(xs, temb, h, w)
        logvar = self.logvar_linear(temb) * self.logvar_scale_factor if self.logvar_linear is not None else None
        out = ((1 - 2 * t) * x + (1 - 2 * t + 2 * t**2) * model_out) / torch.sqrt(t**2 + (1 - t) ** 2)
        return out, logvar

    def final(self, x, t, h, w):
        b = x.shape[0]
        shift, scale = (self.final_layer.scale_shift_table[None] + t[:, None]).chunk(2, dim=1)  # T2IFinalLayer
        x = F.layer_norm(x, (x.shape[-1],), eps=1e-6)
        x = self.final_layer.linear(t2i_modulate(x, shift, scale))
        c = self.out_channels  # unpatchify
        x = x.reshape(b, h, w, self.p, self.p, c)
        x = torch.einsum("nhwpqc->nchpwq", x)
        return x.reshape(b, c, h * self.p, w * self.p)


class ControlSanaMSBlock(nn.Module):  # sana_multi_scale_controlnet.ControlSanaMSBlock
    def __init__(self, base_block, block_index, c):
        super().__init__()
        self.copied_block = copy.deepcopy(base_block)
        self.block_index = block_index
        if block_index == 0:
            self.before_proj = nn.Linear(c, c)
            nn.init.zeros_(self.before_proj.weight)
            nn.init.zeros_(self.before_proj.bias)
        self.after_proj = nn.Linear(c, c)
        nn.init.zeros_(self.after_proj.weight)
        nn.init.zeros_(self.after_proj.bias)

    def forward(self, x, y, t, mask, hw, control_signal):
        if self.block_index == 0:
            control_signal = self.before_proj(control_signal)
            control_signal = self.copied_block(x + control_signal, y, t, mask, hw)
        else:
            control_signal = self.copied_block(control_signal, y, t, mask, hw)
        return control_signal, self.after_proj(control_signal)


class SanaMSControlNet(SanaMS):  # sana_multi_scale_controlnet.SanaMSControlNet, use_pe false
    def __init__(self, spec, caption_channels, tokens, y_norm_scale, copy_blocks_num):
        super().__init__(spec, caption_channels, tokens, y_norm_scale)
        self.copy_blocks_num = copy_blocks_num
        self.controlnet = nn.ModuleList(
            [ControlSanaMSBlock(self.blocks[i], i, spec["hidden"]) for i in range(copy_blocks_num)])

    def forward(self, x, timestep, y, mask, force_drop_ids, control):
        h, w = x.shape[-2] // self.p, x.shape[-1] // self.p
        x, t, t0, y = self.embed(x, timestep, y, force_drop_ids)
        control_signal = self.x_embedder.proj(control).flatten(2).transpose(1, 2)  # forward_controlnet
        x = self.blocks[0](x, y, t0, mask, (h, w))
        for i in range(1, self.copy_blocks_num + 1):
            control_signal, skip = self.controlnet[i - 1](x, y, t0, mask, (h, w), control_signal)
            x = self.blocks[i](x + skip, y, t0, mask, (h, w))
        for i in range(self.copy_blocks_num + 1, len(self.blocks)):
            x = self.blocks[i](x, y, t0, mask, (h, w))
        return self.final(x, t, h, w)


def model_of_case(tensors, spec):
    """SanaMS in float64 with a case file's weights ("w.<name>"), loaded strictly: upstream's
    names and shapes, every one."""
    global ISLAND_DTYPE
    float64 = any(v.dtype == torch.float64 for k, v in tensors.items() if k.startswith("w."))
    ISLAND_DTYPE = torch.float64 if float64 else torch.float32
    weights = {k[2:]: v.double() for k, v in tensors.items() if k.startswith("w.")}
    spec["in_channels"] = tensors["in.x"].shape[1]
    spec["qk_norm"] = "blocks.0.attn.q_norm.weight" in weights
    spec["cross_norm"] = "blocks.0.cross_attn.q_norm.weight" in weights
    tokens, caption_channels = weights["y_embedder.y_embedding"].shape
    copies = spec.get("control_blocks", 0)
    model = (SanaMSControlNet(spec, caption_channels, tokens, 1.0, copies) if copies
             else SanaMS(spec, caption_channels, tokens, 1.0)).double()
    model.load_state_dict(weights, strict=True)
    return model


def check(path):
    tensors, meta = read_safetensors(path)
    spec = json.loads(meta["spec"])
    name = meta.get("case", path)
    if spec["conditioning"] != "caption":
        print(f"{name}: skipped (upstream's SanaMS has no class conditioning)")
        return 0.0
    model = model_of_case(tensors, spec)
    control = (tensors["in.control"].double(),) if "in.control" in tensors else ()
    logvar_worst = 0.0
    with torch.no_grad():
        if spec.get("trigflow"):
            pred, logvar = model.forward_cm(tensors["in.x"].double(), tensors["in.s"].double(), tensors["in.y"].double(),
                                            tensors["in.mask"], tensors["in.drop"].long(), tensors["in.cfg_scale"])
            ours_logvar = tensors["out.logvar"].double()
            logvar_worst = ((logvar - ours_logvar).abs().max() / ours_logvar.abs().max()).item()
        else:
            pred = model(tensors["in.x"].double(), tensors["in.t"].double(), tensors["in.y"].double(),
                         tensors["in.mask"], tensors["in.drop"].long(), *control)
    ours = tensors["out.pred"].double()
    worst = max(((pred - ours).abs().max() / ours.abs().max()).item(), logvar_worst)
    print(f"{name}: max relative difference {worst:.3g}")
    return worst


def count(hidden, heads, patch, qk_norm, cross_norm, depths):
    def built(d):
        spec = {"hidden": hidden, "depth": d, "cross_heads": heads, "patch": patch, "in_channels": 32,
                "out_channels": 32, "linear_head_dim": 32, "mlp_hidden": int(hidden * 2.5), "norm_eps": 1e-5,
                "qk_norm": qk_norm, "cross_norm": cross_norm}
        return sum(p.numel() for p in SanaMS(spec, 2304, 300, 1.0).parameters())
    one, two = built(1), built(2)
    for depth in depths:
        print(one + (depth - 1) * (two - one))


def count_sprint(hidden, heads, depth):
    """SANA-Sprint's stage-2 student and teacher at `depth`: SanaMSCM with qk_norm and
    cross_norm, the student with cfg_embedder and logvar_linear (model.cfg_embed, model.logvar),
    the teacher without; from modules built at depths 1 and 2, as count()."""
    def built(d, student):
        spec = {"hidden": hidden, "depth": d, "cross_heads": heads, "patch": 1, "in_channels": 32,
                "out_channels": 32, "linear_head_dim": 32, "mlp_hidden": int(hidden * 2.5), "norm_eps": 1e-5,
                "qk_norm": True, "cross_norm": True, "cfg_embed": student, "logvar": student}
        return sum(p.numel() for p in SanaMS(spec, 2304, 300, 1.0).parameters())
    for student in (True, False):
        one, two = built(1, student), built(2, student)
        print(one + (depth - 1) * (two - one))


def count_control(hidden, heads, depth, copies):
    """SanaMSControlNet's parameters at `depth` with `copies` control blocks, from upstream's
    modules built at (depth, copies) = (1, 1), (2, 1), (2, 2): every block, and every control
    block after the first (the one with before_proj), adds the same count."""
    def built(d, c):
        spec = {"hidden": hidden, "depth": d, "cross_heads": heads, "patch": 1, "in_channels": 32,
                "out_channels": 32, "linear_head_dim": 32, "mlp_hidden": int(hidden * 2.5), "norm_eps": 1e-5,
                "qk_norm": False, "cross_norm": False}
        return sum(p.numel() for p in SanaMSControlNet(spec, 2304, 300, 1.0, c).parameters())
    first = built(1, 1)
    block, copy = built(2, 1) - first, built(2, 2) - built(2, 1)
    print(first + (depth - 1) * block + (copies - 1) * copy)


def flops(spec_json, height, width):
    """The profiler's FLOPs of one forward pass of one sample (float32, batch 1). Captions
    ("conditioning": "caption") need "caption_channels" and "condition_tokens" in the spec;
    without conditioning the blocks have no cross-attention and there is no caption path."""
    from torch.profiler import ProfilerActivity, profile
    spec = dict(json.loads(spec_json))
    if spec["conditioning"] not in ("none", "caption"):
        sys.exit(f"--flops: conditioning {spec['conditioning']!r} is not upstream's SanaMS")
    spec.setdefault("out_channels", spec["in_channels"])
    spec.setdefault("norm_eps", 1e-5)
    caption = spec["conditioning"] == "caption"
    torch.manual_seed(0)
    model = SanaMS(spec, spec["caption_channels"] if caption else None, spec.get("condition_tokens", 0), 1.0)
    down = spec.get("downsample", 1)
    x = torch.randn(1, spec["in_channels"], height // down, width // down)
    t = torch.tensor([500])
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], with_flops=True, record_shapes=True) as prof:
        if caption:
            model(x, t, torch.randn(1, spec["condition_tokens"], spec["caption_channels"]), None, torch.zeros(1))
        else:
            model(x, t)
    counted = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::conv2d")
    total = sum(e.flops for e in prof.events() if e.name in counted and e.flops)
    print(int(total))


def save_init(spec_json, caption_channels, tokens, out):
    """Upstream's modules for `spec_json` (control_blocks: SanaMSControlNet) with PyTorch's
    default initialisation, their state_dict written as safetensors in upstream's names: a
    checkpoint in upstream's layout that the C++ model must load with nothing missing or left."""
    from diffusers_convert import write
    spec = json.loads(spec_json)
    spec.setdefault("in_channels", 3)
    copies = spec.get("control_blocks", 0)
    torch.manual_seed(0)
    model = (SanaMSControlNet(spec, caption_channels, tokens, 1.0, copies) if copies
             else SanaMS(spec, caption_channels, tokens, 1.0))
    for p in model.parameters():  # away from the zero projections, so that values are told apart
        p.data.add_(torch.randn_like(p) * 0.01)
    write(out, dict(model.state_dict()))
    print(f"{len(model.state_dict())} tensors")


def main():
    if sys.argv[1:2] == ["--save-init"]:
        save_init(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        return
    if sys.argv[1:2] == ["--flops"]:
        flops(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    if sys.argv[1:2] == ["--count-sprint"]:
        count_sprint(*(int(a) for a in sys.argv[2:5]))
        return
    if sys.argv[1:2] == ["--count-control"]:
        count_control(*(int(a) for a in sys.argv[2:6]))
        return
    if sys.argv[1:2] == ["--count"]:
        h, n, p, q, c = sys.argv[2:7]
        count(int(h), int(n), int(p), q == "true", c == "true", [int(d) for d in sys.argv[7:]])
        return
    worst = max(check(path) for path in sys.argv[1:])
    print(f"worst relative difference {worst:.3g} (tolerance {TOLERANCE})")
    sys.exit(0 if worst <= TOLERANCE else 1)


if __name__ == "__main__":
    main()
