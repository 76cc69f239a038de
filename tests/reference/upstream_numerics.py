#!/usr/bin/env python3
"""Upstream Sana's numerics, computed the way upstream's Python computes them, for the C++
trainer to match. Independent of sana_reference.py (our own model reading): every part here
follows a named upstream function, with upstream's dtypes (numpy float64 tables, torch float32
grids) and upstream's step order. Run with Debian's python3 (numpy, torch).

Usage: upstream_numerics.py DIR   -> DIR/upstream.safetensors (float64 tensors)

  train_sigma_s{1,3}, train_t_s{1,3}
      diffusion/model/gaussian_diffusion.py get_named_beta_schedule("linear_flow", 1000):
      betas = np.linspace(1.0, 0.001, 1000); flow sigmas = 1 - betas. respace.py
      SpacedDiffusion with FLOW_VELOCITY: sigmas shifted by flow_shift in numpy, timestep_map =
      sigmas * 1000, and _WrappedModel hands the model map[t] cast to the long timestep dtype.
  lr_{constant,cosine,decay}
      diffusers.optimization get_constant_schedule_with_warmup / get_cosine_schedule_with_warmup
      and upstream's get_cosine_decay_to_constant_with_warmup (diffusion/utils/lr_scheduler.py),
      run through torch's LambdaLR and stepped once per optimizer step, the rate read before
      each optimizer.step() as train.py's step does.
  dpm_grid_20_s3, dpm_toy
      diffusion/model/dpm_solver.py: NoiseScheduleFlow, get_time_steps("time_uniform_flow") in
      torch float32, DPM_Solver.sample(order=2, method="multistep", lower_order_final=True,
      algorithm "dpmsolver++") on a toy velocity v(x, s) = x (1 + s).
  euler_grid_28_s3, euler_toy
      diffusers FlowMatchEulerDiscreteScheduler(shift=3): __init__ and set_timesteps(28), then
      step(): x += (sigma_next - sigma) v.
  pe_{h}x{w}_i{interp}
      get_2d_sincos_pos_embed (PixArt's, in sana_blocks.py) as SanaMS.forward calls it.
"""
import json
import math
import struct
import sys

import numpy as np
import torch


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, value in tensors.items():
        data = np.ascontiguousarray(np.asarray(value, dtype=np.float64)).tobytes()
        header[name] = {"dtype": "F64", "shape": list(np.asarray(value).shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def shift(sigmas, s):
    return s * sigmas / (1 + (s - 1) * sigmas)


# --- training table (gaussian_diffusion.py + respace.py) --------------------------------

def training_table(flow_shift):
    betas = np.linspace(1.0, 0.001, 1000, dtype=np.float64)
    sigmas = shift(1.0 - betas, flow_shift)
    timestep_map = sigmas * 1000
    model_t = torch.tensor(timestep_map, dtype=torch.long)  # map_tensor of dtype long
    return sigmas, model_t.numpy().astype(np.float64)


# --- learning-rate schedules (diffusers, upstream's lr_scheduler.py) --------------------

def constant_with_warmup(warmup):
    return lambda k: k / max(1.0, warmup) if k < warmup else 1.0


def cosine_with_warmup(warmup, total, cycles=0.5):
    def f(k):
        if k < warmup:
            return k / max(1, warmup)
        progress = (k - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress)))
    return f


def decay_to_constant(warmup, total, final, decay=0.667, cycles=0.5):
    def f(k):
        if k < warmup:
            return k / max(1, warmup)
        decay_steps = int(total * decay)
        if k > decay_steps:
            return final
        progress = (k - warmup) / max(1, decay_steps - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * cycles * 2.0 * progress))) * (1 - final) + final
    return f


def lr_per_step(lam, steps, base=1e-3):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=base)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lam)
    rates = []
    for _ in range(steps):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return np.array(rates)


# --- DPM-Solver++ (dpm_solver.py, flow schedule) ----------------------------------------

def toy_velocity(x, s):
    return x * (1 + s)


def dpm_grid(steps, flow_shift):
    betas = torch.linspace(1.0, 1.0 / 1000, steps + 1)  # t_T = 1, t_0 = 1 / total_N, float32
    sigmas = 1.0 - betas
    return shift(sigmas, flow_shift).flip(dims=[0])


