#!/usr/bin/env python3
"""The Python side of scripts/bench/ddp_engine.sh: the same SanaMS architecture in PyTorch
(unconditional, pixel space; sana_torch.py), trained with torch.nn.parallel.DistributedDataParallel on
Gloo with AdamW on random data, printing samples/s. Run under torchrun:
  python3 -m torch.distributed.run --nproc_per_node 2 scripts/bench/ddp_engine.py PRESET STEPS SIDE BATCH
"""
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sana_torch import PRESETS, SanaMS  # noqa: E402


def main():
    preset = sys.argv[1] if len(sys.argv) > 1 else "SanaMS_small_P2_D8"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    side = int(sys.argv[3]) if len(sys.argv) > 3 else 64
    batch = int(sys.argv[4]) if len(sys.argv) > 4 else 4
    dist.init_process_group("gloo")
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "1")))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    model = nn.parallel.DistributedDataParallel(SanaMS(*PRESETS[preset]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, eps=1e-10, weight_decay=0.03)
    torch.manual_seed(rank)
    x, t = torch.randn(batch, 3, side, side), torch.rand(batch) * 1000
    times = []
    for s in range(steps + 2):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        model(x, t).pow(2).mean().backward()
        opt.step()
        if s >= 2:
            times.append(time.perf_counter() - start)
    times.sort()
    step = times[len(times) // 2]
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"python DDP {preset}: {n} parameters, {world} processes, batch {batch} of {side}x{side} per process: "
              f"median step {step:.3f} s, {world * batch / step:.1f} samples/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
