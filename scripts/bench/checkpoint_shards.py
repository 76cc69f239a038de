#!/usr/bin/env python3
"""Checkpoint format 3 against format 2 (ckpt.format), the same model, world size and stage:
the wall time of a save and each rank's host memory around it, measured from outside.

Each format trains STEPS steps with a synchronous checkpoint every 2 steps
(ckpt.async_save false, so the loop's wait is the whole save: for format 2 rank 0 gathering
every share and writing it, for format 3 every rank writing its own and rank 0 committing
once all have). Meanwhile this script reads every worker's VmRSS from /proc every 5 ms. A
save's window is rank 0's "the loop waited X s" line and the X s before it; a rank's steady
state is its largest RSS in the 5 s before that window (training), its peak the largest in
the window. Prints the median save time per format and, per save and rank, steady state,
peak and the growth against 1/W of the checkpoint's tensor bytes + 64 MiB. A benchmark,
not a test: it prints figures.

    .venv/bin/python scripts/bench/checkpoint_shards.py [NPROC=4] [STAGE=3] [PRESET=SanaMS_100M_P2_D12] [STEPS=6]
"""
import datetime
import glob
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("SANA_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "apps", "sana-train")


def rank_of(pid):
    try:
        env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"RANK="):
            return int(item[5:])
    return None


def rss_kib(pid):
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def sample(launcher, samples, stop):
    """(time, rank, RSS KiB) of every worker of `launcher` until `stop` is set."""
    ranks = {}
    while not stop.is_set():
        try:
            children = open(f"/proc/{launcher}/task/{launcher}/children").read().split()
        except OSError:
            children = []
        now = time.time()
        for pid in map(int, children):
            if pid not in ranks:
                ranks[pid] = rank_of(pid)
            kib = rss_kib(pid)
            if ranks[pid] is not None and kib is not None:
                samples.append((now, ranks[pid], kib))
        time.sleep(0.005)


def stamp(line):
    return datetime.datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S.%f").timestamp()


def run(fmt, nproc, stage, preset, steps, work):
    data = os.path.join(ROOT, "data", "example")
    if not os.path.isdir(data):
        data = "/usr/share/backgrounds/mate"
    args = [BIN, "launch", "--nproc-per-node", str(nproc), "--", "--config", os.path.join(ROOT, "configs", "sana_tiny_cpu.yaml"),
            f"--data.data_dir=[{data}]", f"--model.model={preset}", "--train.visualize=false", "--train.log_interval=1",
            "--train.micro_batch_size=1", f"--train.global_batch_size={nproc}", "--train.ema_update=true",
            "--train.optimizer.type=AdamW", f"--train.zero_stage={stage}", f"--ckpt.format={fmt}",
            "--ckpt.async_save=false", "--ckpt.keep_last_n=1", "--train.save_model_steps=2", "--train.save_model_epochs=0",
            f"--train.max_steps={steps}", "--dist.timeout_s=600", f"--work_dir={work}"]
    samples, stop = [], threading.Event()
    with open(f"{work}.log", "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        sampler = threading.Thread(target=sample, args=(proc.pid, samples, stop))
        sampler.start()
        code = proc.wait(timeout=1800)
        stop.set()
        sampler.join()
    if code != 0:
        sys.exit(f"format {fmt}: the run exited {code}; see {work}.log")
    saves = []
    for line in open(os.path.join(work, "train.log")):
        m = re.search(r"checkpoint (step_\d+) \(.*\): the loop waited ([0-9.]+) s", line)
        if m:
            end = stamp(line)
            saves.append((m.group(1), end - float(m.group(2)), end, float(m.group(2))))
    return saves, samples


def checkpoint_bytes(work):
    """Tensor bytes of the newest checkpoint (format 3's index, or format 2's files)."""
    latest = os.path.join(work, "checkpoints", open(os.path.join(work, "checkpoints", "latest")).read().strip())
    index = os.path.join(latest, "index.json")
    if os.path.exists(index):
        return sum(e["bytes"] for part in json.load(open(index))["parts"].values() for e in part)
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(latest, "*.safetensors")))


def main():
    nproc = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    stage = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    preset = sys.argv[3] if len(sys.argv) > 3 else "SanaMS_100M_P2_D12"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 6
    subprocess.run(["cmake", "--build", BUILD, "--target", "sana-train"], check=True, stdout=subprocess.DEVNULL)
    tmp = tempfile.mkdtemp(prefix="sana-bench-shards-")
    medians = {}
    print(f"{preset}, {nproc} processes, train.zero_stage {stage}, AdamW + EMA, a synchronous checkpoint every 2 of "
          f"{steps} steps (machine: {os.cpu_count()} cores)")
    for fmt in (2, 3):
        work = os.path.join(tmp, f"format{fmt}")
        saves, samples = run(fmt, nproc, stage, preset, steps, work)
        total = checkpoint_bytes(work)
        allowed = total / nproc + (64 << 20)
        medians[fmt] = statistics.median(s[3] for s in saves)
        print(f"format {fmt}: checkpoint {total / 2**20:.0f} MiB of tensors; save wall time (rank 0's loop wait) "
              f"{', '.join(f'{s[3]:.2f}' for s in saves)} s, median {medians[fmt]:.2f} s")
        for name, start, end, _ in saves:
            for r in range(nproc):
                steady = max((k for t, rr, k in samples if rr == r and start - 5 <= t < start), default=0) * 1024
                peak = max((k for t, rr, k in samples if rr == r and start <= t <= end), default=0) * 1024
                verdict = "within" if peak - steady <= allowed else "ABOVE"
                print(f"  {name} rank {r}: steady {steady / 2**20:.0f} MiB, peak during the save {peak / 2**20:.0f} MiB, "
                      f"{(peak - steady) / 2**20:+.0f} MiB ({verdict} 1/W of the checkpoint + 64 MiB = "
                      f"{allowed / 2**20:.0f} MiB)")
    print(f"save wall time, format 3 / format 2: {medians[3] / medians[2]:.2f}")
    subprocess.run(["rm", "-rf", tmp])


if __name__ == "__main__":
    main()
