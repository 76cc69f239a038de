#!/usr/bin/env bash
# The dataset index at scale (a benchmark; it prints figures): ROWS synthetic JSONL rows
# (path, caption, width, height; 16 aspect ratios) -> build time and file size of the
# index, memory of a process that opens it and computes an epoch plan (anonymous memory:
# its own; file pages: the mapped index and bucket file, shared through the page cache), and
# the time to step 1's ids, against
# Debian's python3 loading the same JSONL into a list of dicts.
#   scripts/bench/index.sh [ROWS=10000000] [DIR=/tmp/sana-bench-index]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
bin=${SANA_BUILD_DIR:-$root/build}/apps/sana-train
rows=${1:-10000000}
dir=${2:-/tmp/sana-bench-index}
mkdir -p "$dir"
jsonl=$dir/rows.jsonl
if [ ! -f "$jsonl" ] || [ "$(wc -l < "$jsonl")" -ne "$rows" ]; then
  echo "writing $rows rows to $jsonl"
  awk -v n="$rows" 'BEGIN {
    split("512 512,384 672,672 384,448 576,576 448,320 768,768 320,352 704,704 352,416 608,608 416,288 896,896 288,256 1024,1024 256,480 544", s, ",");
    for (i = 0; i < n; i++) {
      split(s[i % 16 + 1], hw, " ");
      printf "{\"path\": \"shard%04d/img%09d.jpg\", \"caption\": \"a synthetic caption for sample %d, with some words\", \"width\": %d, \"height\": %d}\n", i % 1000, i, i, hw[2] * 2, hw[1] * 2
    }
  }' > "$jsonl"
fi
echo "input: $(du -h "$jsonl" | cut -f1) JSONL, $rows rows"

echo "--- sana-train index"
/usr/bin/time -f "index build: %e s wall, peak RSS %M KiB" \
  "$bin" index --input "$jsonl" --output "$dir/rows.sidx" 2>&1 | grep -v '^\[' || true
echo "index file: $(stat -c %s "$dir/rows.sidx") bytes"

cat > "$dir/plan.yaml" <<YAML
data: {data_dir: [$dir/rows.sidx], image_size: 512, aspect_ratio_type: ASPECT_RATIO_512}
model: {image_size: 512}
train: {global_batch_size: 256, micro_batch_size: 32}
work_dir: $dir/work
YAML
rm -f "$dir"/work/index/buckets-*.bin
echo "--- sana-train plan, first run (open the index, assign buckets into work_dir/index/buckets-KEY.bin, plan)"
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
/usr/bin/time -f "plan: %e s wall, peak RSS %M KiB" "$bin" plan --config "$dir/plan.yaml" 2>&1 \
  | grep -E 'steps per epoch|memory|peak RSS'
echo "--- sana-train plan, again (the bucket file mapped; RssAnon is this process's own memory)"
/usr/bin/time -f "plan: %e s wall, peak RSS %M KiB" "$bin" plan --config "$dir/plan.yaml" 2>&1 \
  | grep -E 'steps per epoch|memory|peak RSS'

if [ "$rows" -gt 20000000 ]; then
  echo "--- python3: skipped above 20M rows (a list of dicts takes ~700 bytes a row: more than this machine's memory)"
  exit 0
fi
echo "--- python3: json.loads every line into a list"
/usr/bin/time -f "python: %e s wall, peak RSS %M KiB" "$SANA_PYTHON" -c "
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print('python rows:', len(rows))
" "$jsonl" 2>&1
