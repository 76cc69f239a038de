#!/usr/bin/env python3
"""bitsandbytes itself as the judge of our AdamW8bit: the pinned package's
bitsandbytes.optim.AdamW8bit, on the CPU, takes the case's initial parameters and per-step
gradients, and so does torch's exact fp32 AdamW.

bitsandbytes' CPU backend is not its CUDA kernels (ours follows those, checked code for code
by tests/reference/adamw8bit.py): it rounds the update in another order and quantizes the
moments to the nearest code where the kernel's search picks a neighbour, so a few codes differ
by one step and the trajectories part at the quantization's scale. The judgement is therefore:
- parameters under min_8bit_size (bitsandbytes' 32-bit path): equal within 1e-6;
- quantized parameters: the same state layout (uint8 codes, one absmax per 256), codes equal
  but for under 5% of the lanes, and ours no farther from exact AdamW than bitsandbytes' own
  8-bit step is (at most 1.5x its distance): a wrong map, block or moment rule is far from both.

Usage: bnb_adamw8bit.py CASE.safetensors
The case is the one tests/reference/adamw8bit.py reads (its docstring lists the names), with
weight_decay 0. Prints per parameter the distances; exits 1 on a failed rule."""
import sys

import bitsandbytes as bnb
import torch

import optimizer_case


def main():
    t, config, names, params = optimizer_case.read(__doc__)
    opt = bnb.optim.AdamW8bit(list(params.values()), lr=config["lr"], betas=tuple(config["betas"]), eps=config["eps"],
                              weight_decay=config["weight_decay"], min_8bit_size=config["min_8bit_size"])
    exact = {n: torch.nn.Parameter(t["p0." + n].clone()) for n in names}
    adamw = torch.optim.AdamW(list(exact.values()), lr=config["lr"], betas=tuple(config["betas"]), eps=config["eps"],
                              weight_decay=config["weight_decay"])
    for s in range(config["steps"]):
        for n in names:
            params[n].grad = t[f"g{s}.{n}"].clone()
            exact[n].grad = t[f"g{s}.{n}"].clone()
        opt.step()
        adamw.step()
    ok = True
    dist = lambda a, b: ((a.detach().double() - b.detach().double()).abs().max() / b.detach().double().abs().max()).item()
    for n, p in params.items():
        ours, state = t["out." + n], opt.state[p]
        quantized = "state1" in state and state["state1"].dtype == torch.uint8
        if ("s1." + n in t) != quantized:
            print(f"MISMATCH {n}: bitsandbytes {'quantizes' if quantized else 'keeps fp32 moments'}, we do not")
            ok = False
            continue
        if not quantized:
            rel = dist(ours, p)
            good = rel <= 1e-6
            print(f"{'' if good else 'MISMATCH '}{n} (32-bit path): ours vs bitsandbytes {rel:.2e}")
        else:
            lanes = 2 * p.numel()
            codes = sum(int((state[k].flatten() != t[f"{c}.{n}"].flatten()).sum()) for k, c in (("state1", "s1"), ("state2", "s2")))
            same_layout = all(state[k].numel() == t[f"{c}.{n}"].numel() for k, c in (("absmax1", "a1"), ("absmax2", "a2")))
            d_ours, d_bnb = dist(ours, exact[n]), dist(p, exact[n])
            good = same_layout and codes < 0.05 * lanes and d_ours <= 1.5 * d_bnb + 1e-7
            print(f"{'' if good else 'MISMATCH '}{n} (8-bit): {codes} of {lanes} codes differ; from exact AdamW: ours "
                  f"{d_ours:.2e}, bitsandbytes {d_bnb:.2e}; ours vs bitsandbytes {dist(ours, p):.2e}")
        ok = ok and good
    print(f"bitsandbytes {bnb.__version__} AdamW8bit on the CPU, {config['steps']} steps: "
          f"{'as ours' if ok else 'not as ours'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
