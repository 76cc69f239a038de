#!/usr/bin/env python3
"""Reads a run's TensorBoard event files the way TensorBoard does, without our code or
our .proto: TFRecord framing with both masked CRC-32Cs checked, protobuf wire format
decoded by hand with TensorFlow's field numbers (Event: wall_time 1, step 2,
file_version 3, summary 5; Summary.value 1; Value: tag 1, simple_value 2, image 4;
Image: height 1, width 2, colorspace 3, encoded_image_string 4).

usage: tensorboard_events.py WORK_DIR STEPS PREVIEW_STEP...
Checks every file's records and CRCs, the scalars of every step against metrics.jsonl,
and a PNG image per preview bucket at each PREVIEW_STEP. Prints what it read; exit 1
on the first mismatch."""
import glob, io, json, os, struct, sys

from PIL import Image

POLY = 0x82F63B78
TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ POLY if c & 1 else c >> 1
    TABLE.append(c)


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the standard check value


def records(path):
    raw = open(path, "rb").read()
    at = 0
    while at < len(raw):
        if len(raw) - at < 12:
            raise ValueError(f"{path}: {len(raw) - at} stray bytes at {at}")
        header = raw[at:at + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", raw[at + 8:at + 12])
        if masked(header) != length_crc:
            raise ValueError(f"{path}: length CRC mismatch at byte {at}")
        data = raw[at + 12:at + 12 + length]
        (data_crc,) = struct.unpack("<I", raw[at + 12 + length:at + 16 + length])
        if len(data) != length or masked(data) != data_crc:
            raise ValueError(f"{path}: data CRC mismatch at byte {at}")
        yield data
        at += 16 + length


def varint(b, at):
    v = shift = 0
    while True:
        x = b[at]
        at += 1
        v |= (x & 0x7F) << shift
        shift += 7
        if not x & 0x80:
            return v, at


def fields(b):
    """(field number, wire type, value) of one message; value is int, bytes or raw 8/4 bytes."""
    at = 0
    while at < len(b):
        key, at = varint(b, at)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, at = varint(b, at)
        elif wire == 1:
            v, at = b[at:at + 8], at + 8
        elif wire == 2:
            n, at = varint(b, at)
            v, at = b[at:at + n], at + n
        elif wire == 5:
            v, at = b[at:at + 4], at + 4
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, v


def event(data):
    e = {"step": 0, "values": []}
    for num, wire, v in fields(data):
        if num == 1 and wire == 1:
            e["wall_time"] = struct.unpack("<d", v)[0]
        elif num == 2 and wire == 0:
            e["step"] = v
        elif num == 3 and wire == 2:
            e["file_version"] = v.decode()
        elif num == 5 and wire == 2:
            for n2, w2, value in fields(v):
                if n2 != 1 or w2 != 2:
                    continue
                item = {}
                for n3, w3, x in fields(value):
                    if n3 == 1 and w3 == 2:
                        item["tag"] = x.decode()
                    elif n3 == 2 and w3 == 5:
                        item["simple_value"] = struct.unpack("<f", x)[0]
                    elif n3 == 4 and w3 == 2:
                        img = {}
                        for n4, w4, y in fields(x):
                            img[{1: "height", 2: "width", 3: "colorspace", 4: "png"}.get(n4, n4)] = y
                        item["image"] = img
                e["values"].append(item)
    return e


def main():
    work_dir, steps, preview_steps = sys.argv[1], int(sys.argv[2]), [int(s) for s in sys.argv[3:]]
    files = sorted(glob.glob(os.path.join(work_dir, "tensorboard", "events.out.tfevents.*")))
    if not files:
        sys.exit(f"no event file in {work_dir}/tensorboard")
    scalars, images, n = {}, {}, 0
    for path in files:
        events = [event(r) for r in records(path)]
        n += len(events)
        if events[0].get("file_version") != "brain.Event:2":
            sys.exit(f"{path}: the first record is not the file version: {events[0]}")
        for e in events[1:]:
            for v in e["values"]:
                if "simple_value" in v:
                    scalars.setdefault(e["step"], {})[v["tag"]] = v["simple_value"]
                elif "image" in v:
                    images.setdefault(e["step"], {})[v["tag"]] = v["image"]
    print(f"{len(files)} file(s), {n} records, every CRC right")
    metrics = [json.loads(line) for line in open(os.path.join(work_dir, "metrics.jsonl"))]
    if sorted(scalars) != list(range(1, steps + 1)):
        sys.exit(f"scalar steps {sorted(scalars)[:5]}... != 1..{steps}")
    for m in metrics:
        s = scalars[m["step"]]
        for tag, key in (("train/loss", "loss"), ("train/grad_norm", "grad_norm"), ("train/lr", "lr")):
            if abs(s[tag] - m[key]) > 1e-6 * max(1.0, abs(m[key])):
                sys.exit(f"step {m['step']}: {tag} {s[tag]} != metrics.jsonl {m[key]}")
        for tag in ("train/samples_per_s", "train/data_wait", "train/bad_samples", "time/forward_backward",
                    "time/allreduce", "time/optimizer", "time/data"):
            if tag not in s:
                sys.exit(f"step {m['step']}: no {tag}")
        # one name, one meaning: the step's throughput in both files
        if abs(s["train/samples_per_s"] - m["samples_per_s"]) > 1e-5 * max(1.0, m["samples_per_s"]):
            sys.exit(f"step {m['step']}: train/samples_per_s {s['train/samples_per_s']} != {m['samples_per_s']}")
        if abs(s["perf/tflops_per_process"] - m["tflops_per_process"]) > 1e-6 * max(1e-9, m["tflops_per_process"]):
            sys.exit(f"step {m['step']}: perf/tflops_per_process {s['perf/tflops_per_process']} != {m['tflops_per_process']}")
        if not 0 <= s["train/data_wait"] <= 1:
            sys.exit(f"step {m['step']}: data wait {s['train/data_wait']} is not a fraction")
    print(f"scalars: {len(scalars)} steps x {len(scalars[1])} tags; loss, grad_norm, lr as metrics.jsonl; "
          f"last loss {scalars[steps]['train/loss']:.4f}")
    for step in preview_steps:
        got = images.get(step, {})
        if len(got) < 2:
            sys.exit(f"step {step}: images {sorted(got)}, expected one per preview bucket")
        for tag, img in sorted(got.items()):
            pic = Image.open(io.BytesIO(img["png"]))
            if pic.size != (img["width"], img["height"]) or img["colorspace"] != 3:
                sys.exit(f"step {step} {tag}: PNG {pic.size} vs {img['width']}x{img['height']}")
            print(f"image {tag} at step {step}: {pic.size[0]}x{pic.size[1]} PNG, {len(img['png'])} bytes")
    extra = sorted(set(images) - set(preview_steps))
    if extra:
        sys.exit(f"images at unexpected steps {extra}")


if __name__ == "__main__":
    main()
