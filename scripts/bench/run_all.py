#!/usr/bin/env python3
"""The benchmark suite behind the README's "Performance" table (scripts/bench/run_all.sh).

Every row is the median of RUNS runs (with min and max), the trainer and its reference
alternating run by run so that drift on the machine hits both alike:
  compute    sana-train vs an independent PyTorch DDP trainer (py_trainer.py --peer upstream:
             the model built from upstream's own classes, upstream_peer.py) of the same
             model, batch and threads on small 64x64 PNGs (one bucket), one process on one
             core and on all, and one process per core: samples/s from the median per-step
             wall time (differences of consecutive step ends) after 2 warm-up steps, our
             overhead (the step minus forward+backward, all-reduce and optimizer) and
             achieved training FLOP/s per core
  e2e        the same two trainers on real photos in multi-scale buckets (the example
             wallpapers), epoch 1 and epochs >= 2; ours with and without data.cache memory
  decode, allreduce, index, checkpoint, faults   the other benchmarks' reports, verbatim
             (decode rates vs torchvision; check-dist's all-reduce vs raw c10d Gloo; the
             index at 10M rows vs Python; checkpoint blocking, write rate vs dd, resume;
             fault trials: kill -9 and others to the last process's exit)
Writes OUT/results.json and OUT/results.md and prints the markdown.
  .venv/bin/python scripts/bench/run_all.py [--quick] [--out DIR] [--only compute,e2e,...] [--runs N]
      [--presets SanaMS_tiny_P2_D4] [--rows 1x1,1x2]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BUILD = os.environ.get("SANA_BUILD_DIR", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "apps", "sana-train")
PY = sys.executable
CORES = os.cpu_count() or 1


def run(cmd, cwd=None, env=None, timeout=900):
    """Runs cmd; returns its output (stdout and stderr); raises with the tail on failure."""
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])}... exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def free_port():
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "runs": values}


def torchrun(world, script_args, threads):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    return run([PY, "-m", "torch.distributed.run", "--redirects", "2", "--tee", "1", "--log_dir", tempfile.mkdtemp(),
                "--nproc_per_node", str(world), "--master_port", str(free_port()),
                os.path.join(ROOT, "scripts", "bench", "py_trainer.py")] + script_args, env=env)


def trainer(world, work, overrides):
    run([BIN, "launch", "--nproc-per-node", str(world), "--", "--config", os.path.join(work, "bench.yaml"),
         f"--work_dir={work}/out"] + overrides, env=dict(os.environ, SANA_NO_PROGRESS="1"))
    return [json.loads(line) for line in open(os.path.join(work, "out", "metrics.jsonl"))]


BASE_YAML = """data: {{data_dir: [{data}], image_size: {size}, aspect_ratio_type: generated, bucket_step: 8,
       random_flip: true, tail: pad}}
model: {{model: {preset}, image_size: {size}, mixed_precision: fp32, multi_scale: {multi}, class_dropout_prob: 0.0}}
vae: {{vae_type: none}}
text_encoder: {{text_encoder_name: none}}
train: {{seed: 1, num_epochs: {epochs}, max_steps: {steps}, global_batch_size: {G}, micro_batch_size: {M},
        num_workers: 2, gradient_clip: 1.0, optimizer: {{type: AdamW, lr: 1.0e-3, weight_decay: 0.0, eps: [1.0e-8]}},
        auto_lr: none, lr_schedule: constant, log_interval: 1000, visualize: false,
        save_model_steps: 0, save_model_epochs: 0}}
