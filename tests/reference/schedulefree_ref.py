#!/usr/bin/env python3
"""schedulefree itself as the judge of our ScheduleFreeAdamW: the pinned package's
schedulefree.AdamWScheduleFree, in train mode, takes the case's initial parameters and
per-step gradients (fp32, on the CPU) with the case's options, at its learning rate per
step, and must end where ours did: every parameter (y) and each state tensor (z,
exp_avg_sq) within 1e-6 relative (of its largest magnitude); then, put in eval mode, its
parameters (x) within 1e-6 of our eval weights; and its k and weight sum equal to ours.

Usage: schedulefree_ref.py CASE.safetensors
The case holds "p0.<name>" (initial), "g<step>.<name>" (gradients), "out.<name>" (ours after
the steps), "state.<name>/<state>" (our state, with "k" and "weight_sum") and "x.<name>"
(our eval weights); metadata "config" (JSON: lrs, one per step, and AdamWScheduleFree's
keyword arguments in "options"). Prints per parameter the largest distance; exits 1 on a
miss."""
import sys

from schedulefree import AdamWScheduleFree

import optimizer_case
from optimizer_case import rel


def main():
    t, config, names, params = optimizer_case.read(__doc__)
    opt = AdamWScheduleFree(list(params.values()), lr=1.0, **config["options"])
    opt.train()
    optimizer_case.run_steps(opt, t, config, names, params)
    ok, compared = True, 0
    y = {n: p.detach().clone() for n, p in params.items()}
    opt.eval()
    for n, p in params.items():
        worst = max(rel(t["out." + n], y[n]), rel(t["x." + n], p.detach()))
        state = opt.state[p]
        for key in ("z", "exp_avg_sq"):
            worst = max(worst, rel(t[f"state.{n}/{key}"], state[key]))
            compared += 1
        good = worst <= 1e-6 and not t["x." + n].equal(t["out." + n])
        ok &= good
        print(f"{'' if good else 'MISMATCH '}{n}: {worst:.2e} (relative to schedulefree's, y and x)")
    group = opt.param_groups[0]
    k, weight_sum = t[f"state.{names[0]}/k"].item(), t[f"state.{names[0]}/weight_sum"].item()
    print(f"k: ours {k}, schedulefree's {group['k']}; weight sum: ours {weight_sum!r}, its {group['weight_sum']!r}; "
          f"{compared} state tensors compared")
    ok &= k == group["k"] and weight_sum == group["weight_sum"]
    return 0 if ok and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
