#!/usr/bin/env python3
"""Python peer trainer: the speed reference for sana-train benchmarks.

An independent PyTorch implementation of the same job as sana-train: SanaMS (pixel space,
unconditional) trained with flow matching, DistributedDataParallel on Gloo (CPU), AdamW,
gradient accumulation, aspect-ratio buckets, and images decoded by a torchvision
DataLoader. Run under torchrun, e.g.:

  OMP_NUM_THREADS=1 .venv/bin/python -m torch.distributed.run --redirects 2 --tee 1 \
      --log_dir "$(mktemp -d)" --nproc_per_node 2 --master_port 29517 \
      scripts/bench/py_trainer.py --samples samples.tsv --global-batch 8 --micro-batch 4

--samples is a TSV with one sample per line: path<TAB>height<TAB>width (the bucket size
in pixels that sample trains at); lines starting with # are ignored.
"""
import argparse
import datetime
import json
import os
import random
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from PIL import Image
from torchvision.transforms import InterpolationMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sana_torch import PRESETS, SanaMS  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", required=True, help="TSV: path, height, width")
    p.add_argument("--preset", default="SanaMS_tiny_P2_D4", choices=sorted(PRESETS))
    p.add_argument("--peer", default="upstream", choices=["upstream", "mirror"],
                   help="the model: upstream_peer.py (upstream's classes) or sana_torch.py (a compact transcription)")
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=0, help="global steps, 0 = no limit")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--flip", action="store_true", help="random horizontal flip")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--json", help="rank 0 writes a JSON summary here")
    return p.parse_args()


def read_samples(path):
    samples = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            file, h, w = line.split("\t")
            samples.append((file, int(h), int(w)))
    return samples


class BucketDataset(torch.utils.data.Dataset):
    """Decodes one image, resizes it to cover its bucket, center-crops, maybe flips."""

    def __init__(self, samples, seed, flip):
        self.samples, self.seed, self.flip, self.epoch = samples, seed, flip, 0

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, h, w = self.samples[i]
        img = Image.open(path).convert("RGB")
        W, H = img.size
        scale = max(h / H, w / W)
        size = [max(h, round(H * scale)), max(w, round(W * scale))]  # [height, width]
        img = TF.resize(img, size, interpolation=InterpolationMode.BICUBIC)
        img = TF.center_crop(img, [h, w])
        # The flip decision depends only on (seed, epoch, index): the same in any worker.
        if self.flip and random.Random((self.seed * 1000003 + self.epoch) * 1000003 + i).random() < 0.5:
            img = TF.hflip(img)
        return TF.to_tensor(img) * 2 - 1


