#!/usr/bin/env python3
"""Compares loss curves of runs in one folder: each run's loss averaged over windows of W
steps, the mean absolute gap of every run to the first, the gap of the yardstick run (the
first's config with another seed: run-to-run noise) to the first, each gap's ratio to it,
and a text plot.
  loss_curves.py WORK W REFERENCE:LABEL YARDSTICK:LABEL OTHER:LABEL [OTHER:LABEL ...]
Each NAME is WORK/NAME/metrics.jsonl (one line per step with "step" and "loss").
"""
import json
import sys


def losses(work, name):
    out = {}
    for line in open(f"{work}/{name}/metrics.jsonl"):
        r = json.loads(line)
        if "loss" in r and "step" in r:
            out[r["step"]] = r["loss"]
    return [out[k] for k in sorted(out)]


def main():
    if len(sys.argv) < 6:
        print(__doc__, file=sys.stderr)
        return 2
    work, w = sys.argv[1], int(sys.argv[2])
    runs = [tuple(a.split(":", 1)) for a in sys.argv[3:]]
    curves = {name: losses(work, name) for name, _ in runs}
    n = min(len(v) for v in curves.values())
    win = {k: [sum(v[i:i + w]) / len(v[i:i + w]) for i in range(0, n, w)] for k, v in curves.items()}
    names = [name for name, _ in runs]
    labels = dict(runs)
    print("steps     " + "".join(f"{labels[k]:>14}" for k in names))
    for i in range(len(win[names[0]])):
        print(f"{i * w + 1:4d}-{min(n, (i + 1) * w):<4d}" + "".join(f"{win[k][i]:14.4f}" for k in names))
    ref, yard = names[0], names[1]
    gap = {k: sum(abs(a - b) for a, b in zip(win[ref], win[k])) / len(win[ref]) for k in names[1:]}
    for k in names[2:]:
        print(f"mean |{labels[k]} - {labels[ref]}| over {w}-step windows: {gap[k]:.4f} "
              f"({gap[k] / gap[yard]:.2f} x the seed noise)")
    print(f"mean |{labels[yard]} - {labels[ref]}| (seed noise): {gap[yard]:.4f}; last window: "
          + ", ".join(f"{labels[k]} {win[k][-1]:.4f}" for k in names))
    marks = ".ox+*#"
    lo = min(min(v) for v in win.values())
    hi = max(max(v) for v in win.values())
    print("plot (" + ", ".join(f"{marks[i % len(marks)]} {labels[k]}" for i, k in enumerate([yard, ref] + names[2:]))
          + "; loss down the page is lower):")
    rows = 12
    for r in range(rows):
        level = hi - (hi - lo) * r / (rows - 1)
        line = ""
        for i in range(len(win[ref])):
            cell = " "
            for j, key in enumerate([yard, ref] + names[2:]):
                if abs(win[key][i] - level) <= (hi - lo) / (2 * (rows - 1)):
                    cell = marks[j % len(marks)]
            line += cell + " "
        print(f"{level:7.4f} |{line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
