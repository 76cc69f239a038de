#!/usr/bin/env python3
"""A fine-tuning run of sana-train (train.lora, or a ControlNet) replayed in python3-torch,
step by step, for its loss curve.

Usage: train_replay.py RUN_DIR BASE.pth SETTINGS_JSON
  RUN_DIR: the work_dir of a run made with SANA_TEST_DUMP_BATCHES=1 (batches/: every
    micro-batch's model input, timesteps, target, control input, loss weight and (train.masked_loss)
    each cell's loss weight, as each
    rank fed them), a checkpoint after step 1 (checkpoints/step_00000001/: the trained
    tensors before any update, the warmup's learning rate at step 0 being 0) and
    metrics.jsonl; and at the end pytorch_lora_weights.safetensors (LoRA) or model.safetensors (ControlNet).
  BASE.pth: the frozen base in upstream's layout (torch.save'd {"state_dict": ...}).
  SETTINGS_JSON: {"kind": "lora" or "controlnet", "spec": sana-train model --json's spec,
    "lr", "betas", "eps", "weight_decay", "gradient_clip", "warmup", and "alpha" (LoRA)}:
    the values the run was given.

What the replay computes is not sana-train's code: the base is upstream's modules
(upstream_model.SanaMS, or SanaMSControlNet with its control blocks, float64), a LoRA's
adapters PEFT's layers (lora_reference.attach), the loss diffusers' / upstream's
flow-matching MSE (with masks, each squared error times its cell's weight before the mean,
as OneTrainer's masked training; with class images, diffusers' DreamBooth rule: the mean over
the samples' rows plus prior_loss_weight x the mean over the class images' rows), each micro-batch weighted by its share of the global batch; the gradients are clipped as torch.nn.utils.clip_grad_norm_ clips them, the
learning rate is diffusers' get_constant_schedule_with_warmup, the update torch.optim.AdamW.
Only the batches (data, noise, timesteps) come from the run. Prints every step's loss, the
run's and the replay's, and the trained tensors' largest difference; exits 1 when a step's
loss differs by more than LOSS_TOLERANCE (relative) or an adapter by more than
WEIGHT_TOLERANCE (relative to its largest element).
"""
import glob
import json
import os
import sys

import torch

from lora_reference import attach
from sana_reference import read_checkpoint_part, read_safetensors
from upstream_model import SanaMS, SanaMSControlNet

# Measured on 2026-11-28 (20 steps, 2 processes, float32 runs against this float64
# replay): losses within 1.5e-7 to 5.5e-7 (LoRA) and 2.6e-7 (ControlNet); leaving out the
# run's 0.01 weight decay moves them by 9.7e-5. The loss curve is the measure. The
# trained tensors came within 2.8e-4 to 1.7e-3 (LoRA) and 1.3e-3 (ControlNet) of their
# largest element: AdamW turns float32 noise in a near-zero gradient into a whole step of
# lr, so their check is a backstop (a tensor not updated, or updated wrongly, is off by
# far more).
LOSS_TOLERANCE = 1e-5
WEIGHT_TOLERANCE = 1e-2


def adapters_of(tensors):
    """diffusers' LoRA tensors -> {module: {"lora_A": tensor, "lora_B": tensor}} (float64)."""
    out = {}
    for key, t in tensors.items():
        module, kind, _ = key[len("transformer."):].rsplit(".", 2)
        out.setdefault(module, {})[kind] = t.double()
    return out


def batches_by_step(run_dir):
    """[(epoch, step) -> [micro-batch tensors]] in training order."""
    steps = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "batches", "r*.safetensors"))):
        tensors, meta = read_safetensors(path)
        steps.setdefault((int(meta["epoch"]), int(meta["step"])), []).append(tensors)
    return [steps[k] for k in sorted(steps)]


class Lora:
    """The frozen base with PEFT's adapters, from the checkpoint's lora.safetensors."""

    def __init__(self, model, run_dir, settings):
        self.model = model
        first, _ = read_checkpoint_part(os.path.join(run_dir, "checkpoints", "step_00000001"), "lora")
        self.layers = attach(model, adapters_of(first), settings["alpha"])
        self.final = os.path.join(run_dir, "pytorch_lora_weights.safetensors")

    def trained(self):  # name -> tensor, diffusers' LoRA names
        return {f"transformer.{name}.{kind}.weight": getattr(layer, kind).weight
                for name, layer in self.layers.items() for kind in ("lora_A", "lora_B")}

    def final_tensors(self):
        tensors, _ = read_safetensors(self.final)
        return tensors

    def __call__(self, b):
        return self.model(b["noisy"].double(), b["timesteps"].double())


