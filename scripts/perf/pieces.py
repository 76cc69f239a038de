"""The block-level pieces of the 1.6B step, measured with the machine's PyTorch while
sana-train builds (scripts/gpu_perf.sh): what the hardware allows and what each change of
issue 63 buys, on the shapes of SanaMS_1600M_P1_D20 at 1024 px (hidden 2240, 20 heads of
112, 1024 image tokens, 300 caption tokens, GLUMBConv width 11200).

    python3 scripts/perf/pieces.py OUT.json [--micro 16] [--shapes MODEL.json] [--small]

Each piece is one JSON object in OUT.json's "pieces" list: name, what it measures, and
milliseconds (per call, the median of timed repeats after a warm-up) or a rate. --small
runs the same pieces at a tenth of the sizes (the CPU rehearsal). --shapes takes the
parameter shapes from `sana-train model --json` (its "parameter_shapes"); without it the
optimizer piece is left out.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def timer(device):
    """ms of fn() per call: the median of `repeats` timed calls after `warmup`."""
    def run(fn, repeats=10, warmup=3):
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fn()
                b.record()
                b.synchronize()
                times.append(a.elapsed_time(b))
            else:
                t = time.perf_counter()
                fn()
                times.append(1e3 * (time.perf_counter() - t))
        return statistics.median(times)
    return run


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--micro", type=int, default=16)
    p.add_argument("--shapes")
    p.add_argument("--small", action="store_true")
    p.add_argument("--only", default="", help="comma-separated piece names (default: all)")
    a = p.parse_args()
    only = set(filter(None, a.only.split(",")))
    want = lambda name: not only or name in only
    cuda = torch.cuda.is_available() and not a.small
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    ms = timer(device)
    s = 10 if a.small else 1  # the rehearsal's divisor
    pieces = []

    def add(name, what, **fig):
        pieces.append({"name": name, "what": what, **fig})
        print(f"pieces: {name}: " + ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                                               for k, v in fig.items()), flush=True)

    if want("matmul"):
        ceilings(ms, device, dtype, s, add)
    if want("cross-attention"):
        cross_attention(ms, device, dtype, s, a.micro, add)
    if want("depthwise"):
        depthwise(ms, device, dtype, s, a.micro, add)
    if want("adamw") and a.shapes:
        adamw(ms, device, cuda, a.shapes, add)
    json.dump({"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
               "micro": a.micro, "small": a.small, "pieces": pieces}, open(a.out, "w"), indent=1)


def ceilings(ms, device, dtype, s, add):
    """A large matrix product, and a device copy: what the hardware allows."""
    n = 8192 // s
    x, y = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    t = ms(lambda: x @ y)
    add("matmul", f"{n}^3 {str(dtype)[6:]} product", ms=t, tflops=2 * n**3 / t / 1e9)
    big = torch.empty(256 * 2**20 // s**2, device=device, dtype=torch.float32)  # 1 GiB on the GPU
    dst = torch.empty_like(big)
    t = ms(lambda: dst.copy_(big))
    add("copy", f"{big.numel() * 4 / 2**20:.0f} MiB device copy (read + write)", ms=t,
        gbps=2 * big.numel() * 4 / t / 1e6)


def cross_attention(ms, device, dtype, s, micro, add):
    """7 kernels of matrix products, bias and softmax against SDPA, forward and backward."""
    B, N, L, H, D = micro, 1024 // s, 300 // s, 20 // (2 if s > 1 else 1), 112 // (2 if s > 1 else 1)
    q = torch.randn(B, H, N, D, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, L, D, device=device, dtype=dtype, requires_grad=True)
    bias = torch.zeros(B, 1, 1, L, device=device, dtype=dtype)
    bias[:, :, :, L // 2:] = float("-inf")  # half of each caption is padding
    g = torch.randn(B, H, N, D, device=device, dtype=dtype)

    def eager():
        w = torch.softmax(q @ k.transpose(-1, -2) * D**-0.5 + bias, -1)
        (w @ v).backward(g)

    def sdpa():
        F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=D**-0.5).backward(g)
    te, tf = ms(eager), ms(sdpa)
    add("cross-attention", f"forward + backward, B {B}, {H} heads of {D}, {N} x {L} tokens", eager_ms=te,
        sdpa_ms=tf, ratio=te / tf)


def depthwise(ms, device, dtype, s, micro, add):
    """The GLUMBConv depthwise 3x3 at width 11200: cuDNN's benchmark mode off and on."""
    B = micro
    C, side = 11200 // s, 32 // (2 if s > 1 else 1)
    xin = torch.randn(B, C, side, side, device=device, dtype=dtype, requires_grad=True)
    conv = torch.nn.Conv2d(C, C, 3, padding=1, groups=C).to(device, dtype)
    gout = torch.randn(B, C, side, side, device=device, dtype=dtype)
    out = {}
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        out[bench] = ms(lambda: conv(xin).backward(gout))
    torch.backends.cudnn.benchmark = False
    add("depthwise", f"3x3 forward + backward, B {B}, {C} channels, {side}x{side}", off_ms=out[False],
        on_ms=out[True], ratio=out[False] / out[True])


def adamw(ms, device, cuda, shapes_json, add):
    """The optimizer over the model's own parameter shapes: one tensor at a time, the
    multi-tensor (foreach) path and the fused kernel (torch's AdamW; CAME has no torch form)."""
    shapes = json.load(open(shapes_json))["parameter_shapes"]
    params = [torch.zeros(sh, device=device, dtype=torch.float32, requires_grad=True) for sh in shapes]
    for t_ in params:
        t_.grad = torch.randn_like(t_)
    figs = {}
    modes = {"per_tensor": {"foreach": False}, "foreach": {"foreach": True}}
    if cuda:
        modes["fused"] = {"fused": True}
    for mode, kw in modes.items():
        opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.03, **kw)
        figs[f"{mode}_ms"] = ms(opt.step, repeats=5, warmup=2)
        del opt
    add("adamw", f"torch AdamW step over {len(params)} tensors, {sum(t_.numel() for t_ in params) / 1e6:.1f} M",
        **figs)


if __name__ == "__main__":
    sys.exit(main())
