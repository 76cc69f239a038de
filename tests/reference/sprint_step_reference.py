#!/usr/bin/env python3
"""One generator step and one discriminator step of SANA-Sprint's stage 2 as upstream's
train_scm_ladd.py runs them, in float64, for checking the C++ step (src/sana/train/sprint/objective.h).

Usage: sprint_step_reference.py CASE.safetensors

The case file (written by the C++ test "a Sprint generator and discriminator step match
upstream's in float64"): the student "s.<name>", the teacher "t.<name>" and the heads
"h.<name>" (state dicts with upstream's names), the batch (in.x0: latents x sigma_data,
in.y, in.mask), every draw of both steps (in.g.*: s, s_x0, s_d, cfg and the N(0, 1) noises
z, z_x0, z_d; in.d.*: cfg, s_g, s_fake, s_real, s_shift, z_g, z_fake, z_real, z_shift), the
options as metadata, and what the C++ step gave: out.g (total, sCM, adversarial),
grad.s.<name> (the student's gradients after the generator step), out.d (total, real,
fake), grad.h.<name> (the heads' gradients after the discriminator step) and out.h.<name>
(the heads' spectral-norm vectors after it).

The code follows train_scm_ladd.py's loop body on one process holding the whole batch: the
teacher's guided velocity in one batched pass over [null caption; caption], the JVP of the
student (here torch.autograd.functional.jvp: reverse mode twice), the sCM loss with logvar,
the student's x0 at the largest-timestep draw, re-noised at the discriminator's time, the
discriminator as SanaMSCMDiscriminator (forward hooks on the teacher's blocks
head_block_ids while the teacher runs its whole SanaMSCM forward, the heads of
ladd_heads.py with torch's spectral norm), -mean(D) weighted by adv_lambda, one backward;
then the discriminator's phase: the student in eval mode, fake and real re-noised at their
own times, misaligned pairs torch.roll(x0, 1) appended to the fakes with the captions
repeated, the heads in training mode called on the fakes then the reals, the hinge loss, one
backward. The C++ step runs its batch as micro-batches with the heads over the whole batch
and the feature gradients carried back: the same sums, another order. Exits 1 above 1e-9 (sprint_reference.TOLERANCE).
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import upstream_model  # noqa: E402
from ladd_heads import Heads  # noqa: E402
from sana_reference import read_safetensors  # noqa: E402
from sprint_reference import report  # noqa: E402


def rel(ours, ref):
    return ((ours.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300)).item()


def rel_all(tensors, prefix, module):
    """The largest difference of any parameter's gradient over the largest gradient element of
    all: a tensor whose exact gradient is 0 (a bias before a batch norm) has only round-off to
    compare, so it is measured against the module's scale, not its own."""
    diff = max((tensors[prefix + n].double() - p.grad).abs().max().item() for n, p in module.named_parameters())
    scale = max(p.grad.abs().max().item() for p in module.parameters())
    return diff / scale


def model_of(tensors, prefix, spec):
    case = {"w." + k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}
    case["in.x"] = tensors["in.x0"]
    return upstream_model.model_of_case(case, dict(spec))


