#!/usr/bin/env python3
"""An independent float64 evaluation of the SanaMS linear DiT, for checking the C++ model.

Usage: sana_reference.py CASE.safetensors...

Each case file (written by the C++ test "the C++ model matches an independent Python
implementation") holds the model's weights ("w.<name>", upstream's parameter names), the
inputs ("in.*"), the C++ output and loss ("out.*") and the model's shape as JSON metadata.
This file recomputes the output and the flow-matching loss from the formulas alone: its
own patch reshapes instead of convolutions, the linear attention summed in the other
order (k v^T first, the normaliser as q . sum k), shifted-slice depthwise convolution,
hand-written norms and GELU. It prints the largest relative difference per case and
exits 1 if any exceeds the tolerance (1e-5 of the largest magnitude).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch

TOLERANCE = 1e-5
F64 = torch.float64


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    kinds = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}
    out = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + start:8 + n + end], dtype=kinds[info["dtype"]])
        out[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return out, meta


def read_checkpoint_part(folder, part):
    """A checkpoint part's tensors and metadata: <part>.safetensors (format 2), or in format
    3 every rank's entries gathered by index.json (name -> file, offset, bytes), read here
    from the files' bytes with numpy, independently of sana-train's reader."""
    index_path = os.path.join(folder, "index.json")
    if not os.path.exists(index_path):
        return read_safetensors(os.path.join(folder, f"{part}.safetensors"))
    index = json.load(open(index_path))
    kinds = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64,
             "I32": np.int32, "U8": np.uint8, "BOOL": np.bool_}
    out, meta = {}, {}
    for e in index["parts"][part]:
        with open(os.path.join(folder, e["file"]), "rb") as f:
            f.seek(e["offset"])
            raw = f.read(e["bytes"])
        assert len(raw) == e["bytes"], f"{e['file']} ends inside {e['name']}"
        out[e["name"]] = torch.from_numpy(np.frombuffer(raw, dtype=kinds[e["dtype"]]).reshape(e["shape"]).copy())
    _, meta = read_safetensors(os.path.join(folder, f"{part}-00001-of-{index['world']:05d}.safetensors"))
    meta.pop("shard", None)
    return out, meta


def silu(x):
    return x / (1.0 + torch.exp(-x))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, eps=1e-6):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps)


def rms_norm(x, weight, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight


class Weights:
    def __init__(self, tensors):
        self.t = {k[2:]: v.to(F64) for k, v in tensors.items() if k.startswith("w.")}

    def __getitem__(self, name):
        return self.t[name]

    def has(self, name):
        return name in self.t

    def linear(self, x, name, bias=True):
        y = x @ self.t[name + ".weight"].T
        return y + self.t[name + ".bias"] if bias else y


def timestep_features(t, dim=256):
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half)
    args = t.to(torch.float32)[:, None] * freqs[None]  # as the model: float32 features
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1).to(F64)


def depthwise3x3(x, weight, bias):
    """x: [B, h, w, K] channels-last; weight: [K, 1, 3, 3]."""
    b, h, w, k = x.shape
    padded = torch.zeros(b, h + 2, w + 2, k, dtype=x.dtype)
    padded[:, 1:h + 1, 1:w + 1] = x
    out = bias.expand(b, h, w, k).clone()
    for i in range(3):
        for j in range(3):
            out = out + padded[:, i:i + h, j:j + w] * weight[:, 0, i, j]
    return out


def linear_attention(q, k, v, eps=1e-8):
    """q, k, v: [B, N, d] for one head; ReLU kernel; sum_m v_m (k_m . q_n) / sum_m k_m . q_n."""
    q, k = torch.relu(q), torch.relu(k)
    kv = torch.einsum("bmd,bme->bde", k, v)
    num = torch.einsum("bnd,bde->bne", q, kv)
    den = torch.einsum("bnd,bd->bn", q, k.sum(1))
    return num / (den[..., None] + eps)


def forward(w, spec, x, t, y=None, mask=None, drop=None):
    b, cin, hh, ww = x.shape
    p, c = spec["patch"], spec["hidden"]
    h, wd = hh // p, ww // p
    n = h * wd
    # Patch embedding as a matrix product over flattened patches.
    patches = x.reshape(b, cin, h, p, wd, p).permute(0, 2, 4, 1, 3, 5).reshape(b, n, cin * p * p)
    tokens = patches @ w["x_embedder.proj.weight"].reshape(c, -1).T + w["x_embedder.proj.bias"]

    temb = w.linear(silu(w.linear(timestep_features(t), "t_embedder.mlp.0")), "t_embedder.mlp.2")
    t0 = w.linear(silu(temb), "t_block.1")

    cond, bias = None, None
    if spec["conditioning"] == "caption":
        feats = y.to(F64)
        if drop is not None:
            feats = torch.where(drop[:, None, None], w["y_embedder.y_embedding"][None], feats)
        cond = w.linear(gelu_tanh(w.linear(feats, "y_embedder.y_proj.fc1")), "y_embedder.y_proj.fc2")
        if mask is not None:
            bias = (1.0 - mask.to(F64)) * -10000.0  # [B, L]
    elif spec["conditioning"] == "class":
        labels = y.clone()
        if drop is not None:
            labels[drop] = spec["num_classes"]
        cond = w["y_embedder.embedding_table.weight"][labels][:, None, :]
    if cond is not None and w.has("attention_y_norm.weight"):
        cond = rms_norm(cond, w["attention_y_norm.weight"], spec["norm_eps"])

    d = spec["linear_head_dim"]
    heads = c // d
    cheads = spec["cross_heads"]
    hd = c // cheads
    mh = spec["mlp_hidden"]
    xs = tokens
    for i in range(spec["depth"]):
        pre = f"blocks.{i}."
        mod = w[pre + "scale_shift_table"][None] + t0.reshape(b, 6, c)
        shift_msa, scale_msa, gate_msa = mod[:, 0:1], mod[:, 1:2], mod[:, 2:3]
        shift_mlp, scale_mlp, gate_mlp = mod[:, 3:4], mod[:, 4:5], mod[:, 5:6]

        xn = layer_norm(xs) * (1 + scale_msa) + shift_msa
        qkv = xn @ w[pre + "attn.qkv.weight"].T
        q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
        if w.has(pre + "attn.q_norm.weight"):
            q = rms_norm(q, w[pre + "attn.q_norm.weight"], spec["norm_eps"])
            k = rms_norm(k, w[pre + "attn.k_norm.weight"], spec["norm_eps"])
        att = torch.cat([linear_attention(q[..., j * d:(j + 1) * d], k[..., j * d:(j + 1) * d],
                                          v[..., j * d:(j + 1) * d]) for j in range(heads)], dim=-1)
        xs = xs + gate_msa * w.linear(att, pre + "attn.proj")

        if cond is not None:
            cq = w.linear(xs, pre + "cross_attn.q_linear")
            ckv = w.linear(cond, pre + "cross_attn.kv_linear")
            ck, cv = ckv[..., :c], ckv[..., c:]
            outs = []
            for j in range(cheads):
                sl = slice(j * hd, (j + 1) * hd)
                scores = cq[..., sl] @ ck[..., sl].transpose(1, 2) / math.sqrt(hd)
                if bias is not None:
                    scores = scores + bias[:, None, :]
                scores = scores - scores.max(-1, keepdim=True).values
                e = torch.exp(scores)
                outs.append((e / e.sum(-1, keepdim=True)) @ cv[..., sl])
            xs = xs + w.linear(torch.cat(outs, dim=-1), pre + "cross_attn.proj")

        xn = layer_norm(xs) * (1 + scale_mlp) + shift_mlp
        grid = xn.reshape(b, h, wd, c)
        u = silu(grid @ w[pre + "mlp.inverted_conv.conv.weight"].reshape(2 * mh, c).T
                 + w[pre + "mlp.inverted_conv.conv.bias"])
        u = depthwise3x3(u, w[pre + "mlp.depth_conv.conv.weight"], w[pre + "mlp.depth_conv.conv.bias"])
        u = u[..., :mh] * silu(u[..., mh:])
        ff = u @ w[pre + "mlp.point_conv.conv.weight"].reshape(c, mh).T
        xs = xs + gate_mlp * ff.reshape(b, n, c)

    fmod = w["final_layer.scale_shift_table"][None] + temb[:, None]
    xn = layer_norm(xs) * (1 + fmod[:, 1:2]) + fmod[:, 0:1]
    out = w.linear(xn, "final_layer.linear")
    co = spec["out_channels"]
    out = out.reshape(b, h, wd, p, p, co)
    return torch.einsum("nhwpqc->nchpwq", out).reshape(b, co, hh, ww)


def check(path):
    tensors, meta = read_safetensors(path)
    spec = json.loads(meta["spec"])
    w = Weights(tensors)
    get = lambda k: tensors.get("in." + k)
    drop = get("drop")
    pred = forward(w, spec, get("x").to(F64), get("t").to(F64), get("y"), get("mask"),
                   None if drop is None else drop.to(torch.bool))
    loss = ((pred - get("target").to(F64)) ** 2).mean()
    ours_pred = tensors["out.pred"].to(F64)
    ours_loss = tensors["out.loss"].to(F64).reshape(())
    rel_pred = ((ours_pred - pred).abs().max() / pred.abs().max()).item()
    rel_loss = (abs(ours_loss - loss) / abs(loss)).item()
    print(f"{meta.get('case', path)}: output {list(pred.shape)} max relative difference "
          f"{rel_pred:.3e}, loss {loss.item():.6f} relative difference {rel_loss:.3e}")
    return max(rel_pred, rel_loss)


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    worst = max(check(p) for p in sys.argv[1:])
    print(f"worst relative difference {worst:.3e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
