#!/usr/bin/env python3
"""TensorBoard itself reads a run's event files: its EventAccumulator (the loader behind
`tensorboard --logdir`), keeping every event, finds each scalar tag at every step with the
values of metrics.jsonl, and the preview grids as images at their steps, PNGs of the size the
event gives.

usage: tensorboard_accumulator.py WORK_DIR STEPS PREVIEW_STEP...
Prints what TensorBoard saw; exit 1 on the first mismatch."""
import io
import json
import os
import sys

from PIL import Image
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.version import VERSION

SCALARS = ("train/loss", "train/grad_norm", "train/lr", "train/samples_per_s", "train/data_wait",
           "train/bad_samples", "time/forward_backward", "time/allreduce", "time/optimizer", "time/data",
           "perf/tflops_per_process")
FROM_METRICS = {"train/loss": "loss", "train/grad_norm": "grad_norm", "train/lr": "lr",
                "train/samples_per_s": "samples_per_s", "perf/tflops_per_process": "tflops_per_process"}


def main():
    work_dir, steps, preview_steps = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    acc = event_accumulator.EventAccumulator(
        os.path.join(work_dir, "tensorboard"),
        size_guidance={event_accumulator.SCALARS: 0, event_accumulator.IMAGES: 0})  # 0: keep every event
    acc.Reload()
    tags = acc.Tags()
    missing = [t for t in SCALARS if t not in tags["scalars"]]
    if missing:
        sys.exit(f"TensorBoard {VERSION} sees no scalar {missing}; it sees {sorted(tags['scalars'])}")
    metrics = {m["step"]: m for m in (json.loads(line) for line in open(os.path.join(work_dir, "metrics.jsonl")))}
    for tag in SCALARS:
        events = acc.Scalars(tag)
        seen = [e.step for e in events]
        if seen != list(range(1, steps + 1)):
            sys.exit(f"{tag}: TensorBoard sees steps {seen[:5]}... (of {len(seen)}), not 1..{steps}")
        if tag in FROM_METRICS:
            key = FROM_METRICS[tag]
            for e in events:
                want = metrics[e.step][key]
                if abs(e.value - want) > 1e-5 * max(1.0, abs(want)) + 1e-12:
                    sys.exit(f"{tag} at step {e.step}: TensorBoard reads {e.value}, metrics.jsonl has {want}")
    if not tags["images"]:
        sys.exit(f"TensorBoard {VERSION} sees no image tag")
    pictures = 0
    for step in preview_steps:
        at_step = [(tag, e) for tag in tags["images"] for e in acc.Images(tag) if e.step == step]
        if len(at_step) < 2:
            sys.exit(f"step {step}: TensorBoard sees images {[t for t, _ in at_step]}, expected one per preview bucket")
        for tag, e in at_step:
            pic = Image.open(io.BytesIO(e.encoded_image_string))
            if pic.format != "PNG" or pic.size != (e.width, e.height):
                sys.exit(f"{tag} at step {step}: a {pic.format} of {pic.size}, the event says {e.width}x{e.height}")
            pictures += 1
    print(f"TensorBoard {VERSION}'s EventAccumulator: {len(tags['scalars'])} scalar tags at steps 1..{steps} "
          f"(loss, grad_norm, lr, samples/s, TFLOP/s as metrics.jsonl), {len(tags['images'])} image tags, "
          f"{pictures} PNGs at steps {preview_steps}")


if __name__ == "__main__":
    main()
