#!/usr/bin/env python3
"""SANA-Sprint's sCM step as upstream computes it, in float64, for checking the C++ JVP and loss.

Usage: sprint_reference.py CASE.safetensors

The case file (written by the C++ test "the student's JVP and sCM loss match upstream's in
float64") holds a student's weights "w.<name>", the inputs of one sCM step (in.x_s: the noisy
latent x_t, in.s: TrigFlow times, in.dxds: the teacher's dx_t/dt, in.y, in.mask, in.drop,
in.cfg_scale), its spec and sigma_data and r (the tangent warm-up ratio) as metadata, and what
the C++ run computed: out.F (the student's output), out.dF (its JVP), out.g (the normalised
direction), out.loss and grad.<name> (the loss's gradient of every parameter).

The student is upstream_model.py's SanaMSCM (upstream's module structure and names, loaded
strictly) with its float32 islands in float64 (ISLAND_DTYPE, as the C++ model in float64), so
that the whole step is float64.
The JVP comes from torch.autograd.functional.jvp, which python3-torch computes by the
double-vector-Jacobian trick (reverse mode twice), not by forward-mode AD as the C++ code does:
two different exact methods. The step follows train_scripts/train_scm_ladd.py (the "phase G"
branch with scm_loss): tangents (cos t sin t dxt_dt / sigma_data, cos t sin t), F_theta and
logvar from a second forward with grad, g = -cos^2 t (sigma_data F- - dxt_dt) - r (cos t sin t
x_t + sigma_data dF), g / (||g|| + 0.1), weight 1 / (sigma_data tan t), loss = mean(weight /
exp(logvar) (F_theta - F- - g)^2 + logvar).

Prints the largest relative difference per quantity; exits 1 above 1e-9.
"""
import json
import sys

import torch

import upstream_model
from sana_reference import read_safetensors  # the case-file reader only

TOLERANCE = 1e-9


def rel(ours, ref):
    return ((ours.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def main(path):
    tensors, meta = read_safetensors(path)
    spec = json.loads(meta["spec"])
    sigma_data, r = float(meta["sigma_data"]), float(meta["r"])
    tensors["in.x"] = tensors["in.x_s"]  # model_of_case reads the input channels from in.x
    model = upstream_model.model_of_case(tensors, spec)
    x_t = tensors["in.x_s"].double()
    t = tensors["in.s"].double().view(-1, 1, 1, 1)
    dxt_dt = tensors["in.dxds"].double()
    y, mask, drop = tensors["in.y"].double(), tensors["in.mask"], tensors["in.drop"].long()
    cfg_scale = tensors["in.cfg_scale"].double()

    def student(scaled_x_t, tt):
        return model.forward_cm(scaled_x_t, tt.flatten(), y, mask, drop, cfg_scale)

    v_x = torch.cos(t) * torch.sin(t) * dxt_dt / sigma_data
    v_t = torch.cos(t) * torch.sin(t)
    F_jvp, F_theta_grad = upstream_model.jvp(lambda a, b: student(a, b)[0], (x_t / sigma_data, t),
                                                        (v_x, v_t))
    F_theta, logvar = student(x_t / sigma_data, t)
    logvar = logvar.view(-1, 1, 1, 1)
    F_theta_minus = F_theta.detach()
    g = -torch.cos(t) * torch.cos(t) * (sigma_data * F_theta_minus - dxt_dt)
    g = g - r * (torch.cos(t) * torch.sin(t) * x_t + sigma_data * F_theta_grad)
    g_norm = torch.linalg.vector_norm(g, dim=(1, 2, 3), keepdim=True)
    g = g / (g_norm + 0.1)
    weight = 1 / (torch.tan(t) * sigma_data)
    loss = ((weight / torch.exp(logvar)) * torch.square(F_theta - F_theta_minus - g) + logvar).mean()
    loss.backward()

    worst = {
        "F": rel(tensors["out.F"], F_jvp.detach()),
        "dF (JVP)": rel(tensors["out.dF"], F_theta_grad.detach()),
        "g": rel(tensors["out.g"], g),
        "loss": rel(tensors["out.loss"], loss.detach().reshape(1)),
    }
    grads = 0.0
    for name, p in model.named_parameters():
        ours = tensors.get("grad." + name)
        if ours is None:
            print(f"no gradient of {name} in the case file")
            return 1
        grads = max(grads, rel(ours, p.grad))
    worst["parameter gradients"] = grads
    return report(worst)


def report(worst):
    """Prints each quantity's largest relative difference and the worst; the exit code."""
    for k, v in worst.items():
        print(f"{k}: max relative difference {v:.3g}")
    top = max(worst.values())
    print(f"worst relative difference {top:.3g} (tolerance {TOLERANCE})")
    return 0 if top <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