def main(path):
    tensors, meta = read_safetensors(path)
    sd, r = float(meta["sigma_data"]), float(meta["r"])
    scm_lambda, adv_lambda = float(meta["scm_lambda"]), float(meta["adv_lambda"])
    head_ids = json.loads(meta["head_block_ids"])
    student = model_of(tensors, "s.", json.loads(meta["spec"]))
    teacher = model_of(tensors, "t.", json.loads(meta["teacher_spec"]))
    teacher.requires_grad_(False)
    heads_state = {k[2:]: v.double() for k, v in tensors.items() if k.startswith("h.")}
    channels = heads_state["heads.0.main.0.1.weight"].shape[0]
    heads = Heads(channels, len(head_ids)).double()
    heads.load_state_dict(heads_state, strict=True)

    x0 = tensors["in.x0"].double()
    y, mask = tensors["in.y"].double(), tensors["in.mask"]
    bs = x0.shape[0]
    keep = torch.zeros(bs, dtype=torch.long)
    g = {k[5:]: v.double() for k, v in tensors.items() if k.startswith("in.g.")}
    d = {k[5:]: v.double() for k, v in tensors.items() if k.startswith("in.d.")}

    def disc(x, timestep, yy, mm):  # SanaMSCMDiscriminator.forward
        feats = []
        hooks = [teacher.blocks[i].register_forward_hook(lambda m, i, o: feats.append(o)) for i in head_ids]
        teacher.forward_cm(x, timestep, yy, mm, torch.zeros(x.shape[0], dtype=torch.long), None)
        for h in hooks:
            h.remove()
        return heads(feats)

    # --- generator phase (phase == "G") ---
    t = g["s"].view(-1, 1, 1, 1)
    z = g["z"] * sd
    x_t = torch.cos(t) * x0 + torch.sin(t) * z
    scm_cfg_scale = g["cfg"]

    def student_out(xx, tt):
        return student.forward_cm(xx, tt.flatten(), y, mask, keep, scm_cfg_scale)

    heads.eval()
    student.train()
    with torch.no_grad():
        cfg_pred = teacher.forward_cm(torch.cat([x_t, x_t]) / sd, torch.cat([t, t]).flatten(), torch.cat([y, y]),
                                      torch.cat([mask, mask]), torch.cat([torch.ones(bs, dtype=torch.long), keep]),
                                      None)[0]
        dxt_dt_uncond, dxt_dt = (sd * cfg_pred).chunk(2)
        dxt_dt = dxt_dt_uncond + scm_cfg_scale.view(-1, 1, 1, 1) * (dxt_dt - dxt_dt_uncond)
    v_x = torch.cos(t) * torch.sin(t) * dxt_dt / sd
    v_t = torch.cos(t) * torch.sin(t)
    _, F_theta_grad = upstream_model.jvp(lambda a, b: student_out(a, b)[0], (x_t / sd, t), (v_x, v_t))
    F_theta, logvar = student_out(x_t / sd, t)
    logvar = logvar.view(-1, 1, 1, 1)
    F_theta_minus = F_theta.detach()
    gg = -torch.cos(t) * torch.cos(t) * (sd * F_theta_minus - dxt_dt)
    gg = gg - r * (torch.cos(t) * torch.sin(t) * x_t + sd * F_theta_grad)
    gg = gg / (torch.linalg.vector_norm(gg, dim=(1, 2, 3), keepdim=True) + 0.1)
    weight = 1 / (torch.tan(t) * sd)
    loss = ((weight / torch.exp(logvar)) * torch.square(F_theta - F_theta_minus - gg) + logvar).mean()
    t_new = g["s_x0"].view(-1, 1, 1, 1)  # train_largest_timestep: the coin is in the draw
    x_t_new = torch.cos(t_new) * x0 + torch.sin(t_new) * g["z_x0"] * sd
    F_new = student_out(x_t_new / sd, t_new)[0]
    pred_x_0 = torch.cos(t_new) * x_t_new - torch.sin(t_new) * F_new * sd
    t_D = g["s_d"].view(-1, 1, 1, 1)
    noised_predicted_x0 = torch.cos(t_D) * pred_x_0 + torch.sin(t_D) * g["z_d"] * sd
    pred_fake = disc(noised_predicted_x0 / sd, t_D.flatten(), y, mask)
    adv_loss = -torch.mean(pred_fake)
    total_loss = scm_lambda * loss + adv_loss * adv_lambda
    total_loss.backward()
    worst = {"generator losses": rel(tensors["out.g"], torch.stack([total_loss, loss, adv_loss]).detach())}
    worst["student gradients"] = rel_all(tensors, "grad.s.", student)
    heads.zero_grad(set_to_none=True)  # upstream's optimizer_D.zero_grad() at the next phase's start

    # --- discriminator phase (phase == "D") ---
    heads.train()
    student.eval()
    with torch.no_grad():
        cfg = d["cfg"]
        t_G = d["s_g"].view(-1, 1, 1, 1)
        x_t = torch.cos(t_G) * x0 + torch.sin(t_G) * d["z_g"] * sd
        F_theta = student.forward_cm(x_t / sd, t_G.flatten(), y, mask, keep, cfg)[0]
        pred_x_0 = torch.cos(t_G) * x_t - torch.sin(t_G) * F_theta * sd
    t_D_fake, t_D_real = d["s_fake"].view(-1, 1, 1, 1), d["s_real"].view(-1, 1, 1, 1)
    noised_predicted_x0 = torch.cos(t_D_fake) * pred_x_0 + torch.sin(t_D_fake) * d["z_fake"] * sd
    noised_latents = torch.cos(t_D_real) * x0 + torch.sin(t_D_real) * d["z_real"] * sd
    shifted_x0 = torch.roll(x0, 1, 0)
    t_D_shifted = d["s_shift"].view(-1, 1, 1, 1)
    noised_shifted_x0 = torch.cos(t_D_shifted) * shifted_x0 + torch.sin(t_D_shifted) * d["z_shift"] * sd
    noised_predicted_x0 = torch.cat([noised_predicted_x0, noised_shifted_x0], dim=0)
    t_D_fake = torch.cat([t_D_fake, t_D_shifted], dim=0)
    pred_fake = disc(noised_predicted_x0 / sd, t_D_fake.flatten(), torch.cat([y, y]), torch.cat([mask, mask]))
    pred_true = disc(noised_latents / sd, t_D_real.flatten(), y, mask)
    loss_real = torch.mean(torch.relu(1.0 - pred_true))
    loss_gen = torch.mean(torch.relu(1.0 + pred_fake))
    loss_D = 0.5 * (loss_real + loss_gen)
    loss_D.backward()
    worst["discriminator losses"] = rel(tensors["out.d"], torch.stack([loss_D, loss_real, loss_gen]).detach())
    worst["heads' gradients"] = rel_all(tensors, "grad.h.", heads)
    state = heads.state_dict()
    worst["u and v"] = max(rel(tensors["out.h." + k], state[k]) for k in state if k.endswith(("_u", "_v")))
    return report(worst)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
