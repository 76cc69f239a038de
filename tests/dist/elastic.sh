#!/usr/bin/env bash
# Elastic runs (issue 17): any number of processes, the global batch split unevenly when it
# must (8 on 3: 3, 3, 2), gives the single-process losses; a run resumed 4 -> 3 -> 2 -> 1
# processes while its global batch goes 8 -> 12 -> 4 mid-epoch trains every sample of
# each epoch exactly once; with train.batch_tokens a bucket of 4x the pixels gets 1/4 the
# samples per step, with equal losses at any process count.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$data]" --train.visualize=false --train.log_interval=5
        --dist.timeout_s=60 --train.save_model_steps=0 --train.save_model_epochs=0 --train.micro_batch_size=2
        "--work_dir=$SCRATCH/$TOKEN")  # the token finds this test's processes; a later --work_dir wins
run() {  # NAME NPROC ARGS... (output in $SCRATCH/NAME.log)
  local name=$1 n=$2; shift 2
  timeout 300 "$BIN" launch --nproc-per-node "$n" -- "${common[@]}" "$@" > "$SCRATCH/$name.log" 2>&1
  local code=$?
  [ $code -eq 0 ] || tail -20 "$SCRATCH/$name.log"
  return $code
}

# 1. Losses: W = 1, 2, 3, 4 at G 8 and W = 1, 4 at G 6, 20 steps each.
for w in 1 2 3 4; do
  run "g8w$w" "$w" "--work_dir=$SCRATCH/g8w$w" --train.max_steps=20; assert_code $? 0 "20 steps on $w process(es), G 8"
done
for w in 1 4; do
  run "g6w$w" "$w" "--work_dir=$SCRATCH/g6w$w" --train.max_steps=20 --train.global_batch_size=6
  assert_code $? 0 "20 steps on $w process(es), G 6"
done
assert_contains "$SCRATCH/g8w3/train.rank2.log" "global batch 8: 2 samples on this rank in 1 micro-batch of at most 2" \
  "rank 2 of 3 takes 2 of 8 samples"
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY' > "$SCRATCH/losses.log" 2>&1
import json, sys
root = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{root}/{name}/metrics.jsonl"))}
ok = True
for g, worlds in ((8, (2, 3, 4)), (6, (4,))):
    ref = losses(f"g{g}w1")
    for w in worlds:
        other = losses(f"g{g}w{w}")
        worst = max(abs(other[s] - ref[s]) / abs(ref[s]) for s in ref)
        same = sorted(ref) == sorted(other) == list(range(1, 21))
        print(f"G {g}, {w} processes vs 1: 20 steps {same}, max relative loss difference {worst:.2e}")
        ok = ok and same and worst <= 1e-5
sys.exit(0 if ok else 1)
PY
code=$?
cat "$SCRATCH/losses.log"
assert_code $code 0 "per-step losses equal the single process's within 1e-5 at every world size"

# 2. 4 processes at G 8 to step 2 (epoch 1 of 3 steps), 3 at G 12 to step 4 (mid-epoch 2),
#    2 at G 4 to step 6, 1 at G 4 to step 10.
export SANA_TEST_LOG_IDS=1
x=(--work_dir="$SCRATCH/x" --resume_from=latest)
run r4 4 "${x[@]}" --train.max_steps=2 --train.global_batch_size=8; assert_code $? 0 "2 steps on 4 processes, G 8"
run r3 3 "${x[@]}" --train.max_steps=4 --train.global_batch_size=12; assert_code $? 0 "to step 4 on 3, G 12"
assert_contains "$SCRATCH/r3.log" "train.global_batch_size 8 -> train.global_batch_size 12: epoch 1's samples not yet seen are batched anew" \
  "the change of batch is said"
run r2 2 "${x[@]}" --train.max_steps=6 --train.global_batch_size=4; assert_code $? 0 "to step 6 on 2, G 4"
run r1 1 "${x[@]}" --train.max_steps=10 --train.global_batch_size=4; assert_code $? 0 "to step 10 on 1, G 4"
timeout 300 "$BIN" plan "${common[@]}" --work_dir="$SCRATCH/plan" --samples > "$SCRATCH/samples.tsv" 2> /dev/null
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY' > "$SCRATCH/samples.log" 2>&1
import collections, glob, sys
root = sys.argv[1]
bucket = {}
for line in open(f"{root}/samples.tsv"):
    if not line.startswith("#"):
        i, _, h, w = line.rstrip("\n").split("\t")
        bucket[int(i)] = (h, w)
steps = collections.defaultdict(list)  # (epoch, step) -> ids of all ranks
for f in glob.glob(f"{root}/x/ids.rank*.log"):
    for line in open(f):
        e, s, *ids = map(int, line.split())
        steps[(e, s)] += ids
ok = True
for epoch in sorted({e for e, _ in steps}):
    ids = [i for (e, s), v in sorted(steps.items()) if e == epoch for i in v]
    last = max(s for e, s in steps if e == epoch)
    final_batch = len(steps[(epoch, last)])
    unseen = collections.Counter(bucket[i] for i in set(bucket) - set(ids))
    repeats = len(ids) - len(set(ids))
    complete = epoch < 2
    # Every sample once; what an ended epoch did not see is a tail smaller than its last batch.
    good = repeats == 0 and (not complete or all(n < max(final_batch, 8) for n in unseen.values()))
    print(f"epoch {epoch + 1}: {len(ids)} samples in {last + 1} steps, {repeats} repeated, unseen per bucket "
          f"{dict(unseen)}{'' if complete else ' (epoch in progress)'}: {'ok' if good else 'WRONG'}")
    ok = ok and good
