#!/usr/bin/env bash
# data.cache memory on 2 processes (the tiny config on the example photos, every sample
# in every epoch with data.tail pad): the loss curve and the final weights are bitwise
# those of a run without the cache; from epoch 2 on every rank takes every sample from
# the cache (the ranks share it, though the plan deals samples to ranks anew each epoch);
# the shared memory is gone when the run ends; a cache over data.cache_max_gb is a config
# error (exit 2) that names the key. data.cache disk: below.
. "$(dirname "$0")/lib.sh"
config=$(dirname "$0")/../../configs/sana_tiny_cpu.yaml
data=${SANA_EXAMPLE_DATA:-/usr/share/backgrounds/mate}
common=(--config "$config" --data.data_dir="[$data]" --data.tail=pad --train.max_steps=24 --train.log_interval=8
        --train.visualize=false --train.save_model_steps=0 --dist.timeout_s=60)
# EPOCH WORK_DIR: both ranks took every sample of that epoch from the cache and decoded
# none (each rank's log in WORK_DIR: the terminal shows rank 0's info lines only).
all_from_cache() {
  local r line log
  for r in 0 1; do
    log=$2/train.log
    [ "$r" -gt 0 ] && log=$2/train.rank$r.log
    line=$(grep -o "r$r/2 I\] epoch $1: [0-9]* samples from the cache, [0-9]* decoded" "$log")
    if [[ "$line" =~ epoch\ $1:\ [1-9][0-9]*\ samples\ from\ the\ cache,\ 0\ decoded ]]; then
      pass "rank $r, $line"
    else
      fail "rank $r in epoch $1: '$line'"; head -30 "$log"
    fi
  done
}
shm_before=$(ls /dev/shm | grep -c '^sana-cache-')
for mode in none memory; do
  out=$SCRATCH/$mode.log
  timeout 240 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/$mode-$TOKEN" "--data.cache=$mode" \
    > "$out" 2>&1
  assert_code $? 0 "24 steps on 2 processes, data.cache $mode"
done
out=$SCRATCH/memory.log
if cmp -s <(grep -o '"loss":[^,]*' "$SCRATCH/none-$TOKEN/metrics.jsonl") <(grep -o '"loss":[^,]*' "$SCRATCH/memory-$TOKEN/metrics.jsonl"); then
  pass "the loss curve with the cache is bitwise the one without ($(grep -c . "$SCRATCH/memory-$TOKEN/metrics.jsonl") steps)"
else
  fail "the loss curves differ"; paste <(grep -o '"loss":[^,]*' "$SCRATCH/none-$TOKEN/metrics.jsonl") <(grep -o '"loss":[^,]*' "$SCRATCH/memory-$TOKEN/metrics.jsonl") | head
fi
sum() { grep -o "parameters identical on all 2 ranks (checksum [0-9a-f]*)" "$1" | sort -u; }
if [ -n "$(sum "$out")" ] && [ "$(sum "$out")" = "$(sum "$SCRATCH/none.log")" ]; then
  pass "the same final weights: $(sum "$out")"
else
  fail "final weights: '$(sum "$out")' with the cache, '$(sum "$SCRATCH/none.log")' without"
fi
all_from_cache 2 "$SCRATCH/memory-$TOKEN"
shm_after=$(ls /dev/shm | grep -c '^sana-cache-')
if [ "$shm_after" -le "$shm_before" ]; then pass "no shared memory left behind"; else fail "/dev/shm: $(ls /dev/shm)"; fi

# data.cache disk: check-data --fill-cache fills the file on one process; training on 2
# then takes every sample of epoch 1 from it and trains the same bits; a run with other
# decode settings gets a file of its own and mentions the first.
cachedir=$SCRATCH/cachedir-$TOKEN
out=$SCRATCH/fill.log
timeout 240 "$BIN" check-data "${common[@]}" "--work_dir=$SCRATCH/fill-$TOKEN" --data.cache=disk \
  "--data.cache_dir=$cachedir" --fill-cache > "$out" 2>&1
assert_code $? 0 "check-data --fill-cache"
assert_contains "$out" "samples were ready before; training with data.cache: disk" "check-data says which file it filled"
out=$SCRATCH/disk.log
timeout 240 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/disk-$TOKEN" --data.cache=disk \
  "--data.cache_dir=$cachedir" > "$out" 2>&1
assert_code $? 0 "24 steps on 2 processes, data.cache disk after check-data --fill-cache"
if cmp -s <(grep -o '"loss":[^,]*' "$SCRATCH/none-$TOKEN/metrics.jsonl") <(grep -o '"loss":[^,]*' "$SCRATCH/disk-$TOKEN/metrics.jsonl"); then
  pass "the loss curve from the disk cache is bitwise the one without a cache"
else
  fail "the loss curves differ (disk cache)"
fi
assert_contains "$out" "decoded by earlier runs" "the run says how much of the file earlier runs filled"
all_from_cache 1 "$SCRATCH/disk-$TOKEN"
out=$SCRATCH/disk_bilinear.log
timeout 240 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/bilinear-$TOKEN" --data.cache=disk \
  "--data.cache_dir=$cachedir" --data.interpolation=bilinear --train.max_steps=2 > "$out" 2>&1
assert_code $? 0 "data.cache disk with another resize filter"
[ "$(ls "$cachedir" | grep -c '^samples-.*\.cache$')" = 2 ] && pass "another resize filter, another cache file" ||
  fail "cache files: $(ls "$cachedir")"
assert_contains "$out" "1 other cache file in" "the run mentions the other file"

out=$SCRATCH/too_big.log
timeout 120 "$BIN" launch --nproc-per-node 2 -- "${common[@]}" "--work_dir=$SCRATCH/big-$TOKEN" --data.cache=memory \
  --data.cache_max_gb=0.00001 > "$out" 2>&1
assert_code $? 2 "a cache over data.cache_max_gb"
assert_contains "$out" "raise data.cache_max_gb" "the error names the key and what to do"
assert_no_leftovers
finish
