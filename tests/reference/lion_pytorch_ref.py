#!/usr/bin/env python3
"""lion-pytorch itself as the judge of our Lion: the pinned package's lion_pytorch.Lion takes
the case's initial parameters and per-step gradients (fp32, on the CPU) at the case's
learning rate per step, betas and weight decay, and must end where ours did: every parameter
within 1e-6 relative (of its largest magnitude), and its exp_avg as well.

Usage: lion_pytorch_ref.py CASE.safetensors
The case holds "p0.<name>" (initial), "g<step>.<name>" (gradients), "out.<name>" and
"m.<name>" (our parameters and exp_avg after the steps); metadata "config" (JSON: lrs, one
per step, betas, weight_decay). Prints per parameter the distances; exits 1 on a miss."""
import sys

from lion_pytorch import Lion

import optimizer_case
from optimizer_case import rel


def main():
    t, config, names, params = optimizer_case.read(__doc__)
    opt = Lion(list(params.values()), lr=config["lrs"][0], betas=tuple(config["betas"]),
               weight_decay=config["weight_decay"])
    optimizer_case.run_steps(opt, t, config, names, params)
    ok = True
    for n, p in params.items():
        dp, dm = rel(t["out." + n], p.detach()), rel(t["m." + n], opt.state[p]["exp_avg"])
        good = dp <= 1e-6 and dm <= 1e-6
        ok &= good
        print(f"{'' if good else 'MISMATCH '}{n}: parameter {dp:.2e}, exp_avg {dm:.2e} (relative to lion-pytorch's)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
