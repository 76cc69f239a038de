#!/usr/bin/env python3
"""Whether a run that was stopped and resumed (perhaps on other process counts) trained each
epoch's samples as an uninterrupted run did, each once.

Usage: same_samples.py ROOT REFERENCE RESUMED
Reads ROOT/REFERENCE/ids.rank*.log and ROOT/RESUMED/ids.rank*.log (SANA_TEST_LOG_IDS: one line
per micro-batch, "epoch step id..."); prints one line, and a line per epoch that differs;
exits 1 unless every epoch has the reference's samples, none twice, over at least 2 epochs."""
import collections
import glob
import sys


def epochs(path):
    seen = collections.defaultdict(list)
    for f in glob.glob(f"{path}/ids.rank*.log"):
        for line in open(f):
            e, s, *ids = map(int, line.split())
            seen[e] += ids
    return seen


root, ref_run, chain_run = sys.argv[1:4]
ref, chain = epochs(f"{root}/{ref_run}"), epochs(f"{root}/{chain_run}")
ok = sorted(ref) == sorted(chain) and len(ref) >= 2
for e in sorted(ref):
    c = collections.Counter(chain[e])
    twice = sum(1 for n in c.values() if n > 1)
    same = sorted(c) == sorted(ref[e])
    if not same or twice:
        print(f"epoch {e + 1}: {len(c)} samples, {twice} twice, {'the' if same else 'NOT the'} uninterrupted run's")
    ok = ok and same and twice == 0
print(f"{len(ref)} epochs, {sum(len(v) for v in chain.values())} samples: "
      + ("each epoch the uninterrupted run's samples, none twice" if ok else "NOT as the uninterrupted run"))
sys.exit(0 if ok else 1)
