#!/usr/bin/env bash
# Lints docker/Dockerfile.* with two linters from npm (Debian 12 has no hadolint):
# dockerfile-utils (the parser behind VS Code's Dockerfile support: syntax, instruction
# arguments, deprecations) and dockerfilelint (apt-get habits, ports, missing arguments).
# They are installed on first use into SANA_NPM_CACHE (default /var/cache/sana-npm),
# never into the repository. Exit 1 when either reports anything, 2 when they cannot be
# installed (needs node and npm: apt-get install nodejs npm).
#   bash scripts/compat/lint_dockerfiles.sh [FILE...]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cache=${SANA_NPM_CACHE:-/var/cache/sana-npm}
bin=$cache/node_modules/.bin
if [ ! -x "$bin/dockerfile-utils" ] || [ ! -x "$bin/dockerfilelint" ]; then
  command -v npm > /dev/null || { echo "lint_dockerfiles: npm not found (apt-get install nodejs npm)" >&2; exit 2; }
  mkdir -p "$cache"
  echo "lint_dockerfiles: installing dockerfile-utils and dockerfilelint into $cache"
  npm install --prefix "$cache" --no-audit --no-fund --loglevel=error \
    dockerfile-utils@0.16.3 dockerfilelint@1.8.0 > /dev/null ||
    { echo "lint_dockerfiles: npm install failed" >&2; exit 2; }
fi
files=("$@")
[ "${#files[@]}" -gt 0 ] || files=("$root"/docker/Dockerfile.*)
findings=0
for f in "${files[@]}"; do
  clean=1
  # dockerfile-utils exits 0 on warnings: any output is a finding.
  report=$("$bin/dockerfile-utils" lint "$f" 2>&1 || true)
  if [ -n "$report" ]; then
    echo "dockerfile-utils: $f"; echo "$report"; clean=0
  fi
  if ! report=$("$bin/dockerfilelint" "$f" 2>&1); then
    echo "$report"; clean=0
  fi
  if [ "$clean" -eq 1 ]; then echo "lint_dockerfiles: $f: no findings"; else findings=1; fi
done
exit "$findings"