class EpochBatchSampler:
    """Yields this rank's micro-batches (lists of indices) for one epoch.

    The plan is computed identically on every rank, so all ranks run the same number of steps."""

    def __init__(self, samples, G, M, rank, world, seed):
        self.G, self.M, self.rank, self.world, self.seed, self.epoch = G, M, rank, world, seed, 0
        self.buckets = {}
        for i, (_, h, w) in enumerate(samples):
            self.buckets.setdefault((h, w), []).append(i)

    def global_batches(self):
        rng = random.Random(self.seed * 1000003 + self.epoch)
        batches = []
        for key in sorted(self.buckets):  # fixed order so the rng draws match on every rank
            members = list(self.buckets[key])
            rng.shuffle(members)
            batches += [members[s:s + self.G] for s in range(0, len(members) - self.G + 1, self.G)]
        rng.shuffle(batches)
        return batches

    def __iter__(self):
        per_rank = self.G // self.world
        for gb in self.global_batches():
            mine = gb[self.rank * per_rank:(self.rank + 1) * per_rank]
            for s in range(0, per_rank, self.M):
                yield mine[s:s + self.M]

    def __len__(self):
        return len(self.global_batches()) * (self.G // self.world // self.M)


def main():
    args = parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    G, M = args.global_batch, args.micro_batch
    if G % (world * M) != 0:
        msg = f"py_trainer: --global-batch {G} is not a multiple of world size {world} x --micro-batch {M}"
        print(msg, file=sys.stderr)
        if os.environ.get("RANK", "0") == "0":
            print(msg, flush=True)  # stdout too: torchrun --redirects 2 --tee 1 hides stderr
        sys.exit(2)
    accum = G // (world * M)

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    torch.set_num_threads(args.threads)

    samples = read_samples(args.samples)
    dataset = BucketDataset(samples, args.seed, args.flip)
    sampler = EpochBatchSampler(samples, G, M, rank, world, args.seed)
    loader_kw = dict(num_workers=args.workers, pin_memory=False, persistent_workers=False)
    if args.workers > 0:
        loader_kw.update(prefetch_factor=2, timeout=120)  # bound every wait for a batch
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, **loader_kw)

    torch.manual_seed(args.seed)
    if args.peer == "upstream":
        from upstream_peer import SanaMS as UpstreamSanaMS
        net = UpstreamSanaMS(*PRESETS[args.preset])
    else:
        net = SanaMS(*PRESETS[args.preset])
    model = torch.nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=args.eps,
                            weight_decay=args.weight_decay)
    torch.manual_seed(args.seed * 1000 + rank + 1)  # per-rank noise and timesteps

    global_step, summary = 0, []
    for epoch in range(args.epochs):
        if args.max_steps and global_step >= args.max_steps:
            break
        dataset.epoch = sampler.epoch = epoch  # workers are created anew per epoch, so they see it
        step_times, step_ends, waits, loss_sum = [], [], 0.0, 0.0
        epoch_start = time.perf_counter()
        it = iter(loader)  # starts the workers: counted as data wait of the first step
        while not (args.max_steps and global_step >= args.max_steps):
            step_start = wait_start = time.perf_counter()
            micro = []
            try:
                for _ in range(accum):
                    micro.append(next(it))
            except StopIteration:
                break  # the plan has whole steps only, so this happens on every rank at once
            waits += time.perf_counter() - wait_start

            for k, x0 in enumerate(micro):
                t = torch.sigmoid(torch.randn(x0.shape[0]))  # logit-normal(0, 1)
                noise = torch.randn_like(x0)
                tb = t[:, None, None, None]
                x_t = (1 - tb) * x0 + tb * noise
                target = noise - x0
                if k < accum - 1:
                    with model.no_sync():  # accumulate locally, all-reduce on the last one
                        loss = F.mse_loss(model(x_t, t * 1000), target) / accum
                        loss.backward()
                else:
                    loss = F.mse_loss(model(x_t, t * 1000), target) / accum
                    loss.backward()
                loss_sum += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            global_step += 1
            step_times.append(time.perf_counter() - step_start)
            step_ends.append(time.perf_counter() - epoch_start)
        del it  # shuts the workers down
        seconds = time.perf_counter() - epoch_start

        # Mean loss per step across ranks, and the data wait of the rank that waited longest
        # (a slow rank stalls all the others in the gradient all-reduce).
        total = torch.tensor([loss_sum, float(len(step_times))], dtype=torch.float64)
        dist.all_reduce(total)
        wait_max = torch.tensor([waits], dtype=torch.float64)
        dist.all_reduce(wait_max, op=dist.ReduceOp.MAX)
        waits = wait_max.item()
        steps = len(step_times)
        entry = {
            "epoch": epoch, "steps": steps, "samples": G * steps, "seconds": seconds,
            "samples_per_s": G * steps / seconds if seconds > 0 else 0.0,
            "data_wait_fraction": waits / seconds if seconds > 0 else 0.0,
            "median_step_s": statistics.median(step_times) if step_times else 0.0,
            "loss": total[0].item() / total[1].item() if total[1] > 0 else float("nan"),
            "step_times": step_times, "step_ends": step_ends,
        }
        summary.append(entry)
        if rank == 0:
            print(f"python trainer epoch {epoch}: {steps} steps, {G * steps} samples, {seconds:.2f} s, "
                  f"{entry['samples_per_s']:.2f} samples/s, data wait {100 * entry['data_wait_fraction']:.1f}%, "
                  f"median step {entry['median_step_s']:.3f} s, loss {entry['loss']:.4f}", flush=True)

    if rank == 0:
        steps = sum(e["steps"] for e in summary)
        seconds = sum(e["seconds"] for e in summary)
        print(f"python trainer done: {args.preset}, {world} processes, global batch {G}, micro-batch {M}, "
              f"{args.workers} workers, {args.threads} threads: {steps} steps, {G * steps} samples, "
              f"{seconds:.2f} s, {G * steps / seconds if seconds > 0 else 0.0:.2f} samples/s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"preset": args.preset, "world_size": world, "global_batch": G, "micro_batch": M,
                           "workers": args.workers, "threads": args.threads, "epochs": summary}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
