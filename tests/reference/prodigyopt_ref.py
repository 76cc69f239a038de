#!/usr/bin/env python3
"""prodigyopt itself as the judge of our Prodigy: the pinned package's prodigyopt.Prodigy
takes the case's initial parameters and per-step gradients (fp32, on the CPU) with the
case's options, at its learning rate per step, and must end where ours did: every parameter
and each state tensor (exp_avg, exp_avg_sq, s, p0) within 1e-6 relative (of its largest
magnitude), and the step size d within 1e-6 relative.

Usage: prodigyopt_ref.py CASE.safetensors
The case holds "p0.<name>" (initial), "g<step>.<name>" (gradients), "out.<name>" (ours after
the steps) and "state.<name>/<state>" (our state, with "d"); metadata "config" (JSON: lrs,
one per step, and Prodigy's keyword arguments in "options"). Prints per parameter the
largest distance; exits 1 on a miss."""
import sys

from prodigyopt import Prodigy

import optimizer_case
from optimizer_case import rel


def main():
    t, config, names, params = optimizer_case.read(__doc__)
    options = dict(config["options"])
    if options.get("growth_rate") is None:
        options["growth_rate"] = float("inf")
    opt = Prodigy(list(params.values()), lr=1.0, **options)  # each step sets its own (0 is refused here)
    optimizer_case.run_steps(opt, t, config, names, params)
    ok, compared = True, 0
    for n, p in params.items():
        worst = rel(t["out." + n], p.detach())
        state = opt.state[p]
        for key in ("exp_avg", "exp_avg_sq", "s", "p0"):
            ours = t.get(f"state.{n}/{key}")
            if (key in state) != (ours is not None):
                print(f"MISMATCH {n}: {key} is {'ours alone' if ours is not None else 'prodigyopt alone'}")
                ok = False
            elif ours is not None:
                worst = max(worst, rel(ours, state[key].expand_as(ours)))
                compared += 1
        good = worst <= 1e-6
        ok &= good
        print(f"{'' if good else 'MISMATCH '}{n}: {worst:.2e} (relative to prodigyopt's)")
    d_ours, d_theirs = t[f"state.{names[0]}/d"].item(), opt.param_groups[0]["d"]
    d_rel = abs(d_ours - d_theirs) / abs(d_theirs)
    print(f"d: ours {d_ours:.6e}, prodigyopt's {d_theirs:.6e} ({d_rel:.2e}); {compared} state tensors compared")
    ok &= d_rel <= 1e-6 and d_theirs > options.get("d0", 1e-6)
    return 0 if ok and compared > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