def control_blocks(run_dir):
    """The control blocks of the step-1 checkpoint (its controlnet part): name -> tensor."""
    tensors, _ = read_checkpoint_part(os.path.join(run_dir, "checkpoints", "step_00000001"), "controlnet")
    return {k: v.double() for k, v in tensors.items() if k.startswith("controlnet.")}


class ControlNet:
    """The frozen base with upstream's control blocks, from the checkpoint's."""

    def __init__(self, model, run_dir, settings):
        self.model = model
        control = control_blocks(run_dir)
        missing = set(k for k in model.state_dict() if k.startswith("controlnet.")) - set(control)
        if missing:
            sys.exit(f"the step-1 checkpoint lacks {sorted(missing)[:4]}")
        model.load_state_dict(control, strict=False)
        model.controlnet.requires_grad_(True)
        self.final = os.path.join(run_dir, "model.safetensors")

    def trained(self):
        return {f"controlnet.{k}": p for k, p in self.model.controlnet.named_parameters()}

    def final_tensors(self):
        tensors, _ = read_safetensors(self.final)
        return tensors

    def __call__(self, b):
        return self.model(b["noisy"].double(), b["timesteps"].double(), None, None, None, b["control"].double())


def main():
    run_dir, base_path, settings = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    spec = dict(settings["spec"])
    spec.setdefault("out_channels", spec["in_channels"])
    spec.setdefault("norm_eps", 1e-5)
    lora = settings["kind"] == "lora"
    if lora:
        model = SanaMS(spec, None, 0, 1.0).double()
    else:
        copies = 1 + max(int(k.split(".")[1]) for k in control_blocks(run_dir))
        model = SanaMSControlNet(spec, None, 0, 1.0, copies).double()
    base = {k: v.double() for k, v in torch.load(base_path, map_location="cpu")["state_dict"].items()}
    base.pop("pos_embed", None)  # as upstream's load_checkpoint drops it
    missing, unexpected = model.load_state_dict(base, strict=False)
    if unexpected or any(not k.startswith("controlnet.") for k in missing):
        sys.exit(f"the base does not fit upstream's modules: missing {missing[:4]}, unexpected {unexpected[:4]}")
    model.requires_grad_(False)
    run = (Lora if lora else ControlNet)(model, run_dir, settings)
    trained = run.trained()
    params = list(trained.values())
    optimizer = torch.optim.AdamW(params, lr=settings["lr"], betas=tuple(settings["betas"]), eps=settings["eps"],
                                  weight_decay=settings["weight_decay"])
    logged = [json.loads(l)["loss"] for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in l]
    steps = batches_by_step(run_dir)
    if len(steps) != len(logged):
        sys.exit(f"{len(steps)} steps of batches, {len(logged)} losses in metrics.jsonl")
    worst_loss = 0.0
    for k, micro_batches in enumerate(steps):
        optimizer.zero_grad()
        loss = 0.0
        for b in micro_batches:
            pred = run(b)
            squares = (pred - b["target"].double()).pow(2)
            if "loss_weights" in b:  # train.masked_loss: OneTrainer's weighting, per cell over all channels
                squares = squares * b["loss_weights"].double()
            if "prior_rows" in b:  # diffusers' prior preservation: the last rows are class images
                n = squares.shape[0] - int(b["prior_rows"][0])
                instance, prior = squares[:n].mean(), squares[n:].mean()
                micro = (instance + float(b["prior_loss_weight"][0]) * prior) * b["weight"].double()[0]
            else:
                micro = squares.mean() * b["weight"].double()[0]
            micro.backward()
            loss += micro.item()
        torch.nn.utils.clip_grad_norm_(params, settings["gradient_clip"])
        warmup = settings["warmup"]
        for group in optimizer.param_groups:
            group["lr"] = settings["lr"] * (k / max(1, warmup) if k < warmup else 1.0)
        optimizer.step()
        diff = abs(loss - logged[k]) / abs(logged[k])
        worst_loss = max(worst_loss, diff)
        print(f"step {k + 1}: loss {logged[k]:.6f} (run) {loss:.6f} (replay), relative difference {diff:.2g}")
    final = run.final_tensors()
    worst_weight, worst_name = 0.0, ""
    for name, mine in trained.items():
        theirs = final[name].double()
        d = ((mine.detach() - theirs).abs().max() / theirs.abs().max()).item()
        if d > worst_weight:
            worst_weight, worst_name = d, name
    print(f"{len(steps)} steps replayed: loss within {worst_loss:.2g} (tolerance {LOSS_TOLERANCE}), "
          f"{len(trained)} trained tensors within {worst_weight:.2g} of {os.path.basename(run.final)} "
          f"({worst_name}; tolerance {WEIGHT_TOLERANCE})")
    sys.exit(0 if worst_loss <= LOSS_TOLERANCE and worst_weight <= WEIGHT_TOLERANCE else 1)


if __name__ == "__main__":
    main()