def dpm_sample(x, steps, flow_shift):
    ts = dpm_grid(steps, flow_shift).double()
    alpha = lambda t: 1 - t  # noqa: E731  NoiseScheduleFlow.marginal_alpha
    std = lambda t: t  # noqa: E731  marginal_std
    lam = lambda t: torch.log(1 - t) - torch.log(t)  # noqa: E731  marginal_lambda

    def data_pred(x, t):  # model_wrapper "flow": noise = (1 - t) v + x; x0 = (x - t noise) / alpha
        noise = (1 - t) * toy_velocity(x, t.item()) + x
        return (x - std(t) * noise) / alpha(t)

    def first_order(x, s, t, m):  # dpm_solver_first_update, dpmsolver++
        h = lam(t) - lam(s)
        return std(t) / std(s) * x - alpha(t) * torch.expm1(-h) * m

    def second_order(x, t_prev, m_prev, t):  # multistep_dpm_solver_second_update, "dpmsolver"
        (t1, t0), (m1, m0) = t_prev, m_prev
        h0 = lam(t0) - lam(t1)
        h = lam(t) - lam(t0)
        d1 = (m0 - m1) / (h0 / h)
        phi = torch.expm1(-h)
        return std(t) / std(t0) * x - alpha(t) * phi * m0 - 0.5 * alpha(t) * phi * d1

    t_list, m_list = [ts[0]], [data_pred(x, ts[0])]
    x = first_order(x, ts[0], ts[1], m_list[-1])  # steps 1 .. order - 1: lower orders
    t_list.append(ts[1])
    m_list.append(data_pred(x, ts[1]))
    for step in range(2, steps + 1):
        order = min(2, steps + 1 - step)  # lower_order_final
        t = ts[step]
        if order == 1:
            x = first_order(x, t_list[-1], t, m_list[-1])
        else:
            x = second_order(x, t_list[-2:], m_list[-2:], t)
        if step < steps:
            t_list.append(t)
            m_list.append(data_pred(x, t))
    return x


# --- flow Euler (diffusers' FlowMatchEulerDiscreteScheduler) ----------------------------

def euler_grid(steps, flow_shift):
    train_t = np.linspace(1, 1000, 1000, dtype=np.float32)[::-1].copy()
    train_s = torch.from_numpy(train_t).to(dtype=torch.float32) / 1000
    train_s = shift(train_s, flow_shift)
    s_max, s_min = train_s[0].item(), train_s[-1].item()
    t = np.linspace(s_max * 1000, s_min * 1000, steps)
    s = shift(t / 1000, flow_shift)
    s = torch.from_numpy(s).to(dtype=torch.float32)
    return torch.cat([s, torch.zeros(1)])


def euler_sample(x, steps, flow_shift):
    grid = euler_grid(steps, flow_shift).double()
    for i in range(steps):
        x = x + (grid[i + 1] - grid[i]) * toy_velocity(x, grid[i].item())
    return x


# --- sin-cos position embedding (get_2d_sincos_pos_embed) -------------------------------

def sincos_1d(dim, pos):
    omega = np.arange(dim // 2, dtype=np.float64)
    omega /= dim / 2.0
    omega = 1.0 / 10000 ** omega
    out = np.einsum("m,d->md", pos.reshape(-1), omega)
    return np.concatenate([np.sin(out), np.cos(out)], axis=1)


def sincos_2d(dim, h, w, pe_interpolation, base_size):
    grid_h = np.arange(h, dtype=np.float32) / (h / base_size) / pe_interpolation
    grid_w = np.arange(w, dtype=np.float32) / (w / base_size) / pe_interpolation
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape([2, 1, w, h])
    return np.concatenate([sincos_1d(dim // 2, grid[0]), sincos_1d(dim // 2, grid[1])], axis=1)


def main():
    out = {}
    for s in (1, 3):
        sig, t = training_table(float(s))
        out[f"train_sigma_s{s}"] = sig
        out[f"train_t_s{s}"] = t
    out["lr_constant"] = lr_per_step(constant_with_warmup(10), 120)
    out["lr_cosine"] = lr_per_step(cosine_with_warmup(10, 110), 120)
    out["lr_decay"] = lr_per_step(decay_to_constant(10, 110, 0.1), 120)
    x_T = torch.tensor([0.7, -1.1, 0.3], dtype=torch.float64)
    out["toy_noise"] = x_T.numpy()
    out["dpm_grid_20_s3"] = dpm_grid(20, 3.0).double().numpy()
    out["dpm_toy"] = dpm_sample(x_T.clone(), 20, 3.0).numpy()
    out["euler_grid_28_s3"] = euler_grid(28, 3.0).double().numpy()
    out["euler_toy"] = euler_sample(x_T.clone(), 28, 3.0).numpy()
    out["pe_4x6_i1"] = sincos_2d(32, 4, 6, 1.0, 4)
    out["pe_6x4_i2"] = sincos_2d(32, 6, 4, 2.0, 4)
    write_safetensors(sys.argv[1] + "/upstream.safetensors", out)


if __name__ == "__main__":
    main()
