#!/usr/bin/env python3
"""transformers itself as the judge of our Adafactor: the pinned package's
transformers.optimization.Adafactor takes the case's initial parameters and per-step
gradients (fp32, on the CPU) with the case's options, at its learning rate per step where
relative_step is off, and must end where ours did: every parameter within 1e-6 relative (of
its largest magnitude), and each state tensor (exp_avg_sq_row, exp_avg_sq_col, exp_avg_sq,
exp_avg) as well.

Usage: adafactor_transformers_ref.py CASE.safetensors
The case holds "p0.<name>" (initial), "g<step>.<name>" (gradients), "out.<name>" (ours after
the steps) and "state.<name>/<state>" (our state); metadata "config" (JSON: lrs, one per
step, and the Adafactor keyword arguments in "options"). Prints per parameter the largest
distance; exits 1 on a miss."""
import sys

from transformers.optimization import Adafactor

import optimizer_case
from optimizer_case import rel


def main():
    t, config, names, params = optimizer_case.read(__doc__)
    options = dict(config["options"])
    relative = options["relative_step"]
    opt = Adafactor(list(params.values()), lr=None if relative else config["lrs"][0], **options)
    optimizer_case.run_steps(opt, t, config, names, params, set_lr=not relative)
    ok, compared = True, 0
    for n, p in params.items():
        worst = rel(t["out." + n], p.detach())
        state = opt.state[p]
        for key in ("exp_avg_sq_row", "exp_avg_sq_col", "exp_avg_sq", "exp_avg"):
            ours = t.get(f"state.{n}/{key}")
            if (key in state) != (ours is not None):
                print(f"MISMATCH {n}: {key} is {'ours alone' if ours is not None else 'transformers alone'}")
                ok = False
            elif ours is not None:
                worst = max(worst, rel(ours, state[key]))
                compared += 1
        good = worst <= 1e-6
        ok &= good
        print(f"{'' if good else 'MISMATCH '}{n}: {worst:.2e} (relative to transformers' Adafactor)")
    print(f"{compared} state tensors compared")
    return 0 if ok and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
