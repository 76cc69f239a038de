#!/usr/bin/env bash
# libFuzzer (clang, with ASan and UBSan) over everything that reads outside input: the
# YAML config loader with overrides, the dataset index reader, the safetensors header, the
# JSONL/CSV metadata parsers, the image header reader, the decode path, the run's store
# requests, and precomputed-feature containers (.npy, .npz, tar shards).
#   bash scripts/fuzz.sh [SECONDS_PER_TARGET [TARGET...]]     (default 30 s, every target)
# Builds into build-fuzz/ (or $SANA_FUZZ_BUILD_DIR), replays tests/fuzz/regress/<target>/
# (inputs that once crashed), then fuzzes each target from tests/fuzz/corpus/ and prints
# a table: executions, corpus size, result. A crash's input is copied into
# tests/fuzz/regress/<target>/ for a person to commit with the fix; exit 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
seconds=${1:-30}
shift || true
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config index metadata image_header decode safetensors store_request features)
build=${SANA_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=$(command -v clang++-14 || command -v clang++ || true)
if [ -z "$cxx" ]; then
  echo "fuzz: clang is not installed (apt-get install clang-14)" >&2
  exit 2
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  generator=()
  command -v ninja > /dev/null && generator=(-G Ninja)
  CXX=$cxx cmake -S "$root" -B "$build" "${generator[@]}" -DSANA_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
fi
t0=$(date +%s)
cmake --build "$build" -j "${SANA_BUILD_JOBS:-2}" > "$build/build.log" 2>&1 || { tail -30 "$build/build.log"; exit 1; }
echo "fuzz: built in $(( $(date +%s) - t0 )) s"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export TMPDIR=$work  # the targets write their input there
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
seeds_of() {
  case $1 in
    config) echo "$root/tests/fuzz/corpus/config $root/configs" ;;
    image_header | decode) echo "$root/tests/fuzz/corpus/image" ;;
    *) echo "$root/tests/fuzz/corpus/$1" ;;
  esac
}
status=0
printf '%-14s %12s %10s %8s  %s\n' target executions exec/s corpus result
for t in "${targets[@]}"; do
  bin=$build/tests/fuzz/fuzz_$t
  [ -x "$bin" ] || { echo "fuzz: no target '$t'" >&2; exit 2; }
  regress=$root/tests/fuzz/regress/$t
  if compgen -G "$regress/*" > /dev/null; then
    if ! "$bin" "$regress"/* > "$work/$t.regress.log" 2>&1; then
      echo "fuzz: $t fails on a regression input:"; tail -30 "$work/$t.regress.log"; status=1; continue
    fi
  fi
  mkdir -p "$work/corpus-$t"
  # shellcheck disable=SC2046
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
      -artifact_prefix="$work/crash-$t-" "$work/corpus-$t" $(seeds_of "$t") > "$work/$t.log" 2>&1; then
    result=ok
  else
    result=CRASH
    status=1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log" | tail -1)
  printf '%-14s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$(find "$work/corpus-$t" -type f | wc -l)" "$result"
  if [ "$result" = CRASH ]; then
    grep -m1 -E "ERROR: |runtime error|deadly signal|uncaught|terminate" "$work/$t.log" || true
    grep -A12 -m1 -E "^ *#0 " "$work/$t.log" || tail -20 "$work/$t.log"
    mkdir -p "$regress"
    for a in "$work"/crash-"$t"-*; do
      [ -f "$a" ] && cp "$a" "$regress/" && echo "fuzz: the input is in $regress/$(basename "$a")"
    done
  fi
done
exit $status