dist: {{backend: gloo, device: cpu, timeout_s: 300}}
"""


def train_gflop(work, size):
    """Training GFLOP per sample at size x size, from `sana-train model`."""
    out = run([BIN, "model", "--config", os.path.join(work, "bench.yaml")])
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[1] == f"{size}x{size}":
            return float(parts[4])
    raise RuntimeError("no FLOP figure for %dx%d in:\n%s" % (size, size, out))


def step_seconds(ends, warmup=2):
    """Per-step wall time from the clock at each step's end (time_s): the differences of
    consecutive ends, the first `warmup` steps left out."""
    return [b - a for a, b in zip(ends[warmup - 1:], ends[warmup:])]


def compute_rows():
    """(processes, threads per process) of the compute rows: one process on one core and on
    all cores, and one process per core."""
    return list(dict.fromkeys(((1, 1), (1, CORES), (CORES, 1))))  # one row on a 1-core machine


def compute_bound(quick, runs, presets=None, only_rows=None):
    from PIL import Image
    import numpy as np
    work = tempfile.mkdtemp(prefix="sana-bench-compute-")
    os.makedirs(f"{work}/img")
    rng = np.random.default_rng(0)
    with open(f"{work}/samples.tsv", "w") as tsv:
        for i in range(256):
            path = f"{work}/img/{i:04d}.png"
            Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(path)
            tsv.write(f"{path}\t64\t64\n")
    rows = []
    G, M = 16, 8
    for preset, steps in (("SanaMS_tiny_P2_D4", 10 if quick else 16), ("SanaMS_small_P2_D8", 6 if quick else 10)):
        if presets and preset not in presets:
            continue
        for world, threads in compute_rows():
            if only_rows and f"{world}x{threads}" not in only_rows:
                continue
            with open(f"{work}/bench.yaml", "w") as f:
                f.write(BASE_YAML.format(data=f"{work}/img", size=64, preset=preset, multi="false", epochs=1,
                                         steps=steps, G=G, M=M))
            gflop = train_gflop(work, 64)
            ours, theirs, overhead = [], [], []
            for _ in range(runs):
                steps_json = trainer(world, work, [f"--dist.threads_per_process={threads}"])
                ours.append(G / statistics.median(step_seconds([s["time_s"] for s in steps_json])))
                busy = [s["time"]["forward_backward"] + s["time"]["allreduce"] + s["time"]["optimizer"]
                        for s in steps_json[2:]]
                overhead.append(statistics.median((s["time"]["total"] - b) / s["time"]["total"]
                                                  for s, b in zip(steps_json[2:], busy)))
                out = f"{work}/py.json"
                torchrun(world, ["--samples", f"{work}/samples.tsv", "--preset", preset, "--peer", "upstream",
                                 "--global-batch", str(G), "--micro-batch", str(M), "--epochs", "1", "--max-steps",
                                 str(steps), "--workers", "0", "--threads", str(threads), "--flip", "--json", out],
                         threads)
                theirs.append(G / statistics.median(step_seconds(json.load(open(out))["epochs"][0]["step_ends"])))
            row = {"row": "compute", "preset": preset, "world": world, "threads": threads, "global_batch": G,
                   "peer": "upstream_peer.py", "ours": summary(ours), "python": summary(theirs),
                   "overhead": summary(overhead), "gflop_per_sample": gflop}
            row["ratio"] = row["ours"]["median"] / row["python"]["median"]
            row["gflops_per_core"] = gflop * row["ours"]["median"] / (world * threads)
            print(f"compute {preset} {world}x{threads}: ours {row['ours']['median']:.2f} python "
                  f"{row['python']['median']:.2f} samples/s, ratio {row['ratio']:.3f}", flush=True)
            rows.append(row)
    return rows


def e2e_data(work):
    """Real photos: the example wallpapers (scripts/prepare_example_data.sh), each listed
    `copies` times (symlinks) so an epoch has enough steps to time."""
    src = os.path.join(ROOT, "data", "example")
    run(["bash", os.path.join(ROOT, "scripts", "prepare_example_data.sh"), src])
    photos = sorted(os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs if f.endswith((".jpg", ".png")))
    for c in range(4):
        os.makedirs(f"{work}/photos/copy{c}")
        for p in photos:
            os.symlink(p, f"{work}/photos/copy{c}/{os.path.basename(p)}")
    return f"{work}/photos", len(photos) * 4


def end_to_end(quick, runs):
    work = tempfile.mkdtemp(prefix="sana-bench-e2e-")
    data, count = e2e_data(work)
    G, M, epochs, world = 8, 4, 3, 2
    with open(f"{work}/bench.yaml", "w") as f:
        f.write(BASE_YAML.format(data=data, size=32, preset="SanaMS_tiny_P2_D4", multi="true", epochs=epochs,
                                 steps=0, G=G, M=M))
    # The Python peer trains the same samples at the same bucket sizes: ours, from the index.
    lines = run([BIN, "plan", "--config", f"{work}/bench.yaml", f"--work_dir={work}/out", "--samples"]).splitlines()
    with open(f"{work}/samples.tsv", "w") as f:
        for line in lines:
            parts = line.split("\t")
            if len(parts) == 4 and not line.startswith("#"):
                f.write("\t".join(parts[1:]) + "\n")
    results = {"none": ([], []), "memory": ([], []), "python": ([], [])}
    waits = {"none": [], "memory": []}
    for _ in range(runs):
        for cache in ("none", "memory"):
            steps = trainer(world, work, [f"--data.cache={cache}"])
            first = [s for s in steps if s["epoch"] == 1]
            later = [s for s in steps if s["epoch"] >= 2]
            t1 = first[-1]["time_s"]
            results[cache][0].append(G * len(first) / t1)
            results[cache][1].append(G * len(later) / (later[-1]["time_s"] - t1))
            waits[cache].append(sum(s["time"]["data"] for s in later) / sum(s["time"]["total"] for s in later))
        out = f"{work}/py.json"
        torchrun(world, ["--samples", f"{work}/samples.tsv", "--global-batch", str(G), "--micro-batch", str(M),
                         "--epochs", str(epochs), "--workers", "1", "--flip", "--json", out], 1)
        ep = json.load(open(out))["epochs"]
        results["python"][0].append(ep[0]["samples_per_s"])
        results["python"][1].append(sum(e["samples"] for e in ep[1:]) / sum(e["seconds"] for e in ep[1:]))
    rows = []
    for name, label in (("epoch 1", 0), ("epochs >= 2", 1)):
        row = {"row": "e2e", "epochs": name, "samples": count, "global_batch": G, "world": world,
               "ours": summary(results["none"][label]), "ours_cache": summary(results["memory"][label]),
               "python": summary(results["python"][label])}
        row["ratio"] = row["ours"]["median"] / row["python"]["median"]
        row["ratio_cache"] = row["ours_cache"]["median"] / row["python"]["median"]
        if label == 1:
            row["data_wait"] = {k: summary(v) for k, v in waits.items()}
        print(f"e2e {name}: ours {row['ours']['median']:.1f}, with cache {row['ours_cache']['median']:.1f}, "
              f"python {row['python']['median']:.1f} samples/s", flush=True)
        rows.append(row)
    return rows


def scripts(quick):
    """The other benchmarks' own reports, verbatim."""
    out = {}
    jobs = {"decode": ["bash", "scripts/bench/decode.sh", "/usr/share/backgrounds/mate", "3" if quick else "5"],
            "allreduce": ["bash", "scripts/bench/allreduce.sh", "2", "5"],
            "index": ["bash", "scripts/bench/index.sh", "1000000" if quick else "10000000"],
            "checkpoint": ["bash", "scripts/bench/checkpoint.sh", "SanaMS_small_P2_D8" if quick else "SanaMS_100M_P2_D12"],
            "faults": ["bash", "scripts/fault_trials.sh", "3" if quick else "10"]}
    for name, cmd in jobs.items():
        start = time.time()
        try:
            out[name] = {"output": run(cmd, cwd=ROOT, timeout=1800), "seconds": time.time() - start, "command": cmd}
        except Exception as e:  # a missing tool or data: the table says so instead of stopping
            out[name] = {"output": f"failed: {e}", "seconds": time.time() - start, "command": cmd}
        print(f"{name}: {out[name]['seconds']:.0f} s", flush=True)
    return out