sys.exit(0 if ok and len({e for e, _ in steps}) == 3 else 1)
PY
code=$?
cat "$SCRATCH/samples.log"
assert_code $code 0 "4 -> 3 -> 2 -> 1 processes with G 8 -> 12 -> 4: every sample of an epoch once"
# 3. train.batch_tokens over 32- and 64-px buckets (the tiny model's token: a 2x2 pixel
#    patch, so 256 and 1024 tokens a sample): 4096 tokens make global batches of 16 and 4.
photos=(${SANA_TEST_PHOTOS:-/usr/share/backgrounds/mate}/nature/*.jpg)
row() { printf '{"path": "%s", "width": %d, "height": %d}\n' "${photos[$(( $1 % ${#photos[@]} ))]}" "$2" "$2"; }
{ for ((i = 0; i < 80; i++)); do row $i 40; done; for ((i = 80; i < 104; i++)); do row $i 200; done; } > "$SCRATCH/two_bases.jsonl"
tokens=(--data.data_dir="[$SCRATCH/two_bases.jsonl]" --data.multi_scale_sizes=[64] --train.batch_tokens=4096
        --train.max_steps=11)
unset SANA_TEST_LOG_IDS
for w in 1 2 4; do
  run "tok$w" "$w" "--work_dir=$SCRATCH/tok$w" "${tokens[@]}"; assert_code $? 0 "batch_tokens on $w process(es)"
done
assert_contains "$SCRATCH/tok4.log" "train.batch_tokens 4096: global batches of 4 to 16 samples by bucket" \
  "the log gives the batch range"
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY' > "$SCRATCH/tokens.log" 2>&1
import json, sys
root = sys.argv[1]
rows = {w: [json.loads(l) for l in open(f"{root}/tok{w}/metrics.jsonl")] for w in (1, 2, 4)}
sizes = sorted({(r["height"], r["samples"]) for r in rows[1]})
print("(height, samples) per step:", sizes)
ok = sizes == [(32, 16), (64, 4)] and len(rows[1]) == 11
for w in (2, 4):
    worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(rows[w], rows[1]))
    same = [r["samples"] for r in rows[w]] == [r["samples"] for r in rows[1]]
    print(f"{w} processes vs 1: same batches {same}, max relative loss difference {worst:.2e}")
    ok = ok and same and worst <= 1e-5 and len(rows[w]) == 11
sys.exit(0 if ok else 1)
PY
code=$?
cat "$SCRATCH/tokens.log"
assert_code $code 0 "64-px steps hold 1/4 the samples of 32-px ones; losses equal at 1, 2 and 4 processes"
# 4. data.sampler distributed trains torch's DistributedSampler partition (it depends on the
#    world size): 3 processes cannot split 8 as it does; on 2 each rank trains, step by step,
#    the ids python3-torch's DistributedSampler itself gives it (tests/reference/
#    distributed_sampler.py; seed train.seed, epoch 0), an id being the sample's place among
#    the data's files in sorted order.
sampler=(--data.sampler=distributed --model.multi_scale=false --train.max_steps=2)
run dist3 3 "--work_dir=$SCRATCH/dist3" "${sampler[@]}"
assert_code $? 2 "data.sampler distributed refuses 8 samples on 3 processes"
assert_contains "$SCRATCH/dist3.log" "data.sampler=distributed gives every process train.global_batch_size / world size" \
  "and says why"
export SANA_TEST_LOG_IDS=1
run dist2 2 "--work_dir=$SCRATCH/dist2" "${sampler[@]}"; assert_code $? 0 "data.sampler distributed on 2 processes"
unset SANA_TEST_LOG_IDS
seed=$(sed -n 's/^  seed: *\([0-9]*\).*/\1/p' "$config")
n=$(find "$data" -type f \( -iname '*.png' -o -iname '*.jpg' -o -iname '*.jpeg' -o -iname '*.webp' \) | wc -l)
timeout 120 "$SANA_PYTHON" "$(dirname "$0")/../reference/distributed_sampler.py" "[[$n, 2, $seed, 0, 1, 1]]" \
  > "$SCRATCH/torch_sampler.json" 2> "$SCRATCH/torch_sampler.err" || { fail "DistributedSampler"; cat "$SCRATCH/torch_sampler.err"; }
timeout 120 "$SANA_PYTHON" - "$SCRATCH" <<'PY'
import collections, json, sys
root = sys.argv[1]
torch_lists = json.load(open(f"{root}/torch_sampler.json"))[0]
ok = True
for r in (0, 1):
    trained = collections.defaultdict(list)
    for line in open(f"{root}/dist2/ids.rank{r}.w2.log"):
        e, s, *ids = map(int, line.split())
        trained[(e, s)] += ids
    per_step = len(trained[(0, 0)])  # global batch 8 on 2 processes: 4
    want = torch_lists[r]
    expected = {(0, s): want[s * per_step:(s + 1) * per_step] for s in range(2)}
    same = per_step == 4 and dict(trained) == expected
    print(f"rank {r}: trained {dict(trained)}, DistributedSampler's {expected} (of its {len(want)}): "
          f"{'same' if same else 'DIFFERENT'}")
    ok = ok and same
sys.exit(0 if ok else 1)
PY
assert_code $? 0 "each rank trains DistributedSampler's ids"
assert_no_leftovers
finish
