#!/usr/bin/env bash
# train.profile_steps on the CPU: 2 processes, 3 steps of the tiny preset with step 2 asked
# for. Rank 0 writes profile/step_2.trace.json (Kineto's Chrome trace) and step_2.ops.tsv; no
# other step is recorded; the table's ops are the model's (its matrix products among the top
# five), their shares add up to 1, and each op's call count is the trace's count of it; no
# ERROR line from Kineto's CUDA probe on this machine without a GPU. The device timeline (a
# CUDA run's phases timed by events; here on the host's clock, SANA_TEST_HOST_TIMELINE):
# metrics.jsonl's "device_time" names the step before each line's, its phases add up to its
# total, and the log line gives the device's shares.
# Every command under `timeout` in a `mktemp -d` folder, removed on exit.
[ -n "${1:-}" ] && export SANA_TRAIN_BIN=$1
. "$(dirname "$0")/../dist/lib.sh"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PHOTOS=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
work=$SCRATCH/run-$TOKEN
if ! SANA_TEST_HOST_TIMELINE=1 timeout 240 "$BIN" launch --nproc-per-node 2 -- --config "$ROOT/configs/sana_tiny_cpu.yaml" \
     "--data.data_dir=[$PHOTOS]" --train.max_steps=3 --train.visualize=false --dist.timeout_s=60 \
     "--train.profile_steps=[2]" --train.log_interval=3 "--work_dir=$work" > "$SCRATCH/run.log" 2>&1; then
  fail "the run failed"; tail -20 "$SCRATCH/run.log"; finish
fi
ls "$work/profile" > "$SCRATCH/files"
if [ "$(cat "$SCRATCH/files")" = "$(printf 'step_2.ops.tsv\nstep_2.trace.json')" ]; then
  pass "rank 0 recorded step 2 alone: $(tr '\n' ' ' < "$SCRATCH/files")"
else
  fail "profile/ holds: $(tr '\n' ' ' < "$SCRATCH/files")"
fi
# Kineto's probe for CUDA devices fails on a machine without one: no ERROR line for it.
if grep -q "ERROR" "$SCRATCH/run.log"; then
  fail "an ERROR line on a CPU run: $(grep -m1 ERROR "$SCRATCH/run.log")"
else
  pass "no ERROR line in the run's output"
fi
if grep -q "train.profile_steps: step 2 recorded" "$SCRATCH/run.log"; then
  pass "the log names the step and its top ops: $(grep -o 'by host time: [^(]*' "$SCRATCH/run.log")"
else
  fail "no log line for the recorded step"
fi
if "$SANA_PYTHON" - "$work/profile/step_2.ops.tsv" "$work/profile/step_2.trace.json" > "$SCRATCH/check" 2>&1 <<'EOF'; then
import collections, csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
assert [k for k in rows[0]] == ["op", "calls", "cpu_ms", "device_ms", "share"], rows[0].keys()
share = sum(float(r["share"]) for r in rows)
assert abs(share - 1) < 1e-3, f"shares add up to {share}"
top = [r["op"] for r in rows[:5]]
assert any(op in ("aten::addmm", "aten::mm", "aten::bmm", "aten::convolution_backward", "aten::mkldnn_convolution")
           for op in top), f"no matrix product among the top five: {top}"
assert all(float(a["share"]) >= float(b["share"]) for a, b in zip(rows, rows[1:])), "not sorted by share"
# Host events: ATen's ops (cpu_op) and named regions such as the collectives' (user_annotation).
host = ("cpu_op", "user_annotation")
traced = collections.Counter(e["name"] for e in json.load(open(sys.argv[2]))["traceEvents"] if e.get("cat") in host)
differ = [(r["op"], r["calls"], traced[r["op"]]) for r in rows if int(r["calls"]) != traced[r["op"]]]
assert not differ, f"calls differ from the trace's: {differ[:5]}"
print(f"{len(rows)} ops, {sum(int(r['calls']) for r in rows)} calls, as the trace counts; top: "
      + ", ".join(f"{r['op']} {100 * float(r['share']):.1f}%" for r in rows[:3]))
EOF
  pass "the table: $(cat "$SCRATCH/check")"
else
  fail "the table: $(cat "$SCRATCH/check")"
fi
if timeout 60 "$SANA_PYTHON" - "$work/metrics.jsonl" > "$SCRATCH/device" 2>&1 <<'EOF'; then
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
assert [l["step"] for l in lines] == [1, 2, 3], [l["step"] for l in lines]
assert "device_time" not in lines[0], "step 1's line: no step had ended before it"
for l in lines[1:]:
    d = l["device_time"]
    assert d["step"] == l["step"] - 1, (l["step"], d)
    phases = sum(d[k] for k in ("data", "encoders", "forward_backward", "allreduce", "optimizer",
                                "checkpoint_preview", "other"))
    assert abs(phases - d["total"]) <= 1e-9 * max(d["total"], 1), d
    assert d["forward_backward"] > 0 and d["optimizer"] > 0, d
    # On the host's clock the phases are the host's own, to the marks' bookkeeping.
    host = next(m for m in lines if m["step"] == d["step"])["time"]
    assert abs(d["forward_backward"] - host["forward_backward"]) <= 0.05 * host["forward_backward"] + 0.005, (d, host)
print(", ".join(f'step {l["device_time"]["step"]}: fwd+bwd {l["device_time"]["forward_backward"]:.3f} s of '
                f'{l["device_time"]["total"]:.3f} s' for l in lines[1:]))
EOF
  pass "metrics.jsonl's device_time: $(cat "$SCRATCH/device")"
else
  fail "metrics.jsonl's device_time: $(cat "$SCRATCH/device")"
fi
if grep -qE '\| device:.* fwd\+bwd [0-9.]+%' "$SCRATCH/run.log"; then
  pass "the log line's device shares: $(grep -oE '\| device:.*' "$SCRATCH/run.log" | head -1)"
else
  fail "no device shares on the log line: $(grep -m1 'step 3/3' "$SCRATCH/run.log")"
fi
finish
