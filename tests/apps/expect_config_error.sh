#!/usr/bin/env bash
# Runs sana-train on one malformed config and checks what a user would see: exit code 2,
# every "# expect:" fragment of the file in the output, and no crash or stack trace.
# Lines "# args: ..." add command-line words; "# env: A=1 B=2" sets the environment.
set -u
bin=$1
file=$2
args=$(sed -n 's/^# args: //p' "$file")
envs=$(sed -n 's/^# env: //p' "$file")
# A copy of the config's folder in a temporary one: whatever the run writes (work_dir is
# relative) lands there, never in the source tree.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp -r "$(dirname "$file")"/. "$tmp"/
# shellcheck disable=SC2086
output=$(cd "$tmp" && env $envs timeout 60 "$bin" --config "$(basename "$file")" $args 2>&1)
code=$?
status=0
if [ "$code" -ne 2 ]; then
  echo "FAIL: exit code $code, expected 2"
  status=1
fi
while IFS= read -r fragment; do
  if ! grep -qF -- "$fragment" <<<"$output"; then
    echo "FAIL: output lacks: $fragment"
    status=1
  fi
done < <(sed -n 's/^# expect: //p' "$file")
if ! grep -q '^# expect: ' "$file"; then
  echo "FAIL: $file has no '# expect:' line"
  status=1
fi
if grep -qE 'terminate called|Aborted|Segmentation|what\(\):' <<<"$output"; then
  echo "FAIL: the output looks like a crash"
  status=1
fi
if [ "$status" -ne 0 ]; then
  echo "--- output of sana-train --config $(basename "$file") $args"
  echo "$output"
fi
exit $status
