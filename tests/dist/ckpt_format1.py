"""Rewrites a checkpoint's trainer_state.json in format 1, as sana-train wrote it up to
0016840 (before its parts were Stateful): each part's JSON as loose fields, no "parts".
The tensor files are the same in both formats, so their checksums stay.

    ckpt_format1.py CHECKPOINT_DIR REAL_FORMAT1_STATE_JSON

The second file is a trainer_state.json written by that sana-train
(tests/data/ckpt_format1/trainer_state.json): the rewrite must have exactly its keys, in
its order, so this script writes what that writer wrote, not what we think it wrote.
"""
import json
import sys

ckpt_dir, real_path = sys.argv[1:3]
path = f"{ckpt_dir}/trainer_state.json"
state = json.load(open(path))
real = json.load(open(real_path))
assert state["format"] == "sana-train checkpoint 2", state["format"]
parts = state.pop("parts")
scaler = parts.get("loss_scaler", {})
loose = {
    "format": "sana-train checkpoint 1",
    "exact_scales": parts["reducer"]["exact_scales"],
    "bad_samples": parts["bad_samples"]["bad_samples"],
    "samples_read": parts["bad_samples"]["samples_read"],
    "skipped_steps": parts["nonfinite"]["skipped_steps"],
    "loss_scale": scaler.get("loss_scale", 0.0),
    "loss_scale_clean_steps": scaler.get("loss_scale_clean_steps", 0),
    "overflow_steps": scaler.get("overflow_steps", 0),
}
merged = {**state, **loose}
if set(merged) != set(real):
    print(f"keys differ from format 1's: extra {sorted(set(merged) - set(real))}, "
          f"missing {sorted(set(real) - set(merged))}")
    sys.exit(1)
out = {key: merged[key] for key in real}
json.dump(out, open(path, "w"), indent=2)
print(f"{path}: format 1, {len(out)} keys as in {real_path}; parts {sorted(parts)} as loose fields")
