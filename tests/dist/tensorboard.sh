#!/usr/bin/env bash
# train.report_to: tensorboard on 2 processes: work_dir/tensorboard holds an event file
# that an independent reader (tests/apps/tensorboard_events.py: TFRecord CRCs, protobuf
# wire format by hand) reads whole: every step's scalars equal to metrics.jsonl, and the
# preview grids of both ranks as PNG images at their steps, and so does TensorBoard's own
# EventAccumulator (tests/apps/tensorboard_accumulator.py). A flipped byte is caught;
# report_to: none writes no event file. The model TFLOP/s logged is the training FLOPs over
# the step's time, and those FLOPs are python3-torch's profiler's count of upstream's modules.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_EXAMPLE_DATA:-${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}}
reader=$(dirname "$0")/../apps/tensorboard_events.py
common=(--config "$config" --data.data_dir="[$data]" --train.max_steps=20 --train.log_interval=10
        --train.visualize=true --train.eval_sampling_steps=10 --train.preview_steps=2 --train.preview_images=2
        --train.save_model_steps=0 --dist.timeout_s=60)
dir=$SCRATCH/tb-$TOKEN
timeout 300 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$dir" > "$SCRATCH/run.log" 2>&1
assert_code $? 0 "20 steps with previews, report_to tensorboard (the default)"
assert_contains "$SCRATCH/run.log" "TensorBoard: $dir/tensorboard/events.out.tfevents." "the run says where its events go"
if "$SANA_PYTHON" "$reader" "$dir" 20 10 20 > "$SCRATCH/read.log" 2>&1; then
  pass "the event file reads back: $(tr '\n' ';' < "$SCRATCH/read.log")"
else
  fail "the event file does not read back"; cat "$SCRATCH/read.log"
fi
# And TensorBoard's own reader (the pinned tensorboard package) sees the same.
if timeout 120 "$SANA_PYTHON" "$(dirname "$0")/../apps/tensorboard_accumulator.py" "$dir" 20 10 20 > "$SCRATCH/tb.log" 2>&1; then
  pass "$(tail -1 "$SCRATCH/tb.log")"
else
  fail "TensorBoard's EventAccumulator does not read the run as written"; cat "$SCRATCH/tb.log"
fi
# The model TFLOP/s per process in metrics.jsonl is the model's training FLOPs ("train" that
# `sana-train model --json` counts: 3 x forward here) over the step's time and the 2 processes.
timeout 300 "$BIN" model --json --no-memory "${common[@]}" "--work_dir=$dir" > "$SCRATCH/model.json" 2> /dev/null
if "$SANA_PYTHON" - "$SCRATCH/model.json" "$dir/metrics.jsonl" > "$SCRATCH/flops.log" 2>&1 <<'PY'
import json, sys
model = json.load(open(sys.argv[1]))
train = {(f["height"], f["width"]): f["train"] for f in model["flops_every_bucket"]}
checked = 0
for line in open(sys.argv[2]):
    m = json.loads(line)
    flops = m["tflops_per_process"] * 1e12 * m["time"]["total"] * 2
    expected = train[(m["height"], m["width"])] * m["samples"]
    assert abs(flops - expected) <= 1e-6 * expected, (m["step"], flops, expected)
    assert "mfu" not in m, "no MFU without a known peak (CPU)"
    checked += 1
print(f"{checked} steps: TFLOP/s x step time x processes = sana-train model's training FLOPs x samples")
PY
then pass "$(tail -1 "$SCRATCH/flops.log")"; else fail "FLOP/s: $(tail -2 "$SCRATCH/flops.log")"; fi
# And those FLOPs counted apart from the model: python3-torch's profiler (with_flops) on
# upstream's modules (tests/reference/upstream_model.py --flops), one forward pass of one
# sample at every bucket the run trained; training is 3 forward passes' worth here.
if timeout 300 "$SANA_PYTHON" - "$SCRATCH/model.json" "$dir/metrics.jsonl" "$(dirname "$0")/../reference/upstream_model.py" \
    > "$SCRATCH/oracle.log" 2>&1 <<'PY'
import json, subprocess, sys
model = json.load(open(sys.argv[1]))
buckets = sorted({(m["height"], m["width"]) for m in map(json.loads, open(sys.argv[2]))})
ours = {(f["height"], f["width"]): f for f in model["flops_every_bucket"]}
spec = json.dumps(model["spec"])
for h, w in buckets:
    run = subprocess.run([sys.executable, sys.argv[3], "--flops", spec, str(h), str(w)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    counted = int(run.stdout)
    f = ours[(h, w)]
    assert abs(f["forward"] - counted) <= 1e-9 * counted, (h, w, f["forward"], counted)
    assert abs(f["train"] - 3 * counted) <= 1e-9 * counted, (h, w, f["train"], counted)
trained = ", ".join(f"{h}x{w}" for h, w in buckets)
print(f"every bucket trained ({trained}): the forward FLOPs equal the profiler's count of upstream's modules, training 3 x")
PY
then pass "$(tail -1 "$SCRATCH/oracle.log")"; else fail "FLOPs against the profiler: $(tail -3 "$SCRATCH/oracle.log")"; fi
# Preview grids of rank 1 (the buckets it renders) are in rank 0's file too.
if grep -q "r1/2 I\] preview: " "$dir/train.rank1.log"; then pass "rank 1 rendered previews"; else fail "rank 1 rendered no preview"; fi

# A flipped byte in the middle of the file: the reader's CRC check catches it.
mkdir -p "$SCRATCH/bad/tensorboard"
cp "$dir/metrics.jsonl" "$SCRATCH/bad/"
file=$(ls "$dir"/tensorboard/events.out.tfevents.* | head -1)
cp "$file" "$SCRATCH/bad/tensorboard/"
copy="$SCRATCH/bad/tensorboard/$(basename "$file")"
size=$(stat -c %s "$copy")
timeout 120 "$SANA_PYTHON" -c 'import sys; p, at = sys.argv[1], int(sys.argv[2]); b = bytearray(open(p, "rb").read()); b[at] ^= 0x40; open(p, "wb").write(b)' "$copy" $((size / 2))
if "$SANA_PYTHON" "$reader" "$SCRATCH/bad" 20 10 20 > "$SCRATCH/bad.log" 2>&1; then
  fail "a corrupted event file passed the reader"
else
  pass "a flipped byte fails the reader: $(tail -1 "$SCRATCH/bad.log")"
fi

timeout 300 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" --train.visualize=false --train.max_steps=2 \
  --train.report_to=none "--work_dir=$SCRATCH/none-$TOKEN" > "$SCRATCH/none.log" 2>&1
assert_code $? 0 "report_to none"
if [ -e "$SCRATCH/none-$TOKEN/tensorboard" ]; then fail "report_to none wrote $SCRATCH/none-$TOKEN/tensorboard"; else pass "report_to none: no tensorboard folder"; fi
assert_no_leftovers
finish