def fmt(s, digits=1):
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"


def markdown(res):
    lines = [f"Machine: {res['machine']}; {res['runs']} runs per row, median (min-max).", ""]

    def table(kind, header, row_lines):
        rows = [r for r in res["rows"] if r["row"] == kind]
        if rows:
            lines.extend(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)])
            for r in rows:
                lines.extend(row_lines(r))
            lines.append("")

    table("compute", ["compute-bound, 64x64, global batch 16", "processes x threads", "sana-train samples/s",
                      "PyTorch DDP samples/s (upstream's classes)", "ratio", "our overhead", "GFLOP/s per core"],
          lambda r: [f"| {r['preset']} | {r['world']} x {r['threads']} | {fmt(r['ours'], 2)} | "
                     f"{fmt(r['python'], 2)} | {r['ratio']:.2f} | {100 * r['overhead']['median']:.1f}% | "
                     f"{r['gflops_per_core']:.1f} |"])

    def e2e_lines(r):
        out = [f"| {r['epochs']} ({r['samples']} samples, batch {r['global_batch']}) | {fmt(r['ours'])} | "
               f"{fmt(r['ours_cache'])} | {fmt(r['python'])} | {r['ratio']:.2f} ({r['ratio_cache']:.2f}) |"]
        if "data_wait" in r:
            w = r["data_wait"]
            out.append(f"| data wait, epochs >= 2 | {100 * w['none']['median']:.0f}% | "
                       f"{100 * w['memory']['median']:.0f}% | | |")
        return out

    table("e2e", ["real photos, multi-scale, 2 processes", "sana-train", "sana-train, data.cache memory",
                  "PyTorch + DataLoader (1 worker per rank)", "ratio (cache)"], e2e_lines)
    for name, s in res.get("scripts", {}).items():
        lines += [f"{name} (`{' '.join(s['command'])}`, {s['seconds']:.0f} s):", "```", s["output"].strip(), "```", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter runs (compute rows about 19 minutes at --runs 3)")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "bench"))
    ap.add_argument("--only", default="compute,e2e,scripts")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--presets", help="compute rows of these presets only (comma-separated)")
    ap.add_argument("--rows", help="compute rows of these processes x threads only, e.g. 1x2,2x1")
    a = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"run_all: {BIN} is missing: build first (scripts/build.sh)")
    os.makedirs(a.out, exist_ok=True)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    res = {"machine": f"{cpu}, {CORES} cores", "runs": a.runs, "quick": a.quick, "rows": []}
    only = a.only.split(",")
    start = time.time()
    if "compute" in only:
        res["rows"] += compute_bound(a.quick, a.runs, a.presets and a.presets.split(","), a.rows and a.rows.split(","))
    if "e2e" in only:
        res["rows"] += end_to_end(a.quick, a.runs)
    if "scripts" in only:
        res["scripts"] = scripts(a.quick)
    res["seconds"] = time.time() - start
    json.dump(res, open(os.path.join(a.out, "results.json"), "w"), indent=1)
    md = markdown(res)
    open(os.path.join(a.out, "results.md"), "w").write(md + "\n")
    print(md)
    print(f"\n{res['seconds']:.0f} s; {a.out}/results.json, results.md")


if __name__ == "__main__":
    main()
