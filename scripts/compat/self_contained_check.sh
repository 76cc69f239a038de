#!/usr/bin/env bash
# Every source compiles on its own (syntax only), with the flags its target builds it with.
# The unity build (SANA_UNITY_BUILD, CMakeLists.txt) compiles sources in batches, where a file
# that lacks an #include may compile anyway through the file before it; another batch
# composition then fails: the GPU build (CUDA-only sources in the lists), a bare machine's
# (scripts/gpu_check.sh --rehearse found trainer_report.cpp using batch_options_for without
# part_options.h), or anyone's -DSANA_UNITY_BUILD=OFF. Reads BUILD_DIR's
# compile_commands.json (a configured unity build; the precompiled torch header it names must
# be built, as any build of the targets does) and runs each unity batch's command once per
# member source, -fsyntax-only, on every core.
#   bash scripts/compat/self_contained_check.sh [BUILD_DIR]   (default build)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
. "$repo/scripts/python_env.sh"
build=$(cd "${1:-$repo/build}" && pwd)
[ -f "$build/compile_commands.json" ] || { echo "self_contained_check: no compile_commands.json in $build (configure it first)"; exit 2; }
jobs=${SANA_CHECK_JOBS:-$(nproc)}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One small script per member source: its target's command, syntax only, on that source.
"$SANA_PYTHON" - "$build/compile_commands.json" "$work" <<'PY'
import json, os, re, shlex, sys
entries, work = json.load(open(sys.argv[1])), sys.argv[2]
n = 0
for e in entries:
    if "/Unity/unity_" not in e["file"]:
        continue  # compiled alone already
    members = re.findall(r'^#include "([^"]+)"', open(e["file"]).read(), re.M)
    args = e.get("arguments") or shlex.split(e["command"])
    keep, skip = [], False  # without the output, the dependency file and the unity source
    for a in args:
        if skip:
            skip = False
        elif a in ("-o", "-MF", "-MT", "-c"):
            skip = True
        elif a not in ("-MD", "-MMD", e["file"]):
            keep.append(a)
    for m in members:
        with open(os.path.join(work, f"{n:04d}.sh"), "w") as f:
            f.write(f"# {m}\ncd {shlex.quote(e['directory'])} && {shlex.join(keep)} -fsyntax-only {shlex.quote(m)}\n")
        n += 1
PY
count=$(find "$work" -name '*.sh' | wc -l)
[ "$count" -gt 0 ] || { echo "self_contained_check: no unity batches in $build (SANA_UNITY_BUILD=OFF compiles each alone)"; exit 0; }
echo "self_contained_check: $count sources of the unity batches in $build, $jobs jobs"
start=$(date +%s)
find "$work" -name '*.sh' -print0 | sort -z | xargs -0 -P "$jobs" -n 1 bash -c \
  'bash "$1" > "$1.err" 2>&1 || { head -c 4000 "$1.err"; sed -n "1s/^# //p" "$1" >> "$0/failed"; }' "$work"
if [ -s "$work/failed" ]; then
  echo "self_contained_check: these do not compile on their own (a missing #include?):"
  sed "s|^$repo/||" "$work/failed" | sort
  exit 1
fi
echo "self_contained_check: all $count compile on their own in $(( $(date +%s) - start )) s"
