#!/usr/bin/env bash
# Mutation check: do the tests catch planted bugs? For each line of scripts/mutants.tsv
# (id, file, original text, planted text, what it breaks, the ctest -R regex of the tests
# that should catch it), one at a time: plant the bug (the original must occur exactly once
# in the file), rebuild, run those tests, put the file back. A mutant is caught when one
# of its tests fails; the table says which. Not a ctest test: it rebuilds the tree it
# checks: 30 to 190 s per mutant here (2 cores; 17 mutants, 1118 s on 2026-11-28).
#   bash scripts/mutants.sh [BUILD_DIR] [ID...]   BUILD_DIR: a configured build with tests
#                                                  (default build/); IDs: only those mutants
# Exit 0 when every mutant was caught, 1 when one survived or did not build, 2 on misuse.
# The sources are put back on any exit (a trap), and the build is brought back at the end.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
. "$root/scripts/python_env.sh"
build=${1:-$root/build}
[ $# -gt 0 ] && shift
catalogue=$root/scripts/mutants.tsv
[ -f "$build/CMakeCache.txt" ] || { echo "mutants: $build is not a configured build (bash scripts/test.sh makes build/)" >&2; exit 2; }
grep -q 'SANA_BUILD_TESTS:BOOL=ON' "$build/CMakeCache.txt" ||
  { echo "mutants: $build was configured without tests (-DSANA_BUILD_TESTS=ON)" >&2; exit 2; }
if ! git -C "$root" diff --quiet -- src apps; then
  echo "mutants: src/ or apps/ has uncommitted changes; commit or stash them first (the check plants bugs there)" >&2
  exit 2
fi
only=("$@")
log_dir=$(mktemp -d /tmp/sana-mutants-XXXXXX)
saved=""  # the file being mutated, while it is
restore() {
  if [ -n "$saved" ]; then git -C "$root" checkout -- "$saved"; saved=""; fi
}
trap 'restore; exit 130' INT TERM
trap restore EXIT

build_all() {  # LOG: the binary and the test binaries
  timeout 1800 cmake --build "$build" --target sana-train sana_unit_tests sana_torch_tests ddp_check plan_allreduce > "$1" 2>&1
}

rows=()
record() { rows+=("$1"); echo "  $1" >&2; }  # a table row, shown as it comes
caught=0 total=0
started=$(date +%s)
while IFS=$'\t' read -r id file original planted what tests; do
  [ -z "$id" ] || [[ "$id" == \#* ]] && continue
  if [ ${#only[@]} -gt 0 ] && [[ ! " ${only[*]} " == *" $id "* ]]; then continue; fi
  total=$((total + 1))
  t0=$(date +%s)
  n=$(grep -cF -- "$original" "$root/$file" || true)
  if [ "$n" != 1 ]; then
    record "$id|$what|$file|NOT PLANTED: the original occurs $n times|-|0"
    continue
  fi
  saved=$file
  "$SANA_PYTHON" - "$root/$file" "$original" "$planted" <<'PY'
import sys
path, old, new = sys.argv[1:4]
text = open(path).read()
open(path, "w").write(text.replace(old, new, 1))
PY
  echo "mutant $id ($what): $file" >&2
  if ! build_all "$log_dir/$id.build.log"; then
    restore
    record "$id|$what|$file|DID NOT BUILD ($log_dir/$id.build.log)|-|$(( $(date +%s) - t0 ))"
    continue
  fi
  (cd "$build" && timeout 1800 ctest -R "$tests" --timeout 300 -j 2 --output-junit "$log_dir/$id.xml" \
     > "$log_dir/$id.ctest.log" 2>&1)
  restore
  ran=$(grep -c '<testcase ' "$log_dir/$id.xml" 2>/dev/null || echo 0)
  failed=$("$SANA_PYTHON" - "$log_dir/$id.xml" <<'PY' 2>/dev/null
import sys, xml.etree.ElementTree as ET
cases = ET.parse(sys.argv[1]).getroot().iter("testcase")
print(", ".join(c.get("name") for c in cases if c.get("status") == "fail"))
PY
)
  secs=$(( $(date +%s) - t0 ))
  if [ "$ran" -eq 0 ]; then
    record "$id|$what|$file|NO TEST RAN for '$tests'|-|$secs"
  elif [ -n "$failed" ]; then
    caught=$((caught + 1))
    record "$id|$what|$file|caught|$failed|$secs"
  else
    record "$id|$what|$file|SURVIVED ($ran tests passed)|-|$secs"
  fi
done < "$catalogue"

echo "mutants: bringing the build back to the unmutated sources" >&2
build_all "$log_dir/restore.build.log" || echo "mutants: the final rebuild failed: $log_dir/restore.build.log" >&2
echo
echo "| mutant | what it breaks | file | outcome | failing tests | s |"
echo "| --- | --- | --- | --- | --- | --- |"
for r in "${rows[@]}"; do echo "| ${r//|/ | } |"; done
echo
echo "mutants: $caught of $total caught, $(( $(date +%s) - started )) s (logs: $log_dir)"
[ "$caught" -eq "$total" ] && [ "$total" -gt 0 ]
