#!/usr/bin/env python3
"""The native Gemma-2 forward beside transformers' on the CPU, same threads, same inputs'
shapes (a benchmark: it prints figures). Gemma-2-2b's layer shapes (hidden 2304, MLP 9216,
8 heads on 4 key-value heads of 256, sliding window 4096, soft cap 50) at fewer layers and a
small vocabulary (the embedding is a lookup), random weights written by transformers.

  .venv/bin/python scripts/bench/encoders_cpu.py [--threads N] [--layers 2] [--batch 4]
                                                 [--tokens 300] [--repeats 3]
Builds bench_encoders in $SANA_BUILD_DIR (default build/). Times are medians of REPEATS
forwards after one warm-up, each side in its own process phase, alternating sides per round.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--layers", type=int, default=2)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--tokens", type=int, default=300)
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--rounds", type=int, default=2)
a = p.parse_args()
build = os.environ.get("SANA_BUILD_DIR", os.path.join(root, "build"))
subprocess.run(["cmake", "--build", build, "--target", "bench_encoders"], check=True, stdout=subprocess.DEVNULL)
torch.set_num_threads(a.threads)
torch.manual_seed(0)

with tempfile.TemporaryDirectory() as tmp:
    cfg = Gemma2Config(vocab_size=4096, num_hidden_layers=a.layers, attn_implementation="eager")
    Gemma2ForCausalLM(cfg).save_pretrained(tmp)
    ids = torch.randint(3, cfg.vocab_size, (a.batch, a.tokens))
    mask = torch.ones_like(ids)
    mask[-1, a.tokens // 2:] = 0

    def python_ms(attn):
        m = Gemma2ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation=attn).get_decoder().eval()
        times = []
        with torch.inference_mode():
            m(input_ids=ids, attention_mask=mask)
            for _ in range(a.repeats):
                t0 = time.perf_counter()
                m(input_ids=ids, attention_mask=mask).last_hidden_state.sum().item()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def native_ms():
        env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
        out = subprocess.run([os.path.join(build, "apps", "bench_encoders"), "gemma2", tmp, str(a.batch),
                              str(a.tokens), str(a.repeats)], env=env, check=True, capture_output=True, text=True)
        return float(out.stdout.strip().splitlines()[-1].split()[1])

    rows = {"sana-train (native)": [], "transformers, eager": [], "transformers, sdpa": []}
    for _ in range(a.rounds):
        rows["sana-train (native)"].append(native_ms())
        rows["transformers, eager"].append(python_ms("eager"))
        rows["transformers, sdpa"].append(python_ms("sdpa"))
    print(f"Gemma-2-2b layers x {a.layers}, batch {a.batch} x {a.tokens} tokens, fp32, {a.threads} threads, "
          f"torch {torch.__version__}: median forward ms over {a.rounds} rounds of {a.repeats}")
    ours = statistics.median(rows["sana-train (native)"])
    for name, v in rows.items():
        m = statistics.median(v)
        print(f"  {name:22s} {m:9.1f} ms   {m / ours:5.2f} x ours")
