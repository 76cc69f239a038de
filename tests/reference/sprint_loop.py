#!/usr/bin/env python3
"""SANA-Sprint's stage-2 generator loop as upstream's train_scm_ladd.py runs it (the sCM loss
only: adv_lambda 0, so no discriminator), in python3-torch on upstream_model.py's SanaMSCM,
for holding the C++ trainer's curve against a run of upstream's maths over many steps. A
benchmark-style tool: it prints figures, it is not a test.

Usage: sprint_loop.py TEACHER.safetensors STUDENT0.safetensors DATA_DIR TEXT.pt OUT_DIR
                      [--steps N] [--every K] [--lr LR] [--tangent-warmup N] [--cfg 4,4.5,5]
                      [--warmup N] [--clip C] [--batch B] [--seed S]

TEACHER is a flow model's weights (upstream's names: what sana-train writes), STUDENT0 the
student's initial weights (a stage-2 run's first checkpoint at learning rate 0, so that both
programs start from the same student). DATA_DIR: images with .txt captions beside them,
centre-cropped and resized to 32 x 32 pixels in [-1, 1] (the tiny presets' pixel space),
flipped at random. TEXT.pt: the TorchScript stand-in text encoder (its empty prompt is the
null caption). The optimizer is torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8, no weight
decay) with a linear warm-up, the gradient clipped to --clip; each step is one generator
step of upstream's loop: logit-normal TrigFlow times (mean 0.2, std 1.6), the teacher's
guided velocity at a scale drawn from --cfg, the JVP of the student along (cos t sin t
dx/dt / sigma_d, cos t sin t) by torch.autograd.functional.jvp, the tangent warm-up
r = min(1, step / tangent_warmup), g / (||g|| + 0.1), weight 1 / (sigma_d tan t), the loss
with the log-variance. Every K steps it samples the student in 1 step from fixed noise for
the first 8 captions and prints the mean squared pixel error against the teacher's 20-step
Euler flow samples from the same noise (guidance the middle --cfg value), and writes both as
PNG grids to OUT_DIR.
"""
import argparse
import glob
import math
import os
import random
import sys

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream_model  # noqa: E402
from sana_reference import read_safetensors  # noqa: E402

SIGMA_D = 0.5


def build(path, spec, like):
    weights, _ = read_safetensors(path)
    case = {"w." + k: v for k, v in weights.items()}
    case["in.x"] = like
    return upstream_model.model_of_case(case, dict(spec)).float()  # float32 weights: float32 islands


def images(folder):
    out = []
    for f in sorted(glob.glob(f"{folder}/**/*", recursive=True)):
        cap = os.path.splitext(f)[0] + ".txt"
        if not f.lower().endswith((".jpg", ".jpeg", ".png")) or not os.path.exists(cap):
            continue
        im = Image.open(f).convert("RGB")
        side = min(im.size)
        left, top = (im.size[0] - side) // 2, (im.size[1] - side) // 2
        im = im.crop((left, top, left + side, top + side)).resize((32, 32), Image.BICUBIC)
        x = torch.from_numpy(np.asarray(im, np.float32) / 127.5 - 1).permute(2, 0, 1)
        out.append((x, open(cap).read().strip()))
    return out


def grid(x, path):
    x = ((x.clamp(-1, 1) + 1) * 127.5).round().byte().permute(0, 2, 3, 1).numpy()
    rows = [np.concatenate(list(x[i:i + 4]), axis=1) for i in range(0, len(x), 4)]
    Image.fromarray(np.concatenate(rows, axis=0)).resize((4 * 32 * 3, len(rows) * 32 * 3), Image.NEAREST).save(path)


