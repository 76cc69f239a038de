#!/usr/bin/env bash
# check-dist's all-reduce bandwidth next to raw c10d Gloo, same sizes and timing rule:
# runs each ROUNDS times (alternating) with NPROC processes and prints the median time per
# op of each size. A benchmark, not a test: it prints figures.
#   scripts/bench/allreduce.sh [NPROC=2] [ROUNDS=5]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${SANA_BUILD_DIR:-$root/build}/apps
cmake --build "$(dirname "$bin")" --target sana-train bench_gloo_allreduce > /dev/null
nproc=${1:-2}
rounds=${2:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for ((i = 0; i < rounds; i++)); do
  "$bin/sana-train" launch --nproc-per-node "$nproc" -- check-dist 2>/dev/null >> "$tmp/ours"
  "$bin/sana-train" launch --nproc-per-node "$nproc" -- "$bin/bench_gloo_allreduce" 2>/dev/null >> "$tmp/raw"
done
median() {  # file size-label -> median time/op in us
  grep -E "\] +$2 +[0-9]+ " "$1" | awk '{print $6}' | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'
}
echo "all-reduce, $nproc processes on one host, median of $rounds runs (time per op, us; GB/s = algbw)"
printf "%10s %14s %10s %14s %10s %8s\n" size check-dist GB/s raw-c10d GB/s time-ratio
for size in "1 KiB" "16 KiB" "256 KiB" "1 MiB" "4 MiB" "16 MiB" "64 MiB"; do
  n=${size% *}; unit=${size#* }
  if [ "$unit" = MiB ]; then bytes=$((n * 1048576)); else bytes=$((n * 1024)); fi
  ours=$(median "$tmp/ours" "$n $unit")
  raw=$(median "$tmp/raw" "$n $unit")
  awk -v s="$size" -v o="$ours" -v r="$raw" -v b="$bytes" 'BEGIN {
    printf "%10s %14.1f %10.3f %14.1f %10.3f %8.2f\n", s, o, b / o / 1e3, r, b / r / 1e3, o / r }'
done
