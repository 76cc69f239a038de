#!/usr/bin/env python3
"""Re-saves a safetensors file as Python would save a training checkpoint.

Default: a DDP-style checkpoint,
  torch.save({"state_dict": {"module." + name: tensor}, "step": 7}, OUT).
--upstream: as NVlabs/Sana's save_checkpoint writes one: the model's state dict (with the
persistent `pos_embed` buffer upstream's Sana registers, zeros of 1 x patches x hidden),
the EMA's state dict beside it, the optimizer's and the position,
  torch.save({"state_dict": ..., "state_dict_ema": ..., "optimizer": ..., "epoch": 1,
              "step": 7}, OUT).

Usage: resave_with_torch.py [--upstream] IN.safetensors OUT.pt
"""
import json
import struct
import sys

import numpy as np
import torch


def read(src):
    data = open(src, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"F32": np.float32, "F64": np.float64}
    state = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + start:8 + n + end], dtype=kinds[info["dtype"]])
        state[name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    return state


def main():
    args = sys.argv[1:]
    upstream = args[0] == "--upstream"
    src, dst = args[-2], args[-1]
    state = read(src)
    if not upstream:
        torch.save({"state_dict": {"module." + k: v for k, v in state.items()}, "step": 7}, dst)
        return 0
    hidden = state["x_embedder.proj.weight"].shape[0]
    model = dict(state)
    model["pos_embed"] = torch.zeros(1, 16, hidden)
    ema = {k: v.clone() for k, v in model.items()}
    torch.save({"state_dict": model, "state_dict_ema": ema, "optimizer": {"state": {}, "param_groups": []},
                "epoch": 1, "step": 7}, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