def main():
    ap = argparse.ArgumentParser()
    for name in ("teacher", "student0", "data", "text", "out"):
        ap.add_argument(name)
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--tangent-warmup", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--cfg", default="4,4.5,5")
    ap.add_argument("--clip", type=float, default=0.1)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    torch.set_num_threads(2)
    os.makedirs(a.out, exist_ok=True)
    text = torch.jit.load(a.text)
    data = images(a.data)
    with torch.no_grad():
        y_all, mask_all = text([c for _, c in data])
        y_null, _ = text([""])
    y_all, y_null = y_all.float(), y_null.float()[0]
    like = torch.zeros(1, 3, 32, 32)
    tw, _ = read_safetensors(a.teacher)
    base = {"hidden": tw["x_embedder.proj.weight"].shape[0], "patch": tw["x_embedder.proj.weight"].shape[-1],
            "depth": len({k.split(".")[1] for k in tw if k.startswith("blocks.")}), "out_channels": 3,
            "cross_heads": 4, "linear_head_dim": 32, "mlp_hidden": tw["blocks.0.mlp.point_conv.conv.weight"].shape[1],
            "conditioning": "caption", "norm_eps": 1e-5, "timestep_norm_scale": 1000.0}
    teacher = build(a.teacher, base, like).requires_grad_(False)
    student = build(a.student0, dict(base, cfg_embed=True, cfg_embed_scale=0.1, logvar=True, logvar_scale=1.0), like)
    for m in (teacher, student):
        m.y_embedder.y_embedding.copy_(y_null)
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    scales = [float(s) for s in a.cfg.split(",")]
    w_preview = scales[len(scales) // 2]

    # Fixed preview noise and the teacher's 20-step Euler flow samples from it.
    n_prev = min(8, len(data))
    eps = torch.randn(n_prev, 3, 32, 32, generator=torch.Generator().manual_seed(1234))
    yp, mp = y_all[:n_prev], mask_all[:n_prev]
    keep = torch.zeros(n_prev, dtype=torch.long)
    with torch.no_grad():
        x = eps.clone()
        for i in range(20):
            tf, tn = 1 - i / 20, 1 - (i + 1) / 20
            ts = torch.full((n_prev,), tf * 1000.0)
            v = teacher(torch.cat([x, x]), torch.cat([ts, ts]), torch.cat([yp, yp]), torch.cat([mp, mp]),
                        torch.cat([torch.ones(n_prev, dtype=torch.long), keep]))
            vu, vc = v.chunk(2)
            x = x + (tn - tf) * (vu + w_preview * (vc - vu))
        teacher20 = x
    grid(teacher20, f"{a.out}/teacher20.png")

    def preview(step):
        student.eval()
        with torch.no_grad():
            t = torch.full((n_prev,), math.pi / 2)
            F = student.forward_cm(eps, t, yp, mp, keep, torch.full((n_prev,), w_preview))[0]
            x0 = -F  # cos(pi/2) x_t - sin(pi/2) sigma_d F, over sigma_d: pixels
        student.train()
        grid(x0, f"{a.out}/student_{step:04d}.png")
        return ((x0 - teacher20) ** 2).mean().item()

    print(f"step    0  1-step mse vs the teacher's 20 steps {preview(0):.4f}", flush=True)
    for step in range(1, a.steps + 1):
        batch = random.sample(range(len(data)), a.batch) if a.batch <= len(data) else \
            [random.randrange(len(data)) for _ in range(a.batch)]
        x0 = torch.stack([data[i][0].flip(-1) if random.random() < 0.5 else data[i][0] for i in batch]) * SIGMA_D
        y, mask = y_all[batch], mask_all[batch]
        bs = len(batch)
        keep = torch.zeros(bs, dtype=torch.long)
        t = torch.atan(torch.exp(torch.randn(bs) * 1.6 + 0.2) / SIGMA_D).view(-1, 1, 1, 1)
        z = torch.randn_like(x0) * SIGMA_D
        x_t = torch.cos(t) * x0 + torch.sin(t) * z
        cfg = torch.tensor([random.choice(scales) for _ in range(bs)])
        with torch.no_grad():
            pred = teacher.forward_cm(torch.cat([x_t, x_t]) / SIGMA_D, torch.cat([t, t]).flatten(), torch.cat([y, y]),
                                      torch.cat([mask, mask]), torch.cat([torch.ones(bs, dtype=torch.long), keep]),
                                      None)[0]
            du, dc = (SIGMA_D * pred).chunk(2)
            dxt_dt = du + cfg.view(-1, 1, 1, 1) * (dc - du)
        r = min(1.0, step / a.tangent_warmup) if a.tangent_warmup > 0 else 1.0

        def student_out(xx, tt):
            return student.forward_cm(xx, tt.flatten(), y, mask, keep, cfg)[0]

        v_x = torch.cos(t) * torch.sin(t) * dxt_dt / SIGMA_D
        v_t = torch.cos(t) * torch.sin(t)
        _, dF = upstream_model.jvp(student_out, (x_t / SIGMA_D, t), (v_x, v_t))
        F_theta, logvar = student.forward_cm(x_t / SIGMA_D, t.flatten(), y, mask, keep, cfg)
        logvar = logvar.view(-1, 1, 1, 1)
        F_minus = F_theta.detach()
        g = -torch.cos(t) ** 2 * (SIGMA_D * F_minus - dxt_dt) - r * (torch.cos(t) * torch.sin(t) * x_t + SIGMA_D * dF)
        g = g / (torch.linalg.vector_norm(g, dim=(1, 2, 3), keepdim=True) + 0.1)
        weight = 1 / (torch.tan(t) * SIGMA_D)
        loss = ((weight / torch.exp(logvar)) * (F_theta - F_minus - g) ** 2 + logvar).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, a.clip)
        for group in opt.param_groups:
            group["lr"] = a.lr * min(1.0, step / a.warmup) if a.warmup > 0 else a.lr
        opt.step()
        if step % a.every == 0:
            print(f"step {step:4d}  1-step mse vs the teacher's 20 steps {preview(step):.4f}  (loss {loss.item():.4f}, "
                  f"grad {norm.item():.3g}, r {r:.2f})", flush=True)


if __name__ == "__main__":
    main()
