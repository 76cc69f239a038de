#!/usr/bin/env python3
"""The native encoders beside the Python packages' on the CPU, same threads, same inputs'
shapes (a benchmark: it prints figures), with random weights the package writes.
  --model gemma2: Gemma-2's forward against transformers' (eager and sdpa attention), at
      Gemma-2-2b's layer shapes (hidden 2304, MLP 9216, 8 heads on 4 key-value heads of 256,
      sliding window 4096, soft cap 50) with fewer layers and a small vocabulary (the
      embedding is a lookup);
  --model dc-ae: DC-AE's encode and decode against diffusers' AutoencoderDC, at the released
      f32c32 config (tests/configs/released/mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers).

  .venv/bin/python scripts/bench/encoders_cpu.py [--model gemma2|dc-ae] [--threads N]
      [--layers 2] [--batch 4] [--tokens 300] [--size 256] [--repeats 3] [--rounds 2]
Builds bench_encoders in $SANA_BUILD_DIR (default build/). Times are medians of REPEATS
calls after one warm-up, each side in its own process phase, alternating sides per round;
"load" is reading the folder into fp32 weights (from_pretrained in Python), once a round.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time

import torch

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
p = argparse.ArgumentParser()
p.add_argument("--model", choices=["gemma2", "dc-ae"], default="gemma2")
p.add_argument("--threads", type=int, default=os.cpu_count())
p.add_argument("--layers", type=int, default=2, help="gemma2: decoder layers")
p.add_argument("--batch", type=int, default=None, help="rows (gemma2, default 4) or images (dc-ae, default 1)")
p.add_argument("--tokens", type=int, default=300, help="gemma2: tokens per row")
p.add_argument("--size", type=int, default=256, help="dc-ae: image side in pixels")
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--rounds", type=int, default=2)
a = p.parse_args()
batch = a.batch or (4 if a.model == "gemma2" else 1)
build = os.environ.get("SANA_BUILD_DIR", os.path.join(root, "build"))
subprocess.run(["cmake", "--build", build, "--target", "bench_encoders"], check=True, stdout=subprocess.DEVNULL)
torch.set_num_threads(a.threads)
torch.manual_seed(0)


def timed(f):
    with torch.inference_mode():
        f()
        times = []
        for _ in range(a.repeats):
            t0 = time.perf_counter()
            f().sum().item()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def native(folder, size):
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    out = subprocess.run([os.path.join(build, "apps", "bench_encoders"), a.model, folder, str(batch), str(size),
                          str(a.repeats)], env=env, check=True, capture_output=True, text=True)
    words = out.stdout.strip().splitlines()[-1].split()
    if a.model == "gemma2":
        return {"forward": float(words[1]), "load": float(words[4])}
    return {"encode": float(words[2]), "decode": float(words[5]), "load": float(words[8])}


with tempfile.TemporaryDirectory() as tmp:
    rows = {}
    if a.model == "gemma2":
        from transformers import Gemma2Config, Gemma2ForCausalLM
        cfg = Gemma2Config(vocab_size=4096, num_hidden_layers=a.layers, attn_implementation="eager")
        Gemma2ForCausalLM(cfg).save_pretrained(tmp)
        ids = torch.randint(3, cfg.vocab_size, (batch, a.tokens))
        mask = torch.ones_like(ids)
        mask[-1, a.tokens // 2:] = 0

        def python(attn):
            t0 = time.perf_counter()
            m = Gemma2ForCausalLM.from_pretrained(tmp, dtype=torch.float32, attn_implementation=attn).get_decoder().eval()
            load = (time.perf_counter() - t0) * 1e3
            return {"forward": timed(lambda: m(input_ids=ids, attention_mask=mask).last_hidden_state), "load": load}

        sides = {"sana-train (native)": lambda: native(tmp, a.tokens), "transformers, eager": lambda: python("eager"),
                 "transformers, sdpa": lambda: python("sdpa")}
        title = (f"Gemma-2-2b layers x {a.layers}, batch {batch} x {a.tokens} tokens")
    else:
        from diffusers import AutoencoderDC
        released = os.path.join(root, "tests/configs/released/mit-han-lab--dc-ae-f32c32-sana-1.1-diffusers/config.json")
        AutoencoderDC.from_config(json.load(open(released))).save_pretrained(tmp)
        images = torch.rand(batch, 3, a.size, a.size) * 2 - 1

        def python():
            t0 = time.perf_counter()
            vae = AutoencoderDC.from_pretrained(tmp, dtype=torch.float32).eval()
            load = (time.perf_counter() - t0) * 1e3
            with torch.inference_mode():
                latents = vae.encode(images).latent
            return {"encode": timed(lambda: vae.encode(images).latent), "decode": timed(lambda: vae.decode(latents).sample),
                    "load": load}

        sides = {"sana-train (native)": lambda: native(tmp, a.size), "diffusers": python}
        title = f"DC-AE f32c32 (released config, 312 M parameters), {batch} x {a.size} x {a.size} images"
    for _ in range(a.rounds):
        for name, run in sides.items():
            for phase, ms in run().items():
                rows.setdefault(phase, {}).setdefault(name, []).append(ms)
    print(f"{title}, fp32, {a.threads} threads, torch {torch.__version__}: median ms over {a.rounds} rounds of "
          f"{a.repeats}")
    for phase, by_side in rows.items():
        ours = statistics.median(by_side["sana-train (native)"])
        for name, v in by_side.items():
            m = statistics.median(v)
            print(f"  {phase:8s} {name:22s} {m:9.1f} ms   {m / ours:5.2f} x ours")
