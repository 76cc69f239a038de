#!/usr/bin/env bash
# Checkpoint format 3 (issue 44): every rank writes and reads only its own share.
#  1. The tiny preset on 4 processes (AdamW, EMA), a checkpoint after step 1, at stage 3
#     and at stage 0: index.json (read in Python) puts at most 1/W of the checkpoint's
#     tensor bytes plus the largest parameter's entries (its weight, EMA and optimizer
#     state: ownership is by whole parameters) in each rank's files; each rank's log says
#     it wrote exactly its entries' bytes with 0 bytes passed between ranks (Runtime's count
#     of every collective's bytes). Resumed on 4 processes at the same stage: each rank read
#     at most as much, and what passed between ranks is what every rank restores whole (the
#     model at stage 3; everything at stage 0), nothing else.
#  2. The stage-3 checkpoint resumed at stage 0 on 3 processes: each rank reads its third,
#     the rest reaches it from the other ranks.
#  3. The tiny preset on 2 processes, format 2 and format 3 side by side: the format-3
#     checkpoint consolidated (`inspect --consolidate`) is the format-2 one byte for byte,
#     and resuming either gives the same weights.
#  4. A damaged tensor: resume_from latest passes over that checkpoint to the one before;
#     resume_from naming it stops with exit 1, naming the rank, the file and the tensor.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=1
        --dist.timeout_s=120 --train.save_model_epochs=0 --train.ema_update=true --train.optimizer.type=AdamW
        "--work_dir=$SCRATCH/$TOKEN")
# (SanaMS_100M_P2_D12 ran here until 2026-11-29: the same checks at 25x the bytes; the test took
# 203 s with it, 64 s without, on a 2-core machine. scripts/bench/checkpoint_shards.py measures that size.)
quarter=(--train.micro_batch_size=1 --train.global_batch_size=4)
run() { launch_named "$@"; }  # NAME NPROC ARGS... (lib.sh)
# rank_log WORK RANK: that rank's log file (rank 0's is train.log).
rank_log() { if [ "$2" = 0 ]; then echo "$1/train.log"; else echo "$1/train.rank$2.log"; fi; }

# shares WORK STEP W SAVE_STAGE [RESUMED_WORK W2 RESUME_STAGE]: the checks of 1 and 2.
shares() {
  local work=$SCRATCH/$1 step=$2 w=$3 stage=$4 resumed=${5:+$SCRATCH/$5} w2=${6:-0} stage2=${7:-0}
  timeout 300 "$SANA_PYTHON" - "$work" "$step" "$w" "$stage" "$resumed" "$w2" "$stage2" <<'PY'
import json, os, re, sys
work, step, w, stage, resumed, w2, stage2 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
    sys.argv[5], int(sys.argv[6]), int(sys.argv[7])
folder = f"{work}/checkpoints/step_{step:08d}"
index = json.load(open(f"{folder}/index.json"))
entries = [e for part in index["parts"].values() for e in part]
total = sum(e["bytes"] for e in entries)
# Ownership is by whole parameters (parallel/shard_plan.h): a parameter's weight, EMA
# and optimizer state go together, so a share may exceed 1/W by one parameter's entries.
groups = {}
for e in entries:
    groups[e["name"].split("/")[0]] = groups.get(e["name"].split("/")[0], 0) + e["bytes"]
largest = max(groups.values())
model = sum(e["bytes"] for e in index["parts"]["model"])
def log(d, r):
    return open(f"{d}/train.log" if r == 0 else f"{d}/train.rank{r}.log").read()
ok = index["world"] == w
print(f"checkpoint {total} tensor bytes in {len(entries)} tensors; the largest parameter's entries {largest}; "
      f"1/W = {total // w}")
for r in range(w):
    mine = sum(e["bytes"] for e in entries if e["rank"] == r)
    files = sum(size for name, size in index["files"].items() if name.endswith(f"-{r + 1:05d}-of-{w:05d}.safetensors"))
    m = re.search(rf"checkpoint step_{step:08d}: rank {r} writes (\d+) bytes .*; (\d+) bytes passed between ranks", log(work, r))
    said, passed = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    good = mine <= total / w + largest and said == mine and passed == 0 and files - mine < 1 << 20
    ok = ok and good
    print(f"  save, rank {r}: {mine} bytes in its files ({files} with headers), the log says {said}; "
          f"{passed} bytes passed between ranks{'' if good else '  <-- wrong'}")
if resumed:
    for r in range(w2):
        m = re.search(r"resume: rank \d+ read (\d+) bytes .* and received (\d+) bytes .*; (\d+) bytes passed between ranks",
                      log(resumed, r))
        read, received, passed = map(int, m.groups()) if m else (-1, -1, -1)
        # At stage 3 only the model is restored whole on every rank: its streams pass every
        # rank; the optimizer and EMA shares are read by their owners alone. At stage 0
        # everything passes every rank.
        if stage2 == 3:
            good = 0 < read <= total / w2 + largest and passed == model
        else:
            good = 0 < read <= total / w2 + largest and read + received == total and passed == total
        ok = ok and good
        print(f"  resume on {w2} at stage {stage2}, rank {r}: read {read} bytes, received {received}; "
              f"{passed} bytes passed between ranks{'' if good else '  <-- wrong'}")
sys.exit(0 if ok else 1)
PY
}

