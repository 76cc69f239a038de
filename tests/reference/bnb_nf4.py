#!/usr/bin/env python3
"""bitsandbytes itself as the judge of our NF4 frozen base (model/frozen_storage.h): the pinned
package's quantize_4bit / dequantize_4bit (quant_type nf4, blocksize 64), on the CPU, on the
weights the case holds, against what our store_weight / restore_weight made of them.

Without double quantisation (compress_statistics False), everything is bitwise: the packed
codes, the fp32 absmax of each block, and the weight dequantize_4bit restores, in fp32 and in
bf16 (the two dtypes a stored layer computes in).

With it (bnb_4bit_use_double_quant), the codes, the offset (the absmax values' mean) and the
nested absmax of each block of 256 are bitwise. The absmax values' own uint8 codes are bitwise
those of bitsandbytes' reference backend (its pure-torch quantize_blockwise, which rounds to the
nearest value of the map as its CUDA kernel does). Its native CPU kernel rounds through a table
of 65536 bins over [-1, 1], so a few codes there differ: each such code of ours is at least as
near the value as the native one, and the script prints how many there are. Restoring, our
weight is dequantize_4bit's on a QuantState that holds our tensors, bitwise.

Usage: bnb_nf4.py CASE.safetensors
The case holds, per weight NAME: "w.NAME" (fp32), and for each of "nf4" and "dq" (double
quantised): "<kind>.NAME.codes", ".absmax", ".restored" (fp32), ".restored_bf16", and for "dq"
also ".nested_absmax" and ".offset". Prints a line per check; exits 1 on a failed one."""
import sys

import bitsandbytes.functional as F
import torch
from safetensors.torch import load_file


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    t = load_file(sys.argv[1])
    names = sorted(k[2:] for k in t if k.startswith("w."))
    failed = []

    def same(what, ours, theirs):
        ok = ours.dtype == theirs.dtype and ours.shape == theirs.shape and torch.equal(ours, theirs)
        detail = "" if ok else f" (ours {ours.dtype} {tuple(ours.shape)}, theirs {theirs.dtype} {tuple(theirs.shape)}"
        if not ok and ours.shape == theirs.shape:
            detail += f", {int((ours != theirs).sum())} differ"
        print(f"{'' if ok else 'MISMATCH '}{what}: {'bitwise equal' if ok else 'differs' + detail + ')'}")
        if not ok:
            failed.append(what)

    reference = torch.ops.bitsandbytes.quantize_blockwise.default
    composite = torch._C.DispatchKeySet(torch._C.DispatchKey.CompositeExplicitAutograd)
    for n in names:
        w = t["w." + n]
        q, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
        same(f"{n} nf4 codes", t[f"nf4.{n}.codes"], q.flatten())
        same(f"{n} nf4 absmax", t[f"nf4.{n}.absmax"], state.absmax)
        same(f"{n} nf4 restored fp32", t[f"nf4.{n}.restored"], F.dequantize_4bit(q, state))
        state.dtype = torch.bfloat16
        same(f"{n} nf4 restored bf16", t[f"nf4.{n}.restored_bf16"], F.dequantize_4bit(q, state))

        q, state = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=True)
        assert state.nested and state.state2.blocksize == 256
        same(f"{n} nf4-dq codes", t[f"dq.{n}.codes"], q.flatten())
        same(f"{n} nf4-dq offset", t[f"dq.{n}.offset"], state.offset.reshape(1))
        same(f"{n} nf4-dq nested absmax", t[f"dq.{n}.nested_absmax"], state.state2.absmax)
        # The absmax values' codes: bitsandbytes' reference backend, and its native CPU kernel.
        _, plain = F.quantize_4bit(w, blocksize=64, quant_type="nf4", compress_statistics=False)
        centred = plain.absmax - state.offset
        codes, _ = reference.redispatch(composite, centred, state.state2.code, 256)
        ours = t[f"dq.{n}.absmax"]
        same(f"{n} nf4-dq absmax codes (reference backend)", ours, codes)
        native = state.absmax
        differ = ours != native
        scaled = centred.double() / state.state2.absmax.double().repeat_interleave(256)[: centred.numel()]
        code = state.state2.code.double()
        nearer = ((scaled - code[ours.long()]).abs() <= (scaled - code[native.long()]).abs() + 1e-6) | ~differ
        print(f"{n} nf4-dq absmax codes (native CPU kernel): {int(differ.sum())} of {ours.numel()} differ, "
              f"ours the nearer at each: {bool(nearer.all())}")
        if not nearer.all():
            failed.append(f"{n} nf4-dq absmax codes against the native kernel")
        state.absmax = ours.clone()
        same(f"{n} nf4-dq restored fp32 (our state)", t[f"dq.{n}.restored"], F.dequantize_4bit(q, state))
        state.dtype = torch.bfloat16
        same(f"{n} nf4-dq restored bf16 (our state)", t[f"dq.{n}.restored_bf16"], F.dequantize_4bit(q, state))
    if failed:
        print(f"{len(failed)} checks failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
