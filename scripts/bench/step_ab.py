"""Two sana-train binaries side by side on the compute-bound rows of run_all.py: the same
config (64x64 noise PNGs, one bucket, global batch 16, micro-batch 8, AdamW, fp32, Gloo on
the CPU), run after run alternating A and B so that the machine's drift falls on both.
Prints samples/s per row (16 / the median step time, from consecutive step ends after 2
warm-up steps) as median (min-max) over the runs, and B / A. A benchmark: it prints figures.
  .venv/bin/python scripts/bench/step_ab.py A_BIN B_BIN [--runs 5] [--rows 1x1,2x1]
      [--preset SanaMS_tiny_P2_D4] [--steps 16] [--optimizer AdamW]
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import run_all  # noqa: E402  (its trainer config and timing rule)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", default="1x1,2x1", help="processes x threads per process")
    ap.add_argument("--preset", default="SanaMS_tiny_P2_D4")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--optimizer", default="AdamW")
    args = ap.parse_args()
    from PIL import Image
    import numpy as np
    work = tempfile.mkdtemp(prefix="sana-bench-ab-")
    os.makedirs(f"{work}/img")
    rng = np.random.default_rng(0)
    for i in range(256):
        Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(f"{work}/img/{i:04d}.png")
    with open(f"{work}/bench.yaml", "w") as f:
        f.write(run_all.BASE_YAML.format(data=f"{work}/img", size=64, preset=args.preset, multi="false", epochs=1,
                                         steps=args.steps, G=16, M=8).replace("type: AdamW", f"type: {args.optimizer}")
                .replace(", eps: [1.0e-8]", ", eps: [1.0e-8]" if args.optimizer == "AdamW" else ""))
    print(f"{args.preset}, {args.optimizer}, {args.steps} steps a run, {args.runs} runs each, A={args.a} B={args.b}")
    print("| processes x threads | A samples/s | B samples/s | B / A |")
    print("|---|---|---|---|")
    for row in args.rows.split(","):
        world, threads = (int(x) for x in row.split("x"))
        got = {"a": [], "b": []}
        for _ in range(args.runs):
            for side in ("a", "b"):
                run_all.BIN = getattr(args, side)
                steps = run_all.trainer(world, work, [f"--dist.threads_per_process={threads}"])
                got[side].append(16 / statistics.median(run_all.step_seconds([s["time_s"] for s in steps])))
        a, b = (run_all.summary(got[s]) for s in ("a", "b"))
        print(f"| {world} x {threads} | {a['median']:.2f} ({a['min']:.2f}-{a['max']:.2f}) | {b['median']:.2f} "
              f"({b['min']:.2f}-{b['max']:.2f}) | {b['median'] / a['median']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