# 1. 4 processes, stage 3 then stage 0.
for stage in 3 0; do
  run "s$stage" 4 "${quarter[@]}" --train.zero_stage=$stage --train.max_steps=1 --train.save_model_steps=1
  assert_code $? 0 "stage $stage on 4 processes: 1 step and a checkpoint"
  cp -r "$SCRATCH/s$stage" "$SCRATCH/s$stage-again"
  run "s$stage-again" 4 "${quarter[@]}" --train.zero_stage=$stage --train.max_steps=2 --train.save_model_steps=0 \
    --resume_from=latest
  assert_code $? 0 "stage $stage: resumed on 4 processes"
  if shares "s$stage" 1 4 "$stage" "s$stage-again" 4 "$stage" > "$SCRATCH/s$stage.check" 2>&1; then
    pass "stage $stage on 4: each rank wrote and read its own share: $(tr '\n' ' ' < "$SCRATCH/s$stage.check")"
  else
    fail "stage $stage on 4: shares"; cat "$SCRATCH/s$stage.check"
  fi
done

# 2. The stage-3 checkpoint resumed at stage 0 on 3 processes.
cp -r "$SCRATCH/s3" "$SCRATCH/s3-to-s0"
run s3-to-s0 3 "${quarter[@]}" --train.zero_stage=0 --train.max_steps=2 --train.save_model_steps=0 --resume_from=latest
assert_code $? 0 "the stage-3 checkpoint of 4 processes resumed at stage 0 on 3"
if shares s3 1 4 3 s3-to-s0 3 0 > "$SCRATCH/s3-to-s0.check" 2>&1; then
  pass "4 at stage 3 -> 3 at stage 0: $(tail -3 "$SCRATCH/s3-to-s0.check" | tr '\n' ' ')"
else
  fail "4 at stage 3 -> 3 at stage 0"; cat "$SCRATCH/s3-to-s0.check"
fi

# 3. Format 2 and format 3 side by side (tiny, 2 processes, stage 1).
tiny=(--train.zero_stage=1 --train.micro_batch_size=2 --train.max_steps=4 --train.save_model_steps=2)
run f2 2 "${tiny[@]}" --ckpt.format=2; assert_code $? 0 "format 2: 4 steps"
run f3 2 "${tiny[@]}" --ckpt.format=3; assert_code $? 0 "format 3: 4 steps"
[ -f "$SCRATCH/f2/checkpoints/step_00000002/model.safetensors" ] && [ -f "$SCRATCH/f3/checkpoints/step_00000002/index.json" ] &&
  pass "format 2 wrote one file per part, format 3 each rank's files and index.json" || fail "the formats' files"
timeout 120 "$BIN" inspect "$SCRATCH/f3/checkpoints/step_00000002" --consolidate "$SCRATCH/f3-as-2" > "$SCRATCH/cons.log" 2>&1
assert_code $? 0 "inspect --consolidate"
assert_contains "$SCRATCH/cons.log" "format 3: written by 2 ranks in 6 files" "inspect shows the shards"
same=0
for f in model ema optimizer; do
  cmp -s "$SCRATCH/f2/checkpoints/step_00000002/$f.safetensors" "$SCRATCH/f3-as-2/$f.safetensors" && same=$((same + 1))
