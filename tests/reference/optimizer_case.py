"""The case file tests/unit/train/test_optim.cpp hands an optimizer's judge: tensors
"p0.<name>" (initial parameters), "g<step>.<name>" (gradients) and the C++ results, with the
config as JSON metadata. Shared by the judges that run a PyPI package's optimizer."""
import json
import sys

import torch
from safetensors import safe_open


def read(doc):
    """(tensors, config, names, params) from the file named by sys.argv[1]: `params` fresh
    leaf copies of the initial parameters, by name. Prints `doc` and exits 2 without one."""
    if len(sys.argv) != 2:
        print(doc, file=sys.stderr)
        sys.exit(2)
    with safe_open(sys.argv[1], framework="pt") as f:
        t, config = {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["config"])
    names = sorted(k[len("p0."):] for k in t if k.startswith("p0."))
    params = {n: torch.nn.Parameter(t["p0." + n].clone()) for n in names}
    return t, config, names, params
