#!/usr/bin/env bash
# The [cuda] Catch2 cases of sana_torch_tests as one ctest entry: exit 77 (ctest: Skipped)
# where this process sees no CUDA device, else run them.
#   bash tests/unit/cuda_cases.sh SANA_TORCH_TESTS [CATCH ARGS...]
set -euo pipefail
. "$(dirname "$0")/../../scripts/python_env.sh"
bin=$1; shift
if ! timeout 120 "$SANA_PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
  echo "cuda_cases: no CUDA device visible here: the [cuda] cases did not run (skipped)"
  exit 77
fi
exec timeout 280 "$bin" "[cuda]" "$@"
