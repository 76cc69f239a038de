#!/usr/bin/python3
"""Re-saves a safetensors file as Python would save a training checkpoint:
torch.save({"state_dict": {"module." + name: tensor}, "step": 7}, OUT).

Usage: resave_with_torch.py IN.safetensors OUT.pt
"""
import json
import struct
import sys

import numpy as np
import torch


def main():
    src, dst = sys.argv[1], sys.argv[2]
    data = open(src, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    kinds = {"F32": np.float32, "F64": np.float64}
    state = {}
    for name, info in header.items():
        start, end = info["data_offsets"]
        arr = np.frombuffer(data[8 + n + start:8 + n + end], dtype=kinds[info["dtype"]])
        state["module." + name] = torch.from_numpy(arr.reshape(info["shape"]).copy())
    torch.save({"state_dict": state, "step": 7}, dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
