"""The case file tests/unit/train/test_optim.cpp hands an optimizer's judge: tensors
"p0.<name>" (initial parameters), "g<step>.<name>" (gradients) and the C++ results, with the
config as JSON metadata. Shared by the judges that run a PyPI package's optimizer."""
import json
import sys

import torch
from safetensors import safe_open


def read(doc):
    """(tensors, config, names, params) from the file named by sys.argv[1]: `params` fresh
    leaf copies of the initial parameters, by name. Prints `doc` and exits 2 without one."""
    if len(sys.argv) != 2:
        print(doc, file=sys.stderr)
        sys.exit(2)
    with safe_open(sys.argv[1], framework="pt") as f:
        t, config = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["config"])
    names = sorted(k[len("p0."):] for k in t if k.startswith("p0."))
    params = {n: torch.nn.Parameter(t["p0." + n].clone()) for n in names}
    return t, config, names, params


def run_steps(opt, t, config, names, params, set_lr=True):
    """The case's steps on `opt`: per step its learning rate into every group (unless
    `set_lr` is false: an optimizer that takes its own) and the case's gradients."""
    for s, lr in enumerate(config["lrs"]):
        if set_lr:
            for group in opt.param_groups:
                group["lr"] = lr
        for n in names:
            params[n].grad = t[f"g{s}.{n}"].clone()
        opt.step()


def rel(a, b):
    """The largest distance of `a` from `b`, relative to b's largest magnitude."""
    return ((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30)).item()
