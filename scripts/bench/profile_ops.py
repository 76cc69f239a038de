#!/usr/bin/env python3
"""Sums a Chrome trace of torch's autograd profiler (LibTorch's RecordProfile, e.g.
BENCH_PROFILE=FILE with build/apps/bench_ddp, built by cmake --build build --target
bench_ddp) per operator: self time (an operator's time minus the operators it called),
calls, share. With --python PRESET SIDE BATCH it prints the
same table for a PyTorch step of the same shapes (forward, backward, AdamW; one thread) next
to it: upstream_peer.py's model (upstream's classes) by default, --peer mirror for sana_torch.py.
  .venv/bin/python scripts/bench/profile_ops.py TRACE [--top 25] [--python SanaMS_tiny_P2_D4 64 8]
"""
import argparse
import collections
import json
import os
import sys


def self_times(events):
    """{name: [self microseconds, calls]} from complete or begin/end events of one thread."""
    spans = []
    for e in events:
        if e.get("ph") == "X":
            spans.append((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"], e.get("tid")))
    opened = collections.defaultdict(list)
    for e in events:  # the legacy profiler writes begin ("B") and end ("E") pairs
        if e.get("ph") == "B":
            opened[(e.get("tid"), e["name"])].append(float(e["ts"]))
        elif e.get("ph") == "E" and opened[(e.get("tid"), e["name"])]:
            spans.append((opened[(e.get("tid"), e["name"])].pop(), float(e["ts"]), e["name"], e.get("tid")))
    out = collections.defaultdict(lambda: [0.0, 0])
    for tid in {s[3] for s in spans}:
        mine = sorted((s for s in spans if s[3] == tid), key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, name, _ in mine:
            while stack and stack[-1][1] <= start:
                stack.pop()
            if stack:
                out[stack[-1][2]][0] -= end - start
            out[name][0] += end - start
            out[name][1] += 1
            stack.append((start, end, name))
    return out


def table(title, totals, top):
    total = sum(v[0] for v in totals.values())
    print(f"{title}: {total / 1e3:.1f} ms self time in operators")
    for name, (us, calls) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"  {name:<40} {us / 1e3:9.2f} ms {calls:6d} calls {100 * us / total:5.1f}%")


def python_profile(preset, side, batch, peer):
    # One thread for OpenBLAS too (it reads these when torch loads it; torch's own setting
    # does not reach it): else its matrix products run on every core and look cheaper.
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from torch.profiler import profile, ProfilerActivity
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sana_torch import PRESETS, SanaMS
    if peer == "upstream":
        from upstream_peer import SanaMS
    torch.set_num_threads(1)
    model = SanaMS(*PRESETS[preset])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-10)
    x, t = torch.randn(batch, 3, side, side), torch.rand(batch) * 1000

    def step():  # as bench_ddp's step: forward, backward, AdamW
        model(x, t).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    for _ in range(2):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    return {e.key: [e.self_cpu_time_total, e.count] for e in prof.key_averages()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--python", nargs=3, metavar=("PRESET", "SIDE", "BATCH"))
    ap.add_argument("--peer", default="upstream", choices=["upstream", "mirror"],
                    help="the Python model: upstream_peer.py (upstream's classes) or sana_torch.py")
    a = ap.parse_args()
    data = json.load(open(a.trace))
    events = data["traceEvents"] if isinstance(data, dict) else data
    table("LibTorch (trace)", self_times(events), a.top)
    if a.python:
        table("PyTorch (torch.profiler)", python_profile(a.python[0], int(a.python[1]), int(a.python[2]), a.peer), a.top)


if __name__ == "__main__":
    main()