done
[ "$same" = 3 ] && pass "the format-3 checkpoint consolidated is the format-2 one byte for byte (model, ema, optimizer)" ||
  fail "consolidated format 3 differs from format 2 in $((3 - same)) of 3 files"
checksum() { grep -o 'parameters identical on all [0-9]* ranks\? (checksum [0-9a-f]*)' "$SCRATCH/$1.log" | grep -o '[0-9a-f]*)$' | tr -d ')'; }
# Each checkpoint alone in a work_dir of its own, resumed to step 4.
for f in f2 f3; do
  mkdir -p "$SCRATCH/r$f/checkpoints" && cp -r "$SCRATCH/$f/checkpoints/step_00000002" "$SCRATCH/r$f/checkpoints/"
done
mkdir -p "$SCRATCH/rf3-as-2/checkpoints" && cp -r "$SCRATCH/f3-as-2" "$SCRATCH/rf3-as-2/checkpoints/step_00000002"
for f in f2 f3 f3-as-2; do
  run "r$f" 2 "${tiny[@]}" --resume_from=latest; assert_code $? 0 "resumed from $f"
done
a=$(checksum rf2); b=$(checksum rf3); c=$(checksum rf3-as-2); d=$(checksum f3)
if [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$a" = "$d" ]; then
  pass "format 2, format 3 and format 3 consolidated resume to the uninterrupted run's weights ($a)"
else
  fail "resumed weights: format 2 '$a', format 3 '$b', consolidated '$c', uninterrupted '$d'"
fi

# 4. A damaged tensor in the newest checkpoint: resume_from latest finds it while reading,
# says so, and continues from the checkpoint before (to the uninterrupted run's weights);
# naming that checkpoint itself stops with exit 1, naming the file and the tensor.
damage() {  # FOLDER: flips a byte of rank 1's first model tensor; prints "FILE TENSOR"
  timeout 60 "$SANA_PYTHON" - "$1" <<'PY'
import json, sys
folder = sys.argv[1]
entry = next(e for e in json.load(open(f"{folder}/index.json"))["parts"]["model"] if e["rank"] == 1)
with open(f"{folder}/{entry['file']}", "r+b") as f:
    f.seek(entry["offset"] + 1)
    byte = f.read(1)
    f.seek(entry["offset"] + 1)
    f.write(bytes([byte[0] ^ 0x5a]))
print(f"{entry['file']} {entry['name']}")
PY
}
cp -r "$SCRATCH/f3" "$SCRATCH/damaged"
cp -r "$SCRATCH/f3/checkpoints/step_00000004" "$SCRATCH/named"
if damage "$SCRATCH/damaged/checkpoints/step_00000004" > "$SCRATCH/damage.log" 2>&1 &&
   damage "$SCRATCH/named" > /dev/null 2>&1; then
  read -r file tensor < "$SCRATCH/damage.log"
  run damaged 2 "${tiny[@]}" --resume_from=latest; assert_code $? 0 "resumed past the damaged checkpoint"
  assert_contains "$SCRATCH/damaged.log" "skipping $SCRATCH/damaged/checkpoints/step_00000004: rank 1 read: " \
    "the damaged checkpoint is named and skipped"
  assert_contains "$SCRATCH/damaged.log" "$file is damaged: tensor '$tensor' has checksum" "the file and the tensor named"
  assert_contains "$SCRATCH/damaged.log" "resumed from $SCRATCH/damaged/checkpoints/step_00000002" "resumed from step 2"
  e=$(checksum damaged)
  [ -n "$e" ] && [ "$e" = "$d" ] && pass "the fallback resume ends as the uninterrupted run ($e)" || fail "'$e' vs '$d'"
  run named-resume 2 "${tiny[@]}" --train.max_steps=6 "--resume_from=$SCRATCH/named"
  assert_code $? 1 "resume_from a damaged checkpoint's folder"
  assert_contains "$SCRATCH/named-resume.log" "checkpoint error: resume_from $SCRATCH/named: rank 1 read: " \
    "the error names the checkpoint and the reading rank"
  assert_contains "$SCRATCH/named-resume.log" "is damaged: tensor '$tensor'" "and the tensor"
else
  fail "could not damage the checkpoints: $(cat "$SCRATCH/damage.log")"
fi
finish
